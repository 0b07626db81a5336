//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC; see node_test.go.

package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/messages/messagestest"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// TestPressureOnlyForOperators: a tenant asking a secure node for pool
// pressure gets no answer and is counted; an operator gets the node's: the
// pages held in a chaos build, the way to build one in any other.
func TestPressureOnlyForOperators(t *testing.T) {
	ca := trusttest.Shared(t)
	n := startClusterNode(t, actors.RoleAll)
	control := actor.NewPID(n.Address(), ControlName)
	ask := &messages.PressureRequest{Pages: 3, DurationMs: 200}
	before := n.cfg.Auth.Refused()[trust.RefusedRole]
	tenant := messagestest.StartAwaiting(t, ca.Authority(t, trust.RoleTenant, "mallory", nil))
	if _, err := messages.Request(tenant.Sys.Root, control, ask, time.Second); err == nil {
		t.Error("a tenant's pressure request was answered")
	}
	if got := n.cfg.Auth.Refused()[trust.RefusedRole]; got != before+1 {
		t.Errorf("role refusals went from %d to %d, want one more", before, got)
	}
	if !allFree(n) {
		t.Error("a tenant's pressure request held pages")
	}
	operator := messagestest.StartAwaiting(t, ca.Authority(t, trust.RoleOperator, "ops", nil))
	m, err := messages.Request(operator.Sys.Root, messagestest.PID(control), ask, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rep := m.(*messages.PressureReply)
	if !faults.Available {
		if rep.Err == nil || !strings.Contains(rep.Err.Message, "go build -tags chaos") {
			t.Fatalf("a production node's answer to pressure: %+v", rep)
		}
		return
	}
	if rep.Err != nil || len(rep.Held) != 2 || rep.Held[0].Pages != 3 || rep.Held[1].Pages != 3 {
		t.Fatalf("an operator's pressure of 3 pages: %+v", rep)
	}
	waitFor(t, "held pages released", time.Minute, func() bool { return allFree(n) })
}
