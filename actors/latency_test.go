package actors

import (
	"slices"
	"testing"
	"time"
)

// TestLatencyBuckets: a duration counts in the first bucket whose bound
// holds it, a bound itself included; past the last bound, in the last.
func TestLatencyBuckets(t *testing.T) {
	var l Latency
	bounds := LatencyBounds()
	if len(l.buckets) != len(bounds)+1 || !slices.IsSorted(bounds) {
		t.Fatalf("%d buckets for %d bounds %v", len(l.buckets), len(bounds), bounds)
	}
	for _, d := range []time.Duration{0, time.Millisecond, time.Millisecond + 1, 3 * time.Second, time.Hour} {
		l.Observe(d)
	}
	s := l.Snapshot()
	want := make([]uint64, len(bounds)+1)
	want[0], want[1], want[11], want[len(bounds)] = 2, 1, 1, 1 // ≤1ms ×2, ≤2.5ms, ≤5s, past a minute
	if !slices.Equal(s.Counts, want) || s.Sum != 2*time.Millisecond+1+3*time.Second+time.Hour {
		t.Fatalf("counts %v sum %s, want %v", s.Counts, s.Sum, want)
	}
	if sum := s.Add(s); sum.Counts[0] != 4 || sum.Sum != 2*s.Sum {
		t.Fatalf("a snapshot added to itself: %+v", sum)
	}
}
