// Package tenancy is how tenants share what they share: a policy of
// per-tenant shares (weight, concurrent requests, KV pages in flight) and
// a default for every tenant it does not name, read by routers and
// admission nodes alike; the ledger that holds each tenant to its bounds;
// and the weighted choice of which tenants' sequences a decode worker
// steps when it has more than it steps at once. A tenant is who its
// credential says (an API key's tenant or a certificate's name), never
// what a request claims. The package is a pure core: no goroutines, clock
// or I/O but reading a policy file.
package tenancy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/kvwarden/kvwarden/internal/boundedread"
	"github.com/kvwarden/kvwarden/internal/mutant"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// Bounds of a policy, checked as it is read.
const (
	// FileBytesMax bounds a policy file's size in bytes.
	FileBytesMax = 4 << 20
	// TenantsMax bounds the tenants a policy names.
	TenantsMax = 10_000
	// WeightMax bounds a tenant's weight.
	WeightMax = 1000
	// ConcurrentMax bounds a tenant's concurrent_max.
	ConcurrentMax = 1 << 16
	// PagesMax bounds a tenant's pages_max.
	PagesMax = 1 << 30
)

// Share is one tenant's part of what tenants share, at each admission
// point (a router, or a decode node that clients send to directly): each
// counts what passes through it.
type Share struct {
	// Weight is the tenant's part of a saturated decode worker's steps
	// relative to the other tenants it has sequences of: a tenant of
	// weight 2 is stepped twice as often as one of weight 1 while both
	// have sequences waiting. 1 to WeightMax.
	Weight int `json:"weight,omitempty"`
	// ConcurrentMax is the most requests of the tenant in flight at once,
	// 1 to ConcurrentMax; one more is refused "busy" naming this bound.
	ConcurrentMax int `json:"concurrent_max,omitempty"`
	// PagesMax is the most KV pages the tenant's requests in flight may
	// hold at most (handoff.RequestPages on the decode side), 1 to
	// PagesMax; 0 bounds them by ConcurrentMax and the pools only.
	PagesMax int `json:"pages_max,omitempty"`
	// PoolPercentMax is the most of any one KV pool the tenant's requests
	// may hold at once, in percent, 1 to 100, so that room is left for
	// other tenants' requests however long the tenant's run; a request
	// past it waits for pages as for a full pool (tenancy.PoolShares).
	PoolPercentMax int `json:"pool_percent_max,omitempty"`
	// CacheScope, for a named tenant, is the group whose cached prompt
	// prefixes the tenant shares: every tenant naming the same group
	// reads the KV pages the others' prompts left in the prefix cache,
	// and so can tell by timing what they sent (see Policy.CacheScope).
	// Empty, the tenant shares its cache with nobody. The default share
	// has none: a group is declared tenant by tenant.
	CacheScope string `json:"cache_scope,omitempty"`
}

// DefaultShare is the share of a tenant a policy does not name, when the
// policy says nothing of its own: weight 1, at most 64 requests in flight
// (a quarter of a node's default queue), at most three quarters of any
// pool, so that a tenant's long requests cannot keep the others out until
// they end.
func DefaultShare() Share { return Share{Weight: 1, ConcurrentMax: 64, PoolPercentMax: 75} }

// Policy is every tenant's share: those it names, and Default for the
// rest. A named tenant's field left out (zero) is Default's.
//
//	{
//	  "default": {"weight": 1, "concurrent_max": 16, "pool_percent_max": 50},
//	  "tenants": {
//	    "acme":   {"weight": 4, "concurrent_max": 128, "pages_max": 4096},
//	    "globex": {"weight": 2, "cache_scope": "globex-group"},
//	    "initech": {"cache_scope": "globex-group"}
//	  }
//	}
type Policy struct {
	Default Share            `json:"default"`
	Tenants map[string]Share `json:"tenants,omitempty"`
}

// DefaultPolicy names no tenant and gives every tenant DefaultShare.
func DefaultPolicy() *Policy { return &Policy{Default: DefaultShare()} }

// Of is tenant's share, every field filled.
func (p *Policy) Of(tenant string) Share {
	s, ok := p.Tenants[tenant]
	if !ok {
		return p.Default
	}
	if s.Weight == 0 {
		s.Weight = p.Default.Weight
	}
	if s.ConcurrentMax == 0 {
		s.ConcurrentMax = p.Default.ConcurrentMax
	}
	if s.PagesMax == 0 {
		s.PagesMax = p.Default.PagesMax
	}
	if s.PoolPercentMax == 0 {
		s.PoolPercentMax = p.Default.PoolPercentMax
	}
	return s
}

// CacheScope is the scope of tenant's cached prompt prefixes: the group
// its share names, or the tenant alone, narrowed by salt (a request's
// cache_salt or prompt_cache_key, which can only narrow it). tenant is the
// one its credential names; nothing a request says widens the scope.
func (p *Policy) CacheScope(tenant, salt string) kv.Scope {
	if mutant.Is(mutant.ScopeFromRequest) && salt != "" {
		return kv.SharedScope(salt) // the planted bug: the request's salt names the scope, whichever tenant sends it
	}
	scope := kv.TenantScope(tenant)
	if g := p.Tenants[tenant].CacheScope; g != "" {
		scope = kv.SharedScope(g)
	}
	return scope.Narrow(salt)
}

// Named are the tenants the policy names, sorted.
func (p *Policy) Named() []string { return slices.Sorted(maps.Keys(p.Tenants)) }

// PolicyError is a policy that cannot be used: where and why.
type PolicyError struct {
	Path string
	// Tenant is the tenant at fault; "default" for the default share,
	// empty for the file as a whole.
	Tenant string
	Reason string
	// Err is the cause when the file could not be read, else nil.
	Err error
}

// Unwrap is the cause, so that errors.Is(err, fs.ErrNotExist) holds of a
// missing file.
func (e *PolicyError) Unwrap() error { return e.Err }

func (e *PolicyError) Error() string {
	if e.Tenant != "" {
		return fmt.Sprintf("tenancy: policy %s: tenant %q: %s", e.Path, e.Tenant, e.Reason)
	}
	return fmt.Sprintf("tenancy: policy %s: %s", e.Path, e.Reason)
}

// Parse reads and checks a policy's JSON; path is for errors only. A
// default share left out is DefaultShare; a default share given must be
// whole (weight and concurrent_max), so that every tenant is bounded.
func Parse(path string, data []byte) (*Policy, error) {
	bad := func(tenant, format string, args ...any) error {
		return &PolicyError{Path: path, Tenant: tenant, Reason: fmt.Sprintf(format, args...)}
	}
	if len(data) > FileBytesMax {
		return nil, bad("", "%d bytes, at most %d", len(data), FileBytesMax)
	}
	var raw struct {
		Default *Share           `json:"default"`
		Tenants map[string]Share `json:"tenants"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, bad("", "%v (at byte %d)", err, dec.InputOffset())
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bad("", "more after the JSON object (at byte %d)", dec.InputOffset())
	}
	if len(raw.Tenants) > TenantsMax {
		return nil, bad("", "%d tenants, at most %d", len(raw.Tenants), TenantsMax)
	}
	p := &Policy{Default: DefaultShare(), Tenants: raw.Tenants}
	if raw.Default != nil {
		p.Default = *raw.Default
		if p.Default.Weight == 0 || p.Default.ConcurrentMax == 0 {
			return nil, bad("default", "weight %d and concurrent_max %d: the default share bounds every tenant the policy does not name, give both",
				p.Default.Weight, p.Default.ConcurrentMax)
		}
		if p.Default.PoolPercentMax == 0 {
			p.Default.PoolPercentMax = DefaultShare().PoolPercentMax
		}
	}
	if err := p.Default.check(); err != nil {
		return nil, bad("default", "%s", err)
	}
	if p.Default.CacheScope != "" {
		return nil, bad("default", "cache_scope %q: a shared cache scope is declared tenant by tenant, never for every tenant the policy does not name",
			p.Default.CacheScope)
	}
	for t, s := range p.Tenants {
		if err := messages.CheckTenant(t); err != nil {
			return nil, bad(t, "%v", err)
		}
		if err := s.check(); err != nil {
			return nil, bad(t, "%s", err)
		}
	}
	return p, nil
}

// check reports a field out of its range; zero is allowed (a named
// tenant's zero field is the default's, checked on its own).
func (s Share) check() error {
	switch {
	case s.Weight < 0 || s.Weight > WeightMax:
		return fmt.Errorf("weight %d, want 1 to %d", s.Weight, WeightMax)
	case s.ConcurrentMax < 0 || s.ConcurrentMax > ConcurrentMax:
		return fmt.Errorf("concurrent_max %d, want 1 to %d", s.ConcurrentMax, ConcurrentMax)
	case s.PagesMax < 0 || s.PagesMax > PagesMax:
		return fmt.Errorf("pages_max %d, want 0 (no bound of its own) or 1 to %d", s.PagesMax, PagesMax)
	case s.PoolPercentMax < 0 || s.PoolPercentMax > 100:
		return fmt.Errorf("pool_percent_max %d, want 1 to 100", s.PoolPercentMax)
	}
	if s.CacheScope != "" {
		if err := messages.CheckTenant(s.CacheScope); err != nil {
			return fmt.Errorf("cache_scope: %v", err)
		}
	}
	return nil
}

// Load reads the policy file at path.
func Load(path string) (*Policy, error) {
	data, err := boundedread.File(path, FileBytesMax)
	if err != nil {
		return nil, &PolicyError{Path: path, Reason: err.Error(), Err: err}
	}
	return Parse(path, data)
}

// Shares is the policy in force at a node, replaced whole when its file
// is read again (SIGHUP): everything that reads it sees the old policy or
// the new. A nil *Shares is DefaultPolicy. Safe for concurrent use.
type Shares struct {
	path   string
	policy atomic.Pointer[Policy]
}

// NewShares is p in force, with no file to read again.
func NewShares(p *Policy) *Shares {
	s := &Shares{}
	s.policy.Store(p)
	return s
}

// LoadShares is the policy of the file at path in force.
func LoadShares(path string) (*Shares, error) {
	s := &Shares{path: path}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Policy is the policy in force.
func (s *Shares) Policy() *Policy {
	if s == nil {
		return defaultPolicy
	}
	return s.policy.Load()
}

// defaultPolicy is a nil Shares' policy, never changed.
var defaultPolicy = DefaultPolicy()

// Path is the policy file's path, empty when there is none.
func (s *Shares) Path() string {
	if s == nil {
		return ""
	}
	return s.path
}

// Reload reads the policy file again; with none, it does nothing. On any
// error the policy in force stays: a broken edit never lifts every bound.
func (s *Shares) Reload() error {
	if s == nil || s.path == "" {
		return nil
	}
	p, err := Load(s.path)
	if err != nil {
		return err
	}
	s.policy.Store(p)
	return nil
}
