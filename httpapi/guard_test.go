package httpapi

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func key(s string) netip.Prefix { return clientKey(netip.MustParseAddr(s)) }

func TestClientKey(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"192.0.2.7", "::ffff:192.0.2.7"},           // one IPv4 client, however spelt
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9"}, // one /64
	} {
		if key(tc.a) != key(tc.b) {
			t.Errorf("%s and %s are counted apart (%s, %s)", tc.a, tc.b, key(tc.a), key(tc.b))
		}
	}
	for _, tc := range []struct{ a, b string }{{"192.0.2.7", "192.0.2.8"}, {"2001:db8:1:2::1", "2001:db8:1:3::1"}} {
		if key(tc.a) == key(tc.b) {
			t.Errorf("%s and %s are counted as one client (%s)", tc.a, tc.b, key(tc.a))
		}
	}
}

// TestConnCounts: past the bound in all or of one client, a connection is
// refused and counted nowhere; each release gives its count back, and a
// client holding none is forgotten.
func TestConnCounts(t *testing.T) {
	c := newConnCounts(3, 2)
	a, b, d := key("10.0.0.1"), key("10.0.0.2"), key("10.0.0.3")
	for i, step := range []struct {
		k    netip.Prefix
		want string
	}{{a, ""}, {a, ""}, {a, BoundConnsPerAddrMax}, {b, ""}, {d, BoundConnsMax}, {b, BoundConnsMax}} {
		if got := c.admit(step.k); got != step.want {
			t.Fatalf("step %d, client %s: refused by %q, want %q", i, step.k, got, step.want)
		}
	}
	c.release(a)
	if got := c.admit(d); got != "" {
		t.Fatalf("after a release, a new client is refused by %q", got)
	}
	for _, k := range []netip.Prefix{a, b, d} {
		c.release(k)
	}
	if c.total != 0 || len(c.byClient) != 0 {
		t.Fatalf("every connection released: %d held, %d clients remembered", c.total, len(c.byClient))
	}
}

// TestAuthFailures: a client's failures past max in a window throttle it
// for the penalty, counted down; a window that ends forgets the count; a
// full table throttles no client it does not know until one of it
// expires.
func TestAuthFailures(t *testing.T) {
	l := DefaultLimits()
	l.AuthFailuresMax, l.AuthFailureWindow, l.AuthPenalty, l.AuthAddrsMax = 2, 10*time.Second, time.Minute, 2
	a := newAuthFailures(l)
	t0 := time.Unix(1000, 0)
	x, y, z := key("10.0.0.1"), key("10.0.0.2"), key("10.0.0.3")
	fail := func(k netip.Prefix, at time.Duration) time.Duration {
		wait, _ := a.fail(k, t0.Add(at))
		return wait
	}
	for i, at := range []time.Duration{0, time.Second} {
		if wait := fail(x, at); wait != 0 {
			t.Fatalf("failure %d of a client allowed 2: throttled for %s", i+1, wait)
		}
	}
	if wait, began := a.fail(x, t0.Add(2*time.Second)); wait != time.Minute || !began {
		t.Fatalf("failure 3: throttled for %s (began %v), want 1m0s", wait, began)
	}
	if wait := fail(x, 32*time.Second); wait != 30*time.Second {
		t.Fatalf("30 s into the penalty: throttled for %s, want 30s", wait)
	}
	if wait := fail(x, 62*time.Second); wait != 0 {
		t.Fatalf("after the penalty: throttled for %s", wait)
	}
	// Two failures in each of two windows never reach the third.
	for i, at := range []time.Duration{0, 9 * time.Second, 10 * time.Second, 19 * time.Second} {
		if wait := fail(y, at); wait != 0 {
			t.Fatalf("failure %d of y, two a window: throttled for %s", i+1, wait)
		}
	}
	// The table holds x and y: z is not remembered, so never throttled.
	for i := range 5 {
		if wait := fail(z, 15*time.Second); wait != 0 {
			t.Fatalf("failure %d of a client the full table does not hold: throttled for %s", i+1, wait)
		}
	}
	if len(a.byClient) != 2 {
		t.Fatalf("a table of at most 2 holds %d", len(a.byClient))
	}
	// y's window ended at 20 s (it began at 10 s): z takes its place.
	for i := range 3 {
		if wait := fail(z, 20*time.Second); (wait != 0) != (i == 2) {
			t.Fatalf("failure %d of z once y expired: throttled for %s", i+1, wait)
		}
	}
}

func TestStrangerBoundsValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Limits)
		want string
	}{
		{func(l *Limits) { l.ConnsMax = 0 }, "ConnsMax (0)"},
		{func(l *Limits) { l.ConnsPerAddrMax = l.ConnsMax + 1 }, "ConnsPerAddrMax (2049) must be 1 to ConnsMax (2048)"},
		{func(l *Limits) { l.DescriptorsReserved = 10 }, "DescriptorsReserved (10)"},
		{func(l *Limits) { l.AuthFailuresMax = 0 }, "AuthFailuresMax (0)"},
		{func(l *Limits) { l.AuthFailureWindow = 0 }, "AuthFailureWindow (0s)"},
		{func(l *Limits) { l.AuthPenalty = 48 * time.Hour }, "AuthPenalty (48h0m0s)"},
		{func(l *Limits) { l.AuthAddrsMax = 0 }, "AuthAddrsMax (0)"},
	} {
		l := DefaultLimits()
		tc.edit(&l)
		if err := l.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	l := DefaultLimits()
	if err := l.FitOpenFiles(4096); err != nil {
		t.Fatalf("the defaults do not fit 4096 open files: %v", err)
	}
	var e *OpenFilesError
	if err := l.FitOpenFiles(1024); !errors.As(err, &e) || e.Need != 2048+2+1024 || e.Limit != 1024 ||
		!strings.Contains(err.Error(), "need 3074 file descriptors, over the process's limit of 1024") {
		t.Fatalf("the defaults against 1024 open files: %v", err)
	}
	if err := l.FitOpenFiles(0); err != nil {
		t.Fatalf("an unknown limit: %v", err)
	}
}
