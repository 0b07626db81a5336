//go:build !race

// Several protoactor remote instances in one process; see node_test.go.

package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/messages/messagestest"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// TestControlActorChecksItsSender: the control actor answers only
// operators by its own check, not only because its mailbox drops other
// roles' messages (actors.Node.MailboxFrom): behind a plain mailbox, a
// tenant's and a router's status requests are refused, counted and not
// answered; an operator's is answered.
func TestControlActorChecksItsSender(t *testing.T) {
	ca := trusttest.Shared(t)
	n := startClusterNode(t, actors.RoleAll)
	const plain = "control-plain-mailbox"
	if _, err := n.actors.Root().SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &controlActor{node: n} }),
		plain); err != nil {
		t.Fatal(err)
	}
	for _, who := range []struct {
		role trust.Role
		name string
	}{{trust.RoleTenant, "mallory"}, {trust.RoleRouter, "r9"}} {
		asker := messagestest.Start(t, ca.Authority(t, who.role, who.name, nil))
		inbox, answers := asker.Inbox(t, "answers")
		before := n.cfg.Auth.Refused()[trust.RefusedRole]
		asker.Sys.Root.RequestWithCustomSender(actor.NewPID(n.Address(), plain), &messages.StatusRequest{}, inbox)
		testwait.Report(t, fmt.Sprintf("the %s's status request refused or answered", who.role), time.Minute, func() (bool, string) {
			refused := n.cfg.Auth.Refused()[trust.RefusedRole] - before
			return refused > 0 || len(answers) > 0, fmt.Sprintf("%d role refusals, %d answers", refused, len(answers))
		})
		if len(answers) != 0 {
			t.Fatalf("the %s's status request was answered with a %T", who.role, (<-answers).Message)
		}
	}
	op := messagestest.StartAwaiting(t, ca.Authority(t, trust.RoleOperator, "admin", nil))
	rep, err := messages.Request(op.Sys.Root, actor.NewPID(n.Address(), plain), &messages.StatusRequest{}, time.Minute)
	if s, ok := rep.(*messages.StatusReply); err != nil || !ok || s.Node.Incarnation != n.Incarnation() {
		t.Fatalf("an operator's status request: %+v, %v", rep, err)
	}
}
