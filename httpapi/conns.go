package httpapi

import (
	"net"
	"net/netip"
	"sync"
)

// The bounds of the HTTP server on strangers, as kvwarden_http_refusals_total
// labels what each refused.
const (
	// BoundConnsMax refused a connection because the server held
	// Limits.ConnsMax.
	BoundConnsMax = "conns_max"
	// BoundConnsPerAddrMax refused a connection because its client address
	// held Limits.ConnsPerAddrMax.
	BoundConnsPerAddrMax = "conns_per_addr_max"
	// BoundAuthFailuresMax answered a bad API key 429: its client address
	// sent more than Limits.AuthFailuresMax in Limits.AuthFailureWindow.
	BoundAuthFailuresMax = "auth_failures_max"
)

// bounds are every value of kvwarden_http_refusals_total's label.
var bounds = []string{BoundConnsMax, BoundConnsPerAddrMax, BoundAuthFailuresMax}

// clientKey is what the per-address bounds count a client by: its IPv4
// address, or the /64 of its IPv6 address, since one IPv6 host is given a
// whole /64 and could otherwise take a fresh address for every connection.
// An address that cannot be read (not TCP) is the zero prefix: all such
// clients share one count.
func clientKey(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p
	}
	p, _ := a.Prefix(a.BitLen())
	return p
}

// connKey is clientKey of a connection's remote address.
func connKey(a net.Addr) netip.Prefix {
	if t, ok := a.(*net.TCPAddr); ok {
		return clientKey(t.AddrPort().Addr())
	}
	return netip.Prefix{}
}

// connCounts is the pure core of the connection bounds: how many
// connections are held, in all and by client. Not safe for concurrent
// use.
type connCounts struct {
	max, perClientMax int
	total             int
	byClient          map[netip.Prefix]int // only clients holding one or more
}

func newConnCounts(max, perClientMax int) *connCounts {
	return &connCounts{max: max, perClientMax: perClientMax, byClient: map[netip.Prefix]int{}}
}

// admit counts a new connection of client k, unless it would take the
// server past a bound; then it counts nothing and returns the bound's
// name. The map holds no more entries than connections held, so it is
// bounded by max.
func (c *connCounts) admit(k netip.Prefix) (refusedBy string) {
	switch {
	case c.total >= c.max:
		return BoundConnsMax
	case c.byClient[k] >= c.perClientMax:
		return BoundConnsPerAddrMax
	}
	c.total++
	c.byClient[k]++
	return ""
}

// release ends a connection admit counted.
func (c *connCounts) release(k netip.Prefix) {
	c.total--
	if c.byClient[k]--; c.byClient[k] <= 0 {
		delete(c.byClient, k)
	}
}

// guardedListener refuses, as they are accepted, the connections the
// guard's bounds do not admit: closed at once, before a byte is read, so
// that each costs a file descriptor for a moment and no goroutine. The
// connections it returns give their count back when closed.
type guardedListener struct {
	net.Listener
	g *guard
}

func (l *guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		k := connKey(c.RemoteAddr())
		l.g.mu.Lock()
		refusedBy := l.g.conns.admit(k)
		l.g.mu.Unlock()
		if refusedBy == "" {
			return &guardedConn{Conn: c, release: func() { l.g.releaseConn(k) }}, nil
		}
		if t, ok := c.(*net.TCPConn); ok {
			// A reset, so that the refused connection leaves no TIME_WAIT
			// behind on this side either.
			_ = t.SetLinger(0)
		}
		c.Close()
		l.g.refuse(refusedBy, "an HTTP connection", "client", c.RemoteAddr().String())
	}
}

// guardedConn is an admitted connection: its first Close gives its count
// back.
type guardedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *guardedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// CloseWrite lets net/http half-close the connection after an error answer
// as it does a bare TCP connection, so that the client reads the answer
// before the reset.
func (c *guardedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
