// Package sim is the deterministic simulator of the prefill → decode
// handoff (in the manner of FoundationDB's simulation and TigerBeetle's
// VOPR): a whole cluster in one goroutine, built from one seed, driven by
// the same pure cores a node runs (package handoff), with faults drawn from
// the seed and every invariant checked after every step.
//
// # Common path
//
// Run(seed, DefaultOptions()) builds a world and runs it to quiescence:
// PrefillNodes prefill and DecodeNodes decode nodes, each with a run
// (incarnation), one kv.Pool of a size drawn for it, and its cores
// (prefill: a handoff.Source and the reference engine; decode: a
// handoff.Admission, a handoff.Request per request and decode workers
// stepping handoff.Sequences); a router that picks a decode and a prefill
// node membership reports up and checks handoff.Admit against their pools;
// and Requests client requests of several tenants. Each prefill run keeps a
// prefix cache (handoff.PrefixCache, PrefixCachePercent of its pool) and
// prefills through it as a node's worker does (handoff.ExecPrefillCached,
// and handoff.ExecAckKeep when decode acknowledges or aborts); a crash
// loses it with the pool, and the node comes back with an empty one. Some
// tenants share a cache group in the world's tenancy.Policy, the others
// are alone, and clients send cache salts; the prompts reuse a few
// prefixes across tenants, groups and salts, and some are the next turn
// of an earlier request's chat, so that prefills hit their scope's pages,
// look up prefixes other scopes published, and evict pages (some while a
// prefill reads them) from caches a few pages small. Most decode nodes
// (three in four, drawn once per node) hold prefixes too: a decode prefix
// cache (DecodeCachePercent of the pool, scoped by the same policy) keeps
// an answered request's full prompt pages (handoff.Keep, carried out by
// the request's decode worker at its next turn, after the step that
// closed its sequence; now and then at once, with the sequence's leases
// held), and a request reserves through it (handoff.ExecReserveHeld),
// copying the cached run of its prompt's first pages into its own and
// naming them in its plan, which prefill then does not send; other
// requests' Keeps and evictions come between a reservation's lookup,
// leases and copies, and a crash loses the cache with the pool. Control
// messages (plan, done, ack, abort) cross a simulated network encoded by package messages;
// KV frames cross a simulated data plane encoded as kv batches, one
// connection per send, acknowledged batch by batch as package cluster's
// is. Running requests move between decode nodes as package actors moves
// them (move.go): an operator's or a drain's ask has the request's core
// (handoff.Request) pause its decode job, ask another decode node, whose
// admission runs a handoff.NewMovedRequest, to take it, send its KV over
// the data plane to the pages the target planned, and on the target's
// acknowledgement tell the stream's relay that the stream moved; the relay
// is the client's handoff.Stream, package cluster's relay's own core,
// which hands the stream over and asks the target to stream (StreamTake).
// Time is a simulated clock; every timer a core asks for is a scheduled
// step. The Result says whether an invariant broke (Violation, with the
// command that replays the seed), the paths the run reached (Counters) and
// a hash of its trace. Sweep runs many seeds in parallel.
//
// # Faults
//
// Faults enables each kind with a probability; a run injects each enabled
// kind with probability 3/4 (swarm testing): lost, duplicated, delayed,
// reordered and misdirected messages and frame batches, corrupted batches,
// partitions, crashes with a restart under a new incarnation (peers hear
// handoff.PeerLost after a detection delay), pools shrunk by a dummy owner,
// clock jumps past the reclaim deadlines, bit flips in sealed pages before
// their reader verifies them (cached pages too: every shared lease
// verifies one), bits flipped in a held copy before its seal (which must
// check it against the cached page's checksum), unleases of shared leases
// repeated, Keeps carried out before their sequence closed, oversize
// prompts, cancellations, moves of running requests (asked after a token
// streamed, up to three a request, and drains of a whole node; every fault
// above falls on their messages and frames too, and crashes on either
// side), and chunks forged by a decode node for a stream it does not
// carry. The
// Counters are the "sometimes" assertions: Unreached lists the paths an
// enabled kind never reached, which a campaign treats as a failure, and
// UnreachedCache the paths of the prefix cache a workload never reached.
//
// # Invariants
//
// After every step: every page is free or owned by the owner of the one
// tenancy a reservation handed out, the pool let no other owner at it, and
// its generation only grew (kv.Pool.Inspect agrees with the oracle); a
// source page awaiting decode's acknowledgement is freed only by the ack
// (itself only after decode's ack, an abort or a failed transfer) or by its
// reclaim deadline; a late message of an abandoned attempt changes nothing;
// a corrupted batch never passes the decoder and an intact one always does.
// A cached page is held by the scope a cache published it under, and
// counted among the pool's cached pages and its cache's index; the pool
// counts as many readers of it as the oracle holds shared leases, frees it
// only when none is held, and refuses a repeated unlease; the index never
// finds a page of another scope. While a request moves, its source gives
// no page back before the target's acknowledgement, unless the request
// ends otherwise, and ends moved only on that acknowledgement; a relay
// passes on chunks of the node its stream is on and no other, and a moved
// stream's tokens are the reference's, each once (the answers' check
// below). At every read through a lease: every row
// returned was computed for the lease's owner on that run (the provenance
// oracle: rows are labelled when written, and labels travel with the
// frames and with a held copy's bytes), or, through a shared lease or in
// a held copy, for a request of the reader's scope, by the oracle's own
// account of the policy and of the client each plan or decode request
// serves (never the policy's code, which is under test). A plan names as
// held exactly the pages its reservation copied from the cache, its first
// ones. At every
// answer: tokens streamed and the result equal the reference
// (engine.ReferenceEngine, cut at EOS), and the cached tokens it reports
// are those its prefill read through shared leases (a decode node's held
// pages are not counted there), or the request ends
// with one error of a stable messages.ErrorCode; never twice; a request is
// refused as prompt_too_long exactly when the smallest pool on its path
// cannot hold it. At the end: every request ended, no page is still
// owned, and once the reclaim deadline has passed every page of every pool
// is free or cached, and no lease on a cached page is held. A core's panic
// is a violation too.
//
// # Determinism and concurrency
//
// A world is single-threaded and takes every random choice from one PCG
// seeded by its seed, in the order of its steps; nothing iterates a map
// where the order matters. The same seed and build give the same trace,
// step by step (TestSimSeed -seed N -v prints it). Sweep runs worlds on
// several goroutines, one world each.
package sim
