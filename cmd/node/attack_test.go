package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/cluster/dataplane"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// TestBinaryAttacksRefused plays, against a secure cluster of real
// processes (router, prefill, decode), what a stranger on the network
// would try: a client with another CA's certificate, a client with no
// certificate at all, a tenant claiming another tenant, and bytes of
// garbage (and idle connections) at every port. Each is refused; every
// node serves on; the refusals are counted in status; real requests still
// answer the reference and every pool is free afterwards.
func TestBinaryAttacksRefused(t *testing.T) {
	router := startMember(t, "router", "")
	prefill := startMember(t, "prefill", router.gossip)
	decode := startMember(t, "decode", router.gossip)
	waitConverged(t, router, prefill, decode)

	foreign := filepath.Join(t.TempDir(), "foreign")
	for _, args := range [][]string{{"certs", "init", "--dir", foreign, "--cluster", "test"},
		{"certs", "issue", "--dir", foreign, "--role", "tenant", "--name", "acme"}} {
		if code, _, stderr := runBinary(t, "", args...); code != exitOK {
			t.Fatalf("node %s: exit %d; stderr:\n%s", strings.Join(args, " "), code, stderr)
		}
	}
	attempts := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"another CA's certificate", []string{"--certs", foreign}, "certificate"},
		{"no certificate", []string{"--insecure"}, "node_lost"},
		{"another tenant", []string{"--cert", "tenant-globex"}, "forbidden (8)"},
	}
	for _, a := range attempts {
		args := append([]string{"generate", "--endpoint", router.addr, "--tenant", "acme", "--prompt", "hello",
			"--no-answer-after", "3s"}, a.args...)
		code, stdout, stderr := runBinary(t, "", args...)
		if code != exitFailed || stdout != "" || !strings.Contains(stderr, a.want) {
			t.Errorf("%s: exit %d, stdout %q, want exit %d, nothing printed and %q in stderr:\n%s", a.name, code, stdout,
				exitFailed, a.want, stderr)
		}
	}

	s, err := statusOf(t, decode.addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{router.addr, prefill.addr, decode.addr, s.Node.DataPlane} {
		garbage(t, addr)
	}

	reqs := mixedRequests(4, 2, 200, 16)
	generateAll(t, router.addr, reqs)
	checkReference(t, reqs)
	rs, err := statusOf(t, router.addr)
	if err != nil {
		t.Fatal(err)
	}
	refused := refusedBy(rs)
	if refused["certificate"] < 2 || refused["tenant"] != 1 {
		t.Errorf("router refusals %v, want at least 2 certificate (another CA, none, garbage) and 1 tenant", refused)
	}
	for _, m := range []*member{router, prefill, decode} {
		st, err := statusOf(t, m.addr)
		if err != nil {
			t.Fatalf("%s after the attacks: %v", m.role, err)
		}
		for _, p := range st.Node.Pools {
			if !p.Idle() {
				t.Errorf("%s pool %s: %d of %d pages free, %d cached, after the attacks", m.role, p.Name, p.Free, p.Capacity, p.CachePages)
			}
		}
	}
}

// refusedBy is a node's status's refusals by kind name.
func refusedBy(s *messages.StatusReply) map[string]uint64 {
	refused := map[string]uint64{}
	for i, name := range trust.RefusalNames() {
		if i < len(s.Node.Refused) {
			refused[name] = s.Node.Refused[i]
		}
	}
	return refused
}

// holdBeforeHello keeps n connections from ip to addr open without a
// word until the test ends, dialing again, a moment later, each time the
// server closes one: a stranger holding every connection it may before
// the hello.
func holdBeforeHello(t *testing.T, ip, addr string, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range n {
		wg.Go(func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
			for ctx.Err() == nil {
				if c, err := d.DialContext(ctx, "tcp", addr); err == nil {
					stop := context.AfterFunc(ctx, func() { c.Close() })
					_, _ = c.Read(make([]byte, 1))
					stop()
					c.Close()
				}
				// An attacker's pace: the test's two cores serve the
				// cluster too.
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	}
}

// referenceRequests is how many requests answerReference sends.
const referenceRequests = 7

// answerReference sends referenceRequests requests of 2 tenants through
// the router at addr, fails the test for any answer that is not the
// reference, and returns how long they took.
func answerReference(t *testing.T, addr string) time.Duration {
	t.Helper()
	reqs := mixedRequests(referenceRequests, 2, 200, 16)
	start := time.Now()
	generateAll(t, addr, reqs)
	took := time.Since(start)
	checkReference(t, reqs)
	return took
}

// Attack 5, no credential, on the data plane: strangers on other hosts
// hold every connection before the hello that each address may, and
// together every one strangers may, of the decode node's data plane;
// then the prefill node restarts. Its first transfers go through (the
// reserve is for addresses the cluster's nodes connected from), every
// request answers the reference (none node_lost), the strangers' extra
// connections are refused and counted by bound, and the decode node's
// warnings stay a few a second.
func TestBinaryAttackDataPlaneStrangers(t *testing.T) {
	router := startMember(t, "router", "")
	prefill := startMember(t, "prefill", router.gossip)
	decode := startMember(t, "decode", router.gossip)
	waitConverged(t, router, prefill, decode)
	aloneTook := answerReference(t, router.addr)
	s, err := statusOf(t, decode.addr)
	if err != nil {
		t.Fatal(err)
	}
	data := s.Node.DataPlane

	// Strangers from more addresses than it takes to fill the strangers'
	// share, each trying one more than an address may, together more than
	// every slot there is.
	def := dataplane.DefaultLocalConfig(kv.Geometry{PageTokens: 1}, 1)
	addrs := (def.HandshakesMax-def.HandshakesReserved)/def.HandshakesPerAddrMax + 2
	perAddr := def.HandshakesPerAddrMax + 1
	if addrs*perAddr <= def.HandshakesMax {
		t.Fatalf("%d strangers of %d addresses would not try every one of HandshakesMax (%d)", addrs*perAddr, addrs, def.HandshakesMax)
	}
	warnBefore, bytesBefore := strings.Count(decode.stderr.String(), "level=WARN"), len(decode.stderr.String())
	start := time.Now()
	for i := range addrs {
		holdBeforeHello(t, fmt.Sprintf("127.0.0.%d", 2+i), data, perAddr)
	}
	testwait.Report(t, "the strangers refused by both bounds", time.Minute, func() (bool, string) {
		s, err := statusOf(t, decode.addr)
		if err != nil {
			return false, err.Error()
		}
		r := refusedBy(s)
		return r["handshakes_addr"] >= 1 && r["handshakes"] >= 1, fmt.Sprint(r)
	})

	if err := prefill.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	restarted := startMember(t, "prefill", router.gossip)
	waitConverged(t, router, restarted, decode)
	attackedTook := answerReference(t, router.addr)
	took := time.Since(start)

	// The kinds of warning the strangers cause: the two bounds and the
	// hello timeout of the connections they hold.
	const kinds = 3
	perKind := trust.DefaultConfig().RefusalLinesPerSecond
	warned := strings.Count(decode.stderr.String(), "level=WARN") - warnBefore
	if most := kinds * (perKind + int(math.Ceil(took.Seconds()*float64(perKind)))); warned > most {
		t.Fatalf("the decode node warned %d times in %s, want at most %d:\n%s", warned, took, most, decode.stderr)
	}
	s, err = statusOf(t, decode.addr)
	if err != nil {
		t.Fatal(err)
	}
	logged := len(decode.stderr.String()) - bytesBefore
	t.Logf("in %s the decode node refused %v and warned %d times (%d bytes of log, %.0f a minute); %d requests took %s alone, %s under attack after the restart (goodput ratio %.2f)",
		took, refusedBy(s), warned, logged, float64(logged)/took.Minutes(), referenceRequests, aloneTook, attackedTook,
		aloneTook.Seconds()/attackedTook.Seconds())
}

// garbage sends random bytes to addr on one connection and holds 40 more
// open without a word, then closes them all.
func garbage(t *testing.T, addr string) {
	t.Helper()
	junk := make([]byte, 4096)
	if _, err := rand.Read(junk); err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range 41 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		held = append(held, c)
		if i == 0 {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write(junk)
		}
	}
}
