package handoff

import "github.com/kvwarden/kvwarden/kv"

// HeldCache is a decode pool's prefix cache as a request reserves through
// it: the index is its worker's (asked by message on a node), while the
// request leases the pages it finds and copies them itself, so that a
// cache that does not answer costs a miss and never strands a page.
type HeldCache interface {
	// Match is the cached run of prompt's first full pages in the scope
	// of tenant narrowed by salt, as the index has it, that scope (the
	// cache's policy's, from the tenant the request's credential named),
	// and the index's use stamp after it. A scope that cannot key is zero,
	// with no hits.
	Match(tenant, salt string, prompt []int) (hits []kv.CachedPage, scope kv.Scope, use uint64)
	// Forget evicts a page of a Match whose lease was refused, or whose
	// rows the request's prefill did not confirm (Unhold), and drops it
	// from the index.
	Forget(hit kv.CachedPage)
	// Evict gives up at most n pages last used before use, least
	// recently used first, and says how many.
	Evict(n int, use uint64) int
	// Read counts the pages of a Match a request copied (the cache's
	// hit tokens).
	Read(pages int)
}

// LocalCache is a HeldCache whose index and pool are in the caller's
// hands: the worker that keeps the cache, or a simulation.
type LocalCache struct {
	Pages CachePages
	Cache *PrefixCache
}

// Match looks the prompt up under the scope the cache's policy gives the
// tenant and salt; a scope that cannot key is a miss.
func (l LocalCache) Match(tenant, salt string, prompt []int) ([]kv.CachedPage, kv.Scope, uint64) {
	c := l.Cache
	scope := c.scopeOf(tenant, salt)
	hits, _, err := c.match(l.Pages.Geometry(), scope, prompt)
	if err != nil {
		return nil, kv.Scope{}, c.index.Uses()
	}
	return hits, scope, c.index.Uses()
}

// Read counts pages copied pages' tokens as hit.
func (l LocalCache) Read(pages int) {
	l.Cache.stats.HitTokens += uint64(pages * l.Pages.Geometry().PageTokens)
}

// Forget evicts hit and drops it from the index.
func (l LocalCache) Forget(hit kv.CachedPage) { l.Cache.forget(l.Pages, hit) }

// Evict gives up at most n pages last used before use.
func (l LocalCache) Evict(n int, use uint64) int { return l.Cache.evict(l.Pages, n, use) }

// ExecReserveHeld carries out a Reserve on a decode pool with a prefix
// cache: the longest run of the prompt's first full pages the cache holds
// in the request's scope is leased (leaseRun), the request's pages are
// reserved as ExecReserve does (giving up as many cached pages as the
// pool lacks, none of those leased, when a tenant is not held to its share
// of the pool), and the bytes of each page leased are copied into the
// request's own page at its position, unsealed. Reserved.Held names where
// each copy came from: the request seals a copy only if its bytes hash to
// the cached page's checksum (kv.Page.SealFrom) and its rows are those
// prefill computed (TransferDone.HeldSums), and asks prefill for the
// other pages only. A page that cannot be read or written ends the run
// there: a miss from that page on, never a wrong page.
func ExecReserveHeld(p CachePages, c HeldCache, e Reserve) Reserved {
	hits, scope, use := c.Match(e.Owner.Tenant, e.Salt, e.Tokens)
	leases := leaseRun(p, hits, e.Owner, scope, c.Forget)
	defer func() {
		for _, l := range leases {
			// A lease refused back was reclaimed: the page is not this
			// request's to count.
			_ = p.Unlease(l)
		}
	}()
	r := ExecReserve(p, e)
	if short, ok := evictable(r.Err); ok && c.Evict(short, use) > 0 {
		r = ExecReserve(p, e)
	}
	if r.Err != nil {
		return r
	}
	pt := p.Geometry().PageTokens
	for i, l := range leases {
		b, _, err := p.Read(l)
		if err == nil {
			// A cached page is never written, and the lease keeps it until
			// the copy is made: its bytes need no copy of their own.
			err = p.WriteOwned(r.Dest[i], e.Owner, i*pt, b)
		}
		if err != nil {
			break
		}
		r.Held = append(r.Held, hits[i])
	}
	r.Scope = scope
	if len(r.Held) > 0 {
		c.Read(len(r.Held))
	}
	return r
}
