package membership

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// The verification core, without probes: what settle makes of answers.
// Runs of one node at the same addresses: the latest answer wins, an
// answer older than a proven run's never verifies, and a run of another
// incarnation is a refusal carrying both incarnations.
func TestSettleKeepsTheLatestRun(t *testing.T) {
	auth := trusttest.Shared(t).Authority(t, trust.RoleRouter, "r0", nil)
	m := &Membership{cfg: Config{Auth: auth, VerifyParallelMax: 8, VerifyRetryInterval: time.Second,
		VerifyRetryIntervalMax: time.Second}, log: slog.New(slog.DiscardHandler), name: "self",
		members: map[string]Member{}, events: make(chan Event, 64), proofs: map[string]proof{},
		pending: map[string]*attempt{}, wake: make(chan struct{}, 1)}
	addrs := testMeta()
	run := func() Member {
		meta := testMeta()
		meta.StartedUnixMilli, meta.RemoteAddr, meta.DataAddr = 1_700_000_000_000, addrs.RemoteAddr, addrs.DataAddr
		enc, err := EncodeMeta(nil, meta)
		if err != nil {
			t.Fatal(err)
		}
		m.observe(&memberlist.Node{Name: NodeName("d0", meta.Incarnation), Addr: net.IPv4(127, 0, 0, 1), Port: 7946, Meta: enc})
		return m.members[NodeName("d0", meta.Incarnation)]
	}
	old, rerun, fake := run(), run(), run()
	for _, mem := range []Member{old, rerun, fake} {
		if mem.Verified || mem.Unverified != notProbedYet {
			t.Fatalf("%s listed verified %v (%q) before any probe", mem.Name, mem.Verified, mem.Unverified)
		}
	}
	if due := m.takeDue(time.Now()); len(due) != 3 {
		t.Fatalf("%d members due, want 3", len(due))
	}
	t0 := time.Now()
	m.settle(old, t0, nil)
	m.settle(rerun, t0.Add(2*time.Millisecond), nil)
	m.settle(fake, t0.Add(time.Millisecond), nil)
	if _, ok := m.members[old.Name]; ok || m.superseded.Load() != 1 {
		t.Fatalf("the old run is still listed (superseded %d) after the rerun was proven at its addresses", m.superseded.Load())
	}
	if !m.members[rerun.Name].Verified {
		t.Fatal("the rerun, proven last, is not verified")
	}
	if f := m.members[fake.Name]; f.Verified || !strings.Contains(f.Unverified, "proven at its addresses after this answer") {
		t.Fatalf("an answer older than the rerun's: verified %v, %q", f.Verified, f.Unverified)
	}

	m.pending[fake.Name].next = time.Time{}
	if due := m.takeDue(time.Now()); len(due) != 1 || due[0].Name != fake.Name {
		t.Fatalf("due %v, want the fake's retry", due)
	}
	m.settle(fake, time.Now(), &ClaimError{Member: fake.Name, Field: "remote address", Addr: addrs.RemoteAddr,
		Want: fake.Identity(trusttest.Cluster), Found: fake.Identity(trusttest.Cluster),
		Announced: fake.Meta.Incarnation, Answered: rerun.Meta.Incarnation})
	want := fmt.Sprintf("announces incarnation %016x, but the run of %s at remote address %s answers incarnation %016x",
		fake.Meta.Incarnation, fake.Identity(trusttest.Cluster), addrs.RemoteAddr, rerun.Meta.Incarnation)
	if f := m.members[fake.Name]; f.Verified || !strings.Contains(f.Unverified, want) {
		t.Fatalf("the fake: verified %v, %q; want %q", f.Verified, f.Unverified, want)
	}
	if m.claimsRefused.Load() != 1 || auth.Refused()[trust.RefusedAddress] != 1 {
		t.Fatalf("refusals: membership %d, authority %d; want 1 each", m.claimsRefused.Load(), auth.Refused()[trust.RefusedAddress])
	}
	if m.probing != 0 {
		t.Fatalf("%d probes counted under way after every one settled", m.probing)
	}
}

// A run's first probe goes ahead of every retry, however long the
// retries have waited, so that a restarted node is verified at once
// while unanswered claims hold the probe slots.
func TestFirstProbesGoFirst(t *testing.T) {
	m := &Membership{cfg: Config{VerifyParallelMax: 2}, members: map[string]Member{}, pending: map[string]*attempt{}}
	now := time.Now()
	for i, failed := range []int{3, 0, 5, 0} {
		name := fmt.Sprintf("m%d", i)
		m.members[name] = Member{Name: name}
		m.pending[name] = &attempt{failed: failed, next: now.Add(-time.Duration(10-i) * time.Second)}
	}
	due := m.takeDue(now)
	if names := memberNames(due); len(names) != 2 || names[0] != "m1" || names[1] != "m3" {
		t.Fatalf("due first %v, want the first probes m1 and m3", names)
	}
	if more := m.takeDue(now); len(more) != 0 {
		t.Fatalf("%d more probes started with every slot taken", len(more))
	}
}
