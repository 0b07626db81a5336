package client

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestEndpointChoice: round robin over the endpoints not tried and not
// skipped; a failure skips an endpoint for a backoff that doubles up to
// its bound, and it is probed before its next use; a probe that found it
// stands for a while, a connection up until it ends, and ends the backoff.
func TestEndpointChoice(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newEndpointSet([]string{"a:1", "b:1", "c:1"})
	if ch := s.pick(now, nil); ch.index != 0 || !ch.probe {
		t.Fatalf("an endpoint never seen: %+v, want it probed", ch)
	}
	s.probed(0, now, nil)
	for i := range s.eps {
		s.connected(i)
	}
	var order []int
	for range 4 {
		order = append(order, s.pick(now, nil).index)
	}
	if want := []int{1, 2, 0, 1}; !slices.Equal(order, want) {
		t.Fatalf("round robin %v, want %v", order, want)
	}
	if ch := s.pick(now, []int{1, 2, 0}); ch.index != -1 || ch.wait {
		t.Fatalf("every endpoint tried: %+v, want none", ch)
	}

	s.failed(1, now, "its connection ended")
	for range 4 {
		if i := s.pick(now, nil).index; i == 1 {
			t.Fatalf("the failed endpoint was picked within its backoff")
		}
	}
	if d := s.describe(now); !strings.Contains(d, "b:1 (its connection ended; skipped for 250ms more)") {
		t.Errorf("describe: %s", d)
	}
	// Past the backoff it is probed first; a second request meanwhile
	// leaves it to that probe.
	later := now.Add(EndpointBackoffMin)
	ch := s.pick(later, []int{0, 2})
	if ch.index != 1 || !ch.probe {
		t.Fatalf("after the backoff: %+v, want b probed", ch)
	}
	if ch := s.pick(later, []int{0, 2}); ch.index != -1 || !ch.wait {
		t.Fatalf("during its probe: %+v, want wait", ch)
	}
	// A probe that fails doubles the backoff, up to EndpointBackoffMax.
	backoffs := []time.Duration{}
	for range 6 {
		s.probed(1, later, errors.New("connection refused"))
		backoffs = append(backoffs, s.eps[1].downUntil.Sub(later))
		later = s.eps[1].downUntil
		if ch := s.pick(later, []int{0, 2}); ch.index != 1 || !ch.probe {
			t.Fatalf("after the backoff: %+v", ch)
		}
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, EndpointBackoffMax, EndpointBackoffMax}
	if !slices.Equal(backoffs, want) {
		t.Errorf("backoffs %v, want %v", backoffs, want)
	}
	s.probed(1, later, nil)
	if ch := s.pick(later, []int{0, 2}); ch.index != 1 || ch.probe {
		t.Fatalf("after a probe that found it: %+v, want b without a probe", ch)
	}
	if ch := s.pick(later.Add(probeTrust), []int{0, 2}); ch.index != 1 || !ch.probe {
		t.Fatalf("a probe's finding, once it is old, with no connection up: %+v, want b probed", ch)
	}
	s.probed(1, later, nil)
	s.connected(1)
	s.failed(1, later, "again")
	if got := s.eps[1].downUntil.Sub(later); got != EndpointBackoffMin {
		t.Errorf("a failure after a connection skips it for %s, want %s", got, EndpointBackoffMin)
	}
	if s.index("c:1") != 2 || s.index("d:1") != -1 {
		t.Errorf("index: c %d, d %d", s.index("c:1"), s.index("d:1"))
	}
}
