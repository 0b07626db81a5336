package actors

import (
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
)

var _ handoff.CachePages = (*pageClient)(nil)

// pageClient is a handoff.Pages (and so an engine.KV) whose every call is a message to a page actor of
// one pool: the engine computes over page actors exactly as over a
// kv.Pool. A lease's bytes come back with the lease (same process only),
// and Read serves them while this client holds the lease: sealed bytes do
// not change while leased, so the handshake at Lease is the check.
type pageClient struct {
	pool  *Pool
	r     Requester
	views map[kv.Lease][]byte
	held  map[kv.Lease]int
}

func newPageClient(pool *Pool, r Requester) *pageClient {
	return &pageClient{pool: pool, r: r, views: map[kv.Lease][]byte{}, held: map[kv.Lease]int{}}
}

func (c *pageClient) Geometry() kv.Geometry { return c.pool.Geometry }

func (c *pageClient) VerifyPage(i, first int, mp kv.ManifestPage, owner kv.Owner) error {
	return c.pool.Page(c.r, mp.Tag, PageVerify{Index: i, First: first, Entry: mp, Owner: owner}).Err
}

// Write copies data into the message: the engine reuses its buffers, and
// a message must own what it carries.
func (c *pageClient) Write(tag kv.Tag, owner kv.Owner, first int, data []byte) error {
	return c.WriteOwned(tag, owner, first, append([]byte(nil), data...))
}

// WriteOwned sends data as it is, for a caller whose data nothing else will
// write (a received frame's payload).
func (c *pageClient) WriteOwned(tag kv.Tag, owner kv.Owner, first int, data []byte) error {
	return c.pool.Page(c.r, tag, PageWrite{Tag: tag, Owner: owner, First: first, Data: data}).Err
}

func (c *pageClient) Seal(tag kv.Tag, owner kv.Owner) (uint64, error) {
	rep := c.pool.Page(c.r, tag, PageSeal{Tag: tag, Owner: owner})
	return rep.Sum, rep.Err
}

// SealFrom seals a received page only if its bytes are those its source
// sealed (kv.Page.SealFrom).
func (c *pageClient) SealFrom(tag kv.Tag, owner kv.Owner, o kv.Origin) (uint64, error) {
	rep := c.pool.Page(c.r, tag, PageSeal{Tag: tag, Owner: owner, From: &o})
	return rep.Sum, rep.Err
}

func (c *pageClient) Lease(tag kv.Tag, owner kv.Owner) (kv.Lease, error) {
	return c.hold(c.pool.Page(c.r, tag, PageLease{Tag: tag, Owner: owner}))
}

// LeaseShared leases a cached page for reader under scope.
func (c *pageClient) LeaseShared(p kv.CachedPage, reader kv.Owner, scope kv.Scope) (kv.Lease, error) {
	return c.hold(c.pool.Page(c.r, p.Tag, PageLeaseShared{Page: p, Reader: reader, Scope: scope}))
}

// hold keeps the lease a page granted, and its bytes, for Read.
func (c *pageClient) hold(rep PageReply) (kv.Lease, error) {
	if rep.Err != nil {
		return kv.Lease{}, rep.Err
	}
	c.views[rep.Lease] = rep.Bytes
	c.held[rep.Lease]++
	return rep.Lease, nil
}

// AckPublish acknowledges a page, publishing it under scope when that
// would free it.
func (c *pageClient) AckPublish(tag kv.Tag, owner kv.Owner, scope kv.Scope) (kv.CachedPage, error) {
	rep := c.pool.Page(c.r, tag, PageAckPublish{Tag: tag, Owner: owner, Scope: scope})
	return rep.Cached, rep.Err
}

// Publish turns a full sealed page owner holds, never sent, into a cached
// page of scope.
func (c *pageClient) Publish(tag kv.Tag, owner kv.Owner, scope kv.Scope) (kv.CachedPage, error) {
	rep := c.pool.Page(c.r, tag, PagePublish{Tag: tag, Owner: owner, Scope: scope})
	return rep.Cached, rep.Err
}

// Evict gives a cached page up.
func (c *pageClient) Evict(p kv.CachedPage) error {
	return c.pool.Page(c.r, p.Tag, PageEvict{Page: p}).Err
}

// Read serves a held lease's bytes after checking, without a message, that
// the page is still that tenancy: its page actor publishes every
// generation change, so a page reclaimed under the lease (and perhaps
// reallocated) is refused here, never read.
func (c *pageClient) Read(l kv.Lease) ([]byte, int, error) {
	if c.held[l] == 0 {
		return nil, 0, &kv.StateError{Page: l.Tag, Op: "read without a lease held here", State: kv.Leased}
	}
	if int64(l.Tag.Index) >= int64(len(c.pool.gens)) {
		return nil, 0, &kv.StaleTagError{Page: l.Tag.Index, Have: l.Tag}
	}
	if gen := c.pool.gens[l.Tag.Index].Load(); gen != l.Tag.Generation {
		want := l.Tag
		want.Generation = gen
		return nil, 0, &kv.StaleTagError{Page: l.Tag.Index, Want: want, Have: l.Tag}
	}
	b := c.views[l]
	return b, len(b) / c.pool.Geometry.BytesPerToken(), nil
}

// Unlease gives a lease back. The local record goes whatever the page
// answers: a lease the page refuses (reclaimed) is no lease any more. A
// lease not held here is refused without a word to the page, which counts
// leases, not whose they are: passed on, a second unlease of one lease
// would give back another holder's (a shared page's other reader's).
func (c *pageClient) Unlease(l kv.Lease) error {
	if c.held[l] == 0 {
		return &kv.StateError{Page: l.Tag, Op: "unlease of a lease not held here", State: kv.Leased}
	}
	if c.held[l]--; c.held[l] == 0 {
		delete(c.held, l)
		delete(c.views, l)
	}
	return c.pool.Page(c.r, l.Tag, PageUnlease{Lease: l}).Err
}

// Release gives a page back through its page actor.
func (c *pageClient) Release(tag kv.Tag, owner kv.Owner) error {
	return c.pool.Page(c.r, tag, PageRelease{Tag: tag, Owner: owner}).Err
}

// Reserve asks the pool actor for n pages, all or nothing.
func (c *pageClient) Reserve(owner kv.Owner, first, n int) ([]kv.Tag, error) {
	return c.pool.Reserve(c.r, owner, first, n)
}

// AwaitAck marks a page as sent to a peer that has not acknowledged it.
func (c *pageClient) AwaitAck(tag kv.Tag, owner kv.Owner) error {
	return c.pool.Page(c.r, tag, PageAwaitAck{Tag: tag, Owner: owner}).Err
}

// Ack records the peer's acknowledgement of a page.
func (c *pageClient) Ack(tag kv.Tag, owner kv.Owner) error {
	return c.pool.Page(c.r, tag, PageAck{Tag: tag, Owner: owner}).Err
}
