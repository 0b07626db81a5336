package live

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testnet"
)

// netTimeout bounds each exchange through the proxy; it is only reached
// when something is broken.
const netTimeout = 10 * time.Second

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, netTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echo sends a ping through c and reads it back.
func echo(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(netTimeout))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	var b [4]byte
	_, err := io.ReadFull(c, b[:])
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A real toxiproxy in front of an echo server: a reset fault breaks the
// connections that carry bytes, a partition closes those across it when
// it heals, and each heal leaves the proxy as it was.
func TestNetworkResetAndPartition(t *testing.T) {
	n := NewNetwork()
	t.Cleanup(n.Close)
	addr, err := n.Proxy("decode-0", "remote", "127.0.0.1:0", testnet.Echo(t))
	if err != nil {
		t.Fatal(err)
	}
	before := dial(t, addr)
	if err := echo(before); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	heal, err := n.Apply(Fault{Seq: 1, Kind: Reset, Target: "decode-0"})
	if err != nil {
		t.Fatal(err)
	}
	for what, c := range map[string]net.Conn{"a connection from before": before, "a new connection": dial(t, addr)} {
		if err := echo(c); err == nil || isTimeout(err) {
			t.Errorf("%s during a reset fault: %v, want the connection reset", what, err)
		}
	}
	if err := heal(); err != nil {
		t.Fatal(err)
	}
	if err := echo(dial(t, addr)); err != nil {
		t.Fatalf("after the reset healed: %v", err)
	}

	cut := dial(t, addr)
	if err := echo(cut); err != nil {
		t.Fatal(err)
	}
	heal, err = n.Apply(Fault{Seq: 2, Kind: Partition, Target: "decode-0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cut.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	if err := heal(); err != nil {
		t.Fatal(err)
	}
	_ = cut.SetReadDeadline(time.Now().Add(netTimeout))
	var b [4]byte
	if _, err := io.ReadFull(cut, b[:]); err == nil || isTimeout(err) {
		t.Errorf("a connection across the cut, once healed: read %q, %v; want it closed", b, err)
	}
	if err := echo(dial(t, addr)); err != nil {
		t.Fatalf("after the partition healed: %v", err)
	}

	if _, err := n.Apply(Fault{Kind: Latency, Target: "nobody"}); err == nil {
		t.Error("a fault on a node without a proxy was applied")
	}
	if _, err := n.Apply(Fault{Kind: Kill, Target: "decode-0"}); err == nil {
		t.Error("a kill was applied as a network fault")
	}
}
