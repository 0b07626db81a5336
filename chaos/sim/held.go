package sim

import (
	"fmt"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// The decode nodes' prefix caches. A decode node that holds prefixes
// (node.holds) keeps a handoff.PrefixCache over its pool, scoped by the
// world's policy as the prefill caches are. A request reserves through it
// (handoff.ExecReserveHeld): it copies the cached run of its prompt's
// first pages into its own pages and names them in its plan, which
// prefill then does not send. An answered request hands its prompt pages
// to the cache (handoff.Keep), which its decode worker carries out at its
// next turn, after the step that closed the request's sequence, as a
// node's worker takes the message after that step; now and then
// (Reorder) a Keep is carried out at once instead, with the sequence's
// leases still held, and the pages they hold must be released, not kept.
// On a node the cache is the worker's, which answers a request's asks
// between other messages, while the request leases and copies the pages
// itself: the Keeps waiting are carried out, half the time, between a
// request's lookup and its leases or its eviction, and a quarter of the
// time another request's lookup and eviction come between its lookup and
// its leases, or between its leases and its copies, so that evictions
// race the leases.

// heldCache is a decode run's cache as a request's reservation asks it
// (handoff.HeldCache): the cache itself, with the oracle's counts and the
// worker's other messages in between.
type heldCache struct {
	n     *node
	c     *client // the reserving request's
	local handoff.LocalCache
}

var _ handoff.HeldCache = heldCache{}

func (h heldCache) Match(tenant, salt string, prompt []int) ([]kv.CachedPage, kv.Scope, uint64) {
	hits, scope, use := h.local.Match(tenant, salt, prompt)
	h.n.mailbox()
	if len(hits) > 0 {
		h.n.raceEviction(h.c)
	}
	return hits, scope, use
}

// racingPages is a decode run's pages as a reservation through its cache
// uses them: before its own pages are reserved (its leases held, its
// copies not made yet), another request's lookup and eviction come now
// and then (Reorder).
type racingPages struct {
	*pages
	c *client // the reserving request's
}

func (r racingPages) Reserve(owner kv.Owner, first, n int) ([]kv.Tag, error) {
	if len(r.shared) > 0 {
		r.n.raceEviction(r.c)
	}
	return r.pages.Reserve(owner, first, n)
}

// raceEviction is, a quarter of the time, another client's request,
// whose lookup follows the reservation's of c, giving up cached pages for
// its own reservation: those used before its lookup, which may be the
// ones c's reservation found (its leases are then refused: a shorter run)
// or leased (freed at its last unlease, never under its copies).
func (n *node) raceEviction(c *client) {
	w := n.w
	if w.rng.IntN(4) != 0 {
		return
	}
	other := w.clients[w.rng.IntN(len(w.clients))]
	if other == c {
		return
	}
	local := handoff.LocalCache{Pages: n.pages, Cache: n.cache}
	_, _, use := local.Match(other.tenant, other.salt, other.prompt)
	if local.Evict(1+w.rng.IntN(3), use) > 0 {
		w.count[ReserveRaced]++
	}
}

func (h heldCache) Forget(hit kv.CachedPage) {
	h.n.w.count[HeldRunCut]++
	h.local.Forget(hit)
}

func (h heldCache) Evict(n int, use uint64) int {
	h.n.mailbox()
	return h.local.Evict(n, use)
}

func (h heldCache) Read(pages int) {
	h.n.w.count[HeldPagesCopied] += uint64(pages)
	h.local.Read(pages)
}

// reserveHeld carries a reservation out through the run's cache, and
// counts a prompt that starts with a prefix another scope keeps here.
func (n *node) reserveHeld(dr *dreq, e handoff.Reserve) handoff.Reserved {
	if n.probes(dr.c.prompt, n.w.scopeName(dr.c.tenant, dr.c.salt)) {
		n.w.count[DecodeCrossScopeProbe]++
	}
	r := handoff.ExecReserveHeld(racingPages{pages: n.pages, c: dr.c},
		heldCache{n: n, c: dr.c, local: handoff.LocalCache{Pages: n.pages, Cache: n.cache}}, e)
	if len(r.Held) > 0 {
		n.w.count[HeldHit]++
	}
	return r
}

// keep takes a request's Keep: queued for its decode worker's next turn,
// or now and then (Reorder) carried out at once.
func (n *node) keep(dr *dreq, e handoff.Keep) {
	w := n.w
	if n.cache == nil {
		w.fail("effects", "%s request %s handed its pages to a cache its node does not keep", n.addr, dr.name)
		return
	}
	w.count[DecodeKept]++
	if w.chance(Reorder) {
		w.count[KeepEarly]++
		n.carryKeep(e)
		return
	}
	wk := n.workers[dr.worker]
	wk.keeps = append(wk.keeps, e)
	n.armWorker(dr.worker)
}

// unhold gives up the cached pages a request copied that prefill's rows
// did not confirm, as the worker does when told.
func (n *node) unhold(dr *dreq, e handoff.Unhold) {
	if n.cache == nil {
		n.w.fail("effects", "%s request %s gave up held pages of a cache its node does not keep", n.addr, dr.name)
		return
	}
	n.w.count[HeldUnconfirmed]++
	local := handoff.LocalCache{Pages: n.pages, Cache: n.cache}
	for _, c := range e.Pages {
		local.Forget(c)
	}
}

// carryKeep carries a Keep out on the run's cache.
func (n *node) carryKeep(e handoff.Keep) {
	n.w.trace.line(fmt.Sprintf("  keep %s's pages %s", e.Owner, tags(e.Tags)))
	handoff.ExecKeep(n.pages, n.cache, e, nil)
}

// keepsDue carries out the Keeps waiting for a worker's turn.
func (n *node) keepsDue(wk *worker) {
	for _, e := range wk.keeps {
		n.w.count[KeepDeferred]++
		n.carryKeep(e)
	}
	wk.keeps = nil
}

// mailbox is the worker's other messages taken between a reservation's
// asks, half the time: the Keeps waiting, every worker's.
func (n *node) mailbox() {
	waiting := 0
	for _, wk := range n.workers {
		waiting += len(wk.keeps)
	}
	if waiting == 0 || n.w.rng.IntN(2) == 0 {
		return
	}
	n.w.count[KeepRacedReserve]++
	for _, wk := range n.workers {
		n.keepsDue(wk)
	}
}

// checkHeld is the check of a plan's held pages: exactly the pages the
// attempt's reservation copied from the cache, its first destination
// pages. A page named held and never copied would be sealed from nothing
// prefill sent, and one copied and not named would be overwritten.
func (dr *dreq) checkHeld(plan *messages.TransferPlan) {
	p := dr.n.pages
	held, copied := int(plan.HeldPages), p.copies[plan.RequestID]
	ok := held == copied && held <= len(plan.DestTags)
	for i := 0; ok && i < held; i++ {
		ok = p.copied[plan.DestTags[i]]
	}
	if !ok {
		dr.n.w.fail("held pages", "%s request %s's plan for attempt %d names %d held pages of %s; its reservation copied %d from the cache",
			dr.n.addr, dr.name, plan.RequestID, held, tags(plan.DestTags), copied)
	}
}
