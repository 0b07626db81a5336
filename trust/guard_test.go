package trust

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
)

// A reply to the anonymous sender this process's messages were given is
// dropped from its batch; the batch's other messages get through, and any
// other $-id is still refused.
func TestGuardDropsRepliesToTheAnonymousSender(t *testing.T) {
	g := &guardedStream{pol: RemotePolicy{Self: "10.0.0.1:7070", Types: []string{"m"}}, addr: "10.0.0.2:7070"}
	batch := func(id string) *remote.MessageBatch {
		return &remote.MessageBatch{TypeNames: []string{"m"},
			Targets:   []*actor.PID{{Address: g.pol.Self, Id: "admission"}, {Address: g.pol.Self, Id: id}},
			Envelopes: []*remote.MessageEnvelope{{Target: 1}, {Target: 0}, {Target: 1}}}
	}
	b := batch(AnonymousSender)
	if why := g.checkBatch(b); why != "" {
		t.Fatalf("a batch with replies to %s refused: %s", AnonymousSender, why)
	}
	if len(b.Envelopes) != 1 || b.Envelopes[0].Target != 0 {
		t.Fatalf("envelopes left: %+v, want the one to admission", b.Envelopes)
	}
	if why := g.checkBatch(batch("$7")); why == "" {
		t.Fatal("a batch to $7 was let through")
	}
}
