package actors

import (
	"testing"

	"github.com/kvwarden/kvwarden/messages"
)

// TestInFlightListBounded: a list holds the oldest requests, at most as
// many as asked and never more than a list carries, and counts the rest.
func TestInFlightListBounded(t *testing.T) {
	many := make([]messages.InFlight, messages.InFlightListMax+44)
	for i := range many {
		many[i] = messages.InFlight{Number: uint64(i + 1), ClientID: 1, Tenant: "acme", Phase: messages.PhaseDecode,
			Decode: "127.0.0.1:1", AgeMs: uint64(i % 7)}
	}
	for _, tc := range []struct{ limit, listed int }{{0, messages.InFlightListMax}, {messages.InFlightListMax + 1, messages.InFlightListMax}, {3, 3}} {
		l := InFlightList(9, append([]messages.InFlight(nil), many...), tc.limit)
		if len(l.Requests) != tc.listed || int(l.Omitted) != len(many)-tc.listed || l.Validate() != nil {
			t.Fatalf("limit %d: %d listed, %d omitted (%v); want %d and %d", tc.limit, len(l.Requests), l.Omitted, l.Validate(),
				tc.listed, len(many)-tc.listed)
		}
		for i := 1; i < len(l.Requests); i++ {
			a, b := l.Requests[i-1], l.Requests[i]
			if a.AgeMs < b.AgeMs || a.AgeMs == b.AgeMs && a.Number > b.Number {
				t.Fatalf("limit %d: %+v listed before %+v, want the oldest first", tc.limit, a, b)
			}
		}
		if l.Requests[0].AgeMs != 6 {
			t.Fatalf("limit %d: the first listed is %+v, not one of the oldest", tc.limit, l.Requests[0])
		}
	}
}
