package sim

import (
	"fmt"
	"io"
	"strings"
)

// Counter names one path a run can reach: a fault injected, or what the
// system did about one. They are the "sometimes" assertions of the
// simulator: a fault kind a campaign enables must reach its paths in some
// run, or the campaign tested less than it claims.
type Counter uint8

// The counters.
const (
	FramesDropped Counter = iota
	ControlDropped
	Duplicated
	DuplicatePlanDropped
	Delayed
	PrefillDeadline
	Reordered
	Misdirected
	StrangerRefused
	BatchCorrupted
	BatchRefusedChecksum
	BatchRefusedMalformed
	PartitionCut
	Crashed
	Restarted
	PeerLost
	RetryOtherPeer
	DeadRunDropped
	PoolShrunk
	ReserveRetried
	BusyRefused
	ClockJumped
	ReclaimFreed
	AckLostReclaimed
	BitFlipped
	IntegrityRefused
	StaleTagRefused
	WrongOwnerRefused
	OversizeRefused
	CancelMidDecode
	CancelBeforeDecode
	LateIgnored
	Answered
	Failed
	CachePublished
	CacheHit
	CacheEvicted
	EvictedWhileLeased
	CrossScopeProbe
	CacheLost
	SharedUnleaseRepeated
	RepeatedUnleaseRefused
	CachedFlipped
	CachedCorruptRefused
	DecodeKept
	DecodeKeptPages
	HeldHit
	HeldPagesCopied
	HeldRunCut
	DecodeEvicted
	DecodeEvictedWhileLeased
	DecodeCrossScopeProbe
	DecodeCacheLost
	KeepDeferred
	KeepEarly
	KeepLeasedReleased
	KeepRacedReserve
	ReserveRaced
	HeldCopyFlipped
	HeldCopyRefused
	HeldUnconfirmed
	HeldSumForged
	MoveAsked
	MoveHandedOver
	MoveGaveUp
	MoveUntaken
	MovedTwice
	ChunkForged
	RelayRefused
	counters
)

var counterNames = [counters]string{
	"frame batch dropped", "control message dropped", "message duplicated", "duplicate plan dropped by source",
	"message delayed past prefill timeout", "prefill deadline fired", "message reordered", "message misdirected",
	"stranger's message refused", "frame batch corrupted", "corrupt batch refused by checksum",
	"corrupt batch refused as malformed", "message cut by partition", "node crashed", "node restarted",
	"peer lost stepped into request", "retry with another peer", "message to a dead run dropped",
	"pool shrunk by dummy owner", "reservation retried", "request refused busy", "clock jumped",
	"reclaim deadline freed a page", "ack lost, source freed at reclaim", "page bit flipped at rest",
	"request failed integrity", "stale tag refused by pool", "wrong owner refused by pool",
	"oversize prompt refused", "cancel mid-decode", "cancel before decode", "late message ignored",
	"request answered", "request failed cleanly",
	"page published to a prefix cache", "prefill read a cached prefix", "cached page evicted",
	"cached page evicted while leased", "prefill of a prefix another scope published", "crash lost a prefix cache",
	"shared unlease repeated", "repeated unlease refused", "cached page bit flipped at rest",
	"corrupt cached page refused at lease",
	"answered request kept by decode cache", "page kept by a decode cache", "request copied held pages",
	"held page copied", "held run cut short (gone/corrupt)", "decode cached page evicted",
	"decode cached page evicted while leased", "decode lookup of another scope's prefix", "crash lost a decode cache",
	"keep carried out after its job closed", "keep carried out before its job closed", "keep released a still-leased page",
	"keep carried out amid a reservation", "another lookup's eviction amid a reservation", "held copy bit flipped before seal", "held copy refused at its seal",
	"held pages given up, unconfirmed by prefill", "prefill's held page checksum forged",
	"move of a running request asked", "moved stream handed over", "move given up, decoding went on",
	"moved request ended untaken", "request moved a second time", "chunk forged by another decode node",
	"relay refused a chunk of a node not handed the stream",
}

func (c Counter) String() string { return counterNames[c] }

// required are the counters each fault kind must reach.
var required = [kinds][]Counter{
	Drop:      {FramesDropped, ControlDropped},
	Duplicate: {Duplicated, DuplicatePlanDropped, SharedUnleaseRepeated, RepeatedUnleaseRefused},
	Delay:     {Delayed, PrefillDeadline},
	Reorder:   {Reordered, KeepEarly, KeepLeasedReleased},
	Misdirect: {Misdirected, StrangerRefused, ChunkForged, RelayRefused},
	Corrupt:   {BatchCorrupted, BatchRefusedChecksum},
	Partition: {PartitionCut},
	Crash:     {Crashed, Restarted, PeerLost, RetryOtherPeer, DeadRunDropped, CacheLost, DecodeCacheLost},
	Shrink:    {PoolShrunk, ReserveRetried},
	ClockJump: {ClockJumped, ReclaimFreed, AckLostReclaimed, StaleTagRefused},
	BitFlip:   {BitFlipped, IntegrityRefused, CachedFlipped, HeldCopyFlipped},
	Oversize:  {OversizeRefused},
	Cancel:    {CancelMidDecode, CancelBeforeDecode},
	// A request moved a second time, and a moved request its receiver did
	// not take in time, are counted, not required: a few in a hundred
	// seeds reach them (a moved request has few tokens left to move again).
	Move: {MoveAsked, MoveHandedOver, MoveGaveUp},
}

// cachePaths are the paths a workload of shared prefixes over prefix
// caches must reach, faults or none: pages kept and read again, evicted,
// and prompts whose prefix another scope cached. A page evicted while a
// prefill reads it is counted, not required: a prefill gives up only
// pages used before its own lookup, so only a lease refused under it (a
// corrupt page) evicts one that is leased.
var cachePaths = []Counter{CachePublished, CacheHit, CacheEvicted, CrossScopeProbe}

// decodeCachePaths are those of the decode nodes' caches, when opt runs
// them: pages kept after their job closed and copied again, evicted (some
// while a reservation leases them), and prompts whose prefix another
// scope keeps. A held run cut short by a page gone under its lookup, and a
// flipped held copy refused at its seal, are counted, not required: a few
// in a hundred seeds reach them.
var decodeCachePaths = []Counter{DecodeKeptPages, KeepDeferred, HeldHit, DecodeEvicted, DecodeEvictedWhileLeased,
	DecodeCrossScopeProbe}

// Counters count how often a run (or a sweep, summed) reached each path.
type Counters [counters]uint64

// Add adds o into c.
func (c *Counters) Add(o Counters) {
	for i := range c {
		c[i] += o[i]
	}
}

// Unreached lists, for every kind enabled in f, the counters it requires
// that stayed at zero, as "Kind: counter".
func (c *Counters) Unreached(f Faults) []string {
	var out []string
	for _, k := range f.Enabled() {
		for _, r := range required[k] {
			if c[r] == 0 {
				out = append(out, fmt.Sprintf("%s: %s", k, r))
			}
		}
	}
	return out
}

// UnreachedCache lists the cache paths that stayed at zero, when opt runs
// prefix caches over shared prefixes.
func (c *Counters) UnreachedCache(opt Options) []string {
	if opt.Prefixes == 0 {
		return nil
	}
	var out []string
	for _, p := range []struct {
		percent int
		paths   []Counter
	}{{opt.PrefixCachePercent, cachePaths}, {opt.DecodeCachePercent, decodeCachePaths}} {
		for _, r := range p.paths {
			if p.percent > 0 && c[r] == 0 {
				out = append(out, "prefix cache: "+r.String())
			}
		}
	}
	return out
}

// WriteTable writes one line per counter: its count, its name and the
// fault kinds that require it.
func (c *Counters) WriteTable(w io.Writer) {
	var by [counters][]string
	for k, rs := range required {
		for _, r := range rs {
			by[r] = append(by[r], Kind(k).String())
		}
	}
	for _, r := range cachePaths {
		by[r] = append(by[r], "the prefix cache workload")
	}
	for _, r := range decodeCachePaths {
		by[r] = append(by[r], "the decode cache workload")
	}
	for i, n := range c {
		req := ""
		if len(by[i]) > 0 {
			req = "required by " + strings.Join(by[i], ", ")
		}
		fmt.Fprintf(w, "%10d  %-38s %s\n", n, Counter(i), req)
	}
}
