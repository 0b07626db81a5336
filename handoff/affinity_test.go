package handoff

import (
	"testing"

	"github.com/kvwarden/kvwarden/kv"
)

// keyChain is n keys of one prompt's pages in the scope of tenant.
func keyChain(t testing.TB, tenant string, n int) []kv.PrefixKey {
	g := kv.Geometry{DType: kv.F32, Layers: 1, KVHeads: 1, HeadDim: 4, PageTokens: 2}
	root, err := kv.PrefixRoot(kv.TenantScope(tenant), "model", g)
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int, 2*n+1)
	for i := range prompt {
		prompt[i] = i
	}
	return kv.PrefixKeys(root, prompt, 2)
}

// TestAffinityRemembersRunsPerNode: a node is thought to hold the keys
// routed to it, counted as the run from the first; another scope's keys
// of the same tokens are not held; a lost node is forgotten; each key
// remembers its last AffinityNodesMax nodes.
func TestAffinityRemembersRunsPerNode(t *testing.T) {
	a := NewPrefixAffinity()
	acme, globex := keyChain(t, "acme", 4), keyChain(t, "globex", 4)
	a.Routed(acme[:3], 1)
	a.Routed(acme, 2)
	if h1, h2, h3 := a.Hits(acme, 1), a.Hits(acme, 2), a.Hits(acme, 3); h1 != 3 || h2 != 4 || h3 != 0 {
		t.Fatalf("hits %d, %d, %d, want 3, 4, 0", h1, h2, h3)
	}
	if h := a.Hits(globex, 2); h != 0 {
		t.Fatalf("another tenant's keys of the same tokens: %d hits on node 2", h)
	}
	if h := a.Hits(acme[1:], 2); h != 3 {
		t.Fatalf("a run starting at the second key: %d hits, want 3", h)
	}
	a.Forget(2)
	if h1, h2, n := a.Hits(acme, 1), a.Hits(acme, 2), a.Len(); h1 != 3 || h2 != 0 || n != 3 {
		t.Fatalf("after node 2 was lost: hits %d and %d, %d keys, want 3, 0 and 3", h1, h2, n)
	}
	for inc := uint64(10); inc < 10+AffinityNodesMax+1; inc++ {
		a.Routed(acme[:1], inc)
	}
	if h := a.Hits(acme[:1], 10); h != 0 {
		t.Errorf("the first of %d nodes routed one key is still remembered", AffinityNodesMax+1)
	}
	if h := a.Hits(acme[:1], 10+AffinityNodesMax); h != 1 {
		t.Errorf("the last node routed a key is not remembered")
	}
}

// TestAffinityIsBounded: past AffinityKeysMax keys the least recently
// routed are forgotten first.
func TestAffinityIsBounded(t *testing.T) {
	a := NewPrefixAffinity()
	old := keyChain(t, "old", 1)
	a.Routed(old, 1)
	keys := make([]kv.PrefixKey, AffinityKeysMax)
	for i := range keys {
		keys[i][0], keys[i][1], keys[i][2] = byte(i), byte(i>>8), byte(i>>16)
	}
	a.Routed(keys, 2)
	if a.Len() != AffinityKeysMax || a.Hits(old, 1) != 0 || a.Hits(keys, 2) != len(keys) {
		t.Fatalf("%d keys remembered, the oldest held %d, the newest %d of %d", a.Len(), a.Hits(old, 1), a.Hits(keys, 2), len(keys))
	}
}

// TestAffinityTakesPublishedSummaries: a holder's own summary counts as
// held beside what was routed to it, replaces its previous summary, and
// goes when the holder is forgotten.
func TestAffinityTakesPublishedSummaries(t *testing.T) {
	a := NewPrefixAffinity()
	acme := keyChain(t, "acme", 4)
	a.Published(1, acme[:2])
	a.Routed(acme[:1], 2)
	if h1, h2 := a.Hits(acme, 1), a.Hits(acme, 2); h1 != 2 || h2 != 1 {
		t.Fatalf("hits %d and %d, want 2 (published) and 1 (routed)", h1, h2)
	}
	a.Routed(acme[2:3], 1)
	if h := a.Hits(acme, 1); h != 3 {
		t.Fatalf("published and routed together: %d hits, want 3", h)
	}
	a.Published(1, acme[1:2])
	if h := a.Hits(acme, 1); h != 0 {
		t.Fatalf("a new summary without the first page: %d hits, want 0", h)
	}
	a.Published(1, acme)
	a.Forget(1)
	if h := a.Hits(acme, 1); h != 0 {
		t.Fatalf("a forgotten holder: %d hits", h)
	}
	many := make([]kv.PrefixKey, AffinitySummaryKeysMax+1)
	for i := range many {
		many[i][0], many[i][1] = byte(i), byte(i>>8)
	}
	a.Published(3, many)
	if h := a.Hits(many[len(many)-1:], 3); h != 0 || a.Hits(many[:1], 3) != 1 {
		t.Fatalf("a summary past %d keys kept its last key", AffinitySummaryKeysMax)
	}
}
