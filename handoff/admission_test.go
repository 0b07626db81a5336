package handoff

// Admission's bounds at their edges, against naive models: the admission
// rule over every small case, and a decode node's bookkeeping over random
// sequences of requests starting and ending.

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// naiveAdmit is the admission rule as the design states it, the bounds in
// the order a refusal names them: the request itself, the context window
// (the prompt, then the prompt and the tokens asked for), the prefill pool
// (the prompt's pages) and the decode pool (the prompt's pages and those of
// every generated token that is fed back, all but the last).
func naiveAdmit(l Limits, prompt, maxTokens, prefillPages, decodePages int) error {
	pt := l.Geometry.PageTokens
	pages := func(tokens int) int { return (tokens + pt - 1) / pt }
	switch {
	case prompt < 1 || maxTokens < 1 || maxTokens > l.MaxTokensMax:
		return &BadRequestError{}
	case prompt > l.ContextTokens:
		return &PromptTooLongError{Tokens: prompt, Limit: l.ContextTokens, Where: "context window"}
	case prompt+maxTokens > l.ContextTokens:
		return &PromptTooLongError{Tokens: prompt + maxTokens, Limit: l.ContextTokens, Where: "context window (prompt + max_tokens)"}
	case pages(prompt) > prefillPages:
		return &PromptTooLongError{Tokens: prompt, Limit: prefillPages * pt, Where: "prefill pool"}
	case pages(prompt)+pages(maxTokens-1) > decodePages:
		return &PromptTooLongError{Tokens: prompt + maxTokens, Limit: decodePages * pt, Where: "decode pool"}
	}
	return nil
}

// TestAdmitAgainstANaiveModel: over every prompt, max_tokens and pool size
// of a small geometry, up to one past each bound, Admit refuses exactly
// what the naive rule refuses, naming the same bound and numbers: a
// request that exactly fills the window or a pool is admitted, one token
// more is not.
func TestAdmitAgainstANaiveModel(t *testing.T) {
	l := Limits{ContextTokens: 12, MaxTokensMax: 6, Geometry: tinyModel().Geometry(4)}
	for prompt := 0; prompt <= l.ContextTokens+2; prompt++ {
		for maxTokens := 0; maxTokens <= l.MaxTokensMax+1; maxTokens++ {
			for prefill := 0; prefill <= 4; prefill++ {
				for decode := 0; decode <= 6; decode++ {
					got := Admit(l, prompt, maxTokens, prefill, decode)
					want := naiveAdmit(l, prompt, maxTokens, prefill, decode)
					var long *PromptTooLongError
					var bad *BadRequestError
					ok := got == nil && want == nil
					switch w := want.(type) {
					case *BadRequestError:
						ok = errors.As(got, &bad)
					case *PromptTooLongError:
						ok = errors.As(got, &long) && *long == *w
					}
					if !ok {
						t.Errorf("prompt %d, max_tokens %d, pools of %d and %d pages: %v, want %v", prompt, maxTokens,
							prefill, decode, got, want)
					}
				}
			}
		}
	}
}

// TestAdmissionRefusals: a decode node's admission refuses, with the
// numbers, a request past its queue, a client's second request of the same
// id, a client of a draining node that comes directly (a routed one was
// sent before the router saw the drain), a request with no prefill peer,
// and a prompt the picked peer's pool cannot hold; a router's choice of
// peer (Routed) is not checked against a pool this node does not know.
func TestAdmissionRefusals(t *testing.T) {
	g := tinyModel().Geometry(4)
	lim := Limits{ContextTokens: 64, MaxTokensMax: 16, Geometry: g}
	key := func(id uint64) ClientKey { return ClientKey{Client: "c", ID: id} }
	ask := func(id uint64) Ask { return Ask{Key: key(id), PromptTokens: 9, MaxTokens: 2, PrefillPages: 8} }
	a := NewAdmission(lim, 2, 2, 64)
	admit := func(q Ask, name string) {
		t.Helper()
		d, err := a.Admit(q)
		if err != nil {
			t.Fatalf("%+v: %v", q, err)
		}
		a.Started(name, q.Key, d)
	}
	admit(ask(1), "r1")
	if _, err := a.Admit(ask(1)); !errors.As(err, new(*BadRequestError)) || err.Error() != "handoff: bad request: request id 1 is already in flight" {
		t.Fatalf("the client's second request of id 1: %v", err)
	}
	if _, err := a.Admit(Ask{Key: ClientKey{Client: "other", ID: 1}, PromptTokens: 9, MaxTokens: 2}); err != nil {
		t.Fatalf("another client's request of id 1: %v", err)
	}
	admit(ask(2), "r2")
	var busy *BusyError
	if _, err := a.Admit(ask(3)); !errors.As(err, &busy) || *busy != (BusyError{Where: "admission queue", Have: 2, Limit: 2}) {
		t.Fatalf("a third request, queue of 2: %v", err)
	}
	a.Ended("r1")
	a.Ended("unknown") // ignored
	if _, err := a.Admit(ask(1)); err != nil {
		t.Fatalf("id 1 again once its request ended: %v", err)
	}

	small := ask(4)
	small.PrefillPages = 2 // 8 tokens; the prompt has 9
	var long *PromptTooLongError
	if _, err := a.Admit(small); !errors.As(err, &long) || *long != (PromptTooLongError{Tokens: 9, Limit: 8, Where: "prefill pool"}) {
		t.Fatalf("a 9-token prompt, picked peer of 8: %v", err)
	}
	small.Routed, small.PrefillPages = true, 0
	if _, err := a.Admit(small); err != nil {
		t.Fatalf("a routed request: %v", err)
	}
	var none *UnavailableError
	if _, err := a.Admit(Ask{Key: key(5), PromptTokens: 9, MaxTokens: 2, NoPrefill: true}); !errors.As(err, &none) ||
		fmt.Sprint(none.Roles) != "[prefill]" {
		t.Fatalf("no prefill peer: %v, want unavailable for want of prefill nodes", err)
	}

	a.Drain()
	if _, err := a.Admit(ask(1)); !errors.As(err, &busy) || *busy != (BusyError{Where: "draining node", Have: 1, Limit: 0}) {
		t.Fatalf("a client of a draining node: %v", err)
	}
	routed := ask(1)
	routed.Routed = true
	if _, err := a.Admit(routed); err != nil {
		t.Fatalf("a routed request while draining: %v", err)
	}
}

// TestAdmissionLoadProperty: over random requests starting and ending, a
// decode node's admission puts each request on the first of the workers
// with the fewest requests, its load per worker is what a naive count
// says, and it refuses exactly the requests past its queue or with an id
// of the same client in flight.
func TestAdmissionLoadProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		workers := rapid.IntRange(1, 4).Draw(rt, "workers")
		queueMax := rapid.IntRange(1, 8).Draw(rt, "queue")
		a := NewAdmission(Limits{ContextTokens: 64, MaxTokensMax: 16, Geometry: tinyModel().Geometry(4)}, queueMax, workers, 64)
		inflight := map[string]admitted{}
		load := make([]int, workers)
		for i := range rapid.IntRange(1, 60).Draw(rt, "steps") {
			names := slices.Sorted(maps.Keys(inflight))
			if len(names) > 0 && rapid.Bool().Draw(rt, fmt.Sprintf("end %d", i)) {
				n := rapid.SampledFrom(names).Draw(rt, "ended")
				a.Ended(n)
				load[inflight[n].decode]--
				delete(inflight, n)
			} else {
				admitOne(rt, a, i, inflight, load, queueMax)
			}
			if got := a.Load(); !slices.Equal(got, load) {
				rt.Fatalf("load %v, want %v", got, load)
			}
		}
	})
}

// admitOne asks a for a request of a random client id and checks its
// answer against the naive count: inflight by name, load per worker.
func admitOne(rt *rapid.T, a *Admission, i int, inflight map[string]admitted, load []int, queueMax int) {
	key := ClientKey{Client: "c", ID: uint64(rapid.IntRange(0, 9).Draw(rt, "id"))}
	d, err := a.Admit(Ask{Key: key, PromptTokens: 4, MaxTokens: 1, PrefillPages: 8})
	dup := false
	for _, r := range inflight {
		dup = dup || r.key == key
	}
	switch {
	case len(inflight) >= queueMax:
		if !errors.As(err, new(*BusyError)) {
			rt.Fatalf("request %d past a queue of %d: %v", len(inflight)+1, queueMax, err)
		}
	case dup:
		if !errors.As(err, new(*BadRequestError)) {
			rt.Fatalf("id %d again while in flight: %v", key.ID, err)
		}
	case err != nil:
		rt.Fatalf("request of id %d, %d in flight: %v", key.ID, len(inflight), err)
	case d != slices.Index(load, slices.Min(load)):
		rt.Fatalf("put on worker %d of loads %v", d, load)
	default:
		name := fmt.Sprint("r", i)
		a.Started(name, key, d)
		inflight[name] = admitted{key: key, decode: d}
		load[d]++
	}
}
