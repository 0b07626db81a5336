package cluster

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"

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

// TestPickAffineFollowsTheCacheWithinABalance: the node thought to hold
// most of the prompt is chosen while it has at most AffinityImbalanceMax
// more requests outstanding than the least loaded; past that, or with no
// hit, or when it cannot hold the request, load decides as Pick does.
func TestPickAffineFollowsTheCacheWithinABalance(t *testing.T) {
	r := NewRouting(rand.NewPCG(1, 2))
	cs := []Candidate{{Incarnation: 1, CapacityPages: 64, FreePages: 64}, {Incarnation: 2, CapacityPages: 64, FreePages: 64},
		{Incarnation: 3, CapacityPages: 64, FreePages: 64}}
	for range AffinityImbalanceMax {
		r.Sent(2, 1)
	}
	if i, ok := r.PickAffine(cs, 8, nil, []int{1, 3, 0}); !ok || i != 1 {
		t.Fatalf("picked %d (%t), want node 2, which holds the most", i, ok)
	}
	r.Sent(2, 1)
	if i, _ := r.PickAffine(cs, 8, nil, []int{1, 3, 0}); i == 1 {
		t.Fatalf("picked node 2 with %d more requests than the others", AffinityImbalanceMax+1)
	}
	if i, _ := r.PickAffine(cs, 8, map[uint64]bool{1: true}, []int{1, 0, 0}); i == 0 {
		t.Fatal("picked an excluded node")
	}
	full := slices.Clone(cs)
	full[0].FreePages = 2
	if i, _ := r.PickAffine(full, 8, nil, []int{5, 0, 0}); i == 0 {
		t.Fatal("picked the holder that cannot hold the request while others can")
	}
}

// TestPickAffineWithoutHitsIsPick: with no hit anywhere PickAffine
// chooses as Pick, from the same random draws.
func TestPickAffineWithoutHitsIsPick(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.Uint64().Draw(t, "seed")
		a, b := NewRouting(rand.NewPCG(seed, 0)), NewRouting(rand.NewPCG(seed, 0))
		cs := candidatesOf(t, a)
		b.out = maps.Clone(a.out)
		pages := rapid.IntRange(1, 64).Draw(t, "pages")
		i, ok := a.PickAffine(cs, pages, nil, make([]int, len(cs)))
		j, ok2 := b.Pick(cs, pages, nil)
		if i != j || ok != ok2 {
			t.Fatalf("PickAffine chose %d (%t), Pick %d (%t)", i, ok, j, ok2)
		}
	})
}
