package dataplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testnet"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// dpNoReply checks that conn, on which a hello was written, gets no hello
// reply: the connection ends (an error, or fewer bytes than a reply).
func dpNoReply(t *testing.T, what string, conn net.Conn) {
	t.Helper()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	h := dpHello{version: dpVersion, incarnation: dpSenderInc, expect: dpReceiverInc, limits: dpTestConfig(t, 1).Batch}
	b := h.encode()
	if _, err := conn.Write(b[:]); err != nil {
		return
	}
	r, err := io.ReadAll(conn)
	if _, derr := decodeDPHello(r, true); derr == nil {
		t.Fatalf("%s: got a hello reply (read error %v)", what, err)
	}
}

// A sender must hold a certificate of this cluster: one from another CA,
// none at all, or no TLS at all fails the handshake, counted as a refused
// certificate, and no hello is read from it.
func TestDataPlaneStrangerCertificate(t *testing.T) {
	ca, foreign := trusttest.New(t), trusttest.New(t)
	cfg := dpSecure(t, dpTestConfig(t, dpReceiverInc), ca, trust.RoleDecode, "d0")
	rec := &dpRecorder{}
	srv := dpListen(t, cfg, rec.handle)
	addr := srv.Addr().String()

	// Through Dial, the stranger refuses the server first (its CA
	// is not the server's), and the server counts the failed handshake.
	stranger := dpSecure(t, dpTestConfig(t, dpSenderInc), foreign, trust.RolePrefill, "p0")
	if _, err := Dial(stranger, addr, dpReceiverInc, cfg.Auth.Self()); err == nil {
		t.Fatal("a sender of another CA connected")
	}
	// Clients that check nothing of the server, to see the server refuse
	// them. In TLS 1.3 a client's handshake completes before the server
	// has checked its certificate; the refusal is the first thing read.
	for _, c := range []struct {
		name  string
		certs []tls.Certificate
	}{
		{"foreign certificate", []tls.Certificate{foreign.Bundle(t, trust.RolePrefill, "p0").Cert}},
		{"no certificate", nil},
	} {
		conn, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: c.certs, InsecureSkipVerify: true})
		if err != nil {
			continue
		}
		dpNoReply(t, c.name, conn)
		conn.Close()
	}
	plain, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	dpNoReply(t, "plain TCP", plain)
	plain.Close()

	testwait.For(t, "4 handshakes failed", eventDeadline, func() bool { return srv.Stats().HandshakesFailed == 4 })
	if n := cfg.Auth.Refused()[trust.RefusedCertificate]; n != 4 {
		t.Fatalf("%d certificate refusals counted, want 4", n)
	}
	if rs := srv.Stats(); rs.ConnectionsAccepted != 0 || rs.RefusedHelloMalformed != 0 || rs.BatchesReceived != 0 {
		t.Fatalf("server stats %+v: a stranger got past the handshake", rs)
	}
	// Still serving the cluster's own.
	snd := dpDial(t, dpSecure(t, dpTestConfig(t, dpSenderInc), ca, trust.RolePrefill, "p0"), srv, dpReceiverInc)
	if err := snd.Send(context.Background(), dpFrames(rand.New(rand.NewPCG(1, 1)), 2, 1, dpReceiverInc)); err != nil {
		t.Fatal(err)
	}
}

// Only a role that holds KV has any to send: prefill, all, and decode (a
// running request's move) are served, and each batch is handed on with the
// sender's identity, which the request it is for checks against the one it
// planned with; any other certificate of the cluster is refused in the
// hello reply, counted. A TLS
// probe of the address (membership's verification) is neither.
func TestDataPlaneSenderRoles(t *testing.T) {
	ca := trusttest.New(t)
	cfg := dpSecure(t, dpTestConfig(t, dpReceiverInc), ca, trust.RoleDecode, "d0")
	rec := &dpRecorder{}
	srv := dpListen(t, cfg, rec.handle)
	rng := rand.New(rand.NewPCG(4, 4))
	forbidden := 0
	for _, tc := range []struct {
		role trust.Role
		ok   bool
	}{
		{trust.RolePrefill, true}, {trust.RoleAll, true}, {trust.RoleDecode, true},
		{trust.RoleRouter, false}, {trust.RoleOperator, false}, {trust.RoleTenant, false},
	} {
		scfg := dpSecure(t, dpTestConfig(t, dpSenderInc), ca, tc.role, "x-"+string(tc.role))
		snd, err := Dial(scfg, srv.Addr().String(), dpReceiverInc, cfg.Auth.Self())
		if !tc.ok {
			forbidden++
			var herr *HelloError
			if !errors.As(err, &herr) || herr.Status != StatusForbidden || herr.Self != scfg.Auth.Self() ||
				!errors.Is(err, ErrRefused) {
				t.Fatalf("%s: dial = %v, want refused as forbidden", tc.role, err)
			}
			t.Log(err)
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.role, err)
		}
		before := len(rec.got())
		if err := snd.Send(context.Background(), dpFrames(rng, 2, 1, dpReceiverInc)); err != nil {
			t.Fatalf("%s: %v", tc.role, err)
		}
		snd.Close()
		rec.mu.Lock()
		for i := before; i < len(rec.peer); i++ {
			if rec.peer[i] != scfg.Auth.Self() {
				t.Fatalf("%s: frame %d handed on as from %s", tc.role, i, rec.peer[i])
			}
		}
		rec.mu.Unlock()
	}
	if rs := srv.Stats(); rs.RefusedForbidden != uint64(forbidden) || rs.ConnectionsAccepted != 3 {
		t.Fatalf("server stats %+v: want %d refused as forbidden, 3 accepted", rs, forbidden)
	}
	if n := cfg.Auth.Refused()[trust.RefusedDataPlane]; n != uint64(forbidden) {
		t.Fatalf("%d data plane refusals counted, want %d", n, forbidden)
	}

	prober := ca.Authority(t, trust.RoleRouter, "r0", nil)
	if id, _, err := prober.Peers().Probe(srv.Addr().String()); err != nil || id != cfg.Auth.Self() {
		t.Fatalf("probe found %s, %v; want %s", id, err, cfg.Auth.Self())
	}
	testwait.For(t, "the probe seen closing before its hello", eventDeadline, func() bool { return srv.Stats().ClosedBeforeHello == 1 })
	if n := cfg.Auth.Refused().Total(); n != uint64(forbidden) {
		t.Fatalf("%d refusals counted after a probe, want %d", n, forbidden)
	}
}

// A sender that reaches another node than the one it expects sends it
// nothing: not a byte after the TLS handshake.
func TestDataPlaneSenderChecksReceiver(t *testing.T) {
	ca := trusttest.New(t)
	impostor := ca.Bundle(t, trust.RoleDecode, "d1")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", impostor.ServerTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	scfg := dpSecure(t, dpTestConfig(t, dpSenderInc), ca, trust.RolePrefill, "p0")
	want := trust.Identity{Cluster: trusttest.Cluster, Role: trust.RoleDecode, Name: "d0"}
	_, err = Dial(scfg, ln.Addr().String(), dpReceiverInc, want)
	var perr *PeerError
	if !errors.As(err, &perr) || perr.Want != want || perr.Have != impostor.Self || !errors.Is(err, ErrPeer) {
		t.Fatalf("dial = %v, want refused: %s is not %s", err, impostor.Self, want)
	}
	t.Log(err)
	if n := <-got; n != 0 {
		t.Fatalf("the impostor received %d bytes after the handshake, want 0", n)
	}
	if n := scfg.Auth.Refused()[trust.RefusedDataPlane]; n != 1 {
		t.Fatalf("%d data plane refusals counted by the sender, want 1", n)
	}

	// An expected identity is required exactly when there are credentials
	// to prove it.
	if _, err := Dial(scfg, ln.Addr().String(), dpReceiverInc, trust.Identity{}); err == nil {
		t.Fatal("a secure dial without an expected identity went ahead")
	}
	if _, err := Dial(dpTestConfig(t, dpSenderInc), ln.Addr().String(), dpReceiverInc, want); err == nil {
		t.Fatal("an insecure dial accepted an identity it cannot check")
	}
}

// One peer may hold ConnectionsPerPeerMax connections: its identity when
// secure, its IP address when insecure. One more is refused busy and
// counted; other peers are served up to ConnectionsMax; a slot given back
// is taken again.
func TestDataPlaneConnectionsPerPeer(t *testing.T) {
	for _, secure := range []bool{true, false} {
		t.Run(fmt.Sprintf("secure=%t", secure), func(t *testing.T) {
			ca := trusttest.New(t)
			cfg := dpTestConfig(t, dpReceiverInc)
			cfg.ConnectionsMax, cfg.ConnectionsPerPeerMax = 4, 2
			sender := func(name string) Config {
				c := dpTestConfig(t, dpSenderInc)
				if secure {
					c = dpSecure(t, c, ca, trust.RolePrefill, name)
				}
				return c
			}
			if secure {
				cfg = dpSecure(t, cfg, ca, trust.RoleDecode, "d0")
			}
			srv := dpListen(t, cfg, (&dpRecorder{}).handle)
			p0 := sender("p0")
			first := dpDial(t, p0, srv, dpReceiverInc)
			dpDial(t, p0, srv, dpReceiverInc)
			busy := func(c Config) {
				t.Helper()
				_, err := Dial(c, srv.Addr().String(), dpReceiverInc, dpWant(c, srv))
				var herr *HelloError
				if !errors.As(err, &herr) || herr.Status != StatusBusy {
					t.Fatalf("dial = %v, want busy", err)
				}
			}
			busy(p0)
			if rs := srv.Stats(); rs.RefusedPeerBusy != 1 || rs.RefusedBusy != 0 {
				t.Fatalf("server stats %+v: want one refused over the per-peer cap", rs)
			}
			if n := cfg.Auth.Refused()[trust.RefusedDataPlane]; n != 1 {
				t.Fatalf("%d data plane refusals counted, want 1", n)
			}
			if secure {
				// Another peer has its own share, up to ConnectionsMax.
				p1 := sender("p1")
				dpDial(t, p1, srv, dpReceiverInc)
				dpDial(t, p1, srv, dpReceiverInc)
				busy(sender("p2"))
				if rs := srv.Stats(); rs.RefusedBusy != 1 || rs.ConnectionsActive != 4 {
					t.Fatalf("server stats %+v: want 4 served and one refused for ConnectionsMax", rs)
				}
			}
			first.Close()
			left := uint64(1) // p0's second connection
			if secure {
				left += 2 // p1's
			}
			testwait.For(t, "the closed connection's slot given back", eventDeadline, func() bool { return srv.Stats().ConnectionsActive == left })
			again := dpDial(t, p0, srv, dpReceiverInc)
			if err := again.Send(context.Background(), dpFrames(rand.New(rand.NewPCG(2, 2)), 1, 1, dpReceiverInc)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Strangers that connect and say nothing hold no serving slot: with more
// of them waiting than ConnectionsMax, and a HelloTimeout far longer than
// the test, a transfer goes through at once.
func TestDataPlaneIdleStrangers(t *testing.T) {
	ca := trusttest.New(t)
	cfg := dpSecure(t, dpTestConfig(t, dpReceiverInc), ca, trust.RoleDecode, "d0")
	cfg.HelloTimeout = time.Hour
	const strangers = 40
	cfg.HandshakesPerAddrMax = strangers + 1 // all from this test's one address, the sender too
	if strangers <= cfg.ConnectionsMax || strangers > cfg.HandshakesMax {
		t.Fatalf("test wants ConnectionsMax (%d) < %d strangers <= HandshakesMax (%d)", cfg.ConnectionsMax, strangers, cfg.HandshakesMax)
	}
	rec := &dpRecorder{}
	srv := dpListen(t, cfg, rec.handle)
	for range strangers {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	// The listener's queue is in order: the strangers are accepted first.
	snd := dpDial(t, dpSecure(t, dpTestConfig(t, dpSenderInc), ca, trust.RolePrefill, "p0"), srv, dpReceiverInc)
	frames := dpFrames(rand.New(rand.NewPCG(3, 3)), 5, 1, dpReceiverInc)
	if err := snd.Send(context.Background(), frames); err != nil {
		t.Fatal(err)
	}
	dpEqualFrames(t, rec.got(), frames)
	if rs := srv.Stats(); rs.RefusedHandshakes != 0 || rs.HelloTimeouts != 0 || rs.ConnectionsActive != 1 {
		t.Fatalf("server stats %+v: want the strangers waiting and the sender served", rs)
	}
}

// Connections that send no hello are closed after HelloTimeout, counted;
// past HandshakesMax of them waiting, one more is closed at once; once
// HelloTimeout has closed the waiting ones, a sender gets in again.
func TestDataPlaneHandshakesMax(t *testing.T) {
	cfg := dpTestConfig(t, dpReceiverInc)
	cfg.HandshakesMax, cfg.HandshakesPerAddrMax, cfg.HandshakesReserved = 8, 8, 0
	cfg.HelloTimeout = 200 * time.Millisecond
	srv := dpListen(t, cfg, (&dpRecorder{}).handle)
	idle := make([]net.Conn, cfg.HandshakesMax)
	for i := range idle {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		idle[i] = c
	}
	scfg := dpTestConfig(t, dpSenderInc)
	if _, err := Dial(scfg, srv.Addr().String(), dpReceiverInc, trust.Identity{}); err == nil {
		t.Fatalf("dial past HandshakesMax (%d) waiting connections went ahead", cfg.HandshakesMax)
	}
	if rs := srv.Stats(); rs.RefusedHandshakes != 1 {
		t.Fatalf("server stats %+v: want one connection closed for HandshakesMax", rs)
	}
	for i, c := range idle {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("idle connection %d: read %d bytes, %v; want it closed by the server", i, n, err)
		}
	}
	testwait.For(t, "every idle connection counted", eventDeadline, func() bool { return srv.Stats().HelloTimeouts == uint64(len(idle)) })
	if n := cfg.Auth.Refused()[trust.RefusedDataPlane]; n != uint64(len(idle)) {
		t.Fatalf("%d data plane refusals counted, want %d", n, len(idle))
	}
	snd, err := Dial(scfg, srv.Addr().String(), dpReceiverInc, trust.Identity{})
	if err != nil {
		t.Fatalf("dial after the idle connections were closed: %v", err)
	}
	defer snd.Close()
	if err := snd.Send(context.Background(), dpFrames(rand.New(rand.NewPCG(3, 4)), 1, 1, dpReceiverInc)); err != nil {
		t.Fatal(err)
	}
}

// Every refused batch is the last its connection carries: the refusal is
// acknowledged, then the receiver closes the connection and hands nothing
// more on, not even a good batch already written behind it.
func TestDataPlaneRefusedBatchCloses(t *testing.T) {
	const refusedRequest = 13
	ca := trusttest.New(t)
	for _, secure := range []bool{false, true} {
		for _, tc := range []struct {
			name   string
			status Status
			edit   func(frames []kv.Frame)
		}{
			{"checksum", StatusMalformed, nil}, // the last payload byte flipped on the wire
			{"incarnation", StatusWrongIncarnation, func(f []kv.Frame) { f[0].Dest.Incarnation = dpReceiverInc + 1 }},
			{"handler", StatusRejected, func(f []kv.Frame) { f[0].Owner.Request = refusedRequest }},
		} {
			t.Run(fmt.Sprintf("%s/secure=%t", tc.name, secure), func(t *testing.T) {
				cfg, scfg := dpTestConfig(t, dpReceiverInc), dpTestConfig(t, dpSenderInc)
				if secure {
					cfg = dpSecure(t, cfg, ca, trust.RoleDecode, "d0")
					scfg = dpSecure(t, scfg, ca, trust.RolePrefill, "p0")
				}
				rec := &dpRecorder{}
				srv := dpListen(t, cfg, func(b Batch) error {
					if b.Frames[0].Owner.Request == refusedRequest {
						return &kv.StaleTagError{Page: b.Frames[0].Dest.Index, Have: b.Frames[0].Dest}
					}
					return rec.handle(b)
				})
				rng := rand.New(rand.NewPCG(6, 6))
				bad := dpFrames(rng, 2, 1, dpReceiverInc)
				if tc.edit != nil {
					tc.edit(bad)
				}
				batch, err := kv.AppendBatch(nil, bad, cfg.Batch)
				if err != nil {
					t.Fatal(err)
				}
				if tc.edit == nil {
					batch[len(batch)-1] ^= 1
				}
				good, err := kv.AppendBatch(nil, dpFrames(rng, 1, 2, dpReceiverInc), cfg.Batch)
				if err != nil {
					t.Fatal(err)
				}
				conn := dpRawConn(t, srv, scfg)
				if _, err := conn.Write(append(batch, good...)); err != nil {
					t.Fatal(err)
				}
				if a := readAck(t, conn); a.seq != 0 || a.status != tc.status {
					t.Fatalf("acknowledged %+v, want batch 0 refused as %s", a, tc.status)
				}
				if rest, err := io.ReadAll(conn); len(rest) != 0 || err != nil {
					t.Fatalf("after the refusal: %d bytes, %v; want the connection closed", len(rest), err)
				}
				if got := rec.got(); len(got) != 0 {
					t.Fatalf("%d frames handed on after a refusal", len(got))
				}
				if n := cfg.Auth.Refused()[trust.RefusedDataPlane]; n != 1 {
					t.Fatalf("%d data plane refusals counted, want 1", n)
				}
			})
		}
	}
}

// Strangers from other hosts that connect and say nothing hold at most
// HandshakesPerAddrMax connections each and, together, all but
// HandshakesReserved: one more from a full address, or from a new one once
// the strangers' share is full, is closed at once and counted by its
// bound, while a prefill node whose address is the cluster's own dials in
// and transfers as before.
func TestDataPlaneStrangersPerAddr(t *testing.T) {
	ca := trusttest.New(t)
	cfg := dpSecure(t, dpTestConfig(t, dpReceiverInc), ca, trust.RoleDecode, "d0")
	cfg.HelloTimeout = time.Hour
	cfg.HandshakesMax, cfg.HandshakesPerAddrMax, cfg.HandshakesReserved = 12, 3, 3
	rec := &dpRecorder{}
	srv := dpListen(t, cfg, rec.handle)
	addr := srv.Addr().String()
	prefill := dpSecure(t, dpTestConfig(t, dpSenderInc), ca, trust.RolePrefill, "p0")
	send := func(seed uint64) {
		t.Helper()
		frames := dpFrames(rand.New(rand.NewPCG(seed, seed)), 2, seed, dpReceiverInc)
		if err := dpDial(t, prefill, srv, dpReceiverInc).Send(context.Background(), frames); err != nil {
			t.Fatal(err)
		}
	}
	send(1) // proves 127.0.0.1 the cluster's own

	closedAtOnce := func(what string, c net.Conn) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(eventDeadline))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s: read %d bytes, %v; want the connection closed by the server", what, n, err)
		}
	}
	hold := func(ip string, n int) {
		t.Helper()
		for range n {
			if _, err := testnet.DialFrom(t, ip, addr); err != nil {
				t.Fatal(err)
			}
		}
	}
	hold("127.0.0.2", cfg.HandshakesPerAddrMax)
	extra, err := testnet.DialFrom(t, "127.0.0.2", addr)
	if err != nil {
		t.Fatal(err)
	}
	closedAtOnce("a stranger past HandshakesPerAddrMax", extra)
	hold("127.0.0.3", cfg.HandshakesPerAddrMax)
	hold("127.0.0.4", cfg.HandshakesPerAddrMax)
	late, err := testnet.DialFrom(t, "127.0.0.5", addr)
	if err != nil {
		t.Fatal(err)
	}
	closedAtOnce("a stranger past the strangers' share", late)

	for i := range cfg.HandshakesReserved {
		send(uint64(2 + i))
	}
	if rs := srv.Stats(); rs.RefusedHandshakesAddr != 1 || rs.RefusedHandshakes != 1 || rs.HelloTimeouts != 0 {
		t.Fatalf("server stats %+v: want one stranger refused per address, one for the strangers' share", rs)
	}
	got := cfg.Auth.Refused()
	if got[trust.RefusedHandshakesAddr] != 1 || got[trust.RefusedHandshakes] != 1 {
		t.Fatalf("refusals %v (names %v): want one handshakes_addr and one handshakes", got, trust.RefusalNames())
	}
	if n := len(rec.got()); n != 2*(1+cfg.HandshakesReserved) {
		t.Fatalf("%d frames received, want every transfer's", n)
	}
}
