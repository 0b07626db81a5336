package trust_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// A node's remote answers the run challenge with its own incarnation, to
// nodes only; a TLS server that serves no run challenge (a data plane, an
// older build) is told apart from one that answers, and the identity found
// comes back either way.
func TestRunChallenge(t *testing.T) {
	ca := trusttest.New(t)
	const inc = 0x1122334455667788
	node := ca.Authority(t, trust.RoleDecode, "d0", nil)
	addr, _ := trusttest.ServeRemote(t, node, "127.0.0.1:0", inc)
	asker := ca.Authority(t, trust.RoleRouter, "r0", nil)

	id, got, err := asker.AskRun(context.Background(), addr)
	want := trust.Identity{Cluster: trusttest.Cluster, Role: trust.RoleDecode, Name: "d0"}
	if err != nil || got != inc || id != want {
		t.Fatalf("AskRun: %v, incarnation %x, error %v; want %v, %x", id, got, err, want, uint64(inc))
	}

	tenant := ca.Authority(t, trust.RoleTenant, "acme", nil)
	if _, got, err := tenant.AskRun(context.Background(), addr); err == nil {
		t.Fatalf("a tenant was answered incarnation %x", got)
	}
	if n := node.Refused()[trust.RefusedRole]; n != 1 {
		t.Fatalf("the node counted %d role refusals after a tenant's challenge, want 1", n)
	}

	plain := trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleDecode, "d0"))
	id, _, err = asker.AskRun(context.Background(), plain)
	var perr *trust.RunProtocolError
	if !errors.As(err, &perr) || id != want {
		t.Fatalf("AskRun of a server without the challenge: %v, %v; want %v and a RunProtocolError", id, err, want)
	}

	noRun, _ := trusttest.ServeRemote(t, ca.Authority(t, trust.RoleOperator, "admin", nil), "127.0.0.1:0", 0)
	if _, _, err := asker.AskRun(context.Background(), noRun); err == nil {
		t.Fatal("a remote serving no run (incarnation 0) answered the challenge")
	}
}
