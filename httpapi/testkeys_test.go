package httpapi

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvwarden/kvwarden/tenancy"
)

// The keys of the API tests: acme's, two of a limited tenant (one request
// at a time, writeTenants) and a key restricted to another model.
const (
	keyAcme       = "kvw-test-acme"
	keyLimited    = "kvw-test-limited"
	keyLimited2   = "kvw-test-limited-2"
	keyRestricted = "kvw-test-restricted"
)

// writeKeys writes the tests' keys file in dir.
func writeKeys(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "keys.json")
	for _, e := range []KeyEntry{
		{Name: "acme", Tenant: "acme", SHA256: HashKey(keyAcme)},
		{Name: "limited", Tenant: "limited", SHA256: HashKey(keyLimited)},
		{Name: "limited-2", Tenant: "limited", SHA256: HashKey(keyLimited2)},
		{Name: "restricted", Tenant: "acme", SHA256: HashKey(keyRestricted), Models: []string{"another-model"}},
	} {
		if err := AddKey(path, e); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// limitedPolicy is the tests' tenants' shares: the limited tenant has one
// request in flight at a time, over all its keys.
const limitedPolicy = `{"tenants": {"limited": {"concurrent_max": 1}}}`

// writeTenants writes policy as the tenants' shares file in dir and loads
// it.
func writeTenants(t testing.TB, dir, policy string) *tenancy.Shares {
	t.Helper()
	path := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := tenancy.LoadShares(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
