package cluster

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvwarden/kvwarden/handoff"
)

// TestPickAffineFollowsTheCacheWithinABalance: the node thought to hold
// most of the prompt is chosen while it has at most handoff.AffinityImbalanceMax
// more requests outstanding than the least loaded; past that, or with no
// hit, or when it cannot hold the request, load decides as Pick does.
func TestPickAffineFollowsTheCacheWithinABalance(t *testing.T) {
	r := NewRouting(rand.NewPCG(1, 2))
	cs := []Candidate{{Incarnation: 1, CapacityPages: 64, FreePages: 64}, {Incarnation: 2, CapacityPages: 64, FreePages: 64},
		{Incarnation: 3, CapacityPages: 64, FreePages: 64}}
	for range handoff.AffinityImbalanceMax {
		r.Sent(2, 1)
	}
	if i, ok := r.PickAffine(cs, 8, nil, []int{1, 3, 0}); !ok || i != 1 {
		t.Fatalf("picked %d (%t), want node 2, which holds the most", i, ok)
	}
	r.Sent(2, 1)
	if i, _ := r.PickAffine(cs, 8, nil, []int{1, 3, 0}); i == 1 {
		t.Fatalf("picked node 2 with %d more requests than the others", handoff.AffinityImbalanceMax+1)
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
