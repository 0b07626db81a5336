package main

import (
	"crypto/rand"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	refused := map[string]uint64{}
	for i, name := range trust.RefusalNames() {
		if i < len(rs.Node.Refused) {
			refused[name] = rs.Node.Refused[i]
		}
	}
	if refused["certificate"] < 2 || refused["tenant"] != 1 {
		t.Errorf("router refusals %v, want at least 2 certificate (another CA, none, garbage) and 1 tenant", refused)
	}
	for _, m := range []*member{router, prefill, decode} {
		st, err := statusOf(t, m.addr)
		if err != nil {
			t.Fatalf("%s after the attacks: %v", m.role, err)
		}
		for _, p := range st.Node.Pools {
			if p.Free != p.Capacity {
				t.Errorf("%s pool %s: %d of %d pages free after the attacks", m.role, p.Name, p.Free, p.Capacity)
			}
		}
	}
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
