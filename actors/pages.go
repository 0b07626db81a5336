package actors

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/tenancy"
)

// Messages to a page actor. Each is answered with a PageReply, except
// pageAssign (from the pool actor, which owns the free list) and
// pageReclaim (the page's own timer).
type (
	// PageWrite appends token rows (kv.Page.Write). Data is owned by the
	// message: the sender must not touch it after sending.
	PageWrite struct {
		Tag   kv.Tag
		Owner kv.Owner
		First int
		Data  []byte
	}
	// PageSeal seals the page; the reply carries the checksum. With
	// From, the page seals only if its bytes are those sealed there
	// (kv.Page.SealFrom).
	PageSeal struct {
		Tag   kv.Tag
		Owner kv.Owner
		From  *kv.Origin
	}
	// PageLease asks for a read lease; the reply carries the lease and,
	// for a reader in the same process, the page's written bytes, which do
	// not change while the lease is held.
	PageLease struct {
		Tag   kv.Tag
		Owner kv.Owner
	}
	// PageUnlease gives a lease back.
	PageUnlease struct{ Lease kv.Lease }
	// PageAwaitAck marks the page as sent to a peer that has not
	// acknowledged it.
	PageAwaitAck struct {
		Tag   kv.Tag
		Owner kv.Owner
	}
	// PageAck records the peer's acknowledgement.
	PageAck struct {
		Tag   kv.Tag
		Owner kv.Owner
	}
	// PageRelease gives the page back, at once or deferred.
	PageRelease struct {
		Tag   kv.Tag
		Owner kv.Owner
	}
	// PageVerify checks entry Index of a manifest, expected at sequence
	// position First, against the page.
	PageVerify struct {
		Index, First int
		Entry        kv.ManifestPage
		Owner        kv.Owner
	}
	// PageInspect asks for the page's kv.PageInfo; the reply is a
	// kv.PageInfo.
	PageInspect struct{}
	// PageLeaseShared asks for a shared read lease on a cached page
	// (kv.Page.LeaseShared); the reply carries it and the page's bytes,
	// as for PageLease.
	PageLeaseShared struct {
		Page   kv.CachedPage
		Reader kv.Owner
		Scope  kv.Scope
	}
	// PageAckPublish acknowledges the page and, when that would free it,
	// publishes it under Scope instead (kv.Page.AckPublish); the reply's
	// Cached is its handle, zero when it was only acknowledged.
	PageAckPublish struct {
		Tag   kv.Tag
		Owner kv.Owner
		Scope kv.Scope
	}
	// PagePublish turns a full sealed page never sent into a cached page
	// of Scope (kv.Page.Publish); the reply's Cached is its handle.
	PagePublish struct {
		Tag   kv.Tag
		Owner kv.Owner
		Scope kv.Scope
	}
	// PageEvict gives a cached page up (kv.Page.Evict).
	PageEvict struct{ Page kv.CachedPage }

	// PageReply answers every page message but PageInspect.
	PageReply struct {
		Err    error
		Sum    uint64
		Lease  kv.Lease
		Bytes  []byte
		Tokens int
		Cached kv.CachedPage
	}

	// pageAsk is a page message from this process and the channel its
	// PageReply goes back on (Pool.Page): an answer without a future,
	// whose process registration, timer and goroutine wake-ups were 12 %
	// of a prefix-cache hit's CPU. The channel holds the one reply, so
	// the page never waits on a caller that gave up.
	pageAsk struct {
		Msg   any
		Reply chan PageReply
	}
	pageAssign struct {
		Tag   kv.Tag
		Owner kv.Owner
		First int
	}
	// pageReclaim is the page's timer: its deadline may have come.
	pageReclaim struct{}
	pageFreed   struct{ Tag kv.Tag }
	// pagePublished tells the pool actor a page is cached (its owner is
	// gone): no tenant holds it from then on.
	pagePublished struct{ Tag kv.Tag }
)

// pageActor owns one kv.Page: every change of owner, every write and every
// read lease of that page goes through its mailbox, one at a time. Its one
// timer follows the page's deadline (kv.Page.Deadline), so a page owned
// past OwnedPageTimeout, or released past ReclaimAfter, is reclaimed even
// if its owner died without a word: one timer a page, rearmed, so their
// number is the pool's page count whatever the traffic.
type pageActor struct {
	page  *kv.Page
	pool  *actor.PID     // told of every free, to put the page back on its free list
	gen   *atomic.Uint64 // the page's generation, for readers in other goroutines
	clock func() time.Time
	stats *poolCounters
	timer *time.Timer // sends pageReclaim at armed
	armed time.Time   // the deadline the timer is set for; zero when stopped
}

func (a *pageActor) Receive(c actor.Context) {
	pg := a.page
	defer func() {
		a.gen.Store(pg.Tag().Generation)
		a.arm(c)
	}()
	var r PageReply
	var freed bool
	msg := c.Message()
	var reply chan PageReply
	if a, ok := msg.(pageAsk); ok {
		msg, reply = a.Msg, a.Reply
	}
	switch m := msg.(type) {
	case pageAssign:
		pg.Assign(m.Tag, m.Owner, m.First, a.clock())
		return
	case PageWrite:
		r.Err = pg.Write(m.Tag, m.Owner, m.First, m.Data)
	case PageSeal:
		if m.From != nil {
			r.Sum, r.Err = pg.SealFrom(m.Tag, m.Owner, *m.From)
		} else {
			r.Sum, r.Err = pg.Seal(m.Tag, m.Owner)
		}
	case PageLease:
		if r.Lease, r.Err = pg.Lease(m.Tag, m.Owner); r.Err == nil {
			r.Bytes, r.Tokens, r.Err = pg.Read(r.Lease)
		}
	case PageLeaseShared:
		if r.Lease, r.Err = pg.LeaseShared(m.Page, m.Reader, m.Scope); r.Err == nil {
			r.Bytes, r.Tokens, r.Err = pg.Read(r.Lease)
		}
	case PageAckPublish:
		if r.Cached, freed, r.Err = pg.AckPublish(m.Tag, m.Owner, m.Scope); r.Cached.Tag != (kv.Tag{}) {
			c.Send(a.pool, pagePublished{Tag: r.Cached.Tag})
		}
	case PagePublish:
		if r.Cached, r.Err = pg.Publish(m.Tag, m.Owner, m.Scope); r.Err == nil {
			c.Send(a.pool, pagePublished{Tag: r.Cached.Tag})
		}
	case PageEvict:
		freed, r.Err = pg.Evict(m.Page, a.clock())
	case PageUnlease:
		freed, r.Err = pg.Unlease(m.Lease)
	case PageAwaitAck:
		r.Err = pg.AwaitAck(m.Tag, m.Owner)
	case PageAck:
		freed, r.Err = pg.Ack(m.Tag, m.Owner)
	case PageRelease:
		freed, r.Err = pg.Release(m.Tag, m.Owner, a.clock())
	case PageVerify:
		r.Err = pg.Verify(m.Index, m.First, m.Entry, m.Owner)
	case PageInspect:
		c.Respond(pg.Info())
		return
	case pageReclaim:
		rec, ok := pg.Reclaim(a.clock())
		if !ok {
			a.armed = time.Time{} // early, or for a deadline since moved: arm again
			return
		}
		a.stats.reclaimed[rec.State].Add(1)
		a.stats.log.Warn("page reclaimed at its deadline", "tag", rec.Tag.String(), "state", rec.State.String(),
			"owner", rec.Owner.String(), "readers", rec.Readers, "await_ack", rec.AwaitAck)
		c.Send(a.pool, pageFreed{Tag: pg.Tag()})
		return
	case *actor.Stopping:
		if a.timer != nil {
			a.timer.Stop()
		}
		return
	default:
		return
	}
	if r.Err != nil {
		a.stats.refused(r.Err)
	}
	if freed {
		c.Send(a.pool, pageFreed{Tag: pg.Tag()})
	}
	if reply != nil {
		reply <- r
		return
	}
	c.Respond(r)
}

// arm sets the timer to the page's deadline when it has changed, and
// stops it when the page is free.
func (a *pageActor) arm(c actor.Context) {
	d := a.page.Deadline()
	if d.Equal(a.armed) {
		return
	}
	a.armed = d
	switch {
	case d.IsZero():
		if a.timer != nil {
			a.timer.Stop()
		}
	case a.timer == nil:
		self, sys := c.Self(), c.ActorSystem()
		a.timer = time.AfterFunc(max(d.Sub(a.clock()), 0), func() { sys.Root.Send(self, pageReclaim{}) })
	default:
		a.timer.Reset(max(d.Sub(a.clock()), 0))
	}
}

// Messages to a pool actor.
type (
	// Reserve asks for N pages for Owner from sequence position First, all
	// or nothing; answered with a ReserveReply. Nonce names the
	// reservation for an undo.
	Reserve struct {
		Owner kv.Owner
		First int
		N     int
		Nonce uint64
	}
	// ReserveReply carries the tags, in order, or the refusal
	// (kv.PoolExhaustedError when too few pages are free).
	ReserveReply struct {
		Tags []kv.Tag
		Err  error
	}
	// PoolStatus asks for a PoolStatusReply.
	PoolStatus struct{}
	// PoolStatusReply is the pool's page accounting.
	PoolStatusReply struct {
		Capacity, Free int
		Reservations   uint64
		// Reclaimed counts pages reclaimed at their deadline, by the
		// state they were in (kv.Stats.Reclaimed).
		Reclaimed kv.Reclaims
		Refused   kv.Refusals
		// Cross counts rows the pages' reads returned that another owner
		// wrote (kv.CrossRowsOf): counted only by a chaos build.
		Cross kv.CrossRows
		// Cache is the counts of the prefix cache kept in the pool (of a
		// prefill worker's); nil without one.
		Cache *handoff.PrefixStats
	}
)

// Available is how many pages a reservation can have: the free ones and
// those the prefix cache holds, which it gives up for a reservation that
// finds the pool full. The two are read apart (the cache's counts as of
// its worker's last change), so their sum is capped at the capacity.
func (s PoolStatusReply) Available() int {
	return s.Free + s.Cached()
}

// Cached is how many pages the prefix cache holds, at most those not free.
func (s PoolStatusReply) Cached() int {
	if s.Cache == nil {
		return 0
	}
	return max(0, min(s.Cache.Pages, s.Capacity-s.Free))
}

// poolActor owns one device's kv.FreeList: reservations are all or nothing,
// and a page goes back on the free list only when its page actor reports
// the free.
type poolActor struct {
	cfg          kv.Config
	pids         []*actor.PID
	free         kv.FreeList
	stats        *poolCounters
	reservations uint64
	// granted remembers the last grantedMax reservations by nonce, for an
	// undo from a caller that stopped waiting; order is their age.
	granted map[uint64][]kv.Tag
	order   []uint64
	// fair shares the pages among tenants (tenancy.PoolShares), by the
	// tenants' shares; ownerOf is each page's owner while it is reserved,
	// whose pages a free gives back.
	fair    *tenancy.PoolShares
	tenants *tenancy.Shares
	ownerOf []kv.Owner
	clock   func() time.Time
}

// undoReserve releases the reservation Nonce of Owner, if it was granted.
type undoReserve struct {
	Owner kv.Owner
	Nonce uint64
}

// grantedMax bounds how many reservations a pool actor remembers for an
// undo: far more than can be waiting on an answer at once.
const grantedMax = 4096

func (a *poolActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case Reserve:
		c.Respond(a.reserve(c, m))
	case pageFreed:
		a.free.Push(m.Tag)
		a.unown(m.Tag.Index)
	case pagePublished:
		// Cached, the page is no tenant's to hold against its share.
		a.unown(m.Tag.Index)
	case undoReserve:
		for _, t := range a.granted[m.Nonce] {
			c.Request(a.pids[t.Index], PageRelease{Tag: t, Owner: m.Owner}) // the reply is dropped here
		}
		delete(a.granted, m.Nonce)
	case PoolStatus:
		c.Respond(PoolStatusReply{Capacity: a.free.Capacity(), Free: a.free.Len(), Reservations: a.reservations,
			Reclaimed: a.stats.reclaims(), Refused: a.stats.snapshot(), Cross: a.stats.cross()})
	}
}

// unown counts page idx's pages no longer its owner's, if it had one.
func (a *poolActor) unown(idx uint32) {
	if o := a.ownerOf[idx]; o != (kv.Owner{}) {
		a.fair.Freed(o, 1)
		a.ownerOf[idx] = kv.Owner{}
	}
}

func (a *poolActor) remember(nonce uint64, tags []kv.Tag) {
	if len(a.order) == grantedMax {
		delete(a.granted, a.order[0])
		a.order = a.order[1:]
	}
	a.granted[nonce] = tags
	a.order = append(a.order, nonce)
}

func (a *poolActor) reserve(c actor.Context, m Reserve) ReserveReply {
	if err := m.Owner.Validate(); err != nil {
		return ReserveReply{Err: err}
	}
	if m.First < 0 || m.First > kv.SequenceTokensMax {
		return ReserveReply{Err: fmt.Errorf("actors: reserve at sequence position %d: want 0 to %d", m.First, kv.SequenceTokensMax)}
	}
	if avail, bound, ok := a.fair.Reserve(a.tenants.Policy(), m.Owner, m.N, a.free.Len(), a.clock()); !ok {
		return ReserveReply{Err: &kv.PoolExhaustedError{Need: m.N, Free: avail, Capacity: a.free.Capacity(),
			Tenant: m.Owner.Tenant, Held: a.fair.Held(m.Owner.Tenant), Share: bound}}
	}
	tags, err := a.free.Take(m.N)
	if err != nil {
		a.fair.Freed(m.Owner, m.N) // counted by Reserve, not taken
		return ReserveReply{Err: err}
	}
	for _, t := range tags {
		a.ownerOf[t.Index] = m.Owner
	}
	// The assignments are in the page actors' mailboxes before the reply
	// leaves: anything the owner sends a page after the reply is behind
	// its assignment.
	for i, t := range tags {
		c.Send(a.pids[t.Index], pageAssign{Tag: t, Owner: m.Owner, First: m.First + i*a.cfg.Geometry.PageTokens})
	}
	a.reservations += uint64(m.N)
	a.remember(m.Nonce, tags)
	return ReserveReply{Tags: tags}
}
