package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
)

type role uint8

const (
	rolePrefill role = iota
	roleDecode
)

// simModel stands for the fingerprint of the one model every node of a
// world computes: the simulator checks the handoff, not fingerprints.
var simModel = engine.Fingerprint{'s', 'i', 'm'}

func (r role) String() string {
	if r == rolePrefill {
		return "prefill"
	}
	return "decode"
}

// node is one simulated node: its address (kept across restarts), its
// run (incarnation, 0 while it is down), its pool with the oracle around it,
// and the cores of its role. Everything but the address and the pool size
// is lost in a crash.
type node struct {
	w      *world
	role   role
	addr   string
	pagesN int
	inc    uint64
	known  uint64 // the run membership reports for the address, 0 for none
	pages  *pages
	// cache is the run's prefix cache: every prefill run's, and a decode
	// run's when the node holds prefixes (nil when the world runs none).
	// published records, by prompt prefix (prefixKey), the scopes of the
	// oracle that published its last page on this run.
	cache     *handoff.PrefixCache
	published map[string][]string

	// prefill
	src      *handoff.Source
	ready    map[handoff.JobKey]*prefilled // prefilled, not yet sending
	sends    map[handoff.JobKey]*send
	jobs     map[uint64]*job // by local owner id
	recent   []kv.Frame      // the frames sent last, for the misdirect fault
	byKey    map[handoff.JobKey]*job
	nextArmd bool

	// decode; holds says the node keeps answered prompts' pages in a
	// prefix cache (drawn once, kept across restarts)
	holds   bool
	adm     *handoff.Admission
	cfg     handoff.RequestConfig
	reqs    map[uint64]*dreq // by attempt id, every attempt
	live    []*dreq          // in flight, in start order
	nextID  uint64
	workers []*worker
}

func (w *world) newNode(r role, i, pagesMin, pagesMax int) *node {
	n := &node{w: w, role: r, addr: fmt.Sprintf("%s-%d:7000", r, i), pagesN: pagesMin + w.rng.IntN(pagesMax-pagesMin+1)}
	n.holds = r == roleDecode && w.opt.DecodeCachePercent > 0 && w.rng.IntN(4) != 0
	return n
}

// boot starts a new run of the node: a new incarnation, an empty pool, an
// empty prefix cache and fresh cores.
func (n *node) boot() {
	w := n.w
	n.inc = w.newIncarnation()
	t := w.opt.Timing
	cfg := kv.DefaultConfig(w.limits.Geometry, n.pagesN, n.inc)
	cfg.ReclaimAfter, cfg.OwnedTimeout = t.ReclaimAfter, t.OwnedTimeout
	pool, err := kv.NewPool(cfg)
	if err != nil {
		w.fail("options", "pool of %s: %v", n.addr, err)
		return
	}
	n.pages = newPages(n, pool)
	n.cache, n.published = n.newCache(), map[string][]string{}
	switch n.role {
	case rolePrefill:
		n.src = handoff.NewSource(handoff.SourceConfig{Role: "prefill", PageTokens: w.opt.PageTokens, QueueMax: 8, SendsMax: 2,
			ReclaimAfter: t.ReclaimAfter, DonePlansMax: 64, DoneFor: t.DoneFor, Model: simModel})
		n.ready, n.sends = map[handoff.JobKey]*prefilled{}, map[handoff.JobKey]*send{}
		n.jobs, n.byKey = map[uint64]*job{}, map[handoff.JobKey]*job{}
		n.nextArmd, n.recent = false, nil
	case roleDecode:
		n.adm = handoff.NewAdmission(w.limits, 64, w.opt.DecodeWorkers, n.pagesN)
		n.cfg = handoff.RequestConfig{Geometry: w.limits.Geometry, Incarnation: n.inc, DataPlane: n.addr,
			RequestTimeout: t.RequestTimeout, PrefillTimeout: t.PrefillTimeout, ReserveWait: t.ReserveWait,
			ReserveRetry: t.ReserveRetry, RetriesMax: handoff.RetriesMax, EOS: engine.EOS, Model: simModel.String(),
			Keep: n.holds}
		n.reqs, n.live, n.nextID = map[uint64]*dreq{}, nil, 0
		n.workers = make([]*worker, w.opt.DecodeWorkers)
		for i := range n.workers {
			n.workers[i] = &worker{}
		}
	}
	n.armTick()
}

// senderKey is a node run as a plan's JobKey names its sender: the
// address and the run, so that a restarted node's plans are never taken
// for its old self's (parseSender reads it back).
func senderKey(addr string, inc uint64) string { return fmt.Sprintf("%s/%x", addr, inc) }

// at schedules fn for this run of the node only: if the node crashed in
// between, the step finds another run and does nothing.
func (n *node) at(d time.Duration, what string, fn func()) {
	inc := n.inc
	n.w.after(d, n.addr+" "+what, func() {
		if n.inc != inc {
			n.w.trace.line("  dropped: the run it was for has ended")
			return
		}
		fn()
	})
}

func (n *node) armTick() {
	n.at(n.w.opt.Timing.Tick, "tick", func() {
		n.pages.tick()
		if n.w.open > 0 {
			n.armTick()
		}
	})
}

// crash loses everything of the node's run; membership tells the others
// after a while, and the node comes back with a new incarnation.
func (n *node) crash() {
	w := n.w
	if n.inc == 0 {
		return
	}
	old := n.inc
	w.count[Crashed]++
	w.trace.line(fmt.Sprintf("  CRASH %s (run %x)", n.addr, old))
	n.pages.retire()
	if n.cache != nil && n.cache.Stats().Pages > 0 {
		lost := CacheLost
		if n.role == roleDecode {
			lost = DecodeCacheLost
		}
		w.count[lost]++
	}
	for _, c := range w.clients {
		if !c.done && c.node == n && c.inc == old {
			c.nodeLost(fmt.Sprintf("decode node %s (run %x) died", n.addr, old))
		}
	}
	n.inc = 0
	detect := w.between(w.opt.Timing.Detect/4, w.opt.Timing.Detect)
	w.after(detect, fmt.Sprintf("membership: %s run %x is gone", n.addr, old), func() {
		if n.known == old {
			n.known = 0
		}
		for _, d := range w.decode {
			d.peerLost(old)
		}
	})
	w.after(w.between(w.opt.Timing.Detect/4, 2*w.opt.Timing.Detect), "restart "+n.addr, func() {
		n.boot()
		w.count[Restarted]++
		inc := n.inc
		w.trace.line(fmt.Sprintf("  RESTART %s as run %x", n.addr, inc))
		w.after(w.between(w.opt.Timing.Detect/4, w.opt.Timing.Detect), fmt.Sprintf("membership: %s run %x joined", n.addr, inc), func() {
			if n.inc == inc {
				n.known = inc
			}
		})
	})
}

// alive lists the nodes of ns membership reports up, in index order. A
// node that restarted may still be known by its old run.
func alive(ns []*node) []*node {
	return slices.DeleteFunc(slices.Clone(ns), func(n *node) bool { return n.known == 0 })
}

// peer is the node as membership reports it.
func (n *node) peer() handoff.Peer { return handoff.Peer{Address: n.addr, Incarnation: n.known} }
