package trust_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/trust"
)

func TestIdentityURIRoundTrip(t *testing.T) {
	for _, role := range []trust.Role{trust.RolePrefill, trust.RoleDecode, trust.RoleRouter, trust.RoleAll,
		trust.RoleOperator, trust.RoleTenant} {
		id := trust.Identity{Cluster: "prod.eu-1", Role: role, Name: "node_7-a." + string(role)}
		u, err := url.Parse(id.URI())
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		got, err := trust.ParseIdentity(u)
		if err != nil {
			t.Fatalf("ParseIdentity(%s): %v", u, err)
		}
		if got != id {
			t.Fatalf("round trip of %+v gave %+v", id, got)
		}
		if r, err := trust.ParseRole(string(role)); err != nil || r != role {
			t.Fatalf("ParseRole(%q) = %q, %v", role, r, err)
		}
	}
}

func TestParseIdentityRefusals(t *testing.T) {
	long := strings.Repeat("n", trust.NameBytesMax+1)
	tests := []struct {
		name, uri, want string
	}{
		{"wrong scheme", "https://c/decode/d0", `scheme "https", want "kvwarden"`},
		{"no role or name", "kvwarden://c", "want kvwarden://<cluster>/<role>/<name>"},
		{"no name", "kvwarden://c/decode", "want kvwarden://<cluster>/<role>/<name>"},
		{"extra part", "kvwarden://c/decode/d0/x", "want kvwarden://<cluster>/<role>/<name>"},
		{"query", "kvwarden://c/decode/d0?tenant=other", "want kvwarden://<cluster>/<role>/<name>"},
		{"fragment", "kvwarden://c/decode/d0#x", "want kvwarden://<cluster>/<role>/<name>"},
		{"user", "kvwarden://eve@c/decode/d0", "want kvwarden://<cluster>/<role>/<name>"},
		{"no cluster", "kvwarden:///decode/d0", `cluster "" is 0 bytes, want 1 to 64`},
		{"empty role", "kvwarden://c//d0", `unknown role ""`},
		{"unknown role", "kvwarden://c/root/d0", `unknown role "root"`},
		{"empty name", "kvwarden://c/decode/", `name "" is 0 bytes`},
		{"space in name", "kvwarden://c/tenant/a%20b", `has ' ' at byte 1`},
		{"escaped slash in name", "kvwarden://c/tenant/a%2Fb", "want kvwarden://<cluster>/<role>/<name>"},
		{"port in cluster", "kvwarden://c:1/decode/d0", `has ':' at byte 1`},
		{"name too long", "kvwarden://c/tenant/" + long, "is 65 bytes, want 1 to 64"},
		{"cluster too long", "kvwarden://" + long + "/tenant/t", "is 65 bytes, want 1 to 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := url.Parse(tt.uri)
			if err != nil {
				t.Fatalf("url.Parse(%q): %v", tt.uri, err)
			}
			id, err := trust.ParseIdentity(u)
			if err == nil {
				t.Fatalf("ParseIdentity(%s) = %+v, want a refusal", tt.uri, id)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ParseIdentity(%s) = %q, want it to say %q", tt.uri, err, tt.want)
			}
		})
	}
}

func TestRoleKinds(t *testing.T) {
	tests := []struct {
		role                    trust.Role
		node, prefills, decodes bool
	}{
		{trust.RolePrefill, true, true, false},
		{trust.RoleDecode, true, false, true},
		{trust.RoleRouter, true, false, false},
		{trust.RoleAll, true, true, true},
		{trust.RoleOperator, false, false, false},
		{trust.RoleTenant, false, false, false},
	}
	for _, tt := range tests {
		if tt.role.IsNode() != tt.node || tt.role.Prefills() != tt.prefills || tt.role.Decodes() != tt.decodes {
			t.Errorf("%s: IsNode %v Prefills %v Decodes %v, want %v %v %v", tt.role, tt.role.IsNode(),
				tt.role.Prefills(), tt.role.Decodes(), tt.node, tt.prefills, tt.decodes)
		}
	}
	if _, err := trust.ParseRole("admin"); err == nil || !strings.Contains(err.Error(), `unknown role "admin"`) {
		t.Fatalf("ParseRole(admin) = %v", err)
	}
}
