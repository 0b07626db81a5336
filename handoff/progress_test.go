package handoff

import (
	"fmt"
	"testing"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/messages"
)

// TestProgressFollowsTheRequest: a request shows the stage it is in at
// each effect of its life, with its prefill peer and the tokens streamed,
// and every stage but the last is a phase an InFlight may name.
func TestProgressFollowsTheRequest(t *testing.T) {
	p := newPair(t, 16, 16)
	var seen []string
	p.observe = func(e Effect) {
		if p.req == nil {
			return
		}
		pr := p.req.Progress()
		switch e.(type) {
		case SendPlan, Write, Emit, Finish:
			seen = append(seen, fmt.Sprintf("%T %s %s %d", e, pr.Stage, pr.Peer.Address, pr.Tokens))
		}
	}
	prompt := []int{engine.BOS, 'h', 'e', 'l', 'l', 'o'}
	p.start(prompt, 2)
	want := []string{
		"handoff.SendPlan prefill prefill:1 0",
		"handoff.Write transfer prefill:1 0",
		"handoff.Emit decode prefill:1 1",
		"handoff.Emit done prefill:1 2", // the last token and the answer come out of one step
		"handoff.Finish done prefill:1 2",
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("progress at each effect:\n got %q\nwant %q", seen, want)
	}
	for s := StageQueued; s < StageDone; s++ {
		list := &messages.InFlightList{Incarnation: 1, Requests: []messages.InFlight{{Number: 1, ClientID: 1, Tenant: "a",
			Phase: s.String(), Decode: "d:1"}}}
		if err := list.Validate(); err != nil {
			t.Errorf("stage %s is not a phase an InFlight may name: %v", s, err)
		}
	}
}

// TestProgressQueuedForPages: a request waiting for an exhausted pool is
// queued until it gives up.
func TestProgressQueuedForPages(t *testing.T) {
	p := newPair(t, 2, 16) // the prompt needs 2 pages and decoding 1 more
	p.start([]int{engine.BOS, 'a', 'b', 'c', 'd', 'e'}, 3)
	if pr := p.req.Progress(); pr.Stage != StageQueued || pr.Tokens != 0 {
		t.Fatalf("progress of a request waiting for pages: %+v", pr)
	}
}
