package kv

import (
	"container/heap"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sort"

	"github.com/zeebo/xxh3"

	"github.com/kvwarden/kvwarden/internal/mutant"
)

// PrefixKey names the prompt prefix that ends with one full page, under
// one root: it is how a cached page is found.
//
// Keys form a chain of XXH3-128 hashes. The root (PrefixRoot) hashes
// everything that makes two pages' bytes interchangeable or not: the
// scope, the model's fingerprint, the KV dtype and every field of the page
// geometry. A page's key (Next) hashes its parent's key (the root, for the
// first page) with the token ids the page holds. So a page's key depends
// on every token before it and on everything the root binds: the same
// tokens under another scope (or a narrowing of it), model or layout give
// another key, and a lookup under one scope cannot name a page another
// scope published. A key is only a name, though: the pool checks every
// shared lease against the page's own scope (Page.LeaseShared), so a key
// collision or an index bug shows as a refusal, never as another scope's
// bytes. Every variable-length field is length-prefixed and every number
// encoded at a fixed width, so that no two different inputs encode alike;
// a domain byte keeps a root's input apart from a page's. Nothing of the
// node enters a key, so a prefix has the same keys on every node that
// runs the model with that layout, and a router can match them.
//
// Only full pages that do not hold the prompt's last token have keys
// (PrefixKeys): a prefill computes at least the last token, whose logits
// give the first generated token, so that token's page is being written
// for the request, not shared. A prompt of exactly k full pages so has
// k-1 cacheable pages.
type PrefixKey [16]byte

func (k PrefixKey) String() string { return hex.EncodeToString(k[:]) }

// Domain bytes of the hashed inputs.
const (
	prefixRootDomain = 'R'
	prefixPageDomain = 'P'
)

// PrefixRoot is the key every chain of scope's prompts on model, stored in
// pages of geometry g, starts from. model is the model's fingerprint (a
// digest of its weights and tokenizer), so that pages computed by another
// model are never found. It refuses the zero scope, an empty fingerprint
// and an invalid geometry.
func PrefixRoot(scope Scope, model string, g Geometry) (PrefixKey, error) {
	if err := scope.Validate(); err != nil {
		return PrefixKey{}, err
	}
	if model == "" {
		return PrefixKey{}, fmt.Errorf("kv: prefix root needs a model fingerprint")
	}
	if err := g.Validate(); err != nil {
		return PrefixKey{}, err
	}
	b := make([]byte, 0, 1+8+len(scope.name)+8+len(model)+1+4*8)
	b = append(b, prefixRootDomain)
	if !mutant.Is(mutant.KeyWithoutScope) { // the planted bug: every scope's prompts share one chain of keys
		b = appendLenString(b, scope.name)
	}
	b = appendLenString(b, model)
	b = append(b, byte(g.DType))
	for _, v := range []int{g.Layers, g.KVHeads, g.HeadDim, g.PageTokens} {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	return xxh3.Hash128(b).Bytes(), nil
}

func appendLenString(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint64(b, uint64(len(s))), s...)
}

// Next is the key of the page that holds exactly tokens right after the
// page whose key is k (or first, when k is a root).
func (k PrefixKey) Next(tokens []int) PrefixKey {
	key, _ := k.next(nil, tokens)
	return key
}

// next is Next hashing in buf, which it returns for the next page's use.
func (k PrefixKey) next(buf []byte, tokens []int) (PrefixKey, []byte) {
	b := append(buf[:0], prefixPageDomain)
	b = append(b, k[:]...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(tokens)))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint64(b, uint64(t))
	}
	return xxh3.Hash128(b).Bytes(), b
}

// PrefixKeys is the keys of prompt's cacheable pages under root: one per
// full page that does not hold the prompt's last token, that is
// (len(prompt)-1)/pageTokens of them, in order. pageTokens must be the
// geometry's that root binds.
func PrefixKeys(root PrefixKey, prompt []int, pageTokens int) []PrefixKey {
	if pageTokens < 1 {
		panic(fmt.Sprintf("kv: prefix keys of %d-token pages", pageTokens))
	}
	if len(prompt) < 2 {
		return nil
	}
	keys := make([]PrefixKey, (len(prompt)-1)/pageTokens)
	var buf []byte
	k := root
	for i := range keys {
		k, buf = k.next(buf, prompt[i*pageTokens:(i+1)*pageTokens])
		keys[i] = k
	}
	return keys
}

// PrefixIndex maps prefix keys to the cached pages of one pool, holds at
// most PagesMax of them, and gives up the least recently used first. It is
// a pure value: the caller publishes and evicts the pages in the pool and
// tells the index.
//
// Recency is a use counter, not a clock: every Match is one use and
// stamps every page it returns with it, so pages matched together are
// equally recent. Among equally recent pages the deepest (latest in its
// prompt) goes first, so a parent is never evicted before a child used
// with it: a child without its parent is unreachable, since Match stops at
// the first key it does not hold. A page added is stamped with the latest
// Match's use, so the pages a prefill adds after its own Match are as
// recent as those it matched, and deeper. If another Match came in
// between, they are more recent than their parents, which may go first;
// that costs those children a miss until they are evicted in turn, never
// a wrong page, and a Match of the whole prompt's keys stamps the chain
// together again.
type PrefixIndex struct {
	max   int
	byKey map[PrefixKey]*prefixEntry
	byTag map[Tag]*prefixEntry
	lru   prefixHeap
	uses  uint64 // Matches so far: the recency of the latest use
	adds  uint64 // Adds so far: the order among equals
}

type prefixEntry struct {
	key   PrefixKey
	page  CachedPage
	used  uint64 // the use that last stamped it
	added uint64
	at    int // its place in the heap
}

// NewPrefixIndex makes an index that holds at most limit pages (a pool's
// share for its cache); 0 holds none.
func NewPrefixIndex(limit int) (*PrefixIndex, error) {
	if limit < 0 || limit > pagesMax {
		return nil, fmt.Errorf("kv: prefix index of %d pages: want 0 to %d", limit, pagesMax)
	}
	return &PrefixIndex{max: limit, byKey: map[PrefixKey]*prefixEntry{}, byTag: map[Tag]*prefixEntry{}}, nil
}

// Match is the cached pages of the longest run keys[0], keys[1], … that
// the index holds, in order; it stops at the first key not held. It counts
// as one use, and stamps every page returned with it.
func (x *PrefixIndex) Match(keys []PrefixKey) []CachedPage {
	x.uses++
	var out []CachedPage
	for _, k := range keys {
		e := x.byKey[k]
		if e == nil {
			break
		}
		e.used = x.uses
		heap.Fix(&x.lru, e.at)
		out = append(out, e.page)
	}
	return out
}

// Has says whether the index holds key.
func (x *PrefixIndex) Has(key PrefixKey) bool { return x.byKey[key] != nil }

// Add records page as the cached page of key, stamped with the latest
// use. It refuses a key or a page already held, and any page when the
// index is full: the caller makes room first (Room, Victims).
func (x *PrefixIndex) Add(key PrefixKey, page CachedPage) error {
	if e := x.byKey[key]; e != nil {
		return &PrefixKeyHeldError{Key: key, Held: e.page.Tag, Page: page.Tag}
	}
	if e := x.byTag[page.Tag]; e != nil {
		return &PrefixPageHeldError{Page: page.Tag, Held: e.key, Key: key}
	}
	if x.Room() == 0 {
		return &PrefixIndexFullError{Pages: x.Len(), PagesMax: x.max}
	}
	x.adds++
	e := &prefixEntry{key: key, page: page, used: x.uses, added: x.adds}
	x.byKey[key] = e
	x.byTag[page.Tag] = e
	heap.Push(&x.lru, e)
	return nil
}

// Room is how many more pages the index can hold.
func (x *PrefixIndex) Room() int { return x.max - x.Len() }

// Len is how many pages the index holds.
func (x *PrefixIndex) Len() int { return len(x.lru) }

// PagesMax is the most pages the index holds.
func (x *PrefixIndex) PagesMax() int { return x.max }

// Victims removes up to n pages, least recently used first and, among
// equally recent ones, deepest first, and returns them: the caller evicts
// them from the pool (Pool.Evict).
func (x *PrefixIndex) Victims(n int) []CachedPage {
	n = min(n, x.Len())
	if n <= 0 {
		return nil
	}
	out := make([]CachedPage, n)
	for i := range out {
		e := heap.Pop(&x.lru).(*prefixEntry)
		x.forget(e)
		out[i] = e.page
	}
	return out
}

// Uses is the stamp of the latest Match: pages it stamped (and pages added
// since) are at least this recent.
func (x *PrefixIndex) Uses() uint64 { return x.uses }

// VictimsBefore is Victims of the pages last used before use only: what a
// prefill may give up without taking the pages its own Match stamped
// (those it reads, and the parents of those it adds), which would leave
// it with nothing or with children no Match can reach.
func (x *PrefixIndex) VictimsBefore(n int, use uint64) []CachedPage {
	var out []CachedPage
	for len(out) < n && x.Len() > 0 && x.lru[0].used < use {
		e := heap.Pop(&x.lru).(*prefixEntry)
		x.forget(e)
		out = append(out, e.page)
	}
	return out
}

// Remove forgets the page tag names, if the index holds it: a page that
// is gone from the pool (a shared lease on it was refused as stale).
func (x *PrefixIndex) Remove(tag Tag) bool {
	e := x.byTag[tag]
	if e == nil {
		return false
	}
	heap.Remove(&x.lru, e.at)
	x.forget(e)
	return true
}

func (x *PrefixIndex) forget(e *prefixEntry) {
	delete(x.byKey, e.key)
	delete(x.byTag, e.page.Tag)
}

// RecentKeys are the keys of at most n pages the index holds, the most
// recently used first (the reverse of Victims' order): what a node tells
// routers it holds.
func (x *PrefixIndex) RecentKeys(n int) []PrefixKey {
	es := append(prefixHeap(nil), x.lru...)
	sort.Slice(es, func(i, j int) bool { return es.Less(j, i) })
	out := make([]PrefixKey, min(n, len(es)))
	for i := range out {
		out[i] = es[i].key
	}
	return out
}

// Pages is every page the index holds, in the order Victims would take
// them.
func (x *PrefixIndex) Pages() []CachedPage {
	es := append(prefixHeap(nil), x.lru...)
	sort.Slice(es, func(i, j int) bool { return es.Less(i, j) })
	out := make([]CachedPage, len(es))
	for i, e := range es {
		out[i] = e.page
	}
	return out
}

// prefixHeap orders entries least recently used first, then deepest
// first, then added first.
type prefixHeap []*prefixEntry

func (h prefixHeap) Len() int { return len(h) }

func (h prefixHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	switch {
	case a.used != b.used:
		return a.used < b.used
	case a.page.First != b.page.First:
		return a.page.First > b.page.First
	}
	return a.added < b.added
}

func (h prefixHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}

func (h *prefixHeap) Push(e any) {
	e.(*prefixEntry).at = len(*h)
	*h = append(*h, e.(*prefixEntry))
}

func (h *prefixHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// PrefixKeyHeldError: Add of a key the index holds already (under page
// Held); Page is the page offered.
type PrefixKeyHeldError struct {
	Key        PrefixKey
	Held, Page Tag
}

func (e *PrefixKeyHeldError) Error() string {
	return fmt.Sprintf("kv: prefix key %s is held already by page %s; refused page %s", e.Key, e.Held, e.Page)
}

// PrefixPageHeldError: Add of a page the index holds already (under key
// Held); Key is the key offered.
type PrefixPageHeldError struct {
	Page      Tag
	Held, Key PrefixKey
}

func (e *PrefixPageHeldError) Error() string {
	return fmt.Sprintf("kv: cached page %s is held already under prefix key %s; refused key %s", e.Page, e.Held, e.Key)
}

// PrefixIndexFullError: Add to an index that holds PagesMax pages.
type PrefixIndexFullError struct {
	Pages, PagesMax int
}

func (e *PrefixIndexFullError) Error() string {
	return fmt.Sprintf("kv: prefix index holds %d of %d pages: no room", e.Pages, e.PagesMax)
}
