package bench

import (
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestSeparateByHand: AUCs worked out pair by pair.
func TestSeparateByHand(t *testing.T) {
	for _, tc := range []struct {
		hits, misses []time.Duration
		want         float64
	}{
		{[]time.Duration{1, 2}, []time.Duration{3, 4}, 1},
		{[]time.Duration{3, 4}, []time.Duration{1, 2}, 0},
		{[]time.Duration{1, 3}, []time.Duration{2, 4}, 0.75}, // 1<2, 1<4, 3>2, 3<4
		{[]time.Duration{2, 2}, []time.Duration{2, 2}, 0.5},  // all ties
		{[]time.Duration{1, 2}, []time.Duration{2}, 0.75},    // 1<2, a tie
	} {
		s := Separate(tc.hits, tc.misses)
		if math.Abs(s.AUC-tc.want) > 1e-12 || s.Hits != len(tc.hits) || s.Misses != len(tc.misses) {
			t.Errorf("Separate(%v, %v) = %+v, want AUC %g", tc.hits, tc.misses, s, tc.want)
		}
		if !(s.Low <= s.AUC && s.AUC <= s.High && s.Low >= 0 && s.High <= 1) {
			t.Errorf("Separate(%v, %v): interval [%g, %g] does not hold AUC %g within [0, 1]", tc.hits, tc.misses, s.Low, s.High, s.AUC)
		}
	}
	if s := Separate(nil, []time.Duration{1}); !math.IsNaN(s.AUC) {
		t.Errorf("no hits: AUC %g, want NaN", s.AUC)
	}
	// 100 against 100: chance's interval is 0.5 ± 1.96 √(201 / 120000).
	s := Separate(make([]time.Duration, 100), make([]time.Duration, 100))
	if half := 1.959963984540054 * math.Sqrt(201.0/120000); math.Abs(s.ChanceHigh-0.5-half) > 1e-12 || math.Abs(0.5-s.ChanceLow-half) > 1e-12 {
		t.Errorf("chance interval [%g, %g], want 0.5 ± %g", s.ChanceLow, s.ChanceHigh, half)
	}
}

// TestSeparateCountsPairs: the AUC from ranks equals the share of (hit,
// miss) pairs in which the miss took longer, ties counting half, counted
// pair by pair.
func TestSeparateCountsPairs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		gen := rapid.SliceOfN(rapid.Int64Range(0, 12), 1, 30)
		hits, misses := durations(gen.Draw(t, "hits")), durations(gen.Draw(t, "misses"))
		pairs := 0.0
		for _, h := range hits {
			for _, m := range misses {
				switch {
				case m > h:
					pairs++
				case m == h:
					pairs += 0.5
				}
			}
		}
		want := pairs / float64(len(hits)*len(misses))
		if got := Separate(hits, misses).AUC; math.Abs(got-want) > 1e-9 {
			t.Fatalf("AUC %g, counted pair by pair %g", got, want)
		}
	})
}

func durations(ns []int64) []time.Duration {
	out := make([]time.Duration, len(ns))
	for i, n := range ns {
		out[i] = time.Duration(n)
	}
	return out
}
