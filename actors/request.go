package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// route is the pair of workers a request runs on.
type route struct {
	prefill, decode           *actor.PID
	prefillPool, decodePool   *Pool
	prefillIndex, decodeIndex int
}

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

	kv       *pageClient // decode pool
	phase    phase
	started  time.Time
	dest     []kv.Tag // prompt pages in decode's pool
	spare    []kv.Tag // pages for generated KV, in decode's pool
	manifest *kv.Manifest
	written  int // prompt tokens accepted into dest pages
	frames   int // frames accepted
	done     *PrefillDone
	tokens   []int
	seq      uint32
}

type (
	retryReserve    struct{}
	requestDeadline struct{}
)

func (r *requestActor) Receive(c actor.Context) {
	if r.phase == phaseDone {
		return // late messages after the answer went out
	}
	switch m := c.Message().(type) {
	case *actor.Started:
		r.kv = newPageClient(r.route.decodePool, c)
		r.started = time.Now()
		self, sys := c.Self(), c.ActorSystem()
		time.AfterFunc(r.cfg.RequestTimeout, func() { sys.Root.Send(self, requestDeadline{}) })
		r.reserve(c)
	case retryReserve:
		r.reserve(c)
	case FrameBatch:
		r.accept(c, m)
	case PrefillDone:
		r.prefillDone(c, m)
	case TokenOut:
		r.token(c, m.Token)
	case DecodeDone:
		r.finish(c, m.Err)
	case CancelJob:
		r.finish(c, ErrCancelled)
	case requestDeadline:
		r.finish(c, ErrDeadline)
	}
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
	r.phase = phasePrefill
	c.Send(r.route.prefill, PrefillJob{Owner: r.owner, Prompt: r.prompt, Dest: r.dest, ReplyTo: c.Self()})
}

// accept writes one batch of frames into the destination pages. The batch
// decoder verifies every frame's checksum; each page actor checks that the
// destination tag is current, held by this request and tenant, and that
// the token range is the page's next. Anything refused fails the request:
// nothing is generated from pages that did not fill cleanly.
func (r *requestActor) accept(c actor.Context, b FrameBatch) {
	frames, _, err := kv.DecodeBatch(b.Data, r.cfg.BatchLimits())
	if err != nil {
		r.counters.framesRefused.Add(1)
		r.finish(c, err)
		return
	}
	for i := range frames {
		f := &frames[i]
		if f.Owner != r.owner {
			r.counters.framesRefused.Add(1)
			r.finish(c, &kv.WrongOwnerError{Page: f.Dest, Owner: r.owner.Request, Have: f.Owner.Request})
			return
		}
		if err := r.kv.Write(f.Dest, f.Owner, f.FirstToken, f.Payload); err != nil {
			r.counters.framesRefused.Add(1)
			r.finish(c, err)
			return
		}
		r.frames++
		r.written += f.Tokens
		r.counters.framesAccepted.Add(1)
	}
}

// prefillDone completes the transfer: every frame in, every page sealed and
// the manifest verified before decode may read a byte; then prefill may let
// its pages go, and decode starts.
func (r *requestActor) prefillDone(c actor.Context, m PrefillDone) {
	if m.Err != nil {
		r.finish(c, m.Err)
		return
	}
	r.done = &m
	if r.frames != m.Frames || r.written != len(r.prompt) {
		r.finish(c, &kv.ManifestError{Field: "tokens transferred", Page: -1, Want: len(r.prompt), Have: r.written})
		return
	}
	for i := range r.manifest.Pages {
		mp := &r.manifest.Pages[i]
		sum, err := r.kv.Seal(mp.Tag, r.owner)
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
	c.Send(r.route.prefill, TransferAck{Owner: r.owner})
	r.phase = phaseDecoding
	if r.token(c, m.First); r.phase == phaseDone {
		return
	}
	c.Send(r.route.decode, DecodeJob{Manifest: r.manifest, Next: m.First, MaxNew: r.maxNew - 1,
		Spare: r.spare, ReplyTo: c.Self()})
}

// token streams one generated token to the client; the request ends at
// EOS or at its token budget.
func (r *requestActor) token(c actor.Context, tok int) {
	r.tokens = append(r.tokens, tok)
	r.seq++
	if err := messages.Send(c, r.client, &messages.TokenChunk{RequestID: r.clientID, Seq: r.seq, Tokens: []uint32{uint32(tok)}}); err != nil {
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
		c.Send(r.route.prefill, CancelJob{Owner: r.owner})
		if decoding {
			c.Send(r.route.decode, CancelJob{Owner: r.owner})
		}
	} else if decoding && len(r.tokens) < r.maxNew && r.tokens[len(r.tokens)-1] != gpu.EOS {
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
		res.Tokens = make([]uint32, len(r.tokens))
		for i, t := range r.tokens {
			res.Tokens[i] = uint32(t)
		}
		res.Text = gpu.ByteTokenizer{}.Decode(r.tokens)
		r.counters.completed.Add(1)
	}
	if err := messages.Send(c, r.client, res); err != nil {
		r.log.Error("result refused by its own validation", "err", err)
		_ = messages.Send(c, r.client, &messages.GenerateResult{RequestID: r.clientID, FinishReason: messages.FinishError,
			Err: &messages.WireError{Code: messages.CodeInternal, Message: "result failed validation"}})
	}
	c.Stop(c.Self())
}

func (r *requestActor) releaseAll(tags []kv.Tag) {
	for _, t := range tags {
		if err := r.kv.release(t, r.owner); err != nil {
			r.log.Warn("release of decode page refused", "tag", t.String(), "err", err)
		}
	}
}
