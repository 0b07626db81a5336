package membership

import (
	"log/slog"
	"net"
	"testing"

	"github.com/hashicorp/memberlist"
)

// TestLapsedProofForgottenWhenLost: a run declared dead keeps its proof,
// so that it is verified at once when it comes back from a stall; once
// the node has given it up for lost, whoever announces it again is
// verified afresh, by a probe of its addresses.
func TestLapsedProofForgottenWhenLost(t *testing.T) {
	m := &Membership{log: slog.New(slog.DiscardHandler), name: "self", members: map[string]Member{},
		events: make(chan Event, 64), proofs: map[string]claim{}, pending: map[string]*attempt{}, wake: make(chan struct{}, 1)}
	meta := testMeta()
	meta.StartedUnixMilli = 1_700_000_000_000
	enc, err := EncodeMeta(nil, meta)
	if err != nil {
		t.Fatal(err)
	}
	n := &memberlist.Node{Name: NodeName("decode", meta.Incarnation), Addr: net.IPv4(127, 0, 0, 1), Port: 7946, Meta: enc}
	verified := func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.members[n.Name].Verified
	}
	m.observe(n)
	if verified() {
		t.Fatal("a member verified before any probe")
	}
	m.settle(m.members[n.Name], nil) // a probe proved its claim
	if !verified() {
		t.Fatal("a proven member not verified")
	}
	m.depart(n) // declared dead
	m.observe(n)
	if !verified() {
		t.Fatal("a run declared dead and back was not verified at once on its kept proof")
	}
	m.depart(n)
	m.ForgetLapsed(n.Name) // given up for lost
	m.observe(n)
	if verified() {
		t.Fatal("a run given up for lost and announced again was verified on its old proof")
	}
	if _, due := m.pending[n.Name]; !due || len(m.lapsed) != 0 {
		t.Fatalf("after the loss: pending %v, lapsed %v; want a probe due and no proof kept", m.pending, m.lapsed)
	}
}
