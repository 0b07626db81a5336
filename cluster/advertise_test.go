//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC; see node_test.go.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/cluster/membership"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// forwarder is a TCP proxy in front of one address: every connection to
// its own is forwarded to target, byte for byte both ways, as toxiproxy
// forwards without toxics.
type forwarder struct {
	ln     net.Listener
	target string
	conns  atomic.Int64 // connections forwarded
	bytes  atomic.Int64 // bytes forwarded, both ways
}

func startForwarder(t *testing.T, target string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, target: target}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { f.pipe(c) })
		}
	})
	return f
}

func (f *forwarder) addr() string { return f.ln.Addr().String() }

// pipe forwards c to the target until either side closes.
func (f *forwarder) pipe(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", f.target)
	if err != nil {
		return
	}
	defer up.Close()
	f.conns.Add(1)
	done := make(chan struct{}, 2)
	copyTo := func(dst, src net.Conn) {
		n, _ := io.Copy(dst, src)
		f.bytes.Add(n)
		done <- struct{}{}
	}
	go copyTo(up, c)
	go copyTo(c, up)
	<-done // one side closed: close both, which ends the other copy
}

// TestAdvertisedThroughProxies: a decode node that peers reach only through
// forwarders in front of its remote and its data plane (NodeConfig
// Advertise and DataAdvertise) is proven by the prefill node at those
// addresses, its TLS passing through, gets its KV through one and answers
// a client that dials the other.
func TestAdvertisedThroughProxies(t *testing.T) {
	p := startClusterNode(t, actors.RolePrefill)
	listen, dataListen := trusttest.ClosedAddr(t), trusttest.ClosedAddr(t)
	remote, data := startForwarder(t, listen), startForwarder(t, dataListen)
	cfg := DefaultLocalNodeConfig(actors.RoleDecode)
	cfg.Auth = testAuth(t, actors.RoleDecode)
	cfg.Listen, cfg.DataListen = listen, dataListen
	cfg.Advertise, cfg.DataAdvertise = remote.addr(), data.addr()
	cfg.Gossip.JoinAddrs = []string{p.GossipAddr()}
	d, err := StartNode(withModel(t, cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop() })
	if d.Address() != remote.addr() || d.DataAddr() != data.addr() {
		t.Fatalf("decode node at %s, data plane %s; want the forwarders' %s and %s", d.Address(), d.DataAddr(), remote.addr(), data.addr())
	}
	for _, n := range []*Node{p, d} {
		waitFor(t, "membership converges and is verified", time.Minute, func() bool { return aliveCount(n) == 2 && routable(n) })
	}
	for _, m := range p.Members() {
		if m.Meta.Incarnation == d.Incarnation() && (m.Meta.RemoteAddr != remote.addr() || m.Meta.DataAddr != data.addr()) {
			t.Fatalf("prefill sees the decode node at %s and %s, want the forwarders'", m.Meta.RemoteAddr, m.Meta.DataAddr)
		}
	}
	remoteBefore, dataBefore := remote.bytes.Load(), data.conns.Load()
	c := tenantClient(t, d.Address(), "acme")
	const prompt = "a prompt whose KV goes through a proxy, long enough for two pages"
	res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 6}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := withModel(t, cfg).Model.Answer(prompt, 6); fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
		t.Fatalf("answer %v, reference %v", res.Tokens, want)
	}
	if remote.bytes.Load() == remoteBefore || data.conns.Load() == dataBefore {
		t.Fatalf("the request went around the forwarders: remote %d→%d bytes, data plane %d→%d connections",
			remoteBefore, remote.bytes.Load(), dataBefore, data.conns.Load())
	}
	if s := d.status(); s.Node.Address != remote.addr() || s.Node.DataPlane != data.addr() {
		t.Fatalf("status says %s and %s, want the advertised addresses", s.Node.Address, s.Node.DataPlane)
	}
	freeEverywhere(t, p, d)
}

func TestAdvertisedAddressesValidated(t *testing.T) {
	for _, tc := range []struct {
		role          actors.Role
		remote, data  string
		wantMetaError bool
	}{
		{actors.RoleDecode, "0.0.0.0:7070", "", true},
		{actors.RoleDecode, "proxy:0", "", true},
		{actors.RoleDecode, "proxy", "", true},
		{actors.RoleDecode, "", "[::]:7071", true},
		{actors.RoleDecode, "", "proxy host:7071", true},
		{actors.RolePrefill, "", "proxy:7071", false},
		{actors.RoleRouter, "", "proxy:7071", false},
	} {
		cfg := DefaultLocalNodeConfig(tc.role)
		cfg.Advertise, cfg.DataAdvertise = tc.remote, tc.data
		err := cfg.Validate()
		if err == nil {
			t.Errorf("%s node advertising %q and %q: accepted", tc.role, tc.remote, tc.data)
			continue
		}
		if errors.Is(err, membership.ErrMetaInvalid) != tc.wantMetaError {
			t.Errorf("%s node advertising %q and %q: %v", tc.role, tc.remote, tc.data, err)
		}
	}
	cfg := DefaultLocalNodeConfig(actors.RoleAll)
	cfg.Advertise, cfg.DataAdvertise = "proxy.internal:7070", "10.0.0.9:7071"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("valid advertised addresses refused: %v", err)
	}
}
