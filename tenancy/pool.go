package tenancy

import (
	"time"

	"github.com/kvwarden/kvwarden/kv"
)

// PoolShares is one KV pool's share of its pages among tenants. A tenant
// holds at most its share's PoolPercentMax of the pool, so that room is
// left for others however long its requests run; and while another tenant
// waits for pages (its reservation found too few free), a tenant already
// holding its weight's part of the pool, among the tenants holding or
// waiting for pages, is refused more until the waiters have theirs, so
// that a flood cannot keep the pool by taking every page freed. A request
// of a tenant that holds nothing else (no other request's pages) is held
// to the free pages only, so that none waits forever. Not safe for
// concurrent use: its pool actor calls it.
type PoolShares struct {
	capacity int
	// waitFor is how long a refused tenant counts as waiting: its requests
	// try again every ReserveRetry, so one not seen for a few retries has
	// stopped waiting.
	waitFor time.Duration
	held    map[string]int       // pages by tenant; no entry for none
	owned   map[kv.Owner]int     // pages by request; no entry for none
	waiting map[string]time.Time // tenants refused for want of pages, when last
}

// NewPoolShares is the shares of a pool of capacity pages whose waiters
// try again at least every retry.
func NewPoolShares(capacity int, retry time.Duration) *PoolShares {
	return &PoolShares{capacity: capacity, waitFor: 4 * retry, held: map[string]int{}, owned: map[kv.Owner]int{},
		waiting: map[string]time.Time{}}
}

// Reserve decides whether owner may take n pages at now, under policy p,
// free being free in the pool: it answers how many pages the tenant may
// have had (free, or less when its tenant is at its bound), the bound (0
// when none is below the pool) and whether the n are granted; a grant
// counts them as owner's until Freed.
func (s *PoolShares) Reserve(p *Policy, owner kv.Owner, n, free int, now time.Time) (avail, bound int, ok bool) {
	tenant := owner.Tenant
	for t, at := range s.waiting {
		if now.Sub(at) > s.waitFor {
			delete(s.waiting, t)
		}
	}
	bound = s.capacity * p.Of(tenant).PoolPercentMax / 100
	if s.othersWait(tenant) {
		total := 0
		for t := range s.active() {
			total += p.Of(t).Weight
		}
		bound = min(bound, s.capacity*p.Of(tenant).Weight/max(total, 1))
	}
	avail = free
	if held := s.held[tenant]; held > s.owned[owner] {
		avail = min(free, max(bound-held, 0))
	}
	if bound >= s.capacity {
		bound = 0
	}
	if n > avail {
		s.waiting[tenant] = now
		return avail, bound, false
	}
	delete(s.waiting, tenant)
	s.held[tenant] += n
	s.owned[owner] += n
	return avail, bound, true
}

// Freed counts n pages of owner's freed.
func (s *PoolShares) Freed(owner kv.Owner, n int) {
	if s.held[owner.Tenant] -= n; s.held[owner.Tenant] <= 0 {
		delete(s.held, owner.Tenant)
	}
	if s.owned[owner] -= n; s.owned[owner] <= 0 {
		delete(s.owned, owner)
	}
}

// Held is the pages tenant holds.
func (s *PoolShares) Held(tenant string) int { return s.held[tenant] }

func (s *PoolShares) othersWait(tenant string) bool {
	for t := range s.waiting {
		if t != tenant {
			return true
		}
	}
	return false
}

// active are the tenants holding or waiting for pages.
func (s *PoolShares) active() map[string]bool {
	a := make(map[string]bool, len(s.held)+len(s.waiting))
	for t := range s.held {
		a[t] = true
	}
	for t := range s.waiting {
		a[t] = true
	}
	return a
}
