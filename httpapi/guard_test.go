package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/trust"
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

// refusedBy is w's kvwarden_http_refusals_total of bound.
func refusedBy(w *Web, bound string) float64 {
	var m dto.Metric
	if err := w.guard.refused.WithLabelValues(bound).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// refusals records what a Refuser is given.
type refusals struct {
	mu    sync.Mutex
	kinds []trust.Refusal
}

func (r *refusals) Refuse(k trust.Refusal, _ string, _ ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kinds = append(r.kinds, k)
}

func (r *refusals) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.kinds {
		if k != trust.RefusedHTTP {
			panic(fmt.Sprintf("refused as %s, want %s", k, trust.RefusedHTTP))
		}
	}
	return len(r.kinds)
}

// refused checks that the server closes a connection from from
// unanswered: reset as it connects, or closed before it answers.
func refused(t *testing.T, from, addr, what string) {
	t.Helper()
	c, err := dialFrom(from, addr)
	if err != nil {
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%s: %v, want the connection reset or closed unanswered", what, err)
		}
		return
	}
	defer c.Close()
	status, err := healthz(c)
	var ne net.Error
	if status != "" || err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("%s: answered %q, %v; want the connection closed unanswered", what, status, err)
	}
}

// dialFrom connects to addr from the loopback address from.
func dialFrom(from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: time.Minute}
	return d.Dial("tcp", addr)
}

// admitted is a connection from from, which the server must admit: it
// is served, and kept open until the test ends.
func admitted(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	c, err := dialFrom(from, addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	t.Cleanup(func() { c.Close() })
	if status, err := healthz(c); err != nil || status != "HTTP/1.1 200 OK" {
		t.Fatalf("GET /healthz on a connection from %s that should be admitted: %q, %v", from, status, err)
	}
	return c
}

// TestGuardedListener: over real sockets, a client's connection past its
// bound, and any past the bound in all, is closed unanswered and counted
// by bound in the metric and by the node's Refuser; the others are
// served; a closed connection makes room.
func TestGuardedListener(t *testing.T) {
	l := DefaultLimits()
	l.ConnsMax, l.ConnsPerAddrMax = 3, 2
	r := &refusals{}
	w, err := NewWeb(struct{ Node }{}, nil, l, r)
	if err != nil {
		t.Fatal(err)
	}
	addr := startWeb(t, w).Listener.Addr().String()
	a1 := admitted(t, "127.0.0.1", addr)
	admitted(t, "127.0.0.1", addr)
	refused(t, "127.0.0.1", addr, "a third connection of 127.0.0.1")
	admitted(t, "127.0.0.2", addr)
	refused(t, "127.0.0.3", addr, "a fourth connection in all")
	a1.Close()
	// The server learns of a1's end when it reads it: until then a
	// connection of 127.0.0.3 is refused, and counted, as before.
	testwait.Report(t, "a connection of 127.0.0.3 served once a1 is closed", time.Minute, func() (bool, string) {
		c, err := dialFrom("127.0.0.3", addr)
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		status, err := healthz(c)
		return err == nil && status == "HTTP/1.1 200 OK", fmt.Sprintf("%q, %v", status, err)
	})
	for bound, want := range map[string]float64{BoundConnsPerAddrMax: 1, BoundConnsMax: 1, BoundAuthFailuresMax: 0} {
		if got := refusedBy(w, bound); got < want {
			t.Errorf("kvwarden_http_refusals_total{bound=%q} = %g, want at least %g", bound, got, want)
		}
	}
	if r.count() < 2 {
		t.Errorf("the node's Refuser was given %d refusals, want at least 2", r.count())
	}
}

// healthz sends GET /healthz on c and returns the status line of the
// answer.
func healthz(c net.Conn) (string, error) {
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return "", err
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	status, _, _ := strings.Cut(string(buf[:n]), "\r\n")
	return status, err
}

// TestBadKeysAnswered429: past AuthFailuresMax requests without an
// accepted key, a client's next are answered 429 with Retry-After and
// counted; an accepted key from the same address is still served, and
// another address is still answered 401.
func TestBadKeysAnswered429(t *testing.T) {
	m := modeltest.Builtin(t, engine.DefaultModelConfig())
	keys, err := LoadKeys(writeKeys(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	l := DefaultLimits()
	l.AuthFailuresMax, l.AuthPenalty = 3, time.Hour
	r := &refusals{}
	node := actors.DefaultConfig()
	api := &APIConfig{Model: m, Generator: failingGenerator{text: []string{"ok"}}, Keys: keys, Node: node.Limits()}
	w, err := NewWeb(struct{ Node }{}, api, l, r)
	if err != nil {
		t.Fatal(err)
	}
	base := startWeb(t, w).URL
	const body = `{"model":"builtin","prompt":"hi","max_tokens":1}`
	for i, key := range []string{"", "kvw-wrong", "kvw-wrong"} {
		if status, _, e := post(t, base+"/v1/completions", key, body); status != http.StatusUnauthorized {
			t.Fatalf("failure %d of 3 allowed: %d %+v, want 401", i+1, status, e)
		}
	}
	for i := range 2 {
		status, retry, e := post(t, base+"/v1/completions", "kvw-wrong", body)
		if status != http.StatusTooManyRequests || retry != "3600" || e.Code != "auth_failures_limit" || e.Type != "rate_limit_error" {
			t.Fatalf("failure %d past the bound: %d, Retry-After %q, %+v; want 429, 3600, auth_failures_limit", 4+i, status, retry, e)
		}
	}
	if status, _, e := post(t, base+"/v1/completions", keyAcme, body); status != http.StatusOK {
		t.Fatalf("an accepted key from the throttled address: %d %+v, want 200", status, e)
	}
	other := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/models", nil)
	res, err := other.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	other.CloseIdleConnections()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no key from another address: %d, want 401", res.StatusCode)
	}
	if got := refusedBy(w, BoundAuthFailuresMax); got != 2 {
		t.Errorf("kvwarden_http_refusals_total{bound=auth_failures_max} = %g, want 2", got)
	}
	if r.count() != 2 {
		t.Errorf("the node's Refuser was given %d refusals, want 2", r.count())
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
