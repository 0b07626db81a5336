package testnet

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testwait"
)

func roundTrip(t *testing.T, c net.Conn, line string) {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != line+"\n" {
		t.Fatalf("echo of %q through the gate: %q, %v", line, got, err)
	}
}

// TestGateForwardsUntilShut: an open gate forwards both ways; shutting it
// cuts the connection it forwards; opened again, it forwards new ones.
func TestGateForwardsUntilShut(t *testing.T) {
	g, target := NewGate(t), Echo(t)
	g.Open(target)
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "through")
	if n := g.Held(); n != 0 {
		t.Fatalf("an open gate holds %d connections", n)
	}
	g.Shut()
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("a forwarded connection read %d bytes after the gate shut", n)
	}
	held, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	testwait.For(t, "the gate holds the connection made while shut", time.Minute, func() bool { return g.Held() == 1 })
	g.Open(target)
	again, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	roundTrip(t, again, "again")
}
