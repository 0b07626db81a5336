package handoff

import (
	"errors"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// lossyPages is a kv.Pool as CachePages whose calls can be made to lose
// their reply after the pool carried them out, as an actor ask that timed
// out while the page actor was behind does (the page actor still handles
// it).
type lossyPages struct {
	PoolPages
	loseLeaseShared, loseAckPublish int // replies to lose, from now
	loseUnlease                     bool
}

var errLost = errors.New("no answer in time")

func (c *lossyPages) LeaseShared(p kv.CachedPage, r kv.Owner, s kv.Scope) (kv.Lease, error) {
	l, err := c.Pool.LeaseShared(p, r, s)
	if err == nil && c.loseLeaseShared > 0 {
		c.loseLeaseShared--
		return kv.Lease{}, errLost
	}
	return l, err
}

func (c *lossyPages) AckPublish(t kv.Tag, o kv.Owner, s kv.Scope) (kv.CachedPage, error) {
	cp, err := c.Pool.AckPublish(t, o, s)
	if err == nil && c.loseAckPublish > 0 {
		c.loseAckPublish--
		return kv.CachedPage{}, errLost
	}
	return cp, err
}

func (c *lossyPages) Unlease(l kv.Lease) error {
	err := c.Pool.Unlease(l)
	if c.loseUnlease && !l.Scope.IsZero() {
		return errLost
	}
	return err
}

func (c *lossyPages) Evict(p kv.CachedPage) error {
	_, err := c.Pool.Evict(p, c.Now())
	return err
}

type cacheWorld struct {
	t     *testing.T
	e     *engine.ReferenceEngine
	p     *lossyPages
	cache *PrefixCache
	now   time.Time
	next  uint64
}

func newCacheWorld(t *testing.T, pages, cachePages int) *cacheWorld {
	w := &cacheWorld{t: t, now: time.Unix(1_000_000, 0)}
	e, err := engine.NewReferenceEngine(tinyModel())
	if err != nil {
		t.Fatal(err)
	}
	w.e = e
	pool, err := kv.NewPool(kv.DefaultConfig(e.Config().Geometry(4), pages, prefillInc))
	if err != nil {
		t.Fatal(err)
	}
	w.p = &lossyPages{PoolPages: PoolPages{Pool: pool, Now: func() time.Time { return w.now }}}
	if w.cache, err = NewPrefixCache(cachePages, testModel.String(), func(tenant, salt string) kv.Scope {
		return kv.TenantScope(tenant).Narrow(salt)
	}); err != nil {
		t.Fatal(err)
	}
	return w
}

// run prefills prompt for tenant as the Source would, sends (drops) the
// frames, releases the sources and acknowledges them with their Chain.
func (w *cacheWorld) run(tenant string, prompt []int) Prefilled {
	w.t.Helper()
	w.next++
	g := w.p.Geometry()
	n := g.PagesFor(len(prompt))
	plan := &messages.TransferPlan{RequestID: w.next, Tenant: tenant, TokenCount: uint32(len(prompt)),
		PromptTokens: make([]uint32, len(prompt)), PageTokens: uint32(g.PageTokens), DestTags: make([]kv.Tag, n),
		Model: testModel.String()}
	for i, t := range prompt {
		plan.PromptTokens[i] = uint32(t)
	}
	for i := range plan.DestTags {
		plan.DestTags[i] = kv.Tag{Incarnation: decodeInc, Index: uint32(i), Generation: 1}
	}
	local := kv.Owner{Request: 1000 + w.next, Tenant: tenant}
	out, fr := ExecPrefillCached(w.e, w.p, w.cache, Prefill{Key: JobKey{ID: w.next}, Plan: plan, Owner: plan.Owner(), Local: local})
	if out.Err != nil {
		return out
	}
	if err := fr.Unlease(w.p); err != nil {
		w.t.Fatal(err)
	}
	ExecRelease(w.p, Release{Owner: local, Tags: out.Sources}, nil)
	ExecAckKeep(w.p, w.cache, Ack{Owner: local, Tags: out.Sources, Cached: out.Cached, Scope: out.Scope, Chain: out.Chain}, nil)
	return out
}

func cachePrompt(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = 1 + i%7
	}
	return p
}

// emptied is the pool after a day: reclaims due, and every page the index
// holds evicted.
func (w *cacheWorld) emptied() kv.Stats {
	w.now = w.now.Add(24 * time.Hour)
	w.p.Tick(w.now)
	w.cache.evict(w.p, w.cache.index.Len(), w.cache.index.Uses()+1)
	return w.p.Stats()
}

// TestLostRepliesLeaveNoCachedPageBehind: a shared lease or a publish
// whose reply is lost (carried out by the page after the worker stopped
// waiting) leaves no page cached for nobody: the lease's page is evicted
// (freed at the reclaim deadline, the lost lease holding it), the
// published page is evicted under the tag it would have, and once the
// index is emptied every page is free.
func TestLostRepliesLeaveNoCachedPageBehind(t *testing.T) {
	for _, c := range []struct {
		name string
		lose func(p *lossyPages)
	}{
		{"a shared lease", func(p *lossyPages) { p.loseLeaseShared = 1 }},
		{"a publish", func(p *lossyPages) { p.loseAckPublish = 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newCacheWorld(t, 16, 8)
			prompt := cachePrompt(13) // 3 cacheable pages of 4
			if c.name == "a shared lease" {
				w.run("acme", prompt)
			}
			c.lose(w.p)
			w.run("acme", prompt)
			if s := w.emptied(); s.Free != s.Capacity {
				t.Fatalf("a day later with the index emptied, %d of %d pages free (%d cached)", s.Free, s.Capacity, s.Cached)
			}
		})
	}
}

// TestSmallCacheKeepsReachablePages: a cache smaller than a prompt's
// cacheable pages keeps its first pages, never a child without its
// parent: the repeat reads them.
func TestSmallCacheKeepsReachablePages(t *testing.T) {
	w := newCacheWorld(t, 16, 2)
	prompt := cachePrompt(17) // 4 cacheable pages of 4
	w.run("acme", prompt)
	if pages := w.cache.index.Pages(); len(pages) != 2 || pages[0].First+pages[1].First != 4 {
		t.Fatalf("a 2-page cache after a 4-page prompt holds %+v, want its pages at positions 0 and 4", pages)
	}
	if out := w.run("acme", prompt); out.Cached != 8 || out.Err != nil {
		t.Fatalf("the repeat read %d tokens from the cache (%v), want 8", out.Cached, out.Err)
	}
	if st := w.cache.Stats(); st.Published != 2 || st.Evicted != 0 {
		t.Fatalf("published %d and evicted %d pages, want 2 and none", st.Published, st.Evicted)
	}
	// Another prompt takes the room of the least recently used.
	other := append([]int{6}, cachePrompt(12)...)
	w.run("acme", other)
	if out := w.run("acme", other); out.Cached != 8 {
		t.Fatalf("another prompt's repeat read %d tokens, want 8", out.Cached)
	}
}

// TestPrefixUnleaseRefusalIsReported: the shared leases of a prefill's
// cached prefix go back after the copy, and one refused fails the prefill.
func TestPrefixUnleaseRefusalIsReported(t *testing.T) {
	w := newCacheWorld(t, 16, 8)
	prompt := cachePrompt(13)
	w.run("acme", prompt)
	w.p.loseUnlease = true
	if out := w.run("acme", prompt); !errors.Is(out.Err, errLost) {
		t.Fatalf("the prefix's unleases refused, the prefill says %v", out.Err)
	}
}

// TestReserveEvictingKeepsTheLeasedPrefix: a prefill that finds its pool
// full gives up only cached pages it does not read itself (those could
// not be freed before it lets go of them): with none other, it is
// refused and the cache keeps its prefix.
func TestReserveEvictingKeepsTheLeasedPrefix(t *testing.T) {
	w := newCacheWorld(t, 7, 3)
	prompt := cachePrompt(13) // 4 pages, 3 cacheable
	w.run("acme", prompt)
	if _, err := w.p.Reserve(kv.Owner{Request: 99, Tenant: "acme"}, 0, 4); err != nil {
		t.Fatal(err)
	}
	var full *kv.PoolExhaustedError
	if out := w.run("acme", prompt); !errors.As(out.Err, &full) || w.cache.index.Len() != 3 || w.cache.Stats().Evicted != 0 {
		t.Fatalf("a prefill refused pages (%v) left %d of 3 pages in the index, %d evicted", out.Err, w.cache.index.Len(), w.cache.Stats().Evicted)
	}
}
