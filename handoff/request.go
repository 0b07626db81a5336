package handoff

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvwarden/kvwarden/internal/mutant"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// RequestConfig is what every request of a decode node shares.
type RequestConfig struct {
	// Geometry is the decode pool's.
	Geometry kv.Geometry
	// Incarnation is this decode node's run; DataPlane its KV data plane,
	// named in plans to prefill peers of other runs.
	Incarnation uint64
	DataPlane   string
	// RequestTimeout bounds the whole request, PrefillTimeout one
	// transfer attempt; an exhausted decode pool is retried every
	// ReserveRetry until ReserveWait.
	RequestTimeout, PrefillTimeout, ReserveWait, ReserveRetry time.Duration
	// RetriesMax bounds how many other prefill peers a request tries after
	// the first failed before any token was streamed.
	RetriesMax int
	// EOS is the model's stop token: generation ends when it comes.
	EOS int
	// Model is the fingerprint of the model decode computes, named in
	// every plan (engine.Fingerprint's String).
	Model string
	// Keep says the decode pool keeps prompt pages in a prefix cache: an
	// answered request hands its prompt's pages to it (Keep) instead of
	// releasing them.
	Keep bool
}

// RetriesMax is the number of retries a node's requests make: at most
// 1 + RetriesMax transfer attempts in all.
const RetriesMax = 2

type phase uint8

const (
	phaseNew       phase = iota
	phaseReserving       // waiting for decode pages
	phasePrefill         // prefill computing and streaming frames
	phaseDecoding        // decode generating
	phaseDone
)

// Stage is where a request is in its life, as an operator sees it
// between two steps (messages.InFlight.Phase): Reserve and SealVerify are
// answered within the step that asks, so a request is seen waiting only
// for pages (after an exhausted pool), for its prefill peer, for the rest
// of its KV, or for its tokens.
type Stage uint8

// The stages, in order.
const (
	StageQueued   Stage = iota // waiting for decode pages
	StagePrefill               // the plan is out, no frame of this attempt has come
	StageTransfer              // frames of this attempt are coming
	StageDecode                // decode generates
	StageDone                  // the client has its answer
)

// String is the stage's word: the messages.InFlight phase, or "done".
func (s Stage) String() string {
	switch s {
	case StageQueued:
		return messages.PhaseQueued
	case StagePrefill:
		return messages.PhasePrefill
	case StageTransfer:
		return messages.PhaseTransfer
	case StageDecode:
		return messages.PhaseDecode
	}
	return "done"
}

// Progress is what a request shows of itself while in flight: its stage,
// the prefill peer of its current attempt and the tokens streamed so far.
type Progress struct {
	Stage  Stage
	Peer   Peer
	Tokens int
}

// RequestCounts are a request's own tallies, for the node's counters.
type RequestCounts struct {
	// Ignored: late messages (of an abandoned attempt, or after the end).
	Ignored uint64
	// FramesAccepted and FramesRefused count frames of the current attempt.
	FramesAccepted, FramesRefused uint64
}

// Request is one request's life on its decode node: it reserves the decode
// pages, plans the transfer, accepts frames only into its own pages,
// seals and verifies them, hands the verified manifest to decode, streams
// tokens to the client and, however the request ends, releases every page
// it holds. A transfer that fails before any token streamed is retried with
// another prefill peer under a new attempt id (its pages released first,
// so that anything late of the old attempt presents a stale tag).
type Request struct {
	cfg    RequestConfig
	owner  kv.Owner // of the current attempt
	client uint64   // the client's request id
	prompt []int
	maxNew int // tokens to generate, the first (from prefill) included
	peer   Peer
	tried  map[uint64]bool
	cause  error // of the failed attempt while a Pick is out

	phase    phase
	dest     []kv.Tag        // prompt pages in decode's pool
	held     []kv.CachedPage // the cached page each of the first dest pages was copied from
	scope    kv.Scope        // the decode cache's for the request
	sources  []kv.Tag        // the prefill page each dest page was filled from
	spare    []kv.Tag        // pages for generated KV
	manifest *kv.Manifest
	pending  []kv.Frame // frames of the Write in hand
	written  int        // prompt tokens accepted into dest pages
	frames   int        // frames accepted
	first    int        // prefill's first token
	tokens   []int
	seq      uint32
	stopped  bool   // the client stopped the request at the tokens it has
	salt     string // the client's cache salt, for every plan
	cached   int    // prompt tokens prefill read from its prefix cache
	counts   RequestCounts
	// move is the MoveRequest of a request moved here from another decode
	// node, its peer; nil for one admitted here. Such a request holds its
	// chunks and its answer (withheld) until the stream's receiver takes
	// it (taken).
	move     *messages.MoveRequest
	taken    bool
	withheld []Effect
	resumed  bool  // the decode job of the request moved here began
	firsts   []int // the first position of each page of manifest
	// out is the request's move to another decode node, under way.
	out *moveOut

	started, planSent, firstFrame, transferEnd, firstToken, secondToken time.Time
	// deadline is when the request's time ends (RequestDeadline).
	deadline time.Time
}

// NewRequest is a request of client id client, admitted as owner (its
// first attempt), for prompt and maxNew tokens, planned with peer.
func NewRequest(cfg RequestConfig, owner kv.Owner, client uint64, prompt []int, maxNew int, peer Peer) *Request {
	return &Request{cfg: cfg, owner: owner, client: client, prompt: prompt, maxNew: maxNew, peer: peer,
		tried: map[uint64]bool{}}
}

// NarrowCache has every plan of the request carry the client's cache salt
// (messages.GenerateRequest.CacheSalt), which narrows the scope of the
// prefix cache prefill reads and keeps its pages in.
func (r *Request) NarrowCache(salt string) { r.salt = salt }

// Owner is the owner of the current attempt's pages.
func (r *Request) Owner() kv.Owner { return r.owner }

// LastPromptToken is the prompt's last token, after which the generated
// text starts.
func (r *Request) LastPromptToken() int { return r.prompt[len(r.prompt)-1] }

// Peer is the prefill peer of the current attempt.
func (r *Request) Peer() Peer { return r.peer }

// Done reports whether the request has answered its client.
func (r *Request) Done() bool { return r.phase == phaseDone }

// Progress is where the request is now.
func (r *Request) Progress() Progress {
	p := Progress{Peer: r.peer, Tokens: len(r.tokens)}
	switch r.phase {
	case phaseNew, phaseReserving:
		p.Stage = StageQueued
	case phasePrefill:
		p.Stage = StageTransfer
		if r.firstFrame.IsZero() {
			p.Stage = StagePrefill
		}
	case phaseDecoding:
		p.Stage = StageDecode
	default:
		p.Stage = StageDone
	}
	return p
}

// Counts are the request's tallies so far.
func (r *Request) Counts() RequestCounts { return r.counts }

// Step takes one event at now and returns what to do.
func (r *Request) Step(ev Event, now time.Time) []Effect {
	return r.withhold(r.step(ev, now))
}

func (r *Request) step(ev Event, now time.Time) []Effect {
	if r.phase == phaseDone {
		switch e := ev.(type) {
		case TakeIn:
			return r.takeIn(e)
		case TakeDeadline:
			return r.notTaken()
		}
		r.counts.Ignored++ // late messages after the answer went out
		if e, ok := ev.(Reserved); ok && e.Err == nil {
			return []Effect{Release{Owner: r.owner, Tags: e.Dest}, Release{Owner: r.owner, Tags: e.Spare}}
		}
		return nil
	}
	switch e := ev.(type) {
	case Start:
		if r.phase != phaseNew {
			return nil
		}
		r.started = now
		after := r.cfg.RequestTimeout
		if r.move != nil && r.move.TimeLeftMs > 0 {
			// Moved here: the request has what its source left it.
			after = min(after, time.Duration(r.move.TimeLeftMs)*time.Millisecond)
		}
		r.deadline = now.Add(after)
		return append([]Effect{Timer{After: after, Event: RequestDeadline{}}}, r.reserve())
	case RetryReserve:
		if r.phase == phaseReserving {
			return []Effect{r.reserve()}
		}
	case Reserved:
		return r.reserved(e, now)
	case FramesIn:
		return r.framesIn(e, now)
	case Written:
		return r.writtenOut(e)
	case TransferIn:
		return r.transferIn(e, now)
	case Verified:
		return r.verified(e)
	case PeerLost:
		if o := r.out; o != nil && e.Incarnation == o.to.Incarnation {
			return r.moveFailed(&messages.WireError{Code: messages.CodeNodeLost, Message: fmt.Sprintf("decode node %x left", e.Incarnation)})
		}
		if e.Incarnation == r.peer.Incarnation && r.phase == phasePrefill {
			return r.prefillFailed(&messages.WireError{Code: messages.CodeNodeLost,
				Message: fmt.Sprintf("prefill node %x left", e.Incarnation)})
		}
	case PrefillDeadline:
		if e.Attempt == r.owner.Request && r.phase == phasePrefill {
			return r.prefillFailed(&messages.WireError{Code: messages.CodeNodeLost,
				Message: fmt.Sprintf("no transfer from prefill node %x within %s", r.peer.Incarnation, r.cfg.PrefillTimeout)})
		}
	case Picked:
		return r.picked(e)
	case TokenIn:
		if r.phase != phaseDecoding {
			break
		}
		if r.out != nil && r.out.paused {
			// The job stepped after it answered a pause: it was not held
			// still for this move, which cannot go on; the token is the
			// client's all the same.
			out := r.moveFailed(&MoveRefusedError{Why: "its decode job stepped after its pause"})
			return append(out, r.token(e.Token, now)...)
		}
		return r.token(e.Token, now)
	case Resumed:
		if r.move != nil && r.phase == phaseDecoding && !r.resumed {
			r.resumed = true
			return []Effect{r.ack(), Timer{After: r.cfg.PrefillTimeout, Event: TakeDeadline{}}}
		}
	case MoveOut:
		return r.moveOutStart(e, now)
	case Paused:
		return r.paused(e, now)
	case MovePlanIn:
		return r.movePlanIn(e)
	case MoveSent:
		return r.moveSent(e)
	case MoveAckIn:
		return r.moveAckIn(e, now)
	case MoveAbortIn:
		// The target's request ends the move (naming itself), or its
		// admission refuses it (naming the move).
		if o := r.out; o != nil && e.FromTarget && e.Abort.Tenant == r.owner.Tenant &&
			(o.plan != nil && e.Abort.RequestID == o.plan.Request || o.plan == nil && e.Abort.RequestID == o.id) {
			o.plan = nil // the target ended it: nothing to tell it
			return r.moveFailed(&e.Abort.Reason)
		}
	case MoveDeadline:
		if r.out != nil && e.MoveID == r.out.id {
			return r.moveFailed(r.moveLate())
		}
	case DecodeEnded:
		if r.phase == phaseDecoding {
			return r.finish(e.Err)
		}
	case Cancel:
		return r.finish(ErrCancelled)
	case Stop:
		return r.stop()
	case RequestDeadline:
		return r.finish(ErrDeadline)
	case Failed:
		return r.finish(e.Err)
	case TakeIn:
		return r.takeIn(e)
	case TakeDeadline:
		if r.phase == phaseDecoding {
			return r.notTaken()
		}
	}
	return nil
}

// reserve asks for the prompt's pages and those of the generated tokens:
// for a request moved here, pages at the move's layout and those of the
// tokens left to generate.
func (r *Request) reserve() Effect {
	r.phase = phaseReserving
	g := r.cfg.Geometry
	if m := r.move; m != nil {
		return Reserve{Owner: r.owner, Layout: ints(m.Layout), SpareFirst: m.Positions(), Spare: g.PagesFor(r.maxNew - len(r.tokens))}
	}
	return Reserve{Owner: r.owner, Prompt: g.PagesFor(len(r.prompt)), SpareFirst: len(r.prompt), Spare: g.PagesFor(r.maxNew - 1),
		Tokens: r.prompt, Salt: r.salt}
}

// newManifest lays the transfer's positions over the pages reserved:
// every page full but the last, or a move's layout.
func (r *Request) newManifest() (*kv.Manifest, error) {
	if r.move == nil {
		return kv.NewManifest(r.owner, len(r.prompt), r.cfg.Geometry.PageTokens, r.dest)
	}
	if len(r.dest) != len(r.move.Layout) {
		return nil, &kv.ManifestError{Field: "pages", Page: -1, Want: len(r.move.Layout), Have: len(r.dest)}
	}
	m := &kv.Manifest{Owner: r.owner, Tokens: r.move.Positions(), Pages: make([]kv.ManifestPage, len(r.dest))}
	for i, t := range r.dest {
		m.Pages[i] = kv.ManifestPage{Tag: t, Tokens: int(r.move.Layout[i])}
	}
	return m, nil
}

// pageAt is the index of the manifest's page whose positions start at
// first, -1 if none does.
func (r *Request) pageAt(first int) int {
	if i, ok := slices.BinarySearch(r.firsts, first); ok {
		return i
	}
	return -1
}

// positions is how many positions' KV the transfer brings: the prompt's,
// or those of a move.
func (r *Request) positions() int {
	if r.move != nil {
		return r.move.Positions()
	}
	return len(r.prompt)
}

// tokenAt is the token fed at position i: the prompt's, then those
// streamed.
func (r *Request) tokenAt(i int) int {
	if i < len(r.prompt) {
		return r.prompt[i]
	}
	return r.tokens[i-len(r.prompt)]
}

// reserved plans the transfer on the pages reserved, retries an exhausted
// pool until ReserveWait, then answers "busy".
func (r *Request) reserved(e Reserved, now time.Time) []Effect {
	if r.phase != phaseReserving {
		return nil
	}
	if e.Err != nil {
		var ex *kv.PoolExhaustedError
		short := errors.As(e.Err, &ex)
		switch {
		case short && now.Sub(r.started) < r.cfg.ReserveWait:
			return []Effect{Timer{After: r.cfg.ReserveRetry, Event: RetryReserve{}}}
		case short:
			return r.finish(&BusyError{Where: "decode pool", Have: ex.Need, Limit: ex.Free})
		}
		return r.finish(e.Err)
	}
	r.dest, r.spare, r.held, r.scope = e.Dest, e.Spare, e.Held, e.Scope
	g := r.cfg.Geometry
	m, err := r.newManifest()
	if err != nil {
		return r.finish(err)
	}
	r.manifest = m
	r.firsts = make([]int, len(m.Pages))
	for i := 1; i < len(m.Pages); i++ {
		r.firsts[i] = r.firsts[i-1] + m.Pages[i-1].Tokens
	}
	r.sources = make([]kv.Tag, len(r.dest))
	r.written = len(r.held) * g.PageTokens
	r.phase = phasePrefill
	if r.move != nil {
		r.planSent, r.firstFrame = now, time.Time{}
		return []Effect{Timer{After: r.cfg.PrefillTimeout, Event: PrefillDeadline{Attempt: r.owner.Request}},
			SendMovePlan{To: r.peer, Plan: &messages.MovePlan{MoveID: r.move.MoveID, Tenant: r.owner.Tenant,
				Request: r.owner.Request, DestTags: r.dest, DataPlane: r.cfg.DataPlane}}}
	}
	plan := &messages.TransferPlan{RequestID: r.owner.Request, Tenant: r.owner.Tenant, TokenCount: uint32(len(r.prompt)),
		PromptTokens: u32s(r.prompt), PageTokens: uint32(g.PageTokens), DestTags: r.dest, Model: r.cfg.Model,
		CacheSalt: r.salt, HeldPages: uint32(len(r.held))}
	if r.peer.Incarnation != r.cfg.Incarnation {
		plan.DataPlane = r.cfg.DataPlane
	}
	r.planSent, r.firstFrame = now, time.Time{}
	return []Effect{Timer{After: r.cfg.PrefillTimeout, Event: PrefillDeadline{Attempt: r.owner.Request}},
		SendPlan{To: r.peer, Plan: plan}}
}

// framesIn checks frames and asks for them to be written. Frames of an
// attempt abandoned for a retry carry its own request id: they are late,
// not wrong, and are dropped and counted rather than failing the request.
// Frames of the current attempt from anyone but the planned peer are
// refused and counted, without effect on the request. Every other frame
// must be the request's own, from a page of the planned prefill node's
// run, one source page per destination page; the page checks its tag,
// owner, tenant and token range when it is written. Anything refused fails
// the request: nothing is generated from pages that did not fill cleanly.
func (r *Request) framesIn(e FramesIn, now time.Time) []Effect {
	keep := e.Frames[:0:0]
	for _, f := range e.Frames {
		if f.Owner.Request == r.owner.Request || f.Owner.Tenant != r.owner.Tenant {
			keep = append(keep, f) // a foreign tenant's frame is not late: it is refused below
			continue
		}
		r.counts.Ignored++
	}
	if len(keep) > 0 && e.Stranger {
		return []Effect{Refuse{Err: r.stranger("frames", e.From)}}
	}
	if r.phase != phasePrefill {
		r.counts.Ignored += uint64(len(keep)) // a duplicate after the transfer ended
		return nil
	}
	if len(keep) == 0 {
		return nil
	}
	if r.firstFrame.IsZero() {
		r.firstFrame = now
	}
	for i := range keep {
		f := &keep[i]
		page := r.pageAt(f.FirstToken)
		var err error
		switch {
		case f.Owner != r.owner:
			err = &kv.WrongOwnerError{Page: f.Dest, Owner: r.owner.Request, Have: f.Owner.Request}
		case f.Source.Incarnation != r.peer.Incarnation:
			err = r.stranger("frames", fmt.Sprintf("a page of incarnation %x", f.Source.Incarnation))
		case page < 0:
			// Want is the last position a page starts at before the frame's.
			before, _ := slices.BinarySearch(r.firsts, f.FirstToken)
			err = &kv.ManifestError{Field: "first position of a frame", Page: -1, Want: r.firsts[max(before-1, 0)], Have: f.FirstToken}
		case page < len(r.held):
			err = &kv.ManifestError{Field: "frame of a page decode holds", Page: page, Want: len(r.held), Have: page}
		case r.sources[page] != (kv.Tag{}) && r.sources[page] != f.Source:
			err = &kv.ManifestError{Field: "source pages", Page: page, Want: 1, Have: 2}
		}
		if err != nil {
			r.counts.FramesRefused += uint64(len(keep))
			var out []Effect
			if se, ok := err.(*StrangerError); ok {
				out = append(out, Refuse{Err: se})
			}
			return append(out, r.finish(err)...)
		}
		r.sources[page] = f.Source
	}
	r.pending = keep
	return []Effect{Write{Frames: keep}}
}

// writtenOut counts the frames written and fails the request on a refused
// one.
func (r *Request) writtenOut(e Written) []Effect {
	for _, f := range r.pending[:e.N] {
		r.frames++
		r.written += f.Tokens
	}
	r.counts.FramesAccepted += uint64(e.N)
	if e.Err != nil {
		r.counts.FramesRefused += uint64(len(r.pending) - e.N)
		r.pending = nil
		return r.finish(e.Err)
	}
	r.pending = nil
	return nil
}

// stranger describes frames or a report of the current attempt from
// someone else than its prefill peer.
func (r *Request) stranger(what, from string) *StrangerError {
	return &StrangerError{What: what, From: from, Planned: r.peer.String()}
}

// transferIn takes prefill's report: a failure retries or ends the
// request; success has every page sealed, each only if its bytes are those
// prefill sealed, and the manifest verified before decode may read a byte.
func (r *Request) transferIn(e TransferIn, now time.Time) []Effect {
	m := e.Done
	switch {
	case r.move != nil && !r.taken && r.phase == phaseDecoding && m.Err != nil && e.FromPrefill &&
		m.RequestID == r.owner.Request && m.Tenant == r.owner.Tenant:
		// The source gave the move up after all (no ack reached it in
		// time): it streams on itself.
		return r.finish(m.Err)
	case m.Tenant != r.owner.Tenant, m.RequestID != r.owner.Request && !mutant.Is(mutant.LateDoneAccepted),
		r.phase != phasePrefill:
		r.counts.Ignored++ // another tenant's, an abandoned attempt's, or a duplicate
		return nil
	case !e.FromPrefill:
		return []Effect{Refuse{Err: r.stranger("transfer done", e.From)}} // without effect: see FramesIn
	case m.Err != nil:
		return r.prefillFailed(m.Err)
	}
	r.transferEnd = now
	if mutant.Is(mutant.Incident) {
		// The planted bug: whatever came is taken as the whole prompt's KV.
		r.frames, r.written = int(m.Frames), len(r.prompt)
		m.Sums = append(m.Sums, make([]uint64, max(0, len(r.manifest.Pages)-len(m.Sums)))...)
	}
	if r.frames != int(m.Frames) || r.written != r.positions() {
		return r.finish(&kv.ManifestError{Field: "tokens transferred", Page: -1, Want: r.positions(), Have: r.written})
	}
	if r.move != nil && int(m.First) != r.tokens[len(r.tokens)-1] {
		return r.finish(&FirstTokenError{Prefill: int(m.First), Decode: r.tokens[len(r.tokens)-1],
			Err: errors.New("handoff: the move's last token is not the one it asked to move")})
	}
	if sent := len(r.manifest.Pages) - len(r.held); len(m.Sums) != sent {
		return r.finish(&kv.ManifestError{Field: "source checksums", Page: -1, Want: sent, Have: len(m.Sums)})
	}
	if len(m.HeldSums) != len(r.held) {
		return r.finish(&kv.ManifestError{Field: "held page checksums", Page: -1, Want: len(r.held), Have: len(m.HeldSums)})
	}
	for i, c := range r.held {
		if m.HeldSums[i] != c.Content {
			return append([]Effect{Unhold{Pages: r.held}}, r.finish(&kv.ChecksumMismatchError{
				Where: fmt.Sprintf("held page %d (%s) against the rows prefill computed", i, c.Tag), Want: m.HeldSums[i], Have: c.Content})...)
		}
	}
	if int(m.Cached) >= len(r.prompt) || r.move != nil && m.Cached != 0 {
		return r.finish(&kv.ManifestError{Field: "cached prompt tokens", Page: -1, Want: len(r.prompt) - 1, Have: int(m.Cached)})
	}
	if r.move == nil { // a move's prefill was its source's: the MoveRequest said what it read
		r.cached = int(m.Cached)
	}
	origins := make([]kv.Origin, 0, len(r.manifest.Pages))
	for _, c := range r.held {
		origins = append(origins, c.Origin())
	}
	for i := len(r.held); i < len(r.manifest.Pages); i++ {
		origins = append(origins, kv.Origin{Tag: r.sources[i], Owner: m.SourceOwner(), Checksum: m.Sums[i-len(r.held)]})
	}
	r.first = int(m.First)
	return []Effect{SealVerify{Manifest: r.manifest, Origins: origins}}
}

// verified acknowledges a verified transfer, upon which prefill may let
// its pages go, and has decode start from prefill's first token, which
// the decode worker checks first: the client never sees a token the KV
// does not give.
func (r *Request) verified(e Verified) []Effect {
	if r.phase != phasePrefill {
		return nil
	}
	if e.Err != nil {
		return r.finish(e.Err)
	}
	r.phase = phaseDecoding
	start := StartDecode{Manifest: r.manifest, Next: r.first, Last: r.tokenAt(r.positions() - 1),
		MaxNew: r.maxNew - max(len(r.tokens), 1), Spare: r.spare, Resume: r.move != nil}
	if r.move != nil {
		// A move is acknowledged only once decode recomputed its last
		// token from the pages (Resumed): the source lets go on the ack.
		return []Effect{start}
	}
	return []Effect{start, r.ack()}
}

// ack acknowledges the transfer to its peer: every page sealed against
// its source and the manifest verified.
func (r *Request) ack() Effect {
	return SendAck{To: r.peer, Ack: &messages.TransferAck{RequestID: r.owner.Request, Tenant: r.owner.Tenant,
		TokenCount: uint32(r.positions()), Pages: uint32(len(r.dest))}}
}

// prefillFailed asks for another prefill peer while tries are left: no
// token has been streamed yet, so the client cannot tell.
func (r *Request) prefillFailed(cause error) []Effect {
	r.tried[r.peer.Incarnation] = true
	if len(r.tried) > r.cfg.RetriesMax || r.move != nil {
		return r.finish(cause)
	}
	r.cause = cause
	exclude := make(map[uint64]bool, len(r.tried))
	for inc := range r.tried {
		exclude[inc] = true
	}
	return []Effect{Pick{Exclude: exclude}}
}

// picked moves the request to a new attempt with the peer picked: the old
// attempt is aborted and its pages released first, so that whatever it
// still sends names the old request id or presents a stale tag.
func (r *Request) picked(e Picked) []Effect {
	if r.phase != phasePrefill || r.cause == nil {
		return nil
	}
	cause := r.cause
	r.cause = nil
	if !e.OK {
		return r.finish(cause)
	}
	out := []Effect{r.abort(cause), Release{Owner: r.owner, Tags: r.dest}, Release{Owner: r.owner, Tags: r.spare},
		Retry{Old: r.owner.Request, New: e.Attempt, From: r.peer, To: e.Peer, Cause: cause}}
	r.dest, r.held, r.scope, r.sources, r.spare, r.manifest, r.frames, r.written = nil, nil, kv.Scope{}, nil, nil, nil, 0, 0
	r.owner.Request = e.Attempt
	r.peer = e.Peer
	return append(out, r.reserve())
}

func (r *Request) abort(cause error) Effect {
	return SendAbort{To: r.peer, Abort: &messages.TransferAbort{RequestID: r.owner.Request, Tenant: r.owner.Tenant,
		Reason: *Wire(cause)}}
}

// token streams one generated token; the request ends at EOS or at its
// token budget.
func (r *Request) token(tok int, now time.Time) []Effect {
	r.tokens = append(r.tokens, tok)
	switch len(r.tokens) {
	case 1:
		r.firstToken = now
	case 2:
		r.secondToken = now
	}
	r.seq++
	out := []Effect{Emit{Chunk: &messages.TokenChunk{RequestID: r.client, Seq: r.seq, Tokens: []uint32{uint32(tok)}}}}
	if tok == r.cfg.EOS || len(r.tokens) >= r.maxNew {
		out = append(out, r.finish(nil)...)
	}
	return out
}

// stop ends the request as completed at the tokens streamed so far, with
// messages.FinishStopSequence: the decode worker, still generating, is
// withdrawn and every page released as for a cancel. The transfer was
// acknowledged when decode began, so prefill holds nothing of it, as after
// any completion. Before the first token there is nothing to complete, and
// the stop is a cancel.
func (r *Request) stop() []Effect {
	if r.phase != phaseDecoding || len(r.tokens) == 0 {
		return r.finish(ErrCancelled)
	}
	r.stopped = true
	return append([]Effect{CancelDecode{Owner: r.owner}}, r.finish(nil)...)
}

// finish answers the client, withdraws the request from both workers when
// it ends early, and releases every page it holds. A page a worker still
// leases is freed when the lease comes back (or at the reclaim deadline).
func (r *Request) finish(cause error) []Effect {
	if r.phase == phaseDone {
		return nil
	}
	decoding := r.phase == phaseDecoding
	out := r.endMove(cmp.Or(cause, errEndedMoving))
	if cause != nil {
		if r.phase == phasePrefill || decoding {
			out = append(out, r.abort(cause))
		}
		if decoding {
			out = append(out, CancelDecode{Owner: r.owner})
		}
	} else if decoding && !r.stopped && (len(r.tokens) == 0 || len(r.tokens) < r.maxNew && r.tokens[len(r.tokens)-1] != r.cfg.EOS) {
		cause = fmt.Errorf("handoff: decode ended after %d of %d tokens", len(r.tokens), r.maxNew)
	}
	r.phase = phaseDone
	if cause == nil && r.cfg.Keep && r.move == nil {
		out = append(out, Keep{Owner: r.owner, Tags: r.dest, Tokens: r.prompt, Scope: r.scope})
	} else {
		out = append(out, Release{Owner: r.owner, Tags: r.dest})
	}
	out = append(out, Release{Owner: r.owner, Tags: r.spare})
	res := &messages.GenerateResult{RequestID: r.client}
	fin := Finish{Result: res, Cause: cause, Silent: r.move != nil && !r.taken && cause != nil}
	switch {
	case cause != nil:
		res.FinishReason, res.Err = messages.FinishError, Wire(cause)
	case r.stopped:
		res.FinishReason = messages.FinishStopSequence
	case r.tokens[len(r.tokens)-1] == r.cfg.EOS:
		res.FinishReason = messages.FinishStop
	default:
		res.FinishReason = messages.FinishLength
	}
	if cause == nil {
		res.CachedTokens = uint32(r.cached)
		res.Tokens = u32s(r.tokens)
		fin.Tokens = r.tokens
		if r.move != nil {
			return append(out, fin) // its first token was not this node's
		}
		p := Phases{Queue: r.planSent.Sub(r.started), Prefill: r.firstFrame.Sub(r.planSent),
			Transfer: r.transferEnd.Sub(r.firstFrame), Verify: r.firstToken.Sub(r.transferEnd)}
		if !r.secondToken.IsZero() {
			p.FirstDecode = r.secondToken.Sub(r.firstToken)
		}
		fin.Phases = &p
	}
	return append(out, fin)
}
