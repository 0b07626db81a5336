//go:build !race

// Several protoactor remote instances in one process; see remote_test.go.

package actors

// A prefill node keeps plans from anyone but a node that decodes twice:
// its dispatcher's and workers' mailboxes drop a remote message from any
// other role before it takes a place (MailboxFrom), and the plan policy
// refuses it again, with the data plane check besides. Each layer is
// tested here without the other: a probe actor with the filtered mailbox
// and no policy, and a probe with the policy behind a plain mailbox.

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/messages/messagestest"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// layered is a secure prefill node and three peers: a decode node, a
// router and another decode node that membership does not vouch for at
// the first's data plane.
type layered struct {
	n                              *Node
	auth                           *trust.Authority
	decode, router, rogue, unknown *messagestest.Peer
	dataPlaneOf                    DataPlaneOf
}

// The data plane membership gives for the decode node's and the router's
// addresses; the rogue decode node's is not a member.
const layeredDataPlane = "127.0.0.1:7070"

func startLayered(t *testing.T) *layered {
	t.Helper()
	ca := trusttest.New(t)
	l := &layered{
		decode:  messagestest.Start(t, ca.Authority(t, trust.RoleDecode, "d0", nil)),
		router:  messagestest.Start(t, ca.Authority(t, trust.RoleRouter, "r0", nil)),
		rogue:   messagestest.Start(t, ca.Authority(t, trust.RoleDecode, "d1", nil)),
		unknown: messagestest.Start(t, ca.Authority(t, trust.RoleDecode, "d2", nil)),
		auth:    ca.Authority(t, trust.RolePrefill, "p0", nil),
	}
	ids := map[string]trust.Identity{
		l.decode.Addr: {Cluster: trusttest.Cluster, Role: trust.RoleDecode, Name: "d0"},
		// A router vouched for at a data plane: no membership says so,
		// but only then does the policy's role check stand alone.
		l.router.Addr: {Cluster: trusttest.Cluster, Role: trust.RoleRouter, Name: "r0"},
		// The rogue's address, vouched for as someone else's.
		l.rogue.Addr: {Cluster: trusttest.Cluster, Role: trust.RoleDecode, Name: "d9"},
	}
	cfg := testConfig()
	cfg.Role = RolePrefill
	l.dataPlaneOf = func(addr string) (string, trust.Identity, bool) {
		id, ok := ids[addr]
		return layeredDataPlane, id, ok
	}
	l.n = startRemoteNode(t, cfg, Options{Auth: l.auth, DataPlaneOf: l.dataPlaneOf})
	return l
}

func (l *layered) plan(id uint64) *messages.TransferPlan {
	cfg := l.n.Config()
	return &messages.TransferPlan{RequestID: id, Tenant: "acme", TokenCount: 2, PromptTokens: []uint32{'h', 'i'},
		PageTokens: uint32(cfg.PageTokens), DestTags: []kv.Tag{{Incarnation: 9, Index: 0, Generation: 1}},
		DataPlane: layeredDataPlane, Model: l.n.Model().Fingerprint().String()}
}

// probe spawns on l's node an actor named name with mailbox mb (nil: a
// plain one) that hands every plan it gets to got, with its sender as
// the node authenticates it.
func (l *layered) probe(t *testing.T, name string, mb actor.MailboxProducer, got func(actor.Context, *messages.TransferPlan)) {
	t.Helper()
	var opts []actor.PropsOption
	if mb != nil {
		opts = append(opts, actor.WithMailbox(mb))
	}
	props := actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*messages.TransferPlan); ok {
			got(c, m)
		}
	}, opts...)
	if _, err := l.n.Root().SpawnNamed(props, name); err != nil {
		t.Fatal(err)
	}
}

// TestMailboxFromDropsOtherRoles: a mailbox that takes remote messages
// only from nodes that decode drops a router's before its actor sees it,
// counted as a role refusal; a decode node's gets through.
func TestMailboxFromDropsOtherRoles(t *testing.T) {
	l := startLayered(t)
	got := make(chan uint64, 4)
	l.probe(t, "filtered", l.n.MailboxFrom(trust.RoleDecode, trust.RoleAll), func(_ actor.Context, m *messages.TransferPlan) {
		got <- m.RequestID
	})
	before := l.auth.Refused()[trust.RefusedRole]
	l.router.Sys.Root.Send(actor.NewPID(l.n.Address(), "filtered"), l.plan(1))
	testwait.Report(t, "the router's plan refused or taken", time.Minute, func() (bool, string) {
		return l.auth.Refused()[trust.RefusedRole] > before || len(got) > 0,
			fmt.Sprintf("%d role refusals, %d plans taken", l.auth.Refused()[trust.RefusedRole]-before, len(got))
	})
	if len(got) != 0 {
		t.Fatalf("the router's plan %d reached the actor", <-got)
	}
	l.decode.Sys.Root.Send(actor.NewPID(l.n.Address(), "filtered"), l.plan(2))
	if id := testwait.Recv(t, "the decode node's plan", time.Minute, got); id != 2 {
		t.Fatalf("plan %d reached the actor, want the decode node's 2", id)
	}
	if n := l.auth.Refused()[trust.RefusedRole] - before; n != 1 {
		t.Fatalf("%d role refusals, want the router's one", n)
	}
}

// TestPlanPolicyAlone: behind a mailbox that takes anyone's, the plan
// policy refuses a router's plan even when membership vouches for its
// data plane (the role), a decode node whose address membership gives
// another identity (the identity), one naming another data plane, and
// one that is no member; a decode node's plan to its own data plane
// passes.
func TestPlanPolicyAlone(t *testing.T) {
	l := startLayered(t)
	type verdict struct {
		id  uint64
		err error
	}
	got := make(chan verdict, 8)
	policy := planPolicy{auth: l.auth, dataPlaneOf: l.dataPlaneOf}
	l.probe(t, "policy", nil, func(c actor.Context, m *messages.TransferPlan) {
		got <- verdict{m.RequestID, policy.check(c, m)}
	})
	other := l.plan(4)
	other.DataPlane = "127.0.0.1:9"
	for i, tc := range []struct {
		name string
		from *messagestest.Peer
		plan *messages.TransferPlan
		want any // nil: passes
	}{
		{"a router vouched for at the data plane", l.router, l.plan(1), new(*ForbiddenError)},
		{"a decode node at an address vouched for as another's", l.rogue, l.plan(2), new(*DataPlaneMismatchError)},
		{"a decode node's plan", l.decode, l.plan(3), nil},
		{"a decode node naming another data plane", l.decode, other, new(*DataPlaneMismatchError)},
		{"a decode node that is no member", l.unknown, l.plan(5), new(*NotMemberError)},
	} {
		tc.from.Sys.Root.Send(actor.NewPID(l.n.Address(), "policy"), tc.plan)
		v := testwait.Recv(t, tc.name, time.Minute, got)
		switch {
		case v.id != tc.plan.RequestID:
			t.Fatalf("%d: verdict on plan %d, want %d", i, v.id, tc.plan.RequestID)
		case tc.want == nil && v.err != nil, tc.want != nil && !errors.As(v.err, tc.want):
			t.Errorf("%s: %v, want %T", tc.name, v.err, tc.want)
		}
	}
}
