package handoff

import (
	"container/list"
	"slices"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// PrefixAffinity is a router's memory of which nodes hold which prompt
// pages in their prefix caches (or a node's, of which of its prefill
// workers do), learned from its own choices: a request's cacheable pages
// (kv.PrefixKeys, whose chain starts from the request's scope) will be
// cached where it was sent, on its prefill node once decode has them and
// on its decode node once it is answered. Holders
// are named by a number: a node's incarnation, or a worker's index. It is
// a pure core, bounded (AffinityKeysMax keys, each on at most
// AffinityNodesMax holders, least recently sent forgotten first) and never
// authoritative: a holder may have evicted a page, or restarted, and
// another router may have filled a node's cache. A wrong guess costs a
// miss (the prefill worker computes the prompt), never a wrong page: the
// worker's own index and the page's handshake decide. Keys chain from the
// scope, so a request's guesses are about its own scope's pages only.
//
// A holder may also publish what it holds (Published): a node's summary
// of its caches, which covers what other routers sent it and leaves out
// what it gave up. A key counts as held when either says so.
type PrefixAffinity struct {
	byKey     map[kv.PrefixKey]*list.Element // of *affinity
	lru       *list.List                     // front: routed last
	published map[uint64]map[kv.PrefixKey]struct{}
}

// AffinityKeysMax bounds the keys remembered (about 80 bytes each), and
// AffinityNodesMax the holders remembered for one key.
const (
	AffinityKeysMax  = 1 << 16
	AffinityNodesMax = 4
)

// AffinitySummaryKeysMax bounds the keys remembered of one holder's
// summary (Published), as a node's CacheSummary does; the holders are
// bounded by the caller (the members it asks).
const AffinitySummaryKeysMax = messages.CacheSummaryKeysMax

// AffinityImbalanceMax is how many more requests a router (or a node's
// dispatcher) may have outstanding on the holder of the longest run of a
// prompt's pages than on the least loaded candidate, and still send the
// prompt there: past it, load decides (a hot prefix must not pin all its
// traffic to one holder).
const AffinityImbalanceMax = 4

type affinity struct {
	key   kv.PrefixKey
	nodes []uint64 // holders, sent to last first
}

// NewPrefixAffinity remembers nothing yet.
func NewPrefixAffinity() *PrefixAffinity {
	return &PrefixAffinity{byKey: map[kv.PrefixKey]*list.Element{}, lru: list.New(),
		published: map[uint64]map[kv.PrefixKey]struct{}{}}
}

// Len is how many keys it remembers.
func (a *PrefixAffinity) Len() int { return a.lru.Len() }

// Hits is how many of keys, from the first, holder inc is thought to
// hold.
func (a *PrefixAffinity) Hits(keys []kv.PrefixKey, inc uint64) int {
	pub := a.published[inc]
	for i, k := range keys {
		_, published := pub[k]
		if e := a.byKey[k]; !published && (e == nil || !slices.Contains(e.Value.(*affinity).nodes, inc)) {
			return i
		}
	}
	return len(keys)
}

// Published replaces what holder inc is known to hold by its own summary,
// at most AffinitySummaryKeysMax keys (those past it are left out).
func (a *PrefixAffinity) Published(inc uint64, keys []kv.PrefixKey) {
	keys = keys[:min(len(keys), AffinitySummaryKeysMax)]
	set := make(map[kv.PrefixKey]struct{}, len(keys))
	for _, k := range keys {
		set[k] = struct{}{}
	}
	a.published[inc] = set
}

// Routed remembers keys as held by holder inc, where their request went.
func (a *PrefixAffinity) Routed(keys []kv.PrefixKey, inc uint64) {
	for _, k := range keys {
		e := a.byKey[k]
		if e == nil {
			if a.lru.Len() == AffinityKeysMax {
				old := a.lru.Back()
				delete(a.byKey, old.Value.(*affinity).key)
				a.lru.Remove(old)
			}
			a.byKey[k] = a.lru.PushFront(&affinity{key: k, nodes: []uint64{inc}})
			continue
		}
		a.lru.MoveToFront(e)
		af := e.Value.(*affinity)
		af.nodes = slices.DeleteFunc(af.nodes, func(n uint64) bool { return n == inc })
		af.nodes = slices.Insert(af.nodes, 0, inc)
		af.nodes = af.nodes[:min(len(af.nodes), AffinityNodesMax)]
	}
}

// Forget drops holder inc (a node that left or failed: a new run of it
// starts with an empty cache under another incarnation).
func (a *PrefixAffinity) Forget(inc uint64) {
	delete(a.published, inc)
	for e := a.lru.Front(); e != nil; {
		next := e.Next()
		af := e.Value.(*affinity)
		if af.nodes = slices.DeleteFunc(af.nodes, func(n uint64) bool { return n == inc }); len(af.nodes) == 0 {
			delete(a.byKey, af.key)
			a.lru.Remove(e)
		}
		e = next
	}
}
