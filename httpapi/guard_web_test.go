//go:build !race

// These serve the API on real sockets with api_test.go's servers, whose
// node serves protoactor remote; see api_test.go.

package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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
