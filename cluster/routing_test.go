package cluster

import (
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// routingOf is a Routing drawing from a source seeded by the property's
// own draw, so that a failing case replays from rapid's seed.
func routingOf(t *rapid.T) *Routing {
	return NewRouting(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 0))
}

// candidatesOf draws 1 to 6 nodes, each with its capacity, what gossip
// says is free, and pages this router has outstanding there.
func candidatesOf(t *rapid.T, r *Routing) []Candidate {
	n := rapid.IntRange(1, 6).Draw(t, "nodes")
	cs := make([]Candidate, n)
	for i := range cs {
		capacity := rapid.IntRange(1, 64).Draw(t, "capacity")
		cs[i] = Candidate{Incarnation: uint64(i + 1), CapacityPages: capacity,
			FreePages: rapid.IntRange(0, capacity).Draw(t, "free")}
		for range rapid.IntRange(0, 4).Draw(t, "outstanding") {
			r.Sent(cs[i].Incarnation, rapid.IntRange(1, 32).Draw(t, "pages out"))
		}
	}
	return cs
}

// Pick never chooses a node that cannot hold the request when one can
// (by min(gossiped free, capacity − outstanding), the naive estimate
// computed here), never one excluded, and otherwise a node whose pool
// could hold the request once empty, and otherwise the largest pool.
func TestPickPrefersNodesThatHoldTheRequest(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := routingOf(t)
		cs := candidatesOf(t, r)
		pages := rapid.IntRange(1, 48).Draw(t, "pages")
		exclude := map[uint64]bool{}
		for _, c := range cs {
			if rapid.IntRange(0, 3).Draw(t, "excluded") == 0 {
				exclude[c.Incarnation] = true
			}
		}
		var holds, waits, left []int
		for i, c := range cs {
			switch free := min(c.FreePages, c.CapacityPages-r.Outstanding(c.Incarnation).Pages); {
			case exclude[c.Incarnation]:
				continue
			case free >= pages:
				holds = append(holds, i)
			case c.CapacityPages >= pages:
				waits = append(waits, i)
			}
			left = append(left, i)
		}
		got, ok := r.Pick(cs, pages, exclude)
		switch {
		case ok != (len(left) > 0):
			t.Fatalf("pick %d, %v with %d candidates not excluded", got, ok, len(left))
		case len(holds) > 0 && !slices.Contains(holds, got):
			t.Fatalf("picked %+v (outstanding %+v) for %d pages; these hold it: %v of %+v", cs[got],
				r.Outstanding(cs[got].Incarnation), pages, holds, cs)
		case len(holds) == 0 && len(waits) > 0 && !slices.Contains(waits, got):
			t.Fatalf("picked %+v for %d pages, none holds it now; these could: %v of %+v", cs[got], pages, waits, cs)
		case len(holds) == 0 && len(waits) == 0 && ok:
			for _, i := range left {
				if cs[i].CapacityPages > cs[got].CapacityPages {
					t.Fatalf("picked %+v for %d pages, no pool holds it, %+v is larger", cs[got], pages, cs[i])
				}
			}
		}
	})
}

// Whatever is sent and finishes, in any order, the counts are those of
// the requests still outstanding (a naive sum kept here) and go back to
// zero, with no entry left, when every request has ended.
func TestRoutingCountsGoBackToZero(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := routingOf(t)
		type sent struct {
			inc   uint64
			pages int
		}
		var out []sent
		for range rapid.IntRange(0, 64).Draw(t, "steps") {
			if len(out) > 0 && rapid.Bool().Draw(t, "finish") {
				i := rapid.IntRange(0, len(out)-1).Draw(t, "which")
				r.Done(out[i].inc, out[i].pages)
				out = slices.Delete(out, i, i+1)
			} else {
				s := sent{inc: rapid.Uint64Range(1, 4).Draw(t, "node"), pages: rapid.IntRange(1, 40).Draw(t, "pages")}
				r.Sent(s.inc, s.pages)
				out = append(out, s)
			}
			for inc := uint64(1); inc <= 4; inc++ {
				var want Load
				for _, s := range out {
					if s.inc == inc {
						want.Requests++
						want.Pages += s.pages
					}
				}
				if got := r.Outstanding(inc); got != want {
					t.Fatalf("node %d: outstanding %+v, want %+v", inc, got, want)
				}
			}
		}
		for _, s := range out {
			r.Done(s.inc, s.pages)
		}
		if len(r.out) != 0 {
			t.Fatalf("after every request ended: %+v", r.out)
		}
	})
}

// A burst on two nodes of one size that gossip shows all free (it has not
// republished yet) spreads to within one request of even, however many
// requests and of whatever size; on more nodes, none is given more than it
// holds while another still holds the request.
func TestBurstSpreads(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := routingOf(t)
		n := rapid.IntRange(2, 5).Draw(t, "nodes")
		capacity := rapid.IntRange(8, 256).Draw(t, "capacity")
		pages := rapid.IntRange(1, capacity).Draw(t, "pages")
		cs := make([]Candidate, n)
		for i := range cs {
			cs[i] = Candidate{Incarnation: uint64(i + 1), CapacityPages: capacity, FreePages: capacity}
		}
		for k := range rapid.IntRange(1, 4*n*capacity/pages).Draw(t, "burst") {
			i, ok := r.Pick(cs, pages, nil)
			if !ok {
				t.Fatalf("request %d: no node picked", k)
			}
			before := r.Free(cs[i])
			r.Sent(cs[i].Incarnation, pages)
			if before < pages {
				for _, c := range cs {
					if r.Free(c) >= pages {
						t.Fatalf("request %d went to node %d with %d free, node %d holds it", k, i+1, before, c.Incarnation)
					}
				}
			}
		}
		if n == 2 {
			a, b := r.Outstanding(1).Pages, r.Outstanding(2).Pages
			if max(a, b)-min(a, b) > pages {
				t.Fatalf("two nodes: %d and %d pages outstanding, requests of %d", a, b, pages)
			}
		}
	})
}

// The burst the router used to send to one node: 40 requests of 11 pages
// on two decode nodes of 256, both showing all pages free in gossip, land
// 20 and 20; routed by gossip alone every one goes to the first. Gossip
// showing fewer free pages than this router's count (another router's
// requests) takes precedence.
func TestBurstOfFortySplitsEvenly(t *testing.T) {
	r := NewRouting(rand.NewPCG(1, 2))
	cs := []Candidate{{Incarnation: 1, CapacityPages: 256, FreePages: 256}, {Incarnation: 2, CapacityPages: 256, FreePages: 256}}
	for range 40 {
		i, _ := r.Pick(cs, 11, nil)
		r.Sent(cs[i].Incarnation, 11)
	}
	if a, b := r.Outstanding(1), r.Outstanding(2); a != (Load{Requests: 20, Pages: 220}) || b != a {
		t.Fatalf("40 requests of 11 pages: %+v and %+v", a, b)
	}
	cs[0].FreePages = 20 // another router has most of node 1
	if i, _ := r.Pick(cs, 11, nil); cs[i].Incarnation != 2 {
		t.Fatalf("picked node %d, which gossip shows with 20 free pages; node 2 has %d", cs[i].Incarnation, r.Free(cs[1]))
	}
	if i, ok := r.Pick(cs, 11, map[uint64]bool{2: true}); !ok || i != 0 {
		t.Fatalf("node 2 excluded: picked %d, %v", i, ok)
	}
}

// A Done without its Sent is a bug in the router, not a state to carry on
// from.
func TestDoneWithoutSentPanics(t *testing.T) {
	r := NewRouting(rand.NewPCG(1, 2))
	r.Sent(1, 4)
	r.Done(1, 4)
	defer func() {
		if recover() == nil {
			t.Fatal("a second Done of the same request did not panic")
		}
	}()
	r.Done(1, 4)
}
