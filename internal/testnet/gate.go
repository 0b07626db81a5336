// Package testnet holds network devices for tests that run real nodes on
// loopback.
package testnet

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Gate is a TCP proxy in front of one address that a test can shut: while
// open it forwards each connection to its target byte for byte, both ways;
// shut, it cuts the connections it forwards and holds every new one open
// with nothing forwarded, as a node that hangs without closing its port
// looks to its peers. A node advertised at the gate's address (node run
// --advertise) keeps gossiping directly, so its peers still see it alive
// while nothing they send it arrives. A new gate is shut.
type Gate struct {
	ln net.Listener

	mu     sync.Mutex
	target string // "" while shut
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// NewGate listens on a free port of 127.0.0.1 until the test ends.
func NewGate(t testing.TB) *Gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &Gate{ln: ln, conns: map[net.Conn]bool{}}
	g.wg.Go(g.accept)
	t.Cleanup(g.close)
	return g
}

// Addr is where the gate listens.
func (g *Gate) Addr() string { return g.ln.Addr().String() }

// Open forwards the connections that come from now on to target.
func (g *Gate) Open(target string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.target = target
}

// Held is how many connections the gate holds, taken while it was shut,
// with nothing forwarded: a test waits for a peer's dial to be held.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, forwarded := range g.conns {
		if !forwarded {
			n++
		}
	}
	return n
}

// Shut cuts every connection forwarded so far and holds the ones that
// come from now on.
func (g *Gate) Shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.target = ""
	for c, forwarded := range g.conns {
		if forwarded {
			c.Close()
			delete(g.conns, c)
		}
	}
}

func (g *Gate) accept() {
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		target := g.target
		g.conns[c] = target != ""
		g.mu.Unlock()
		if target != "" {
			g.wg.Go(func() { g.forward(c, target) })
		}
	}
}

// forward pipes c to target until either side closes.
func (g *Gate) forward(c net.Conn, target string) {
	defer func() {
		c.Close()
		g.mu.Lock()
		delete(g.conns, c)
		g.mu.Unlock()
	}()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done // one side closed: the deferred closes end the other copy
}

// close stops listening and closes every connection, held or forwarded.
func (g *Gate) close() {
	g.ln.Close()
	g.mu.Lock()
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}
