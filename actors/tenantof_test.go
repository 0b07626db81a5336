package actors

import (
	"errors"
	"testing"

	"github.com/kvwarden/kvwarden/trust"
)

// TestTenantOf: a request runs as the tenant its sender's credential
// names, and only a tenant's credential may generate; a request that
// claims another tenant, and one from any other role, is forbidden with
// the reason and counted under its refusal. Only a sender in this process
// or to an insecure node is taken at its word. Router and admission both
// call TenantOf; the node tests see it behind remote, this sees it alone.
func TestTenantOf(t *testing.T) {
	as := func(role trust.Role, name string) trust.Sender {
		return trust.Sender{Identity: trust.Identity{Cluster: "c", Role: role, Name: name}}
	}
	const notTenant = "only a tenant's credential may generate"
	for _, tc := range []struct {
		name    string
		sender  trust.Sender
		claimed string
		reason  string // "" when the request runs as claimed
		refusal trust.Refusal
	}{
		{"its own tenant", as(trust.RoleTenant, "acme"), "acme", "", 0},
		{"another tenant", as(trust.RoleTenant, "acme"), "globex", `tenant "globex", the credential names "acme"`, trust.RefusedTenant},
		{"a router", as(trust.RoleRouter, "r0"), "acme", notTenant, trust.RefusedRole},
		{"an operator", as(trust.RoleOperator, "acme"), "acme", notTenant, trust.RefusedRole},
		{"a decode node", as(trust.RoleDecode, "acme"), "acme", notTenant, trust.RefusedRole},
		{"no credential", trust.Sender{}, "acme", notTenant, trust.RefusedRole},
		{"this process", trust.Sender{Local: true}, "acme", "", 0},
		{"an insecure node's client", trust.Sender{Insecure: true}, "acme", "", 0},
	} {
		auth := trust.Insecure(nil)
		got, err := TenantOf(auth, tc.sender, tc.claimed)
		refused := auth.Refused()
		var fe *ForbiddenError
		switch {
		case tc.reason == "" && (err != nil || got != tc.claimed || refused.Total() != 0):
			t.Errorf("%s: %q, %v, refusals %v; want to run as %q", tc.name, got, err, refused, tc.claimed)
		case tc.reason != "" && (!errors.As(err, &fe) || fe.Reason != tc.reason || got != ""):
			t.Errorf("%s: %q, %v; want forbidden: %s", tc.name, got, err, tc.reason)
		case tc.reason != "" && (refused[tc.refusal] != 1 || refused.Total() != 1):
			t.Errorf("%s: refusals %v, want one %s", tc.name, refused, tc.refusal)
		}
	}
}
