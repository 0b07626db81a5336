// Package trusttest makes throwaway cluster credentials for tests: a CA in
// memory and an Authority for any identity it issues.
package trusttest

import (
	"crypto/tls"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvwarden/kvwarden/internal/testnet"
	"github.com/kvwarden/kvwarden/trust"
)

// Cluster is the cluster name of every CA made here.
const Cluster = "test"

// CA is a test cluster's CA with its gossip key.
type CA struct {
	*trust.CA
	Gossip [][]byte
}

// New makes a CA valid for a day.
func New(t testing.TB) *CA {
	t.Helper()
	ca, err := trust.NewCA(Cluster, 24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	k, err := trust.NewGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	return &CA{CA: ca, Gossip: [][]byte{k}}
}

// Bundle issues credentials for role/name valid for an hour.
func (ca *CA) Bundle(t testing.TB, role trust.Role, name string) *trust.Bundle {
	t.Helper()
	b, err := ca.CA.Bundle(trust.Identity{Cluster: ca.Cluster, Role: role, Name: name}, []string{"127.0.0.1"},
		time.Hour, time.Now(), ca.Gossip)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Authority is an authority holding fresh credentials for role/name; log
// may be nil.
func (ca *CA) Authority(t testing.TB, role trust.Role, name string, log *slog.Logger) *trust.Authority {
	t.Helper()
	a, err := trust.New(ca.Bundle(t, role, name), trust.DefaultConfig(), log)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Shared is one CA for every test of a package that needs no CA of its
// own (made once, on first use).
func Shared(t testing.TB) *CA {
	t.Helper()
	shared.once.Do(func() { shared.ca = New(t) })
	return shared.ca
}

var shared struct {
	once sync.Once
	ca   *CA
}

// ServeTLS serves b's certificate over TLS on a loopback port until the
// test ends, as a node's remote and data plane do: it completes each
// handshake and hangs up. It returns the address.
func ServeTLS(t testing.TB, b *trust.Bundle) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", b.ServerTLS())
	if err != nil {
		t.Fatal(err)
	}
	return testnet.Serve(t, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_ = c.(*tls.Conn).Handshake()
	})
}

// ServeRemote serves on listen (host:port; port 0 picks one) what a
// node's protoactor remote serves for its run incarnation: gRPC under
// a.ServerOptions, with no service, which answers the run challenge with
// incarnation (trust.RunProto) and completes gRPC's handshake for anyone
// else. It returns the address and a stop that closes it, as a killed
// process's sockets are (also called at the end of the test).
func ServeRemote(t testing.TB, a *trust.Authority, listen string, incarnation uint64) (string, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(a.ServerOptions(trust.RemotePolicy{Self: ln.Addr().String(), RecvBytesMax: 1 << 20,
		Incarnation: incarnation})...)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), srv.Stop
}

// ClosedAddr is a loopback address where nothing listens.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
