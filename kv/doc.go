// Package kv is the paged KV-cache pool of one device as a pure state
// machine: page geometry, generation-tagged pages, owners, states, read
// leases, deferred release, manifests, checksums and the transfer frame
// codec.
//
// # Common path
//
// Decode reserves pages for a request (Pool.Reserve, at a time: the owner has
// them until OwnedTimeout from then), which returns one Tag per page. A Tag is
// (node incarnation, page index, generation); the generation moves on every
// release, so a tag names exactly one tenancy of one physical page. The writer
// appends token rows (Pool.Write) and seals the page (Pool.Seal), which
// computes a checksum over the page header (tag, owner, token range) and the
// payload. A reader obtains a Lease by handshake (Pool.Lease checks tag,
// tenant, request and state) and reads only through it (Pool.Read). Release
// (Pool.Release) is deferred while the page is leased or awaits a peer's
// acknowledgement, and forced by Pool.Tick once the reclaim deadline has
// passed; Pool.Tick likewise reclaims a page still owned (reserved, filling,
// sealed or leased) past OwnedTimeout, so that an owner that died without
// releasing cannot pin it. Either way the generation moves on and every old
// tag is refused from then on.
//
// A Manifest lists the tags a request expects, in order, with one checksum per
// page and the token count; Manifest.Verify checks all of it against the pool
// before decode reads. A page received from another pool seals only if its
// bytes are those its source sealed (Pool.SealFrom with the source's Origin),
// which catches bytes changed after the source's seal that every frame
// checksum, computed at send, would pass. Frames (EncodeFrame, DecodeFrame)
// carry a token range of one page between pools; the decoder refuses anything
// malformed, oversized or inconsistent with a typed error and never panics.
//
// # Cached pages
//
// A full sealed page of a prompt can be published (Pool.Publish) under a
// Scope: it becomes read-only and ownerless, and any request of that scope
// leases it (Pool.LeaseShared, which verifies its checksum afresh) and
// reads it through the lease; it is freed only by eviction (Pool.Evict),
// which waits for the last lease. PrefixRoot, PrefixKey.Next and PrefixKeys
// name such pages by a chain of hashes over the scope, the model, the page
// layout and every token up to the page's end, and a PrefixIndex holds a
// bounded set of them and says which to evict, least recently used first.
//
// # Concurrency and ownership
//
// Nothing here starts a goroutine, takes a lock, reads a clock or does I/O.
// Time is an argument (Pool.Reserve, Pool.Tick, Pool.Release). A Pool, a Page and a
// FreeList must each be used by one goroutine at a time; the actor that owns
// it serialises access. Pool composes Pages and a FreeList over one arena;
// an actor system may instead give each Page to its own actor and the
// FreeList to a pool actor (NewPages, FirstTags). Slices that Read returns
// alias the arena: they must not be written, and their bytes do not change
// while a lease on the page is outstanding, short of a reclaim after the
// deadline. The one exception is a chaos build's cross-read oracle
// (oracle.go): a pool's pages share its counters, which are atomic, so that
// pages owned by different goroutines count into one place.
//
// # Invariants
//
// At most one owner per page; generations only grow; free + used pages equal
// capacity; no read without a current lease; a leased or unacknowledged page
// is never reallocated before its reclaim deadline. Expected failures are
// typed errors with the numbers in them; a broken invariant panics with the
// numbers.
package kv
