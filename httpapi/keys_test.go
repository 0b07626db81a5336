package httpapi

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseKeysFile: a bad file is refused naming the key and what is
// wrong, before any key of it is used.
func TestParseKeysFile(t *testing.T) {
	h := HashKey("k")
	for _, tc := range []struct{ file, want string }{
		{`{"keys":[{"name":"a","tenant":"acme","sha256":"` + h + `"}]}`, ""},
		{`{"keys":[{"name":"a","tenant":"acme","sha256":"` + h + `","extra":1}]}`, `unknown field "extra"`},
		{`{"keys":[{"name":"a","tenant":"ac me","sha256":"` + h + `"}]}`, "key 0: tenant: "},
		{`{"keys":[{"name":"a","tenant":"acme","sha256":"abc"}]}`, "key 0: sha256 of 3 characters, want 64"},
		{`{"keys":[{"name":"a","tenant":"acme","sha256":"` + strings.ToUpper(h) + `"}]}`, "lower-case hex"},
		{`{"keys":[{"name":"a","tenant":"acme","sha256":"` + h + `"},{"name":"a","tenant":"b","sha256":"` + HashKey("j") + `"}]}`,
			`key 1: name "a" is key 0's too`},
		{`{"keys":[{"name":"a","tenant":"acme","sha256":"` + h + `"},{"name":"b","tenant":"b","sha256":"` + h + `"}]}`,
			`key 1: the same key as key 0`},
		{`{"tenants":{"acme":{"concurrent_max":8}},"keys":[]}`, `move its "tenants" section to the tenants' shares file (node run --tenants`},
		{`{"keys":[]} {}`, "more after the JSON object"},
		{`{"keys":[{"name":"","tenant":"acme","sha256":"` + h + `"}]}`, "key 0: name of 0 bytes"},
	} {
		_, err := ParseKeysFile("f", []byte(tc.file))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.file, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", tc.file, err, tc.want)
		}
	}
	if _, err := ParseKeysFile("f", make([]byte, KeysFileBytesMax+1)); err == nil || !strings.Contains(err.Error(), "4194305 bytes, at most 4194304") {
		t.Errorf("a file over the bound: %v", err)
	}
}

// TestAuthenticate: only a listed key in a Bearer header is accepted, as
// its tenant.
func TestAuthenticate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	if err := AddKey(path, KeyEntry{Name: "a", Tenant: "acme", SHA256: HashKey("kvw-a")}); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("keys file mode %v (%v), want 0600", info.Mode(), err)
	}
	k, err := LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	for header, want := range map[string]error{"": errNoKey, "Basic kvw-a": errNoKey, "Bearer kvw-b": errBadKey,
		"Bearer " + strings.Repeat("x", KeyBytesMax+1): errBadKey} {
		if _, err := k.Authenticate(header); !errors.Is(err, want) {
			t.Errorf("%.20q: %v, want %v", header, err, want)
		}
	}
	key, err := k.Authenticate("bearer kvw-a")
	if err != nil || key.Tenant != "acme" || key.Name != "a" {
		t.Fatalf("the listed key: %+v, %v", key, err)
	}
}

// TestAddKeyNames: a tenant's keys made without a name are named after it,
// one name each, and every one authenticates as that tenant; a name given
// that another key has is refused, naming that key, and the file stays as
// it was.
func TestAddKeyNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	for _, key := range []string{"kvw-1", "kvw-2", "kvw-3"} {
		if err := AddKey(path, KeyEntry{Tenant: "acme", SHA256: HashKey(key)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := AddKey(path, KeyEntry{Tenant: "globex", SHA256: HashKey("kvw-g")}); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	err = AddKey(path, KeyEntry{Name: "acme-2", Tenant: "globex", SHA256: HashKey("kvw-4")})
	var kerr *KeysFileError
	if !errors.As(err, &kerr) || kerr.Key != 1 || !strings.Contains(err.Error(), `named "acme-2" already`) {
		t.Fatalf("a taken name: %v, want refused naming key 1", err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Fatal("a refused key changed the file")
	}
	k, err := LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]KeyEntry{"kvw-1": {Name: "acme", Tenant: "acme"}, "kvw-2": {Name: "acme-2", Tenant: "acme"},
		"kvw-3": {Name: "acme-3", Tenant: "acme"}, "kvw-g": {Name: "globex", Tenant: "globex"}} {
		got, err := k.Authenticate("Bearer " + key)
		if err != nil || got.Name != want.Name || got.Tenant != want.Tenant {
			t.Errorf("%s: %+v, %v; want name %s of tenant %s", key, got, err, want.Name, want.Tenant)
		}
	}
}

// TestAddKeyNamesOfALongTenant: the second key of a tenant whose name is
// as long as a key's name may be is named within that bound.
func TestAddKeyNamesOfALongTenant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	tenant := strings.Repeat("t", KeyNameBytesMax)
	for i, key := range []string{"kvw-1", "kvw-2"} {
		if err := AddKey(path, KeyEntry{Tenant: tenant, SHA256: HashKey(key)}); err != nil {
			t.Fatalf("key %d of a tenant of %d bytes: %v", i+1, len(tenant), err)
		}
	}
	k, err := LoadKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k.Authenticate("Bearer kvw-2"); err != nil || got.Name != tenant[:KeyNameBytesMax-2]+"-2" {
		t.Fatalf("the second key: %+v, %v", got, err)
	}
}
