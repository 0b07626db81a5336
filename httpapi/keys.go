package httpapi

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/kvwarden/kvwarden/internal/atomicfile"
	"github.com/kvwarden/kvwarden/internal/boundedread"
	"github.com/kvwarden/kvwarden/messages"
)

// Bounds of an API keys file, checked as it is read.
const (
	// KeysFileBytesMax bounds the file's size in bytes.
	KeysFileBytesMax = 4 << 20
	// KeysMax bounds its keys.
	KeysMax = 10_000
	// KeyBytesMax bounds a key as a client presents it, in bytes.
	KeyBytesMax = 256
	// KeyNameBytesMax bounds a key's name (what logs say instead of it).
	KeyNameBytesMax = 64
	// KeyModelsMax bounds the models one key may be restricted to.
	KeyModelsMax = 64
)

// KeyPrefix starts every key NewKey makes, so that a key pasted where it
// should not be is recognisable (secret scanners match on it).
const KeyPrefix = "kvw-"

// KeysFile is the file of API keys a node accepts: JSON, only each key's
// SHA-256 stored, never the key.
//
//	{
//	  "keys": [
//	    {"name": "acme-ci", "tenant": "acme", "sha256": "9f86d0…", "models": ["stories260K"]}
//	  ]
//	}
//
// A key's requests run as its tenant, whatever a request says, held to the
// tenant's share (package tenancy, node run --tenants) like a request
// whose certificate names the tenant. "models", when present, is the only
// models the key may use (by name or fingerprint).
type KeysFile struct {
	Keys []KeyEntry `json:"keys"`
}

// KeyEntry is one key.
type KeyEntry struct {
	// Name identifies the key in logs and errors, unique in the file.
	Name string `json:"name"`
	// Tenant is who the key's requests run as.
	Tenant string `json:"tenant"`
	// SHA256 is the hex SHA-256 of the key's bytes (HashKey).
	SHA256 string `json:"sha256"`
	// Models, if not empty, are the only models the key may use.
	Models []string `json:"models,omitempty"`
}

// HashKey is what a keys file stores for key: its SHA-256 in hex, as
// `printf %s "$KEY" | sha256sum` prints it. A key is 32 random bytes, so a
// plain hash suffices: there is no dictionary to guess from.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// NewKey makes a key: KeyPrefix and 32 random bytes, base64url.
func NewKey() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("httpapi: making a key: %w", err)
	}
	return KeyPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// KeysFileError is a keys file that cannot be used: where and why.
type KeysFileError struct {
	Path string
	// Key is the index of the key entry at fault, -1 when none.
	Key    int
	Reason string
}

func (e *KeysFileError) Error() string {
	if e.Key >= 0 {
		return fmt.Sprintf("httpapi: keys file %s: key %d: %s", e.Path, e.Key, e.Reason)
	}
	return fmt.Sprintf("httpapi: keys file %s: %s", e.Path, e.Reason)
}

// ParseKeysFile reads and checks a keys file's content; path is for
// errors only.
func ParseKeysFile(path string, data []byte) (*KeysFile, error) {
	bad := func(key int, format string, args ...any) error {
		return &KeysFileError{Path: path, Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	if len(data) > KeysFileBytesMax {
		return nil, bad(-1, "%d bytes, at most %d", len(data), KeysFileBytesMax)
	}
	var f KeysFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		if strings.Contains(err.Error(), `unknown field "tenants"`) {
			return nil, bad(-1, "tenants' limits are no longer in the keys file: move its \"tenants\" section to the tenants' shares file "+
				"(node run --tenants; the same concurrent_max, with weight and pages_max), which holds every tenant's requests, by key or by certificate")
		}
		return nil, bad(-1, "%v (at byte %d)", err, dec.InputOffset())
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bad(-1, "more after the JSON object (at byte %d)", dec.InputOffset())
	}
	if len(f.Keys) > KeysMax {
		return nil, bad(-1, "%d keys, at most %d", len(f.Keys), KeysMax)
	}
	names, hashes := map[string]int{}, map[string]int{}
	for i, k := range f.Keys {
		switch {
		case k.Name == "" || len(k.Name) > KeyNameBytesMax:
			return nil, bad(i, "name of %d bytes, want 1 to %d", len(k.Name), KeyNameBytesMax)
		case strings.ContainsFunc(k.Name, func(r rune) bool { return r < 0x21 || r > 0x7e }):
			return nil, bad(i, "name %q: want visible ASCII", k.Name)
		case len(k.SHA256) != 2*sha256.Size || strings.ToLower(k.SHA256) != k.SHA256:
			return nil, bad(i, "sha256 of %d characters, want %d lower-case hex digits", len(k.SHA256), 2*sha256.Size)
		case len(k.Models) > KeyModelsMax:
			return nil, bad(i, "%d models, at most %d", len(k.Models), KeyModelsMax)
		}
		if _, err := hex.DecodeString(k.SHA256); err != nil {
			return nil, bad(i, "sha256: %v", err)
		}
		if err := messages.CheckTenant(k.Tenant); err != nil {
			return nil, bad(i, "tenant: %v", err)
		}
		if j, ok := names[k.Name]; ok {
			return nil, bad(i, "name %q is key %d's too", k.Name, j)
		}
		if j, ok := hashes[k.SHA256]; ok {
			return nil, bad(i, "the same key as key %d (%q)", j, f.Keys[j].Name)
		}
		names[k.Name], hashes[k.SHA256] = i, i
	}
	return &f, nil
}

// Key is what an accepted key grants.
type Key struct {
	Name, Tenant string
	models       []string
}

// MayUse says whether the key may use the model of name or fingerprint.
func (k Key) MayUse(name, fingerprint string) bool {
	return len(k.models) == 0 || slices.Contains(k.models, name) || slices.Contains(k.models, fingerprint)
}

// keySet is one reading of the keys file.
type keySet struct {
	byHash map[[sha256.Size]byte]Key
}

// Keys are the API keys a node accepts, read from a keys file and read
// again on Reload (SIGHUP). Safe for concurrent use.
type Keys struct {
	path string
	set  atomic.Pointer[keySet]
}

// LoadKeys reads the keys file at path.
func LoadKeys(path string) (*Keys, error) {
	k := &Keys{path: path}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Path is the keys file's path.
func (k *Keys) Path() string { return k.path }

// Reload reads the keys file again. On any error the keys in use stay as
// they were: a broken edit never locks every client out.
func (k *Keys) Reload() error {
	data, err := boundedread.File(k.path, KeysFileBytesMax)
	if err != nil {
		return &KeysFileError{Path: k.path, Key: -1, Reason: err.Error()}
	}
	f, err := ParseKeysFile(k.path, data)
	if err != nil {
		return err
	}
	s := &keySet{byHash: make(map[[sha256.Size]byte]Key, len(f.Keys))}
	for _, e := range f.Keys {
		var h [sha256.Size]byte
		hex.Decode(h[:], []byte(e.SHA256)) // checked by ParseKeysFile
		s.byHash[h] = Key{Name: e.Name, Tenant: e.Tenant, models: e.Models}
	}
	k.set.Store(s)
	return nil
}

// Len is how many keys are in use.
func (k *Keys) Len() int { return len(k.set.Load().byHash) }

// Authentication failures, answered with 401.
var (
	errNoKey  = errors.New("no API key: send the header Authorization: Bearer <key>")
	errBadKey = errors.New("API key not accepted")
)

// Authenticate is the key of an Authorization header's bearer key.
func (k *Keys) Authenticate(header string) (Key, error) {
	scheme, key, ok := strings.Cut(header, " ")
	if header == "" {
		return Key{}, errNoKey
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Key{}, fmt.Errorf("the Authorization header's scheme is not Bearer: %w", errNoKey)
	}
	key = strings.TrimSpace(key)
	if key == "" || len(key) > KeyBytesMax {
		return Key{}, fmt.Errorf("a key of %d bytes (want 1 to %d): %w", len(key), KeyBytesMax, errBadKey)
	}
	got, ok := k.set.Load().byHash[sha256.Sum256([]byte(key))]
	if !ok {
		return Key{}, errBadKey
	}
	return got, nil
}

// AddKey adds e to the keys file at path, making the file if there is
// none. An e without a name is named
// after its tenant: the tenant's name for its first key, then tenant-2,
// tenant-3, … as it gets more. The file is checked as a node would read it
// and replaced at once (write and rename), mode 0600: a running node sees
// the old file or the new, whole.
func AddKey(path string, e KeyEntry) error {
	var f KeysFile
	data, err := boundedread.File(path, KeysFileBytesMax)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return &KeysFileError{Path: path, Key: -1, Reason: err.Error()}
	default:
		old, err := ParseKeysFile(path, data)
		if err != nil {
			return err
		}
		f = *old
	}
	if i := slices.IndexFunc(f.Keys, func(k KeyEntry) bool { return k.Name == e.Name }); i >= 0 {
		return &KeysFileError{Path: path, Key: i, Reason: fmt.Sprintf("is named %q already: give the new key another name, "+
			"or none to have it named after its tenant (%s, %s-2, …)", e.Name, e.Tenant, e.Tenant)}
	}
	if e.Name == "" {
		e.Name = freeName(f.Keys, e.Tenant)
	}
	f.Keys = append(f.Keys, e)
	out, err := json.MarshalIndent(&f, "", "  ")
	if err != nil {
		return err
	}
	out = append(out, '\n')
	if _, err := ParseKeysFile(path, out); err != nil {
		return err
	}
	return atomicfile.Write(path, out, 0o600)
}

// freeName is the first of tenant, tenant-2, tenant-3, … that no key in
// keys is named, the tenant's name cut where a suffix would make it longer
// than KeyNameBytesMax.
func freeName(keys []KeyEntry, tenant string) string {
	taken := make(map[string]bool, len(keys))
	for _, k := range keys {
		taken[k.Name] = true
	}
	name := tenant
	for i := 2; taken[name]; i++ {
		suffix := fmt.Sprintf("-%d", i)
		name = tenant[:min(len(tenant), KeyNameBytesMax-len(suffix))] + suffix
	}
	return name
}
