package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// route is the pair of workers a request runs on. The prefill worker may
// be in another node (another incarnation than this node's): its frames
// then come through this node's KV data plane.
type route struct {
	prefill, decode    *actor.PID
	prefillIncarnation uint64
	decodePool         *Pool
	decodeIndex        int
}

// retriesMax bounds how many other prefill peers a request tries after the
// first failed before any token was streamed: at most 1 + retriesMax
// attempts in all.
const retriesMax = 2

// phase is where a request is in its life.
type phase uint8

const (
	phaseReserving phase = iota // waiting for decode pages
	phasePrefill                // prefill computing and streaming frames
	phaseDecoding               // decode generating
	phaseDone
)

// requestActor is one request's life: it reserves the decode pages, plans
// the transfer, accepts frames only into its own pages, seals and verifies
// them, hands the verified manifest to decode, streams tokens to the client
// and, however the request ends, releases every page it holds.
type requestActor struct {
	cfg      *Config
	log      *slog.Logger
	counters *nodeCounters
	owner    kv.Owner
	client   *actor.PID // where TokenChunk and GenerateResult go
	clientID uint64     // the client's request id
	prompt   []int
	maxNew   int // tokens to generate, the first (from prefill) included
	route    route
	// dataPlane is this node's KV data plane, named in plans to prefill
	// peers in other nodes.
	dataPlane string
	// pick chooses another prefill peer when a transfer fails before any
	// token was streamed; tried holds the peers that failed.
	pick  PrefillPicker
	tried map[uint64]bool
	// registry maps request ids to this actor for the data plane; the
	// actor keeps its own entry, which changes with each attempt.
	registry *sync.Map
	// auth says who sent frames and transfer reports: only the prefill
	// peer of the current attempt may.
	auth *trust.Authority

	kv       *pageClient // decode pool
	phase    phase
	started  time.Time
	dest     []kv.Tag // prompt pages in decode's pool
	sources  []kv.Tag // the prefill page each dest page was filled from
	spare    []kv.Tag // pages for generated KV, in decode's pool
	manifest *kv.Manifest
	written  int // prompt tokens accepted into dest pages
	frames   int // frames accepted
	tokens   []int
	seq      uint32
	// marks of the phases of the time to first token (see Phases)
	planSent, firstFrame, transferEnd, firstToken, secondToken time.Time
}

type (
	retryReserve    struct{}
	requestDeadline struct{}
	// prefillDeadline: the transfer attempt of request id attempt has not
	// finished in PrefillTimeout.
	prefillDeadline struct{ attempt uint64 }
)

func (r *requestActor) Receive(c actor.Context) {
	if _, stopping := c.Message().(*actor.Stopping); r.phase == phaseDone && !stopping {
		r.counters.ignored.Add(1) // late messages after the answer went out
		return
	}
	switch m := c.Message().(type) {
	case *actor.Started:
		r.kv = newPageClient(r.route.decodePool, c)
		r.registry.Store(r.owner.Request, c.Self())
		r.started = time.Now()
		self, sys := c.Self(), c.ActorSystem()
		time.AfterFunc(r.cfg.RequestTimeout, func() { sys.Root.Send(self, requestDeadline{}) })
		r.reserve(c)
	case *actor.Stopping:
		r.registry.Delete(r.owner.Request)
	case retryReserve:
		if r.phase == phaseReserving {
			r.reserve(c)
		}
	case FrameBatch:
		frames, _, err := kv.DecodeBatch(m.Data, r.cfg.BatchLimits())
		if err == nil {
			err = r.accept(r.current(frames))
		}
		if err != nil {
			r.finish(c, err)
		}
	case FramesIn:
		frames := r.current(m.Frames)
		if err := r.fromPeer(c, m.Peer, len(frames)); err != nil {
			// A stranger's frames are refused (its connection is closed)
			// and counted, but do not end the request: request ids are no
			// secret, and anyone could otherwise fail anyone's request.
			c.Respond(FramesInReply{Err: err})
			return
		}
		err := r.accept(frames)
		c.Respond(FramesInReply{Err: err})
		if err != nil {
			r.finish(c, err)
		}
	case *messages.TransferDone:
		switch {
		case m.RequestID != r.owner.Request || r.phase != phasePrefill:
			r.counters.ignored.Add(1) // an abandoned attempt's, or a duplicate
		case !r.fromPrefill(c):
			_ = r.stranger("transfer done", r.auth.Of(c).String()) // counted, and without effect: see FramesIn
		case m.Err != nil:
			r.prefillFailed(c, m.Err)
		default:
			r.transferDone(c, m)
		}
	case PeerLost:
		if m.Incarnation == r.route.prefillIncarnation && r.phase == phasePrefill {
			r.prefillFailed(c, &messages.WireError{Code: messages.CodeNodeLost,
				Message: fmt.Sprintf("prefill node %x left", m.Incarnation)})
		}
	case prefillDeadline:
		if m.attempt == r.owner.Request && r.phase == phasePrefill {
			r.prefillFailed(c, &messages.WireError{Code: messages.CodeNodeLost,
				Message: fmt.Sprintf("no transfer from prefill node %x within %s", r.route.prefillIncarnation, r.cfg.PrefillTimeout)})
		}
	case TokenOut:
		if m.Owner == r.owner && r.phase == phaseDecoding {
			r.token(c, m.Token)
		}
	case DecodeDone:
		if m.Owner == r.owner && r.phase == phaseDecoding {
			r.finish(c, m.Err)
		}
	case CancelJob:
		r.finish(c, ErrCancelled)
	case requestDeadline:
		r.finish(c, ErrDeadline)
	}
}

// current keeps the frames of the current transfer attempt. Frames of an
// attempt abandoned for a retry carry its own request id: they are late,
// not wrong, and are dropped and counted rather than failing the request.
func (r *requestActor) current(frames []kv.Frame) []kv.Frame {
	keep := frames[:0:0]
	for _, f := range frames {
		if f.Owner.Request == r.owner.Request || f.Owner.Tenant != r.owner.Tenant {
			keep = append(keep, f) // a foreign tenant's frame is not late: accept refuses it
			continue
		}
		r.counters.ignored.Add(1)
	}
	return keep
}

// fromPrefill says whether the message in hand came from the prefill peer
// of the current attempt: from its address, which the remote boundary
// proved the sender holds, or, for a plan with this node, from inside this
// process (no sender).
func (r *requestActor) fromPrefill(c actor.Context) bool {
	from := c.Self().Address
	if s := c.Sender(); s != nil {
		from = s.Address
	}
	return from == r.route.prefill.Address
}

// fromPeer checks that n frames of the current attempt that the data plane
// received came from the identity proven to serve at the planned prefill
// peer's address. A peer without an identity passes only on an insecure
// node, where nobody has one, or for a plan with this node.
func (r *requestActor) fromPeer(c actor.Context, peer trust.Identity, n int) error {
	if n == 0 || r.auth.Insecure() {
		return nil
	}
	if r.route.prefill.Address == c.Self().Address {
		if peer.IsZero() {
			return nil
		}
	} else if want, ok := r.auth.Peers().At(r.route.prefill.Address); ok && !peer.IsZero() && peer == want {
		return nil
	}
	from := peer.String()
	if peer.IsZero() {
		from = "an unauthenticated peer"
	}
	return r.stranger("frames", from)
}

// stranger counts and describes frames or a report of the current
// attempt from someone else than its prefill peer.
func (r *requestActor) stranger(what, from string) error {
	planned := fmt.Sprintf("%s (incarnation %x)", r.route.prefill.Address, r.route.prefillIncarnation)
	r.auth.Refuse(trust.RefusedStranger, what, "request", r.owner.Request, "from", from, "planned", planned)
	return &StrangerError{What: what, From: from, Planned: planned}
}

// reserve takes the decode pages for the prompt and for the generated
// tokens, all or nothing, then asks prefill for the KV. An exhausted pool
// is retried until ReserveWait, then answered "busy".
func (r *requestActor) reserve(c actor.Context) {
	g := r.route.decodePool.Geometry
	var err error
	if r.dest, err = r.route.decodePool.Reserve(c, r.owner, 0, g.PagesFor(len(r.prompt))); err == nil {
		if n := g.PagesFor(r.maxNew - 1); n > 0 {
			if r.spare, err = r.route.decodePool.Reserve(c, r.owner, len(r.prompt), n); err != nil {
				r.releaseAll(r.dest)
				r.dest = nil
			}
		}
	}
	var ex *kv.PoolExhaustedError
	switch {
	case err == nil:
	case errors.As(err, &ex) && time.Since(r.started) < r.cfg.ReserveWait:
		self, sys := c.Self(), c.ActorSystem()
		time.AfterFunc(r.cfg.ReserveRetry, func() { sys.Root.Send(self, retryReserve{}) })
		return
	case errors.As(err, &ex):
		r.finish(c, &BusyError{Where: "decode pool", Have: ex.Need, Limit: ex.Free})
		return
	default:
		r.finish(c, err)
		return
	}
	if r.manifest, err = kv.NewManifest(r.owner, len(r.prompt), g.PageTokens, r.dest); err != nil {
		r.finish(c, err)
		return
	}
	r.sources = make([]kv.Tag, len(r.dest))
	r.phase = phasePrefill
	plan := &messages.TransferPlan{RequestID: r.owner.Request, Tenant: r.owner.Tenant, TokenCount: uint32(len(r.prompt)),
		PromptTokens: make([]uint32, len(r.prompt)), PageTokens: uint32(g.PageTokens), DestTags: r.dest,
		DataPlane: r.planDataPlane()}
	for i, t := range r.prompt {
		plan.PromptTokens[i] = uint32(t)
	}
	if err := messages.SendFrom(c, r.route.prefill, plan); err != nil {
		r.finish(c, err)
		return
	}
	r.planSent, r.firstFrame = time.Now(), time.Time{}
	self, sys, attempt := c.Self(), c.ActorSystem(), r.owner.Request
	time.AfterFunc(r.cfg.PrefillTimeout, func() { sys.Root.Send(self, prefillDeadline{attempt: attempt}) })
}

// prefillFailed retries the transfer with another prefill peer when this
// node chose the peer and tries are left: no token has been streamed yet,
// so the client cannot tell. The old destination pages are released first,
// so any late frame of the failed attempt presents a stale tag.
func (r *requestActor) prefillFailed(c actor.Context, cause error) {
	r.tried[r.route.prefillIncarnation] = true
	if len(r.tried) > retriesMax {
		r.finish(c, cause)
		return
	}
	peer, ok := r.pick(r.tried)
	if !ok {
		r.finish(c, cause)
		return
	}
	r.log.Info("retrying transfer with another prefill node", "owner", r.owner.String(), "cause", cause,
		"from", fmt.Sprintf("%x", r.route.prefillIncarnation), "to", fmt.Sprintf("%x", peer.Incarnation))
	r.abort(c, cause)
	r.releaseAll(r.dest)
	r.releaseAll(r.spare)
	r.dest, r.sources, r.spare, r.frames, r.written = nil, nil, nil, 0, 0
	// A new attempt is a new request id: whatever the abandoned attempt
	// still sends (frames, its TransferDone) names the old one and is
	// dropped, and the prefill peer keys the new plan apart.
	r.registry.Delete(r.owner.Request)
	r.owner.Request = r.counters.requestIDs.Add(1)
	r.registry.Store(r.owner.Request, c.Self())
	r.route.prefill, r.route.prefillIncarnation = peer.PID, peer.Incarnation
	r.counters.retried.Add(1)
	r.phase = phaseReserving
	r.reserve(c)
}

// planDataPlane is where a plan asks for frames: nowhere (as messages to
// this actor) when the prefill peer is this node, else this node's data
// plane.
func (r *requestActor) planDataPlane() string {
	if r.route.prefillIncarnation == r.cfg.Incarnation {
		return ""
	}
	return r.dataPlane
}

// abort tells the prefill peer to drop the transfer.
func (r *requestActor) abort(c actor.Context, cause error) {
	abort := &messages.TransferAbort{RequestID: r.owner.Request, Tenant: r.owner.Tenant, Reason: *wireError(cause)}
	if err := messages.SendFrom(c, r.route.prefill, abort); err != nil {
		r.log.Error("transfer abort refused by its own validation", "err", err)
	}
}

// accept writes frames into the destination pages. The batch decoder
// has verified every frame's checksum; each frame must come from a page of
// the planned prefill node's incarnation, one source page per destination
// page; each page actor checks that the destination tag is current, held
// by this request and tenant, and that the token range is the page's next.
// Anything refused fails the request: nothing is generated from pages that
// did not fill cleanly.
func (r *requestActor) accept(frames []kv.Frame) error {
	if r.phase != phasePrefill {
		r.counters.ignored.Add(uint64(len(frames))) // a duplicate after the transfer ended
		return nil
	}
	if r.firstFrame.IsZero() {
		r.firstFrame = time.Now()
	}
	for i := range frames {
		f := &frames[i]
		// A frame for another request is refused here, before any page sees
		// it: this actor writes only into its own pages.
		var err error
		page := f.FirstToken / r.route.decodePool.Geometry.PageTokens
		switch {
		case f.Owner != r.owner:
			err = &kv.WrongOwnerError{Page: f.Dest, Owner: r.owner.Request, Have: f.Owner.Request}
		case f.Source.Incarnation != r.route.prefillIncarnation:
			err = r.stranger("frames", fmt.Sprintf("a page of incarnation %x", f.Source.Incarnation))
		case page < len(r.sources) && r.sources[page] != (kv.Tag{}) && r.sources[page] != f.Source:
			err = &kv.ManifestError{Field: "source pages", Page: page, Want: 1, Have: 2}
		default:
			// The payload is the message's own (a received batch, or the
			// data plane's copy), so it goes to the page without another.
			err = r.kv.writeOwned(f.Dest, f.Owner, f.FirstToken, f.Payload)
		}
		if err != nil {
			r.counters.framesRefused.Add(uint64(len(frames) - i))
			return err
		}
		r.sources[page] = f.Source // in range: the page took the write
		r.frames++
		r.written += f.Tokens
		r.counters.framesAccepted.Add(1)
	}
	return nil
}

// transferDone completes the transfer: every frame in, every page sealed,
// each only if its bytes are those prefill sealed (its checksum in m), and
// the manifest verified before decode may read a byte; then prefill may let
// its pages go, and decode starts from prefill's first token, which the
// decode worker checks first.
func (r *requestActor) transferDone(c actor.Context, m *messages.TransferDone) {
	r.transferEnd = time.Now()
	if r.frames != int(m.Frames) || r.written != len(r.prompt) {
		r.finish(c, &kv.ManifestError{Field: "tokens transferred", Page: -1, Want: len(r.prompt), Have: r.written})
		return
	}
	if len(m.Sums) != len(r.manifest.Pages) {
		r.finish(c, &kv.ManifestError{Field: "source checksums", Page: -1, Want: len(r.manifest.Pages), Have: len(m.Sums)})
		return
	}
	for i := range r.manifest.Pages {
		mp := &r.manifest.Pages[i]
		sum, err := r.kv.sealFrom(mp.Tag, r.owner, kv.Origin{Tag: r.sources[i], Owner: m.SourceOwner(), Checksum: m.Sums[i]})
		if err != nil {
			r.finish(c, err)
			return
		}
		mp.Checksum = sum
	}
	if err := r.manifest.Verify(r.kv); err != nil {
		r.finish(c, err)
		return
	}
	ack := &messages.TransferAck{RequestID: r.owner.Request, Tenant: r.owner.Tenant,
		TokenCount: uint32(len(r.prompt)), Pages: uint32(len(r.dest))}
	if err := messages.SendFrom(c, r.route.prefill, ack); err != nil {
		r.finish(c, err)
		return
	}
	// The decode worker streams prefill's first token only once it has
	// recomputed it from the pages, so the client never sees a token the
	// KV does not give.
	r.phase = phaseDecoding
	c.Send(r.route.decode, DecodeJob{Manifest: r.manifest, Next: int(m.First), Last: r.prompt[len(r.prompt)-1],
		MaxNew: r.maxNew - 1, Spare: r.spare, ReplyTo: c.Self()})
}

// token streams one generated token to the client; the request ends at
// EOS or at its token budget.
func (r *requestActor) token(c actor.Context, tok int) {
	r.tokens = append(r.tokens, tok)
	switch len(r.tokens) {
	case 1:
		r.firstToken = time.Now()
	case 2:
		r.secondToken = time.Now()
	}
	r.seq++
	// Tokens and the result name this actor as their sender, so that the
	// client can tell them from anyone else's.
	if err := messages.SendFrom(c, r.client, &messages.TokenChunk{RequestID: r.clientID, Seq: r.seq, Tokens: []uint32{uint32(tok)}}); err != nil {
		r.log.Error("token chunk refused", "err", err)
	}
	if tok == gpu.EOS || len(r.tokens) >= r.maxNew {
		r.finish(c, nil)
	}
}

// finish answers the client, withdraws the request from both workers when
// it ends early, releases every page it holds and stops. A page a worker
// still leases is released when the lease comes back (or at the reclaim
// deadline).
func (r *requestActor) finish(c actor.Context, cause error) {
	if r.phase == phaseDone {
		return
	}
	decoding := r.phase == phaseDecoding
	r.phase = phaseDone
	if cause != nil {
		r.abort(c, cause)
		if decoding {
			c.Send(r.route.decode, CancelJob{Owner: r.owner})
		}
	} else if decoding && (len(r.tokens) == 0 || len(r.tokens) < r.maxNew && r.tokens[len(r.tokens)-1] != gpu.EOS) {
		cause = fmt.Errorf("actors: decode ended after %d of %d tokens", len(r.tokens), r.maxNew)
	}
	r.releaseAll(r.dest)
	r.releaseAll(r.spare)
	res := &messages.GenerateResult{RequestID: r.clientID}
	switch {
	case cause != nil:
		res.FinishReason, res.Err = messages.FinishError, wireError(cause)
		r.counters.failed.Add(1)
		r.log.Info("request failed", "owner", r.owner.String(), "err", cause)
	case r.tokens[len(r.tokens)-1] == gpu.EOS:
		res.FinishReason = messages.FinishStop
	default:
		res.FinishReason = messages.FinishLength
	}
	if cause == nil {
		r.recordPhases()
		res.Tokens = make([]uint32, len(r.tokens))
		for i, t := range r.tokens {
			res.Tokens[i] = uint32(t)
		}
		res.Text = gpu.ByteTokenizer{}.Decode(r.tokens)
		r.counters.completed.Add(1)
	}
	if err := messages.SendFrom(c, r.client, res); err != nil {
		r.log.Error("result refused by its own validation", "err", err)
		_ = messages.SendFrom(c, r.client, &messages.GenerateResult{RequestID: r.clientID, FinishReason: messages.FinishError,
			Err: &messages.WireError{Code: messages.CodeInternal, Message: "result failed validation"}})
	}
	c.Stop(c.Self())
}

// recordPhases adds a completed request's phases to the node's sums; a
// request of one token has no decode step and counts zero for it.
func (r *requestActor) recordPhases() {
	p := &r.counters.phases
	p.count.Add(1)
	p.queue.Add(int64(r.planSent.Sub(r.started)))
	p.prefill.Add(int64(r.firstFrame.Sub(r.planSent)))
	p.transfer.Add(int64(r.transferEnd.Sub(r.firstFrame)))
	p.verify.Add(int64(r.firstToken.Sub(r.transferEnd)))
	if !r.secondToken.IsZero() {
		p.firstDecode.Add(int64(r.secondToken.Sub(r.firstToken)))
	}
}

func (r *requestActor) releaseAll(tags []kv.Tag) {
	for _, t := range tags {
		if err := r.kv.release(t, r.owner); err != nil {
			ownsOrPanic(err, "request", t, r.owner)
			r.log.Warn("release of decode page refused", "tag", t.String(), "err", err)
		}
	}
}

// ownsOrPanic is the check on a refused release or ack of a page the
// caller reserved itself: a stale tag (the page was reclaimed) is expected,
// but a page that belongs to another owner means two owners, a broken
// invariant that must stop the node rather than be logged.
func ownsOrPanic(err error, who string, t kv.Tag, o kv.Owner) {
	var tenant *kv.WrongTenantError
	var owner *kv.WrongOwnerError
	if errors.As(err, &tenant) || errors.As(err, &owner) {
		panic(fmt.Sprintf("actors: %s %s reserved page %s and it belongs to another owner: %v", who, o, t, err))
	}
}
