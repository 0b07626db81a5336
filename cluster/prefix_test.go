//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC; see node_test.go.

package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/tenancy"
)

// TestPrefixCacheIsScopedByCredential: a prompt's full pages, once its
// transfer is acknowledged, are kept by the prefill pool and read instead
// of computed by the next request of the same scope only: the same
// tenant, or a tenant the policy puts in the same group, with the same
// cache salt. Another tenant, another salt, or none, computes the prompt
// again. Every answer is the reference's, whether its prefix was read or
// computed, and a longer prompt that starts with a cached one (the next
// turn of a chat) reads the cached pages. On a role-all node as across
// router, prefill and decode nodes.
func TestPrefixCacheIsScopedByCredential(t *testing.T) {
	policy := tenancy.DefaultPolicy()
	policy.Tenants = map[string]tenancy.Share{"hooli": {CacheScope: "team"}, "pied": {CacheScope: "team"}}
	shares := tenancy.NewShares(policy)
	// Room in the cache (half the prefill pool) for every scope's pages.
	tune := func(cfg *NodeConfig) { cfg.Actors.Tenants, cfg.Actors.PrefillPages = shares, 256 }
	for _, topo := range []string{"role all", "router, prefill and decode"} {
		t.Run(topo, func(t *testing.T) {
			var entry, prefill *Node
			if topo == "role all" {
				entry = startNodeTuned(t, testAuth(t, actors.RoleAll), actors.RoleAll, nil, tune)
				prefill = entry
			} else {
				prefill, _, entry = trio(t, tune, tune)
			}
			m := prefill.cfg.Model
			pageTokens := prefill.cfg.Actors.PageTokens
			prompt := strings.Repeat("Once upon a time there was a little cat. ", 4)
			n := len(m.Tokenizer().Encode(prompt))
			cacheable := (n - 1) / pageTokens * pageTokens
			if cacheable < 2*pageTokens {
				t.Fatalf("the prompt is %d tokens: too short for two cached pages of %d", n, pageTokens)
			}
			published := func() uint64 { return cachePublished(prefill) }
			clients := map[string]*client.Client{}
			ask := func(tenant, salt, prompt string, wantCached int) {
				t.Helper()
				c := clients[tenant]
				if c == nil {
					c = tenantClient(t, entry.Address(), tenant)
					clients[tenant] = c
				}
				before := published()
				res, err := c.Generate(context.Background(), tenant, prompt, client.GenerateOptions{MaxTokens: 16, CacheSalt: salt}, nil)
				if err != nil {
					t.Fatalf("%s (salt %q): %v", tenant, salt, err)
				}
				want, err := m.Answer(prompt, 16)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(res.Tokens, want) {
					t.Fatalf("%s (salt %q), %d tokens cached: answered %v, the reference %v", tenant, salt, res.CachedTokens, res.Tokens, want)
				}
				if res.CachedTokens != wantCached {
					t.Fatalf("%s (salt %q): %d prompt tokens read from the cache, want %d", tenant, salt, res.CachedTokens, wantCached)
				}
				if wantCached == 0 {
					// Its pages are kept once decode acknowledges them,
					// which may come after the answer.
					testwait.Report(t, "the prompt's pages kept", time.Minute, func() (bool, string) {
						have := published()
						return have >= before+uint64(cacheable/pageTokens), fmt.Sprintf("%d pages kept, %d before", have, before)
					})
				}
			}
			ask("acme", "", prompt, 0)
			ask("acme", "", prompt, cacheable)
			ask("globex", "", prompt, 0) // another tenant: its own scope
			ask("acme", "user-1", prompt, 0)
			ask("acme", "user-1", prompt, cacheable)
			ask("acme", "user-2", prompt, 0)
			ask("hooli", "", prompt, 0)
			ask("pied", "", prompt, cacheable) // the policy's group
			ask("acme", "", prompt+"Then it ran away.", cacheable)
			var queries, hits uint64
			for _, p := range prefill.Status().Node.Pools {
				queries, hits = queries+p.CacheQueries, hits+p.CacheHitTokens
			}
			// A transfer retried on a loaded machine looks the prompt up
			// again: at least one lookup a request.
			if queries < 9 || hits < uint64(4*cacheable) {
				t.Errorf("status: %d cache lookups and %d tokens hit, want at least 9 and %d", queries, hits, 4*cacheable)
			}
		})
	}
}

// TestRouterFollowsThePrefixCache: with two prefill nodes of two prefill
// workers each, a router sends a prompt to the node whose cache holds its
// prefix (as its own routing left it), and the node's dispatcher to the
// worker whose cache does, so every request after the first of the same
// scope reads the prefix (load-only routing would pick either node and
// miss half the time: all of six after the first is a chance of 1 in 64;
// an idle node's dispatcher would pick its first worker anyway, which
// TestDispatchFollowsThePrefixCache covers); another tenant's identical
// prompt holds nothing there.
func TestRouterFollowsThePrefixCache(t *testing.T) {
	twoWorkers := func(cfg *NodeConfig) { cfg.Actors.PrefillWorkers = 2 }
	p1 := startNodeTuned(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, nil, twoWorkers)
	p2 := startNodeTuned(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, nil, twoWorkers, p1.GossipAddr())
	d := startClusterNode(t, actors.RoleDecode, p1.GossipAddr())
	r := startClusterNode(t, actors.RoleRouter, p1.GossipAddr())
	for _, n := range []*Node{p1, p2, d, r} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 4 && routable(n) })
	}
	m := p1.cfg.Model
	prompt := strings.Repeat("A tale of two caches. ", 3)
	cacheable := (len(m.Tokenizer().Encode(prompt)) - 1) / p1.cfg.Actors.PageTokens * p1.cfg.Actors.PageTokens
	published := func() uint64 { return cachePublished(p1, p2) }
	acme := tenantClient(t, r.Address(), "acme")
	for i := range 7 {
		before := published()
		res, err := acme.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 4}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := cacheable
		if i == 0 {
			want = 0
		}
		if res.CachedTokens != want {
			t.Fatalf("request %d: %d prompt tokens read from the cache, want %d", i, res.CachedTokens, want)
		}
		if i == 0 {
			testwait.Report(t, "the first prompt's pages kept", time.Minute, func() (bool, string) {
				return published() > before, fmt.Sprintf("%d pages kept", published())
			})
		}
	}
	res, err := tenantClient(t, r.Address(), "globex").Generate(context.Background(), "globex", prompt, client.GenerateOptions{MaxTokens: 4}, nil)
	if err != nil || res.CachedTokens != 0 {
		t.Fatalf("another tenant's identical prompt: %d tokens read from the cache (%v)", res.CachedTokens, err)
	}
	freeEverywhere(t, p1, p2, d, r)
}

// TestRouterLearnsWhatNodesCache: a router sends a prompt to the prefill
// node that holds its prefix although another router computed it there:
// it asks each prefilling node what its caches hold (CacheSummary). Of
// six prompts each sent first through one router and then through the
// other, every second send reads its prefix (a router that knew only its
// own routing would pick either node: all six by chance is 1 in 64).
func TestRouterLearnsWhatNodesCache(t *testing.T) {
	often := func(cfg *NodeConfig) { cfg.Actors.CacheSummaryEvery = 50 * time.Millisecond }
	p1 := startClusterNode(t, actors.RolePrefill)
	p2 := startClusterNode(t, actors.RolePrefill, p1.GossipAddr())
	d := startClusterNode(t, actors.RoleDecode, p1.GossipAddr())
	r1 := startNodeTuned(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, nil, often, p1.GossipAddr())
	r2 := startNodeTuned(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, nil, often, p1.GossipAddr())
	for _, n := range []*Node{p1, p2, d, r1, r2} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 5 && routable(n) })
	}
	pageTokens := p1.cfg.Actors.PageTokens
	published := func() uint64 { return cachePublished(p1, p2) }
	via1, via2 := tenantClient(t, r1.Address(), "acme"), tenantClient(t, r2.Address(), "acme")
	for i := range 6 {
		prompt := fmt.Sprintf("Prompt %d: %s", i, strings.Repeat("a story of caches and routers. ", 2))
		cacheable := (len(p1.cfg.Model.Tokenizer().Encode(prompt)) - 1) / pageTokens * pageTokens
		before := published()
		if res, err := via1.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 2}, nil); err != nil || res.CachedTokens != 0 {
			t.Fatalf("prompt %d through the first router: %d tokens cached (%v), want a miss", i, res.CachedTokens, err)
		}
		testwait.Report(t, "the prompt's pages kept", time.Minute, func() (bool, string) {
			return published() >= before+uint64(cacheable/pageTokens), fmt.Sprintf("%d pages kept, %d before", published(), before)
		})
		// Two rounds of summaries from the three nodes that cache (two
		// prefill, one decode): the second router has asked since the
		// pages were kept, and heard back.
		polled := r2.cacheSummaries()
		testwait.Report(t, "the second router's summaries", time.Minute, func() (bool, string) {
			return r2.cacheSummaries() >= polled+6, fmt.Sprintf("%d summaries taken, %d before", r2.cacheSummaries(), polled)
		})
		res, err := via2.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 2}, nil)
		if err != nil || res.CachedTokens != cacheable {
			t.Fatalf("prompt %d through the second router: %d tokens cached (%v), want %d", i, res.CachedTokens, err, cacheable)
		}
	}
	freeEverywhere(t, p1, p2, d, r1, r2)
}

// trio starts a prefill node tuned by tunePrefill, and a decode node and a
// router tuned by tune, waits until each sees the others, and, once the
// test is over, until every pool is free.
func trio(t *testing.T, tunePrefill, tune func(*NodeConfig)) (prefill, decode, router *Node) {
	t.Helper()
	prefill = startNodeTuned(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, nil, tunePrefill)
	decode = startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, tune, prefill.GossipAddr())
	router = startNodeTuned(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, nil, tune, prefill.GossipAddr())
	for _, n := range []*Node{prefill, decode, router} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 && routable(n) })
	}
	t.Cleanup(func() { freeEverywhere(t, prefill, decode, router) })
	return prefill, decode, router
}

// cachePublished is how many pages the prefix caches of nodes have kept.
func cachePublished(nodes ...*Node) (pages uint64) {
	for _, n := range nodes {
		for _, p := range n.Status().Node.Pools {
			pages += p.CachePublished
		}
	}
	return pages
}

// TestDecodeNodeHoldsThePrefix: a decode node keeps an answered prompt's
// full pages in its own prefix cache; the next request of the same tenant
// whose prompt starts with them copies them there, and its prefill node
// (whose own cache is off here, so it computes every token) sends only
// the pages after them over the data plane. Another tenant's request of
// the same prompt gets every page from prefill. Every answer is the
// reference's, and at the end every page not cached is free.
func TestDecodeNodeHoldsThePrefix(t *testing.T) {
	prefill, decode, router := trio(t, func(cfg *NodeConfig) { cfg.Actors.PrefixCachePercent = 0 }, nil)
	m := prefill.cfg.Model
	pageTokens := decode.cfg.Actors.PageTokens
	prompt := strings.Repeat("Once upon a time there was a little cat. ", 4)
	n := len(m.Tokenizer().Encode(prompt))
	pages, cacheable := (n+pageTokens-1)/pageTokens, (n-1)/pageTokens
	if cacheable < 2 {
		t.Fatalf("the prompt is %d tokens: too short for two cached pages of %d", n, pageTokens)
	}
	decodeCache := func() (published, hitTokens uint64) {
		for _, p := range decode.Status().Node.Pools {
			published, hitTokens = published+p.CachePublished, hitTokens+p.CacheHitTokens
		}
		return published, hitTokens
	}
	ask := func(tenant string, wantFrames int) {
		t.Helper()
		before := decode.data.Stats().FramesAccepted
		res, err := tenantClient(t, router.Address(), tenant).Generate(context.Background(), tenant, prompt,
			client.GenerateOptions{MaxTokens: 8}, nil)
		if err != nil {
			t.Fatalf("%s: %v", tenant, err)
		}
		want, err := m.Answer(prompt, 8)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Tokens, want) {
			t.Fatalf("%s: answered %v, the reference %v", tenant, res.Tokens, want)
		}
		if got := int(decode.data.Stats().FramesAccepted - before); got != wantFrames {
			t.Fatalf("%s: decode accepted %d frames of the prompt's %d pages, want %d", tenant, got, pages, wantFrames)
		}
	}
	ask("acme", pages)
	testwait.Report(t, "the answered prompt's pages kept by the decode node", time.Minute, func() (bool, string) {
		published, _ := decodeCache()
		return published >= uint64(cacheable), fmt.Sprintf("%d pages kept, want %d", published, cacheable)
	})
	ask("acme", pages-cacheable)
	if _, hits := decodeCache(); hits != uint64(cacheable*pageTokens) {
		t.Errorf("the decode cache counts %d tokens read, want %d", hits, cacheable*pageTokens)
	}
	ask("globex", pages)
}

// TestRouterFollowsTheDecodeCache: with two decode nodes that say they
// keep a cache, a router sends a prompt to the decode node that holds its
// prefix (where it sent the prompt before), so each of six prompts, sent
// twice, gets its held pages copied on the decode node the second time and
// only the pages after them over the data plane (load-only routing would
// pick either decode node: all six by chance is 1 in 64).
func TestRouterFollowsTheDecodeCache(t *testing.T) {
	p := startNodeTuned(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, nil,
		func(cfg *NodeConfig) { cfg.Actors.PrefixCachePercent = 0 })
	d1 := startClusterNode(t, actors.RoleDecode, p.GossipAddr())
	d2 := startClusterNode(t, actors.RoleDecode, p.GossipAddr())
	r := startNodeTuned(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, nil,
		func(cfg *NodeConfig) { cfg.Actors.CacheSummaryEvery = 50 * time.Millisecond }, p.GossipAddr())
	for _, n := range []*Node{p, d1, d2, r} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 4 && routable(n) })
	}
	testwait.Report(t, "the router told by both decode nodes that they cache", time.Minute, func() (bool, string) {
		return r.decodeCaches() == 2, fmt.Sprintf("%d decode nodes known to cache", r.decodeCaches())
	})
	pageTokens := d1.cfg.Actors.PageTokens
	frames := func() uint64 { return d1.data.Stats().FramesAccepted + d2.data.Stats().FramesAccepted }
	acme := tenantClient(t, r.Address(), "acme")
	for i := range 6 {
		prompt := fmt.Sprintf("Prompt %d: %s", i, strings.Repeat("a story of decode nodes and routers. ", 2))
		n := len(p.cfg.Model.Tokenizer().Encode(prompt))
		pages, cacheable := (n+pageTokens-1)/pageTokens, (n-1)/pageTokens
		for send, want := range []int{pages, pages - cacheable} {
			before, kept := frames(), cachePublished(d1, d2)
			if _, err := acme.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 2}, nil); err != nil {
				t.Fatalf("prompt %d, send %d: %v", i, send, err)
			}
			if got := int(frames() - before); got != want {
				t.Fatalf("prompt %d, send %d: decode accepted %d frames of its %d pages, want %d", i, send, got, pages, want)
			}
			if send == 0 {
				testwait.Report(t, "the answered prompt's pages kept", time.Minute, func() (bool, string) {
					have := cachePublished(d1, d2)
					return have >= kept+uint64(cacheable), fmt.Sprintf("%d pages kept, %d before", have, kept)
				})
			}
		}
	}
	freeEverywhere(t, p, d1, d2, r)
}
