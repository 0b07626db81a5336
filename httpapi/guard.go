package httpapi

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvwarden/kvwarden/trust"
)

// Refuser counts what a node refused from outside, by kind, and logs it at
// a bounded rate (internal/ratelog): a *trust.Authority, whose counts
// node status prints.
type Refuser interface {
	Refuse(r trust.Refusal, what string, args ...any)
}

// guard bounds what a stranger can make the HTTP server hold before it has
// shown a key: connections, in all and per client (guardedListener), and
// bad keys per client (authFailures). Every refusal is counted by bound in
// kvwarden_http_refusals_total and passed to the node's Refuser as
// trust.RefusedHTTP. Safe for concurrent use.
type guard struct {
	refused *prometheus.CounterVec
	refuser Refuser // nil: counted in the metric alone
	now     func() time.Time

	mu    sync.Mutex
	conns *connCounts
	auth  *authFailures
}

func newGuard(l Limits, reg prometheus.Registerer, refuser Refuser) (*guard, error) {
	g := &guard{refuser: refuser, now: time.Now, conns: newConnCounts(l.ConnsMax, l.ConnsPerAddrMax),
		auth: newAuthFailures(l),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvwarden_http_refusals_total",
			Help: "HTTP connections closed unread and requests answered 429 by a bound on strangers, by the bound: " +
				"conns_max, conns_per_addr_max (connections), auth_failures_max (bad API keys)."}, []string{"bound"}),
	}
	if err := reg.Register(g.refused); err != nil {
		return nil, err
	}
	for _, b := range bounds {
		g.refused.WithLabelValues(b)
	}
	return g, nil
}

// listener is ln with the guard's connection bounds.
func (g *guard) listener(ln net.Listener) net.Listener { return &guardedListener{Listener: ln, g: g} }

func (g *guard) releaseConn(k netip.Prefix) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.conns.release(k)
}

// authFailed counts a failed authentication from remoteAddr (a request's
// RemoteAddr) and returns how long its client is throttled for: 0 when it
// is not, and the failure is answered 401.
func (g *guard) authFailed(remoteAddr string) time.Duration {
	var k netip.Prefix
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		k = clientKey(ap.Addr())
	}
	g.mu.Lock()
	wait, began := g.auth.fail(k, g.now())
	g.mu.Unlock()
	switch {
	case began:
		g.refuse(BoundAuthFailuresMax, "bad API keys: the client is answered 429 for a while", "client", remoteAddr,
			"for", wait)
	case wait > 0:
		g.refuse(BoundAuthFailuresMax, "a bad API key from a throttled client", "client", remoteAddr, "for", wait)
	}
	return wait
}

// refuse counts a refusal by bound and has the node count and log it.
func (g *guard) refuse(bound, what string, args ...any) {
	g.refused.WithLabelValues(bound).Inc()
	if g.refuser != nil {
		g.refuser.Refuse(trust.RefusedHTTP, what, append(args, slog.String("bound", bound))...)
	}
}
