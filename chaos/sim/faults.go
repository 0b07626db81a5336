package sim

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kvwarden/kvwarden/kv"
)

// buildFaults schedules the run's faults of the world itself, each kind up
// to three times at random times while clients send: partitions, crashes,
// pool shrinks, clock jumps, bit flips and drains.
func (w *world) buildFaults() {
	t := w.opt.Timing
	window := t.Arrivals + t.PrefillTimeout
	for _, f := range []struct {
		kind Kind
		what string
		fn   func()
	}{
		{Partition, "partition", w.partition},
		{Crash, "crash", func() { w.nodes[w.rng.IntN(len(w.nodes))].crash() }},
		{Shrink, "pool shrink", w.shrink},
		{ClockJump, "clock jump", w.jump},
		{BitFlip, "bit flip", func() { w.flip(20) }},
		{Move, "drain", w.drain},
	} {
		for range 3 {
			if w.chance(f.kind) {
				w.after(w.between(0, window), "fault: "+f.what, f.fn)
			}
		}
	}
}

// partition cuts a prefill node from a decode node for a while.
func (w *world) partition() {
	t := w.opt.Timing
	p := partition{a: w.prefill[w.rng.IntN(len(w.prefill))], b: w.decode[w.rng.IntN(len(w.decode))], from: w.now}
	p.until = w.now.Add(w.between(t.PrefillTimeout/2, 3*t.PrefillTimeout))
	w.parts = append(w.parts, p)
	w.trace.line(fmt.Sprintf("  PARTITION %s | %s until +%s", p.a.addr, p.b.addr, p.until.Sub(w.start)))
}

// shrink has a dummy owner hold some of a pool's free pages for a while.
func (w *world) shrink() {
	n := w.nodes[w.rng.IntN(len(w.nodes))]
	if n.inc == 0 {
		return
	}
	free := n.pages.pool.Stats().Free
	if free == 0 {
		return
	}
	w.count[PoolShrunk]++
	owner := kv.Owner{Request: w.seq, Tenant: "pool-shrink"}
	held, err := n.pages.Reserve(owner, 0, 1+w.rng.IntN(free))
	if err != nil {
		w.fail("effects", "shrink of %s by %d free pages: %v", n.addr, free, err)
		return
	}
	w.trace.line(fmt.Sprintf("  SHRINK %s by %s", n.addr, tags(held)))
	t := w.opt.Timing
	n.at(w.between(t.ReserveWait/2, 3*t.ReserveWait), "pool shrink ends", func() {
		for _, tag := range held {
			if err := n.pages.Release(tag, owner); err != nil {
				w.trace.line("  shrink page " + tag.String() + " released with " + err.Error())
			}
		}
	})
}

// jump moves the clock past the reclaim deadline, or now and then past the
// owned timeout, and has every pool tick at once.
func (w *world) jump() {
	t := w.opt.Timing
	d := w.between(t.ReclaimAfter, 2*t.ReclaimAfter)
	if w.rng.IntN(3) == 0 {
		d = w.between(t.OwnedTimeout, t.OwnedTimeout+t.ReclaimAfter)
	}
	w.now = w.now.Add(d)
	w.count[ClockJumped]++
	w.trace.line(fmt.Sprintf("  CLOCK JUMP by %s to +%s", d, w.now.Sub(w.start)))
	for _, n := range w.nodes {
		if n.inc != 0 {
			n.pages.tick()
		}
	}
}

// flip flips a high exponent bit of one KV value in a sealed page at rest,
// in a window where its reader still verifies it before reading: a source
// page computed and not yet sent, or a decode page verified and not yet
// begun (Begin verifies again). It tries again a little later, tries
// times, when no page is in such a window.
func (w *world) flip(tries int) {
	var cands []struct {
		n   *node
		tag kv.Tag
	}
	for _, n := range w.nodes {
		if n.inc == 0 {
			continue
		}
		for _, t := range n.atRest() {
			if n.pages.flippedAt(t) {
				continue // a second flip could undo the first
			}
			cands = append(cands, struct {
				n   *node
				tag kv.Tag
			}{n, t})
		}
	}
	if len(cands) == 0 {
		if tries > 1 {
			w.after(w.opt.Timing.DecodeStep, "fault: bit flip", func() { w.flip(tries - 1) })
		}
		return
	}
	c := cands[w.rng.IntN(len(cands))]
	p := c.n.pages
	info := p.pool.Inspect(c.tag.Index)
	var l kv.Lease
	var err error
	if info.State == kv.Cached {
		cp := kv.CachedPage{Tag: info.Tag, Scope: info.Scope, First: info.First, Tokens: info.Tokens, Checksum: info.Checksum}
		l, err = p.pool.LeaseShared(cp, kv.Owner{Request: w.seq, Tenant: "bit-flip"}, info.Scope)
	} else {
		l, err = p.pool.Lease(c.tag, info.Owner)
	}
	if err != nil {
		w.trace.line("  bit flip found " + c.tag.String() + " gone: " + err.Error())
		return
	}
	b, rows, _ := p.pool.Read(l)
	row := w.rng.IntN(rows)
	bpt := p.pool.Geometry().BytesPerToken()
	b[row*bpt+4*w.rng.IntN(bpt/4)+3] ^= 0x40 // b is the arena, written behind the pool's back on purpose
	p.rows[int(c.tag.Index)*p.pt+row] = flipped
	if err := p.pool.Unlease(l); err != nil {
		w.fail("effects", "bit flip gives back its lease of %s: %v", c.tag, err)
	}
	w.count[BitFlipped]++
	if info.State == kv.Cached {
		w.count[CachedFlipped]++
	}
	w.trace.line(fmt.Sprintf("  BIT FLIP in row %d of %s on %s", row, c.tag, c.n.addr))
}

// atRest are the node's sealed pages that a reader will verify before it
// reads them: a cached page is verified at every shared lease.
func (n *node) atRest() []kv.Tag {
	out := n.pages.cachedTags()
	for _, p := range n.ready {
		for _, f := range p.frames.Frames {
			out = append(out, f.Source)
		}
	}
	for _, s := range n.sends {
		for _, f := range s.frames[s.next:] {
			out = append(out, f.Source)
		}
	}
	for _, wk := range n.workers {
		for _, j := range wk.queued {
			for _, mp := range j.start.Manifest.Pages {
				out = append(out, mp.Tag)
			}
		}
	}
	return sortTags(out)
}

// sortTags orders tags by page and generation: the maps they came from
// have no order, and the seed must fix every choice.
func sortTags(ts []kv.Tag) []kv.Tag {
	slices.SortFunc(ts, func(a, b kv.Tag) int {
		return cmp.Or(cmp.Compare(a.Index, b.Index), cmp.Compare(a.Generation, b.Generation))
	})
	return ts
}

// checkStep is the check after every step: every live pool agrees with the
// oracle.
func (w *world) checkStep() {
	for _, n := range w.nodes {
		if n.inc != 0 {
			n.pages.check()
		}
	}
}

// checkEnd is the check once nothing is left to happen: every request
// ended; no page is owned any more (a page still reserved, filling, sealed
// or leased is a leak that only the owned timeout would end); and once the
// reclaim deadline has passed, every page of every pool is free or cached,
// and no lease on a cached page is held.
func (w *world) checkEnd() {
	for _, c := range w.clients {
		if !c.done {
			w.fail("liveness", "client %d (%s) never got an answer or an error", c.id, c.tenant)
			return
		}
	}
	up := slices.DeleteFunc(slices.Clone(w.nodes), func(n *node) bool { return n.inc == 0 })
	for _, n := range up {
		if owned := n.pages.busy(func(s kv.State) bool { return s != kv.Released && s != kv.Cached }); len(owned) > 0 {
			w.fail("pages released", "%s (run %x) still has %d pages owned after every request ended: %v", n.addr, n.inc, len(owned), owned)
			return
		}
	}
	t := w.opt.Timing
	w.now = w.now.Add(t.ReclaimAfter + t.Tick)
	w.trace.line(fmt.Sprintf("end: every request ended; clock to +%s, past the reclaim deadline", w.now.Sub(w.start)))
	for _, n := range up {
		n.pages.tick()
		n.pages.check()
		if busy := n.pages.busy(func(s kv.State) bool { return s != kv.Cached }); len(busy) > 0 {
			w.fail("pages freed", "%s (run %x) has %d pages neither free nor cached after every request ended and the reclaim deadline passed: %v",
				n.addr, n.inc, len(busy), busy)
		}
		if leased := n.pages.leasedCached(); len(leased) > 0 || len(n.pages.shared) > 0 {
			w.fail("pages freed", "%s (run %x) has cached pages leased after every request ended: %v (shared leases held %d)",
				n.addr, n.inc, leased, len(n.pages.shared))
		}
		n.pages.retire()
	}
	for _, dr := range w.all {
		w.count[LateIgnored] += dr.r.Counts().Ignored
	}
}
