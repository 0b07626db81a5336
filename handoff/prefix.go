package handoff

import (
	"errors"
	"fmt"

	"github.com/kvwarden/kvwarden/kv"
)

// CachePages is Pages with the calls of cached pages (kv.CachedPage): a
// worker's pool whose full prompt pages outlive their request as a prefix
// cache (a prefill worker's, once decode has them; a decode worker's, once
// the request is answered).
type CachePages interface {
	Pages
	LeaseShared(c kv.CachedPage, reader kv.Owner, scope kv.Scope) (kv.Lease, error)
	// AckPublish acknowledges a source page and, when that would free it,
	// publishes it under scope instead (kv.Page.AckPublish): the zero
	// CachedPage says it was only acknowledged.
	AckPublish(tag kv.Tag, owner kv.Owner, scope kv.Scope) (kv.CachedPage, error)
	// Publish turns a full sealed page owner holds, never sent, into a
	// cached page of scope (kv.Page.Publish).
	Publish(tag kv.Tag, owner kv.Owner, scope kv.Scope) (kv.CachedPage, error)
	Evict(c kv.CachedPage) error
}

// PrefixCache is one worker's cache of prompt prefixes: the index
// of the cached pages of its pool (kv.PrefixIndex), keyed by a chain that
// starts from the request's scope, the model and the KV geometry, and the
// counts operators see. The scope of a plan is its tenant's, from the
// node's tenants policy (ScopeOf), narrowed by the plan's cache salt; a
// plan's own words never widen it.
type PrefixCache struct {
	index   *kv.PrefixIndex
	model   string
	scopeOf func(tenant, salt string) kv.Scope
	stats   PrefixStats
}

// PrefixStats counts a prefix cache's work since it started.
type PrefixStats struct {
	// Queries counts prefills that looked the cache up; QueryTokens the
	// prompt tokens they could have found (their cacheable pages'), and
	// HitTokens those found.
	Queries, QueryTokens, HitTokens uint64
	// Published counts pages kept in the cache; Evicted those given up
	// to make room; Gone those found in the index whose lease was
	// refused (evicted or reclaimed under the index), a miss.
	Published, Evicted, Gone uint64
	// Pages is how many pages the cache holds now, of PagesMax.
	Pages, PagesMax int
}

// NewPrefixCache is an empty cache of at most pagesMax pages for the model
// of fingerprint model, scoping each plan's tenant and salt by scopeOf.
func NewPrefixCache(pagesMax int, model string, scopeOf func(tenant, salt string) kv.Scope) (*PrefixCache, error) {
	index, err := kv.NewPrefixIndex(pagesMax)
	if err != nil {
		return nil, err
	}
	return &PrefixCache{index: index, model: model, scopeOf: scopeOf}, nil
}

// Stats are the cache's counts as of now.
func (c *PrefixCache) Stats() PrefixStats {
	s := c.stats
	s.Pages, s.PagesMax = c.index.Len(), c.index.PagesMax()
	return s
}

// RecentKeys are the keys of at most n pages the cache holds, the most
// recently used first (kv.PrefixIndex.RecentKeys).
func (c *PrefixCache) RecentKeys(n int) []kv.PrefixKey { return c.index.RecentKeys(n) }

// PromptKeys are the keys of prompt's cacheable pages (kv.PrefixKeys) in
// scope, for the model of fingerprint model over pages of geometry g: the
// keys a prefill worker's cache holds them under, and a router or
// dispatcher sends them by (PrefixAffinity).
func PromptKeys(scope kv.Scope, model string, g kv.Geometry, prompt []int) ([]kv.PrefixKey, error) {
	root, err := kv.PrefixRoot(scope, model, g)
	if err != nil {
		return nil, err
	}
	return kv.PrefixKeys(root, prompt, g.PageTokens), nil
}

// lookup finds the longest cached run of prompt's first full pages in
// scope and leases each for reader (leaseRun). It returns the leases and
// the pages leased, in order, and every cacheable page's key.
func (c *PrefixCache) lookup(p CachePages, scope kv.Scope, reader kv.Owner, prompt []int) ([]kv.Lease, []kv.CachedPage, []kv.PrefixKey, error) {
	hits, keys, err := c.match(p.Geometry(), scope, prompt)
	if err != nil {
		return nil, nil, nil, err
	}
	leases := leaseRun(p, hits, reader, scope, func(hit kv.CachedPage) { c.forget(p, hit) })
	c.stats.HitTokens += uint64(len(leases) * p.Geometry().PageTokens)
	return leases, hits[:len(leases)], keys, nil
}

// match is the cached run of prompt's first full pages in scope, as the
// index has it, and every cacheable page's key; the run's pages are
// stamped as used.
func (c *PrefixCache) match(g kv.Geometry, scope kv.Scope, prompt []int) ([]kv.CachedPage, []kv.PrefixKey, error) {
	keys, err := PromptKeys(scope, c.model, g, prompt)
	if err != nil {
		return nil, nil, err
	}
	c.stats.Queries++
	c.stats.QueryTokens += uint64(len(keys) * g.PageTokens)
	return c.index.Match(keys), keys, nil
}

// forget evicts a cached page whose lease was refused (gone, refused as
// corrupt, or unanswered: a lease granted late is then held by nobody) and
// drops it from the index: it is freed at once or at the reclaim deadline,
// never left cached with no index entry to evict it.
func (c *PrefixCache) forget(p CachePages, hit kv.CachedPage) {
	_ = p.Evict(hit)
	c.index.Remove(hit.Tag)
	c.stats.Gone++
}

// leaseRun leases each of hits for reader under the reader's scope (the
// one its credential gives, never the scope a hit names: a page the index
// got wrong is refused by the page), in order, stopping at the first that
// is not at its page's position or whose lease is refused, which gone
// hears of: a miss from there on, never a wrong page.
func leaseRun(p CachePages, hits []kv.CachedPage, reader kv.Owner, scope kv.Scope, gone func(kv.CachedPage)) []kv.Lease {
	pt := p.Geometry().PageTokens
	var leases []kv.Lease
	for i, hit := range hits {
		l, err := kv.Lease{}, error(&kv.ManifestError{Field: "cached page position", Page: i, Want: i * pt, Have: hit.First})
		if hit.First == i*pt {
			l, err = p.LeaseShared(hit, reader, scope)
		}
		if err != nil {
			gone(hit)
			break
		}
		leases = append(leases, l)
	}
	return leases
}

// evict gives up at most n pages last used before use, least recently
// used first (kv.PrefixIndex.VictimsBefore), and says how many; a page
// still leased is freed at its last unlease.
func (c *PrefixCache) evict(p CachePages, n int, use uint64) int {
	victims := c.index.VictimsBefore(n, use)
	for _, v := range victims {
		// A refusal means the page is gone already: either way it is
		// out of the index.
		_ = p.Evict(v)
		c.stats.Evicted++
	}
	return len(victims)
}

// ExecAckKeep carries out an Ack whose computed Chain pages the cache
// takes: each is published under the Ack's scope instead of freed (keep);
// every other page is acknowledged as ExecAck does.
func ExecAckKeep(p CachePages, c *PrefixCache, e Ack, refused func(kv.Tag, error)) {
	ack := func(t kv.Tag) { each("ack", p.Ack, e.Owner, []kv.Tag{t}, refused) }
	c.keep(p, e.Chain, e.Cached/p.Geometry().PageTokens, e.Tags, e.Scope, func(t kv.Tag) (kv.CachedPage, error) {
		cached, err := p.AckPublish(t, e.Owner, e.Scope)
		if err != nil {
			OwnsOrPanic(err, "ack", t, e.Owner)
			if refused != nil {
				refused(t, err)
			}
		}
		return cached, err
	}, ack)
}

// ExecKeep carries out a Keep on a decode pool: the full pages of the
// prompt are offered to the cache under the Keep's scope (the one the
// cache's policy gave the request when it reserved, so a policy reloaded
// since changes nothing), and published (keep); every other page, and one
// the cache does not take, is released as ExecRelease does. A page still
// leased (a decode job that has not closed its sequence yet: its worker
// carries the Keep out after the step that closed it) is released, not
// kept: freed at its last unlease.
func ExecKeep(p CachePages, c *PrefixCache, e Keep, refused func(kv.Tag, error)) {
	release := func(t kv.Tag) { each("release", p.Release, e.Owner, []kv.Tag{t}, refused) }
	keys, err := PromptKeys(e.Scope, c.model, p.Geometry(), e.Tokens)
	if err != nil {
		keys = nil // no scope (the cache did not answer the reservation): nothing is kept
	}
	c.keep(p, keys, 0, e.Tags, e.Scope, publishOrRelease(p, e.Owner, e.Scope, release), release)
}

// publishOrRelease publishes a page owner holds, never sent, under scope
// (for keep), and releases one the page refuses to publish: still the
// owner's (leased, say), it is freed as it would have been.
func publishOrRelease(p CachePages, owner kv.Owner, scope kv.Scope, release func(kv.Tag)) func(kv.Tag) (kv.CachedPage, error) {
	return func(t kv.Tag) (kv.CachedPage, error) {
		cached, err := p.Publish(t, owner, scope)
		if err != nil {
			release(t)
		}
		return cached, err
	}
}

// keep offers the cache tags[i] under keys[i], in prompt order, from page
// from on: each is published (publish, which reports its own refusal)
// unless the cache already holds its key (another request of the same
// prefix published first) or has no room left but what its own prompt's
// pages take (a child is never kept by giving up its parent: the chain is
// stamped as used first, and only pages used before it are given up);
// otherwise has every other page.
func (c *PrefixCache) keep(p CachePages, keys []kv.PrefixKey, from int, tags []kv.Tag, scope kv.Scope,
	publish func(kv.Tag) (kv.CachedPage, error), otherwise func(kv.Tag)) {
	c.index.Match(keys)
	use, full := c.index.Uses(), false
	for i, t := range tags {
		ok := i >= from && i < len(keys)
		var key kv.PrefixKey
		if ok {
			key = keys[i]
		}
		if ok && !full && !c.index.Has(key) && c.index.Room() == 0 {
			full = c.evict(p, 1, use) == 0
		}
		if !ok || full || c.index.Has(key) {
			otherwise(t)
			continue
		}
		cached, err := publish(t)
		if err != nil && !errors.Is(err, kv.ErrRefused) {
			// Unanswered: the page may yet be published, under the tag
			// that follows its own, with no index entry; evicted now,
			// it cannot stay cached for nobody (the eviction is refused
			// if it was not published).
			next := t
			next.Generation++
			_ = p.Evict(kv.CachedPage{Tag: next, Scope: scope})
		}
		if err != nil || cached.Tag == (kv.Tag{}) {
			continue // refused, or acknowledged and freed, or still leased: not kept
		}
		if err := c.index.Add(key, cached); err != nil {
			panic(fmt.Sprintf("handoff: page %s published under key %x and refused by the index: %v", cached.Tag, key, err))
		}
		c.stats.Published++
	}
}

// reserveEvicting reserves n pages for owner from position 0, and when the
// pool is too full gives up as many cached pages as are missing (least
// recently used first, none of those the prefill's lookup, at use, read
// or passed) and tries once more. A tenant held to its share of the pool
// gives nothing up: another scope's cached pages would not make room for
// it.
func (c *PrefixCache) reserveEvicting(p CachePages, owner kv.Owner, n int, use uint64) ([]kv.Tag, error) {
	tags, err := p.Reserve(owner, 0, n)
	if short, ok := evictable(err); !ok || c.evict(p, short, use) == 0 {
		return tags, err
	}
	return p.Reserve(owner, 0, n)
}

// evictable says how many cached pages a reservation refused with err
// lacks, if giving them up could make room for it: not for a tenant held
// to its share of the pool, which another scope's pages would not change.
func evictable(err error) (int, bool) {
	var full *kv.PoolExhaustedError
	if !errors.As(err, &full) || full.Share > 0 && full.Held+full.Need > full.Share {
		return 0, false
	}
	return full.Need - full.Free, true
}
