package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/cluster/membership"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// TestBinaryFakeMemberAcrossRestarts plays a holder of the gossip key
// without a certificate against a secure cluster of real processes
// (router, prefill, decode): a member of its own incarnation announced
// under the decode node's name and at its addresses. It is never
// verified, neither while the decode node runs nor after the decode node
// is killed and restarted on the same ports (twice); each restarted run is
// verified again, and every request routed through the router, before and
// during the attack, answers the reference: no node_lost once the new run
// is verified (by the router and the prefill node, which sends it KV), no
// wrong answer. It logs how long after each restart the router and the
// prefill node listed the new run verified, and the goodput with the fake
// in gossip over the goodput before it.
func TestBinaryFakeMemberAcrossRestarts(t *testing.T) {
	router := startMember(t, "router", "")
	prefill := startMember(t, "prefill", router.gossip)
	remote, data, gossip := freeTCPAddr(t), freeTCPAddr(t), fmt.Sprintf("127.0.0.1:%d", freeGossipPort(t))
	ports := []string{"--listen", remote, "--data", data, "--gossip", gossip}
	decode := startMember(t, "decode", router.gossip, ports...)
	waitConverged(t, router, prefill, decode)

	goodput := func(tag string) float64 {
		reqs := mixedRequests(16, 2, 200, 16)
		for _, r := range reqs {
			r.prompt = tag + r.prompt
		}
		start := time.Now()
		generateAll(t, router.addr, reqs)
		took := time.Since(start)
		checkReference(t, reqs)
		return float64(len(reqs)) / took.Seconds()
	}
	goodput("warm-up: ") // the first requests of a process run slower, whatever else happens
	alone := goodput("alone: ")

	fake := startFake(t, decode, router.gossip)
	awaitSees(t, router, fake, "the fake listed, unverified", func(messages.MemberStatus) bool { return true },
		router.incarnation, prefill.incarnation, decode.incarnation)
	attacked := goodput("with the fake in gossip: ")
	for restart := range 2 {
		want := fmt.Sprintf("answers incarnation %016x", decode.incarnation)
		awaitSees(t, router, fake, "the fake refused by the run at its address", func(m messages.MemberStatus) bool {
			return strings.Contains(m.Unverified, want)
		}, router.incarnation, prefill.incarnation, decode.incarnation)
		if err := decode.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-decode.exited
		started := time.Now()
		decode = startMember(t, "decode", router.gossip, ports...)
		ready := time.Now()
		for _, m := range []*member{router, prefill} {
			awaitSees(t, m, fake, fmt.Sprintf("restarted run %016x verified", decode.incarnation),
				func(messages.MemberStatus) bool { return true }, router.incarnation, prefill.incarnation, decode.incarnation)
			t.Logf("restart %d: the %s listed the new run verified %s after its readiness line (%s after its start)",
				restart+1, m.role, time.Since(ready).Round(time.Millisecond), time.Since(started).Round(time.Millisecond))
		}
	}
	restarted := goodput("with the fake in gossip, after two restarts: ")
	t.Logf("goodput in requests/s: %.2f alone; with the fake in gossip %.2f (ratio %.2f), after two restarts %.2f (ratio %.2f)",
		alone, attacked, attacked/alone, restarted, restarted/alone)
	awaitSees(t, router, fake, "the fake still listed, unverified", func(messages.MemberStatus) bool { return true },
		router.incarnation, prefill.incarnation, decode.incarnation)
	want := fmt.Sprintf("answers incarnation %016x", decode.incarnation)
	awaitSees(t, router, fake, "the fake refused by the last run at its address", func(m messages.MemberStatus) bool {
		return strings.Contains(m.Unverified, want)
	}, router.incarnation, prefill.incarnation, decode.incarnation)
	code, stdout, stderr := runBinary(t, "", "status", "--endpoint", router.addr)
	why := fmt.Sprintf("%s unverified: cluster: member %s announces incarnation", fake, fake)
	if code != exitOK || !strings.Contains(stdout, why) || !strings.Contains(stdout, want) {
		t.Errorf("node status: exit %d, want the fake unverified, refused by run %016x (%q); printed:\n%s%s", code,
			decode.incarnation, why, stdout, stderr)
	}
}

// startFake joins a member to the cluster at join that holds the gossip
// key (from the test credentials) and no certificate, and announces a run
// of its own incarnation under victim's name, at victim's remote and data
// addresses, with the largest pool. It stays in gossip until the test
// ends. It returns the member's name.
func startFake(t *testing.T, victim *member, join string) string {
	t.Helper()
	auth, err := credFlags{}.operator(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := statusOf(t, victim.addr)
	if err != nil {
		t.Fatal(err)
	}
	model, err := engine.ParseFingerprint(s.Node.ModelFingerprint)
	if err != nil {
		t.Fatal(err)
	}
	cfg := membership.DefaultLocalConfig()
	cfg.Insecure, cfg.Keys = true, auth.Bundle().GossipKeys
	cfg.NamePrefix = strings.TrimSuffix(s.Node.Name, fmt.Sprintf("-%016x", victim.incarnation))
	cfg.JoinAddrs = []string{join}
	meta := membership.Meta{Role: membership.RoleDecode, Incarnation: victim.incarnation ^ 0x5a5a5a5a5a5a5a5a,
		RemoteAddr: victim.addr, DataAddr: s.Node.DataPlane, CapacityPages: 1 << 30, FreePages: 1 << 30, Model: model}
	fake, err := membership.Start(cfg, meta)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Shutdown() })
	return fake.Name()
}

// awaitSees waits until the node observer lists the fake unverified with
// a reason that ok accepts, and verified and alive exactly the runs of
// the incarnations verified, failing at once if it ever lists the fake
// verified.
func awaitSees(t *testing.T, observer *member, fake, what string, ok func(messages.MemberStatus) bool, verified ...uint64) {
	t.Helper()
	testwait.Report(t, observer.role+": "+what, convergeTimeout, func() (bool, string) {
		s, err := statusOf(t, observer.addr)
		if err != nil {
			return false, err.Error()
		}
		seen := false
		var good []uint64
		for _, m := range s.Members {
			if m.Name == fake {
				if m.Verified {
					t.Fatalf("the %s lists the fake %s verified: %+v", observer.role, fake, m)
				}
				seen = ok(m)
			}
			if m.Verified && m.State == messages.MemberAlive {
				good = append(good, m.Incarnation)
			}
		}
		slices.Sort(good)
		slices.Sort(verified)
		return seen && slices.Equal(good, verified), fmt.Sprintf("verified %x, want %x; members %+v", good, verified, s.Members)
	})
}
