package httpapi

import (
	"path/filepath"
	"testing"
)

// The keys of the API tests: acme's, a limited tenant's (one request at a
// time) and a key restricted to another model.
const (
	keyAcme       = "kvw-test-acme"
	keyLimited    = "kvw-test-limited"
	keyRestricted = "kvw-test-restricted"
)

// writeKeys writes the tests' keys file in dir.
func writeKeys(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "keys.json")
	for _, k := range []struct {
		e      KeyEntry
		limits *TenantLimits
	}{
		{KeyEntry{Name: "acme", Tenant: "acme", SHA256: HashKey(keyAcme)}, nil},
		{KeyEntry{Name: "limited", Tenant: "limited", SHA256: HashKey(keyLimited)}, &TenantLimits{ConcurrentMax: 1}},
		{KeyEntry{Name: "restricted", Tenant: "acme", SHA256: HashKey(keyRestricted), Models: []string{"another-model"}}, nil},
	} {
		if err := AddKey(path, k.e, k.limits); err != nil {
			t.Fatal(err)
		}
	}
	return path
}
