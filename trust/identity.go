package trust

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
)

// Role is what an identity may do in a cluster. Node roles match the
// roles a node runs (actors.Role); operators and tenants are people and
// programs outside the cluster.
type Role string

const (
	RolePrefill  Role = "prefill"
	RoleDecode   Role = "decode"
	RoleRouter   Role = "router"
	RoleAll      Role = "all"
	RoleOperator Role = "operator"
	RoleTenant   Role = "tenant"
)

// Scheme is the URI scheme of every identity.
const Scheme = "kvwarden"

// NameBytesMax bounds a cluster, node or tenant name, in bytes: a tenant
// name must fit messages' tenant field.
const NameBytesMax = 64

// ParseRole reads a role name.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case RolePrefill, RoleDecode, RoleRouter, RoleAll, RoleOperator, RoleTenant:
		return r, nil
	}
	return "", fmt.Errorf("trust: unknown role %q (want prefill, decode, router, all, operator or tenant)", s)
}

// IsNode says whether the role is one a cluster node runs.
func (r Role) IsNode() bool {
	return r == RolePrefill || r == RoleDecode || r == RoleRouter || r == RoleAll
}

// IsCluster says whether the role is the cluster's own, a node's or an
// operator's, rather than a tenant's: its traffic keeps a reserved share
// of what strangers and tenants compete for.
func (r Role) IsCluster() bool { return r.IsNode() || r == RoleOperator }

// Prefills and Decodes say whether a node of the role runs workers of
// each kind.
func (r Role) Prefills() bool { return r == RolePrefill || r == RoleAll }
func (r Role) Decodes() bool  { return r == RoleDecode || r == RoleAll }

// Identity is who a certificate says its holder is: kvwarden://<cluster>/
// <role>/<name>. For a tenant's client the name is the tenant.
type Identity struct {
	Cluster string
	Role    Role
	Name    string
}

// URI is the identity as a certificate's URI SAN carries it.
func (id Identity) URI() string {
	return Scheme + "://" + id.Cluster + "/" + string(id.Role) + "/" + id.Name
}

func (id Identity) String() string { return id.URI() }

// IsZero says whether the identity names nobody.
func (id Identity) IsZero() bool { return id == Identity{} }

// Validate refuses an identity that would not survive a URI round trip.
func (id Identity) Validate() error {
	if _, err := ParseRole(string(id.Role)); err != nil {
		return err
	}
	for _, f := range []struct{ what, v string }{{"cluster", id.Cluster}, {"name", id.Name}} {
		if err := checkName(f.what, f.v); err != nil {
			return err
		}
	}
	return nil
}

// checkName allows letters, digits and . _ -, 1 to NameBytesMax bytes.
func checkName(what, v string) error {
	if len(v) < 1 || len(v) > NameBytesMax {
		return fmt.Errorf("trust: %s %q is %d bytes, want 1 to %d", what, v, len(v), NameBytesMax)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-", c) >= 0) {
			return fmt.Errorf("trust: %s %q has %q at byte %d (allowed: letters, digits, . _ -)", what, v, c, i)
		}
	}
	return nil
}

// ParseIdentity reads kvwarden://<cluster>/<role>/<name>.
func ParseIdentity(u *url.URL) (Identity, error) {
	if u.Scheme != Scheme {
		return Identity{}, fmt.Errorf("trust: identity %q: scheme %q, want %q", u, u.Scheme, Scheme)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 2 || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return Identity{}, fmt.Errorf("trust: identity %q: want %s://<cluster>/<role>/<name>", u, Scheme)
	}
	id := Identity{Cluster: u.Host, Role: Role(parts[0]), Name: parts[1]}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("trust: identity %q: %w", u, err)
	}
	return id, nil
}

// SecretName is a fresh actor name no one can guess: 128 random bits. A
// request's actors get one, so that reaching them takes having been told
// their name.
func SecretName() string {
	var b [16]byte
	if _, err := crand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("trust: the system's random source failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}
