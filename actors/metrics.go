package actors

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
)

// A node's operational counters beyond requests and latencies: where its
// requests wait, its KV transfers on both sides, what its integrity checks
// refused and by which bound admission refused requests. Each is a fixed set
// of atomic counters, whatever the traffic, with labels from fixed lists:
// nothing here is per request or per tenant.

// IntegrityReason is why an integrity check refused KV: the values are
// stable, since status reports counts by them.
type IntegrityReason uint8

const (
	// IntegrityStaleTag: a tag, request id or incarnation that names no
	// current tenancy of a page here (kv.StaleTagError; a frame for another
	// incarnation of this node).
	IntegrityStaleTag IntegrityReason = iota
	// IntegrityWrongOwner: a page or frame of another request
	// (kv.WrongOwnerError).
	IntegrityWrongOwner
	// IntegrityWrongTenant: a page of another tenant (kv.WrongTenantError).
	IntegrityWrongTenant
	// IntegrityChecksum: bytes that do not match their checksum: a frame's
	// own, or a page sealed here against the one its source sealed
	// (kv.ChecksumMismatchError).
	IntegrityChecksum
	// IntegrityManifest: a manifest that disagrees with the pages, the
	// frames or the transfer report (kv.ManifestError).
	IntegrityManifest
	// IntegrityFingerprint: a plan or a data-plane hello from a node of
	// another model (engine.FingerprintError).
	IntegrityFingerprint
	// IntegrityState: an access the page's state does not allow
	// (kv.StateError).
	IntegrityState
	// IntegrityTokenRange: a write outside the page's next tokens
	// (kv.TokenRangeError).
	IntegrityTokenRange
	// IntegrityFrame: a frame or batch that does not decode (kv.FrameError
	// and the batch's own checks).
	IntegrityFrame
	// IntegrityFirstToken: prefill's first token is not the one decode
	// recomputes from the KV it received (handoff.FirstTokenError).
	IntegrityFirstToken
	integrityReasons
)

var integrityNames = [integrityReasons]string{"stale_tag", "wrong_owner", "wrong_tenant", "checksum", "manifest",
	"fingerprint", "state", "token_range", "frame", "first_token"}

// IntegrityReasonNames are the names of the reasons, in their order.
func IntegrityReasonNames() []string { return integrityNames[:] }

// A status carries every reason.
var _ [messages.IntegrityReasonsMax - integrityReasons]struct{}

// IntegrityOf is the reason err is an integrity refusal, if it is one that
// was detected here: a peer's report (a *messages.WireError) was counted
// where it was detected, and is not one here. A first-token refusal is that,
// whatever failed while recomputing it.
func IntegrityOf(err error) (IntegrityReason, bool) {
	var (
		first  *handoff.FirstTokenError
		stale  *kv.StaleTagError
		owner  *kv.WrongOwnerError
		tenant *kv.WrongTenantError
		sum    *kv.ChecksumMismatchError
		man    *kv.ManifestError
		fp     *engine.FingerprintError
		state  *kv.StateError
		rng    *kv.TokenRangeError
		frame  *kv.FrameError
	)
	switch {
	case errors.As(err, &first):
		return IntegrityFirstToken, true
	case errors.As(err, &stale):
		return IntegrityStaleTag, true
	case errors.As(err, &owner):
		return IntegrityWrongOwner, true
	case errors.As(err, &tenant):
		return IntegrityWrongTenant, true
	case errors.As(err, &sum):
		return IntegrityChecksum, true
	case errors.As(err, &man):
		return IntegrityManifest, true
	case errors.As(err, &fp):
		return IntegrityFingerprint, true
	case errors.As(err, &state):
		return IntegrityState, true
	case errors.As(err, &rng):
		return IntegrityTokenRange, true
	case errors.As(err, &frame):
		return IntegrityFrame, true
	}
	return 0, false
}

// IntegrityCounts counts integrity refusals by reason, from any goroutine.
type IntegrityCounts [integrityReasons]atomic.Uint64

// Add counts one refusal of reason r.
func (c *IntegrityCounts) Add(r IntegrityReason) { c[r].Add(1) }

// Count counts err if it is an integrity refusal (IntegrityOf).
func (c *IntegrityCounts) Count(err error) {
	if r, ok := IntegrityOf(err); ok {
		c.Add(r)
	}
}

// Counts is every count, index the reason.
func (c *IntegrityCounts) Counts() []uint64 { return loadAll(c[:]) }

// RejectBound is the bound a request was refused by before it ran. The
// values are stable: status reports counts by them.
type RejectBound uint8

const (
	// RejectContextWindow: the prompt, or the prompt and max_tokens, exceed
	// the context window.
	RejectContextWindow RejectBound = iota
	// RejectPrefillPool, RejectDecodePool: the smallest pool on the
	// request's path cannot hold its KV.
	RejectPrefillPool
	RejectDecodePool
	// RejectQueue: QueueMax requests are in flight (admission or router).
	RejectQueue
	// RejectDraining: the node drains.
	RejectDraining
	// RejectNoPeer: no node of a role the request needs is in sight
	// (messages.CodeUnavailable).
	RejectNoPeer
	// RejectBadRequest: the request is invalid (max_tokens out of range, a
	// request id in flight already, a field out of its bounds, an
	// undecodable message).
	RejectBadRequest
	// RejectForbidden: the sender's credential may not make the request.
	RejectForbidden
	// RejectIncarnation: routed to an earlier run of this node.
	RejectIncarnation
	// RejectOther: any other refusal.
	RejectOther
	// RejectTenantConcurrent, RejectTenantPages: the request's tenant is
	// at its share's concurrent_max or pages_max (tenancy.LimitError).
	RejectTenantConcurrent
	RejectTenantPages
	rejectBounds
)

var rejectNames = [rejectBounds]string{"context_window", "prefill_pool", "decode_pool", "queue", "draining", "no_peer",
	"bad_request", "forbidden", "incarnation", "other", "tenant_concurrent_max", "tenant_pages_max"}

// RejectBoundNames are the names of the bounds, in their order.
func RejectBoundNames() []string { return rejectNames[:] }

var _ [messages.RejectBoundsMax - rejectBounds]struct{}

// rejectWhere maps the bounds that PromptTooLongError and BusyError name
// (their Where, up to a parenthesis) to a RejectBound.
var rejectWhere = map[string]RejectBound{
	"context window":             RejectContextWindow,
	"prefill pool":               RejectPrefillPool,
	"decode pool":                RejectDecodePool,
	"admission queue":            RejectQueue,
	"router":                     RejectQueue,
	"draining node":              RejectDraining,
	messages.WhereDrainingRouter: RejectDraining,
}

// RejectBoundOf is the bound that err, a refusal of a request before it
// ran, names: for a prompt too long or a busy node the one its Where says,
// for any other refusal the one its stable code implies.
func RejectBoundOf(err error) RejectBound {
	var (
		long   *PromptTooLongError
		busy   *BusyError
		tenant *tenancy.LimitError
	)
	where := ""
	switch {
	case errors.As(err, &tenant):
		if tenant.Bound == tenancy.BoundPages {
			return RejectTenantPages
		}
		return RejectTenantConcurrent
	case errors.As(err, &long):
		where = long.Where
	case errors.As(err, &busy):
		where = busy.Where
	default:
		switch handoff.Wire(err).Code {
		case messages.CodeBadRequest:
			return RejectBadRequest
		case messages.CodeForbidden:
			return RejectForbidden
		case messages.CodeNodeLost:
			return RejectIncarnation
		case messages.CodeUnavailable:
			return RejectNoPeer
		}
		return RejectOther
	}
	where, _, _ = strings.Cut(where, " (")
	if b, ok := rejectWhere[where]; ok {
		return b
	}
	return RejectOther
}

// RejectCounts counts refused requests by bound, from any goroutine.
type RejectCounts [rejectBounds]atomic.Uint64

// Add counts err, a refusal, by its bound.
func (c *RejectCounts) Add(err error) { c[RejectBoundOf(err)].Add(1) }

// AddBound counts a refusal by bound b.
func (c *RejectCounts) AddBound(b RejectBound) { c[b].Add(1) }

// Counts is every count, index the bound.
func (c *RejectCounts) Counts() []uint64 { return loadAll(c[:]) }

func loadAll(c []atomic.Uint64) []uint64 {
	out := make([]uint64, len(c))
	for i := range c {
		out[i] = c[i].Load()
	}
	return out
}

// Transfers counts one side's KV transfers (one per request attempt),
// from any goroutine: those that completed with their pages (frames),
// KV bytes (the frames' payloads) and duration, and those that failed by
// the code of the failure.
type Transfers struct {
	transfers, pages, bytes atomic.Uint64
	failed                  messages.CodeCounts
	duration                Latency
}

// Done counts a transfer of pages (frames, one a page) and bytes of KV
// that completed after d.
func (t *Transfers) Done(pages, bytes int, d time.Duration) {
	t.transfers.Add(1)
	t.pages.Add(uint64(pages))
	t.bytes.Add(uint64(bytes))
	t.duration.Observe(d)
}

// payloadBytes is the KV bytes frames carry.
func payloadBytes(frames []kv.Frame) int {
	n := 0
	for i := range frames {
		n += len(frames[i].Payload)
	}
	return n
}

// Failed counts a transfer that failed with err.
func (t *Transfers) Failed(err error) { t.failed.Add(TransferFailureCode(err)) }

// TransferFailureCode is the stable code of a transfer's failure: the
// code its request is told, a send that ran out of its PrefillTimeout
// being a lost receiver and one whose transfer was withdrawn a cancelled
// one.
func TransferFailureCode(err error) messages.ErrorCode {
	switch {
	case errors.Is(err, context.Canceled):
		return messages.CodeCancelled
	case errors.Is(err, context.DeadlineExceeded):
		return messages.CodeNodeLost
	}
	return handoff.Wire(err).Code
}

// TransferStats is a Transfers at one moment; each counter is read
// atomically, the set is not.
type TransferStats struct {
	Transfers, Pages, Bytes uint64
	// FailedByCode is indexed by messages.ErrorCode
	// (messages.CodeCounts.Counts).
	FailedByCode []uint64
	Duration     LatencySnapshot
}

// Stats reads the counters.
func (t *Transfers) Stats() TransferStats {
	return TransferStats{Transfers: t.transfers.Load(), Pages: t.pages.Load(), Bytes: t.bytes.Load(),
		FailedByCode: t.failed.Counts(), Duration: t.duration.Snapshot()}
}

// Status is s as a status reports it (without the durations).
func (s TransferStats) Status() *messages.TransferStatus {
	return &messages.TransferStatus{Transfers: s.Transfers, Pages: s.Pages, Bytes: s.Bytes, FailedByCode: s.FailedByCode}
}

// gauge is a count of things in one state, moved as they come and go.
type gauge struct{ n atomic.Int64 }

func (g *gauge) add(d int) { g.n.Add(int64(d)) }

// load is the count, never below zero: a reader between two moves of one
// thing sees it in neither state, or both, never less than nothing.
func (g *gauge) load() uint32 { return uint32(max(0, g.n.Load())) }

// stage is where one request is, as its request actor moves it between
// the node's gauges: one gauge at a time, or none once it ended.
type stage struct{ in *gauge }

func (s *stage) move(to *gauge) {
	if s.in == to {
		return
	}
	if s.in != nil {
		s.in.add(-1)
	}
	if s.in = to; to != nil {
		to.add(1)
	}
}

// Metrics is a node's operational counters at one moment, beyond its
// request accounting (Status) and latencies (Latencies).
type Metrics struct {
	// WaitingPages, WaitingKV and Running are the requests admitted here
	// and in flight, by stage: waiting for decode pages (the pool is
	// exhausted, for at most ReserveWait), waiting for the prompt's KV
	// (planned with a prefill node: queued there, computing or in
	// transfer, until its manifest is verified), and decoding.
	WaitingPages, WaitingKV, Running uint32
	// PrefillQueued is the transfer plans this node's prefill workers hold
	// and have not started computing; PrefillInFlight those computed whose
	// KV is being sent or awaits decode's acknowledgement.
	PrefillQueued, PrefillInFlight uint32
	// RejectedBy counts refused requests by RejectBound.
	RejectedBy []uint64
	// Integrity counts integrity refusals by IntegrityReason.
	Integrity []uint64
	// Sent and Received are the node's transfers as prefill and as decode.
	Sent, Received TransferStats
	// RetriedTransfers is the transfers admission planned again with
	// another prefill node, before any token reached the client;
	// RetriedRoutes (a router's, filled in by package cluster) the requests
	// a router sent on to another decode node.
	RetriedTransfers, RetriedRoutes uint64
	// PromptTokens counts the prompt tokens whose KV this node's prefill
	// workers computed: where prompts cost compute. A prompt computed again
	// (its transfer failed and decode planned it with another prefill
	// node) counts again.
	PromptTokens uint64
	// GenerationTokens counts the tokens this node generated and streamed
	// for the requests it admitted (an end-of-sequence token that ended one
	// among them); with RelayedTokens, what its status counts as TokensOut.
	GenerationTokens uint64
	// RelayedTokens (a router's, filled in by package cluster) counts the
	// tokens a router passed on to its clients, which their decode nodes
	// counted as generated; RoutedWaiting the requests it routed that have
	// had no token back yet.
	RelayedTokens uint64
	RoutedWaiting uint32
	// StreamBatches and StreamItems count the TokenBatch messages this
	// node sent and the chunks and results they carried; StreamUnknown
	// the items it received for no stream here (late, or a guess), and
	// StreamUndecodable the batches it received that did not decode.
	StreamBatches, StreamItems, StreamUnknown, StreamUndecodable uint64
	// MovedOut counts the running requests this node moved to another
	// decode node, MovedIn those it took over from one (their stream's
	// receiver took them); StreamsMoved (a router's, filled in by package
	// cluster) the streams its relays followed from one decode node to
	// another.
	MovedOut, MovedIn, StreamsMoved uint64
}

// metricCounters are what Metrics reads.
type metricCounters struct {
	waitingPages, waitingKV, running gauge
	prefillQueued, prefillInFlight   gauge
	rejectedBy                       RejectCounts
	integrity                        IntegrityCounts
	sent, received                   Transfers
	promptTokens                     atomic.Uint64
}

// Metrics reads the node's operational counters, without a message: it
// answers while every actor is busy.
func (n *Node) Metrics() Metrics {
	c := &n.counters.metrics
	return Metrics{WaitingPages: c.waitingPages.load(), WaitingKV: c.waitingKV.load(), Running: c.running.load(),
		PrefillQueued: c.prefillQueued.load(), PrefillInFlight: c.prefillInFlight.load(),
		RejectedBy: c.rejectedBy.Counts(), Integrity: c.integrity.Counts(),
		Sent: c.sent.Stats(), Received: c.received.Stats(), RetriedTransfers: n.counters.retried.Load(),
		PromptTokens: c.promptTokens.Load(), GenerationTokens: n.counters.latencies.Tokens(),
		StreamBatches: n.streams.Batches.Load(), StreamItems: n.streams.Items.Load(), StreamUnknown: n.streams.Unknown.Load(),
		StreamUndecodable: n.streams.Undecodable.Load(), MovedOut: n.counters.moved.Load(), MovedIn: n.counters.movedIn.Load()}
}

// receiving is a request actor's view of its current attempt's transfer:
// under way from the plan until the manifest is verified, with the pages
// and bytes written so far, when the first was written and when prefill's
// report came.
type receiving struct {
	on           bool
	pages, bytes int
	first, end   time.Time
}

// written counts frames written into the request's pages at now.
func (r *receiving) written(frames []kv.Frame, now time.Time) {
	if !r.on || len(frames) == 0 {
		return
	}
	if r.first.IsZero() {
		r.first = now
	}
	r.pages += len(frames)
	r.bytes += payloadBytes(frames)
}

// done counts the transfer as completed into t: from its first frame to
// prefill's report.
func (r *receiving) done(t *Transfers) {
	if r.on {
		t.Done(r.pages, r.bytes, r.end.Sub(r.first))
	}
	*r = receiving{}
}

// failed counts the transfer, if one is under way, as failed with err.
func (r *receiving) failed(t *Transfers, err error) {
	if r.on && err != nil {
		t.Failed(err)
	}
	*r = receiving{}
}
