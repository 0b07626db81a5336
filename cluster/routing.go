package cluster

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvwarden/kvwarden/handoff"
)

// Routing is one router's choice of nodes, a pure state machine (no
// goroutines, clock or I/O; the router actor calls it from its Receive and
// adds no rule of its own). Gossip says how many pages each node had free
// when it last published (every MetaInterval), which lags a burst: every
// request of the burst would see the same figures and go to the same node.
// So Routing also counts what this router has sent to each node and not
// yet seen finish, in requests and in pages (handoff.RequestPages), and
// estimates a node's free pages as the lesser of what gossip says and its
// capacity less what is outstanding there. Several routers each count
// only their own requests; gossip carries the others'.
//
// Among the candidates that can hold a request by that estimate, Pick
// takes two at random and keeps the one with more free pages, then the
// one with fewer requests outstanding (the power of two choices: close to
// the best choice's balance, without herding every router onto the one
// node they all think best).
type Routing struct {
	rand *rand.Rand
	out  map[uint64]Load // by node incarnation; a node with nothing outstanding has no entry
}

// Load is what a router has sent to one node and not seen finish.
type Load struct {
	Requests, Pages int
}

// Candidate is a node a request may be routed to, as gossip shows it.
type Candidate struct {
	Incarnation uint64
	// CapacityPages and FreePages are the node's pool, as it last
	// published it (Meta.CapacityPages, Meta.FreePages).
	CapacityPages, FreePages int
}

// NewRouting is a router's routing, drawing its choices from src.
func NewRouting(src rand.Source) *Routing {
	return &Routing{rand: rand.New(src), out: map[uint64]Load{}}
}

// Outstanding is what is outstanding on the node of incarnation inc.
func (r *Routing) Outstanding(inc uint64) Load { return r.out[inc] }

// Free is the estimate of c's free pages: what gossip says, or its
// capacity less the pages outstanding there, whichever is less. It is
// negative when more is outstanding than the node holds (the excess waits
// for pages there).
func (r *Routing) Free(c Candidate) int {
	return min(c.FreePages, c.CapacityPages-r.Outstanding(c.Incarnation).Pages)
}

// Pick chooses, of cs, the candidate (its index) for a request that holds
// pages there, skipping the incarnations in exclude (nodes the request was
// already answered busy by). It prefers, in order: candidates whose
// estimated free pages hold the request; then those whose capacity does
// (the request waits there for pages that requests in flight will free);
// and, when no candidate's pool is large enough, the largest, whose
// admission then refuses the request with the numbers. Within the first
// two groups it chooses by two random choices. It reports false when no
// candidate is left.
func (r *Routing) Pick(cs []Candidate, pages int, exclude map[uint64]bool) (int, bool) {
	fits, waits := make([]int, 0, len(cs)), make([]int, 0, len(cs))
	largest := -1
	for i, c := range cs {
		switch {
		case exclude[c.Incarnation]:
			continue
		case r.Free(c) >= pages:
			fits = append(fits, i)
		case c.CapacityPages >= pages:
			waits = append(waits, i)
		}
		if largest < 0 || c.CapacityPages > cs[largest].CapacityPages {
			largest = i
		}
	}
	switch {
	case len(fits) > 0:
		return r.twoChoices(cs, fits), true
	case len(waits) > 0:
		return r.twoChoices(cs, waits), true
	}
	return largest, largest >= 0
}

// twoChoices is the better of two distinct candidates of cs, of the
// indexes in among, drawn at random (among's only one if it has one).
func (r *Routing) twoChoices(cs []Candidate, among []int) int {
	if len(among) == 1 {
		return among[0]
	}
	i := r.rand.IntN(len(among))
	j := r.rand.IntN(len(among) - 1)
	if j >= i {
		j++
	}
	a, b := among[i], among[j]
	if fa, fb := r.Free(cs[a]), r.Free(cs[b]); fa != fb {
		if fb > fa {
			return b
		}
		return a
	}
	if r.out[cs[b].Incarnation].Requests < r.out[cs[a].Incarnation].Requests {
		return b
	}
	return a
}

// Sent counts a request holding pages on the node of incarnation inc as
// outstanding there.
func (r *Routing) Sent(inc uint64, pages int) {
	l := r.out[inc]
	r.out[inc] = Load{Requests: l.Requests + 1, Pages: l.Pages + pages}
}

// Done counts a request that Sent counted on inc as finished there. Each
// Sent is followed by exactly one Done of the same pages; more is a bug.
func (r *Routing) Done(inc uint64, pages int) {
	l := r.out[inc]
	l.Requests--
	l.Pages -= pages
	switch {
	case l.Requests < 0 || l.Pages < 0 || l.Requests == 0 && l.Pages != 0:
		panic(fmt.Sprintf("cluster: node %x has %d requests of %d pages outstanding after a Done of %d pages",
			inc, l.Requests, l.Pages, pages))
	case l.Requests == 0:
		delete(r.out, inc)
	default:
		r.out[inc] = l
	}
}

// PickAffine is Pick for a request whose prompt's cached pages each
// candidate is thought to hold, hits[i] of them on cs[i] (PrefixAffinity):
// among the candidates Pick would choose from, the one with the most hits,
// unless it has more than handoff.AffinityImbalanceMax requests outstanding beyond
// the least loaded of them; with no hit anywhere, or past that, as Pick.
func (r *Routing) PickAffine(cs []Candidate, pages int, exclude map[uint64]bool, hits []int) (int, bool) {
	fits, waits := make([]int, 0, len(cs)), make([]int, 0, len(cs))
	for i, c := range cs {
		switch {
		case exclude[c.Incarnation]:
		case r.Free(c) >= pages:
			fits = append(fits, i)
		case c.CapacityPages >= pages:
			waits = append(waits, i)
		}
	}
	among := fits
	if len(among) == 0 {
		among = waits
	}
	best, least := -1, -1
	load := func(i int) int { return r.out[cs[i].Incarnation].Requests }
	for _, i := range among {
		if hits[i] > 0 && (best < 0 || hits[i] > hits[best] || hits[i] == hits[best] && load(i) < load(best)) {
			best = i
		}
		if least < 0 || load(i) < load(least) {
			least = i
		}
	}
	if best >= 0 && load(best)-load(least) <= handoff.AffinityImbalanceMax {
		return best, true
	}
	return r.Pick(cs, pages, exclude)
}
