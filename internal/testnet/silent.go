package testnet

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Silent is an address that accepts TCP and never answers, as one a
// hostile peer claims to serve at: it holds every connection without a
// byte until Release (or the end of the test), then closes them.
type Silent struct {
	addr     string
	accepted atomic.Int64
	done     chan struct{}
	once     sync.Once
}

// NewSilent listens on a free port of 127.0.0.1 until the test ends.
func NewSilent(t testing.TB) *Silent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Silent{done: make(chan struct{})}
	t.Cleanup(s.Release)
	s.addr = Serve(t, ln, func(net.Conn) {
		s.accepted.Add(1)
		<-s.done
	})
	return s
}

// Addr is where it listens.
func (s *Silent) Addr() string { return s.addr }

// Accepted is how many connections it has taken.
func (s *Silent) Accepted() int { return int(s.accepted.Load()) }

// Release closes the connections held, and each later one at once.
func (s *Silent) Release() { s.once.Do(func() { close(s.done) }) }
