package actors

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// TestDispatchFollowsThePrefixCache: with prefix caches, a plan goes to
// the worker an earlier plan of its prefix (in its scope) went to, while
// that worker has at most handoff.AffinityImbalanceMax more plans
// outstanding than the least loaded; otherwise, or with no earlier plan
// of its prefix, to the least loaded.
func TestDispatchFollowsThePrefixCache(t *testing.T) {
	g := kv.Geometry{DType: kv.F32, Layers: 1, KVHeads: 1, HeadDim: 4, PageTokens: 2}
	keysOf := func(m *messages.TransferPlan) []kv.PrefixKey {
		prompt := make([]int, len(m.PromptTokens))
		for i, tok := range m.PromptTokens {
			prompt[i] = int(tok)
		}
		keys, err := handoff.PromptKeys(kv.TenantScope(m.Tenant), "model", g, prompt)
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	d := &dispatchActor{workers: []*actor.PID{{Id: "w0"}, {Id: "w1"}, {Id: "w2"}}, load: []int{0, 0, 0},
		keysOf: keysOf, affinity: handoff.NewPrefixAffinity()}
	plan := func(tenant string, tokens ...uint32) *messages.TransferPlan {
		return &messages.TransferPlan{Tenant: tenant, PromptTokens: tokens}
	}
	d.load = []int{1, 0, 3}
	if w := d.pick(plan("acme", 1, 2, 3, 4, 5)); w != 1 {
		t.Fatalf("a first plan went to worker %d, want the least loaded, 1", w)
	}
	d.load = []int{0, 2, 1}
	if w := d.pick(plan("acme", 1, 2, 3, 4, 9, 9)); w != 1 {
		t.Fatalf("a plan of the same prefix went to worker %d, want 1, which holds it", w)
	}
	if w := d.pick(plan("globex", 1, 2, 3, 4, 5)); w != 0 {
		t.Fatalf("another tenant's plan of the same tokens went to worker %d, want the least loaded, 0", w)
	}
	d.load = []int{0, handoff.AffinityImbalanceMax + 1, 1}
	if w := d.pick(plan("acme", 1, 2, 3, 4, 5)); w != 0 {
		t.Fatalf("a plan went to worker %d, whose prefix holder has %d more plans out, want the least loaded, 0", w, handoff.AffinityImbalanceMax+1)
	}
	d.keysOf = nil
	d.load = []int{0, 0, 0}
	if w := d.pick(plan("acme", 1, 2, 3, 4, 5)); w != 0 {
		t.Fatalf("without caches a plan went to worker %d, want the least loaded, 0", w)
	}
}
