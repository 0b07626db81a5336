package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
	"github.com/kvwarden/kvwarden/trust"
)

// Messages between request actors and GPU-worker actors. The prefill
// handshake uses the wire messages (messages.TransferPlan, TransferDone,
// TransferAck, TransferAbort), so that it runs the same whether the request
// actor is in this node or another. The rest stays inside a node.
type (
	// FrameBatch is one bounded batch of encoded frames (kv.AppendBatch),
	// from a prefill worker to a request actor in the same process.
	FrameBatch struct {
		Owner kv.Owner
		Data  []byte
	}
	// FramesIn is frames the KV data plane received for a request actor
	// from Peer (as the data plane's TLS proved it; zero when insecure);
	// answered with a FramesInReply once they are written (or refused).
	FramesIn struct {
		Peer   trust.Identity
		Frames []kv.Frame
	}
	// FramesInReply carries the outcome of a FramesIn.
	FramesInReply struct{ Err error }

	// DecodeJob asks a decode worker to generate from a verified
	// manifest (handoff.StartDecode); tokens and the end go to ReplyTo.
	DecodeJob struct {
		handoff.StartDecode
		ReplyTo *actor.PID
	}
	// TokenOut is one generated token.
	TokenOut struct {
		Owner kv.Owner
		Token int
	}
	// DecodeDone ends a decode job: the worker holds no lease of it any
	// more. Err is nil when it generated MaxNew tokens or met EOS.
	DecodeDone struct {
		Owner kv.Owner
		Err   error
	}
	// CancelJob withdraws a decode job; sent to a request actor, it
	// withdraws the request (a CancelRequest's CancelWithdraw).
	CancelJob struct{ Owner kv.Owner }
	// PauseJob holds a decode job still after the step in hand, for its
	// request to move; the worker answers its ReplyTo JobPaused.
	// ResumeJob has a paused job step again (nothing, for one not paused).
	PauseJob struct {
		Owner  kv.Owner
		MoveID uint64
	}
	ResumeJob struct{ Owner kv.Owner }
	// JobResumed tells a request moved here that its job began: the last
	// token it streamed where it was, recomputed from the pages received.
	JobResumed struct{ Owner kv.Owner }
	// JobPaused is a paused job's pages and tail (handoff.Sequence.Paused),
	// or why there is no such job.
	JobPaused struct {
		Owner kv.Owner
		handoff.Paused
	}
	// StopJob ends a request as completed at the tokens it has: its
	// client has what it wants of the answer (a CancelRequest's
	// CancelStop).
	StopJob struct{}

	// CacheKeys asks a prefill worker for the keys of at most Max pages
	// its prefix cache holds, most recently used first: a
	// []kv.PrefixKey, empty without a cache.
	CacheKeys struct{ Max int }

	// WorkerStatus asks a worker for a WorkerStatusReply.
	WorkerStatus      struct{}
	WorkerStatusReply struct {
		Role                                 string
		Queued, Sending, Active, AwaitingAck int
		FramesSent, BatchesSent, Steps       uint64
		FirstTokensRefused                   uint64
	}

	step struct{}
	// transferSent is the outcome of one transfer's sending goroutine:
	// sender is the connection it used (dialed says it opened it), err
	// why it failed.
	transferSent struct {
		job    handoff.JobKey
		peer   string
		sender FrameSender
		dialed bool
		err    error
		move   *moveSend // a move's frames, nil for a prefill job's
	}
	// moveFrames asks a decode worker to send a paused job's pages to a
	// move's target, whose remote address is To (handoff.SendMoveFrames);
	// it answers ReplyTo MoveFramesSent.
	moveFrames struct {
		handoff.SendMoveFrames
		To      string
		ReplyTo *actor.PID
	}
	// MoveFramesSent answers a moveFrames: the frames went, or why not.
	MoveFramesSent struct {
		Owner  kv.Owner
		MoveID uint64
		Err    error
	}
	// injectFault installs a function the worker applies to every
	// transfer's frames after prefill sealed their pages and before they
	// are sent: a seam for tests to corrupt bytes in that gap. Only code of
	// this package can make one.
	injectFault struct{ frames func([]kv.Frame) }
)

// FrameSender sends frames to one peer's KV data plane and returns once
// the peer has accepted (or refused) them, or ctx ended; it may be used
// by several goroutines at once. Done is closed when its connection is
// gone for good (the peer closed it idle, or died).
type FrameSender interface {
	Send(ctx context.Context, frames []kv.Frame) error
	Done() <-chan struct{}
	Close() error
}

// Dialer opens a FrameSender to the data plane at addr of the node run
// whose incarnation is given. It should bound its own wait (connect and
// handshake); a worker stops waiting for it at the transfer's
// PrefillTimeout anyway, and closes what it returns after that.
type Dialer func(addr string, incarnation uint64) (FrameSender, error)

// workerCounters are read by tests and status from other goroutines.
type workerCounters struct {
	framesSent, batchesSent, steps atomic.Uint64
	// firstRefused counts decode jobs whose first token the KV did not
	// give.
	firstRefused atomic.Uint64
}

// sequence is one running decode job and where its tokens go.
type sequence struct {
	*handoff.Sequence
	replyTo *actor.PID
	stepped bool // in the step just run (rotate)
}

// workerActor is one GPU worker: the engine and the pool of one device.
// It runs prefill jobs and decode steps interleaved (continuous batching):
// each step message runs at most one queued prefill, then one decode step
// of up to BatchMax running sequences, then yields to its mailbox so that
// new jobs and cancellations get in between steps. A prefilled transfer to
// another node's data plane is sent from a goroutine of its own (at most
// sendsMax at once), whose outcome comes back as a message: a slow or
// silent peer holds up its own transfer, never the worker.
type workerActor struct {
	role     string
	engine   engine.Engine
	stop     int // the model's stop token
	pool     *Pool
	kv       *pageClient
	limits   kv.BatchLimits
	batchMax int
	// timeout (PrefillTimeout) bounds one transfer's dial and send.
	timeout time.Duration
	dial    Dialer
	policy  planPolicy
	log     *slog.Logger
	stats   *workerCounters
	// src is the prefill side of the worker's transfers; jobs holds, per
	// plan it runs, what only this shell keeps: where to answer, the
	// frames and their leases, and how to cancel the send in flight.
	src     *handoff.Source
	cache   *handoff.PrefixCache // unless PrefixCachePercent (prefill) or DecodeCachePercent (decode) is 0
	jobs    map[handoff.JobKey]*prefillJob
	senders map[string]FrameSender // data planes by peerKey
	seqs    []*sequence
	// paused are the decode jobs held still for a move, out of the steps.
	paused map[kv.Owner]*sequence
	// batch, stepSeqs and stepped are one step's, kept for the next so
	// that a step allocates no slices.
	batch    []*sequence
	stepSeqs []*handoff.Sequence
	stepped  []handoff.Stepped
	// tenants weigh the tenants' sequences, and steps shares the worker
	// among them, when more than one tenant has sequences here (share);
	// model weighs a sequence's step; order and rotated are a step's.
	tenants  *tenancy.Shares
	steps    *tenancy.Steps
	model    engine.ModelConfig
	order    []int
	rotated  []*sequence
	stepping bool
	fault    func([]kv.Frame)
	// metrics are the node's; queued and inFlight what this worker counts
	// in its prefill gauges now.
	metrics          *metricCounters
	queued, inFlight int
}

// newWorker is a worker of role computing model over pool, with no dialer.
func newWorker(role string, model *engine.Model, pool *Pool, cfg *Config, log *slog.Logger, policy planPolicy) *workerActor {
	w := &workerActor{role: role, engine: model.Engine(), stop: model.Tokenizer().Stop(), pool: pool, limits: cfg.BatchLimits(), batchMax: cfg.BatchMax,
		tenants: cfg.Tenants, steps: tenancy.NewSteps(), model: model.Config(), timeout: cfg.PrefillTimeout, log: log, stats: &workerCounters{}, policy: policy, metrics: &metricCounters{},
		src: handoff.NewSource(handoff.SourceConfig{Role: role, PageTokens: cfg.PageTokens, QueueMax: cfg.QueueMax,
			SendsMax: cfg.TransferSendsMax, ReclaimAfter: cfg.ReclaimAfter, DonePlansMax: cfg.DonePlansMax,
			DoneFor: cfg.PrefillTimeout, Model: model.Fingerprint()})}
	pages, percent := cfg.PrefillPages, cfg.PrefixCachePercent
	if role == "decode" {
		pages, percent = cfg.DecodePages, cfg.DecodeCachePercent
	}
	if percent > 0 {
		tenants := cfg.Tenants
		cache, err := handoff.NewPrefixCache(pages*percent/100, model.Fingerprint().String(),
			func(tenant, salt string) kv.Scope { return tenants.Policy().CacheScope(tenant, salt) })
		if err != nil {
			panic(fmt.Sprintf("actors: %s prefix cache of a validated config (%d pages, %d%%): %v", role, pages, percent, err))
		}
		w.cache = cache
		pool.cache.Store(new(cache.Stats()))
	}
	return w
}

// prefillJob is the shell's part of one plan the worker runs.
type prefillJob struct {
	replyTo *actor.PID
	frames  handoff.Frames
	cancel  context.CancelFunc
	sending time.Time // when its frames started on their way
}

func (w *workerActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		w.kv = newPageClient(w.pool, c)
		w.jobs = map[handoff.JobKey]*prefillJob{}
		w.paused = map[kv.Owner]*sequence{}
		w.senders = map[string]FrameSender{}
	case *actor.Stopping:
		w.publish(handoff.SourceCounts{})
		for _, j := range w.jobs {
			if j.cancel != nil {
				j.cancel()
			}
		}
		for _, s := range w.senders {
			s.Close()
		}
	case *messages.TransferPlan:
		w.plan(c, m)
	case transferSent:
		w.transferSent(c, m)
		w.kick(c)
	case moveFrames:
		w.sendMove(c, m)
	case DecodeJob:
		w.startDecode(c, m)
		w.kick(c)
	case step:
		w.stepping = false
		w.runStep(c)
		w.kick(c)
	case *messages.TransferAck:
		w.run(c, handoff.AckIn{Key: handoff.JobKey{Sender: senderKey(c), ID: m.RequestID}, Ack: m})
	case *messages.TransferAbort:
		w.run(c, handoff.AbortIn{Key: handoff.JobKey{Sender: senderKey(c), ID: m.RequestID}, Tenant: m.Tenant})
	case CancelJob:
		w.cancel(c, m.Owner)
	case PauseJob:
		w.pause(c, m)
	case ResumeJob:
		if s := w.paused[m.Owner]; s != nil {
			delete(w.paused, m.Owner)
			w.seqs = append(w.seqs, s)
			w.kick(c)
		}
	case injectFault:
		w.fault = m.frames
	case CacheKeys:
		var keys []kv.PrefixKey
		if w.cache != nil {
			keys = w.cache.RecentKeys(m.Max)
		}
		c.Respond(keys)
	case heldMatch, heldForget, heldEvict, heldRead, keepPages:
		w.held(c, m)
	case WorkerStatus:
		n := w.src.Counts()
		c.Respond(WorkerStatusReply{Role: w.role, Queued: n.Queued, Sending: n.Sending, Active: len(w.seqs),
			AwaitingAck: n.AwaitingAck, FramesSent: w.stats.framesSent.Load(), BatchesSent: w.stats.batchesSent.Load(),
			Steps: w.stats.steps.Load(), FirstTokensRefused: w.stats.firstRefused.Load()})
	}
}

// plan hands a transfer plan to the source, which answers it later (from
// its Queued on, the job keeps the plan's sender) or at once.
func (w *workerActor) plan(c actor.Context, m *messages.TransferPlan) {
	key := handoff.JobKey{Sender: senderKey(c), ID: m.RequestID}
	if c.Sender() == nil {
		w.log.Warn("transfer plan without a sender dropped", "request", m.RequestID)
		return
	}
	w.run(c, handoff.PlanIn{Key: key, Plan: m, Refused: w.policy.check(c, m)})
	w.kick(c)
}

// run steps the source, carries its effects out and publishes its queues.
func (w *workerActor) run(c actor.Context, ev handoff.Event) {
	handoff.RunClock(w.src, ev, time.Now, func(e handoff.Effect) handoff.Event { return w.do(c, e) })
	w.publish(w.src.Counts())
}

// publish moves the node's prefill gauges by what changed in n since the
// last call.
func (w *workerActor) publish(n handoff.SourceCounts) {
	inFlight := n.Sending + n.AwaitingAck
	w.metrics.prefillQueued.add(n.Queued - w.queued)
	w.metrics.prefillInFlight.add(inFlight - w.inFlight)
	w.queued, w.inFlight = n.Queued, inFlight
}

func (w *workerActor) do(c actor.Context, e handoff.Effect) handoff.Event {
	switch e := e.(type) {
	case handoff.RefusePlan:
		w.metrics.integrity.Count(e.Err) // a plan of another model
		if err := refusePlan(c, e.Plan, e.Err); err != nil {
			w.log.Error("transfer done refused by its own validation", "err", err)
		}
	case handoff.Queued:
		w.jobs[e.Key] = &prefillJob{replyTo: c.Sender()}
	case handoff.Dropped:
		w.log.Warn(e.Why+"; dropped", "request", e.Key.ID, "from", e.Key.Sender)
	case handoff.Prefill:
		out, frames := w.prefill(e)
		w.jobs[e.Key].frames = frames
		if out.Err == nil {
			w.metrics.promptTokens.Add(uint64(len(e.Plan.PromptTokens) - out.Cached))
			if w.fault != nil {
				w.fault(frames.Frames)
			}
		}
		return out
	case handoff.SendFrames:
		return w.send(c, e)
	case handoff.CancelSend:
		if j := w.jobs[e.Key]; j != nil && j.cancel != nil {
			j.cancel()
		}
	case handoff.Release:
		handoff.ExecRelease(w.kv, e, func(t kv.Tag, err error) {
			w.log.Warn("release of page refused", "tag", t.String(), "err", err)
		})
	case handoff.Ack:
		refused := func(t kv.Tag, err error) { w.log.Warn("ack of source page refused", "tag", t.String(), "err", err) }
		if w.cache != nil && len(e.Chain) > 0 {
			handoff.ExecAckKeep(w.kv, w.cache, e, refused)
			w.pool.cache.Store(new(w.cache.Stats()))
		} else {
			handoff.ExecAck(w.kv, e, refused)
		}
	case handoff.Ended:
		delete(w.jobs, e.Key)
	case handoff.Reply:
		if j := w.jobs[e.Key]; j != nil {
			if err := messages.Send(c, j.replyTo, e.Done); err != nil {
				w.log.Error("transfer done refused by its own validation", "err", err)
			}
			delete(w.jobs, e.Key)
		}
	}
	return nil
}

// prefill carries a Prefill out, through the prefix cache when the worker
// has one.
func (w *workerActor) prefill(e handoff.Prefill) (handoff.Prefilled, handoff.Frames) {
	if w.cache == nil {
		return handoff.ExecPrefill(w.engine, w.kv, e)
	}
	out, frames := handoff.ExecPrefillCached(w.engine, w.kv, w.cache, e)
	w.pool.cache.Store(new(w.cache.Stats()))
	return out, frames
}

// send sends a prefilled plan's frames: to a request actor here at once,
// to another node's data plane from a goroutine (sendRemote), whose
// outcome comes back as a transferSent.
func (w *workerActor) send(c actor.Context, e handoff.SendFrames) handoff.Event {
	j := w.jobs[e.Key]
	j.sending = time.Now()
	var err error
	switch {
	case e.Plan.DataPlane == "":
		err = w.sendLocal(c, j)
	case w.dial == nil:
		err = fmt.Errorf("actors: plan names data plane %s and this node has none", e.Plan.DataPlane)
	default:
		w.sendRemote(c, e.Key, e.Plan, j)
		return nil
	}
	return w.sent(e.Key, j, err)
}

// sent is a send's outcome, once the frames' leases are given back,
// counted as the node's transfer sent or failed.
func (w *workerActor) sent(key handoff.JobKey, j *prefillJob, err error) handoff.Event {
	frames := j.frames.Frames
	if err = errors.Join(err, j.frames.Unlease(w.kv)); err == nil {
		w.stats.batchesSent.Add(uint64(len(w.batches(frames))))
		w.stats.framesSent.Add(uint64(len(frames)))
		w.metrics.sent.Done(len(frames), payloadBytes(frames), time.Since(j.sending))
	} else {
		w.metrics.sent.Failed(err)
	}
	j.frames.Frames, j.cancel = nil, nil
	return handoff.Sent{Key: key, Err: err}
}

// kick makes sure a step message is on its way while there is work a step
// can do: a running sequence, or a queued plan that can start.
func (w *workerActor) kick(c actor.Context) {
	if !w.stepping && (len(w.seqs) > 0 || w.src.Startable()) {
		w.stepping = true
		c.Send(c.Self(), step{})
	}
}

// runStep starts at most one queued plan, then runs one decode step of up
// to batchMax sequences, round robin (rotate), shared by tenants' weights
// when more than one tenant has sequences here (share), in one batched step of the engine
// (handoff.StepBatch: each weight matrix read once for all of them).
func (w *workerActor) runStep(c actor.Context) {
	if w.src.Startable() {
		w.run(c, handoff.Next{})
	}
	if n := min(len(w.seqs), w.batchMax); n > 0 {
		indexOf := func(s *sequence) int {
			for i, x := range w.seqs {
				if x == s {
					return i
				}
			}
			return -1
		}
		order := w.order[:0] // indexes into seqs of the step's sequences
		if n == len(w.seqs) && w.oneTenant() {
			for i := range n {
				order = append(order, i)
			}
		} else {
			order = w.share(n, order)
		}
		batch, seqs := w.batch[:0], w.stepSeqs[:0]
		for _, i := range order {
			batch = append(batch, w.seqs[i])
			seqs = append(seqs, w.seqs[i].Sequence)
		}
		w.order = order
		out := append(w.stepped[:0], make([]handoff.Stepped, len(batch))...)
		handoff.StepBatch(w.kv, seqs, out)
		w.batch, w.stepSeqs, w.stepped = batch, seqs, out
		for i, s := range batch {
			s.stepped = true
			if done, err := w.decodeStep(c, s, out[i]); done {
				w.finish(c, indexOf(s), err)
			}
		}
		w.rotate()
		clear(batch) // holding no finished sequence until the next step
		clear(seqs)
	}
	w.stats.steps.Add(1)
}

// share chooses the n or fewer of more sequences that a step takes,
// appending their indexes in seqs to order: the tenants share the worker's
// compute by weight, not by how many or how long sequences each has
// (tenancy.Steps, each step weighed by engine.ModelConfig.TokenMACs), and
// each tenant's first sequences in seqs go first (rotate puts those just
// stepped last).
func (w *workerActor) share(n int, order []int) []int {
	owners, costs := make([]string, len(w.seqs)), make([]float64, len(w.seqs))
	for i, s := range w.seqs {
		owners[i], costs[i] = s.Owner().Tenant, w.model.TokenMACs(s.Context())
	}
	policy := w.tenants.Policy()
	return w.steps.Choose(owners, costs, func(t string) int { return policy.Of(t).Weight }, n, order)
}

// rotate moves the sequences the step just ran behind those it did not,
// each group in its order, so that the next step takes, of each tenant,
// the sequences that waited longest: every one of a tenant's gets its turn.
func (w *workerActor) rotate() {
	waited := w.rotated[:0]
	for _, s := range w.seqs {
		if !s.stepped {
			waited = append(waited, s)
		}
	}
	for _, s := range w.seqs {
		if s.stepped {
			waited = append(waited, s)
			s.stepped = false
		}
	}
	copy(w.seqs, waited)
	clear(waited)
	w.rotated = waited
}

// oneTenant says whether every sequence is one tenant's.
func (w *workerActor) oneTenant() bool {
	for _, s := range w.seqs[1:] {
		if s.Owner().Tenant != w.seqs[0].Owner().Tenant {
			return false
		}
	}
	return true
}

// batches cuts frames into groups of at most one transfer batch.
func (w *workerActor) batches(frames []kv.Frame) [][]kv.Frame {
	var out [][]kv.Frame
	lo, bytes := 0, 0
	for i := range frames {
		if i-lo == w.limits.PagesMax || bytes+w.limits.Frame.FrameBytesMax() > w.limits.BytesMax {
			out = append(out, frames[lo:i])
			lo, bytes = i, 0
		}
		bytes += w.limits.Frame.FrameBytesMax()
	}
	return append(out, frames[lo:])
}

// sendLocal sends the job's frames to its request actor in this process,
// as encoded batches (kv.AppendBatch copies the payloads).
func (w *workerActor) sendLocal(c actor.Context, j *prefillJob) error {
	for _, b := range w.batches(j.frames.Frames) {
		data, err := kv.AppendBatch(nil, b, w.limits)
		if err != nil {
			return err
		}
		c.Send(j.replyTo, FrameBatch{Owner: b[0].Owner, Data: data})
	}
	return nil
}

// peerKey names a data plane connection: by incarnation too, since a
// decode node restarted at the same address is another peer, and refuses
// a connection made for its old self.
func peerKey(addr string, incarnation uint64) string { return fmt.Sprintf("%s#%x", addr, incarnation) }

// sendRemote sends the job's frames to the plan's data plane from a
// goroutine of its own, on the connection in hand or one it dials, within
// PrefillTimeout, and reports the outcome as a transferSent. The goroutine
// touches nothing of the worker's: the frames' payloads stay leased, and
// so unchanged, until the outcome is in.
func (w *workerActor) sendRemote(c actor.Context, key handoff.JobKey, plan *messages.TransferPlan, j *prefillJob) {
	j.cancel = w.sendAsync(c, plan.DataPlane, plan.DestTags[0].Incarnation, j.frames.Frames, transferSent{job: key})
}

// sendAsync sends frames to the data plane at addr (of the run inc) from
// a goroutine, on the connection in hand or one it dials, within
// PrefillTimeout, and reports out, with the outcome, to the worker.
func (w *workerActor) sendAsync(c actor.Context, addr string, inc uint64, frames []kv.Frame, out transferSent) context.CancelFunc {
	peer := peerKey(addr, inc)
	w.pruneSenders()
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	out.peer, out.sender = peer, w.senders[peer]
	dial, self, root := w.dial, c.Self(), c.ActorSystem().Root
	go func() {
		defer cancel()
		if out.sender == nil {
			out.sender, out.err = dialWithin(ctx, dial, addr, inc)
			out.dialed = out.sender != nil
		}
		if out.err == nil {
			out.err = out.sender.Send(ctx, frames)
		}
		root.Send(self, out)
	}()
	return cancel
}

// moveSend is a move's frames on their way: the leases that keep their
// pages' bytes until the send is over, and whom to tell.
type moveSend struct {
	owner   kv.Owner
	id      uint64
	leases  []kv.Lease
	replyTo *actor.PID
}

// sendMove sends a paused job's pages to a move's target: each sealed
// page's bytes read under a lease of its own, held until the send is
// over, then the tail's as the job gave them.
func (w *workerActor) sendMove(c actor.Context, m moveFrames) {
	ms := &moveSend{owner: m.Owner, id: m.MoveID, replyTo: m.ReplyTo}
	fail := func(err error) { w.moveSent(c, ms, err) }
	if w.dial == nil {
		fail(fmt.Errorf("actors: a move to data plane %s and this node has none", m.Plan.DataPlane))
		return
	}
	// The KV goes only to the data plane membership gives the target.
	if w.policy.dataPlaneOf != nil {
		if addr, _, ok := w.policy.dataPlaneOf(m.To); !ok || addr != m.Plan.DataPlane {
			w.policy.auth.Refuse(trust.RefusedStranger, "move plan", "target", m.To, "data_plane", m.Plan.DataPlane,
				"advertised", addr)
			fail(&DataPlaneMismatchError{Sender: m.To, Named: m.Plan.DataPlane, Advertised: addr})
			return
		}
	}
	frames := make([]kv.Frame, 0, len(m.Pages))
	first := 0
	for i, p := range m.Pages {
		payload := m.Tail
		if i < len(m.Pages)-1 || len(m.Tail) == 0 {
			l, err := w.kv.Lease(p.Tag, m.Owner)
			if err != nil {
				fail(err)
				return
			}
			ms.leases = append(ms.leases, l)
			if payload, _, err = w.kv.Read(l); err != nil {
				fail(err)
				return
			}
		}
		frames = append(frames, kv.Frame{Owner: m.Plan.Owner(), Source: p.Tag, Dest: m.Plan.DestTags[i], FirstToken: first,
			Tokens: p.Tokens, Payload: payload})
		first += p.Tokens
	}
	w.sendAsync(c, m.Plan.DataPlane, m.Plan.DestTags[0].Incarnation, frames, transferSent{move: ms})
}

// moveSent gives a move's leases back and tells its request how the send
// went.
func (w *workerActor) moveSent(c actor.Context, ms *moveSend, err error) {
	for _, l := range ms.leases {
		if uerr := w.kv.Unlease(l); uerr != nil {
			w.log.Warn("unlease of a moved page refused", "tag", l.Tag.String(), "err", uerr)
		}
	}
	c.Send(ms.replyTo, MoveFramesSent{Owner: ms.owner, MoveID: ms.id, Err: err})
}

// Pauses between dials of a data plane that answered busy or cut the
// connection, and how many cuts in a row a transfer takes.
const (
	dialBusyPauseMin = 5 * time.Millisecond
	dialBusyPauseMax = 500 * time.Millisecond
	dialCutsMax      = 4
)

// cutError is a dial error that says whether the receiver took the
// connection and then cut it before the hellos were done
// (dataplane.DialError).
type cutError interface{ Cut() bool }

// dialWithin dials, waiting no longer than ctx. A receiver that answers
// busy has its connection slots taken, often by connections of this very
// node that are closing (a sender closes its spare connection, and the
// receiver frees the slot only once it reads the close): it is dialed
// again until ctx ends, and the transfer fails busy only then. One that
// cuts the connection may be shedding handshakes it cannot finish in time
// (an overloaded process past its HelloTimeout): it is dialed again up to
// dialCutsMax times, and then taken for lost, since a receiver that cuts
// every connection (no data plane there, or none that speaks TLS) never
// will take one. The pause between dials doubles from dialBusyPauseMin to
// dialBusyPauseMax, with up to half of it again drawn at random so that
// the senders of a busy receiver do not come back in step.
func dialWithin(ctx context.Context, dial Dialer, addr string, inc uint64) (FrameSender, error) {
	cuts := 0
	for pause := dialBusyPauseMin; ; pause = min(2*pause, dialBusyPauseMax) {
		s, err := dialOnce(ctx, dial, addr, inc)
		var cut cutError
		switch {
		case err == nil:
			return s, nil
		case errors.As(err, &cut) && cut.Cut():
			if cuts++; cuts > dialCutsMax {
				return nil, err
			}
		case handoff.Wire(err).Code != messages.CodeBusy:
			return nil, err
		}
		t := time.NewTimer(pause + rand.N(pause/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

// dialOnce dials, waiting no longer than ctx: a dialer that does not
// return in time is left to finish, and what it returns then is closed.
func dialOnce(ctx context.Context, dial Dialer, addr string, inc uint64) (FrameSender, error) {
	type dialed struct {
		s   FrameSender
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		s, err := dial(addr, inc)
		ch <- dialed{s, err}
	}()
	select {
	case d := <-ch:
		if d.err != nil {
			return nil, d.err // whatever it returned with the error is no sender
		}
		return d.s, nil
	case <-ctx.Done():
		go func() {
			if d := <-ch; d.s != nil {
				d.s.Close()
			}
		}()
		return nil, &messages.WireError{Code: messages.CodeNodeLost, Where: "data plane",
			Message: fmt.Sprintf("actors: dial of data plane %s: %v", addr, ctx.Err())}
	}
}

// transferSent takes a sending goroutine's outcome: it keeps a connection
// it dialed for the next transfer to that peer (or closes it, when another
// transfer dialed one meanwhile), drops a connection that failed, and
// finishes the job.
func (w *workerActor) transferSent(c actor.Context, m transferSent) {
	switch {
	case m.err != nil && m.sender != nil:
		m.sender.Close() // dial afresh next time
		if w.senders[m.peer] == m.sender {
			delete(w.senders, m.peer)
		}
	case m.dialed && w.senders[m.peer] == nil:
		w.senders[m.peer] = m.sender
	case m.dialed:
		m.sender.Close()
	}
	if m.move != nil {
		w.moveSent(c, m.move, m.err)
		return
	}
	if j := w.jobs[m.job]; j != nil {
		w.run(c, w.sent(m.job, j, m.err))
	}
}

// pruneSenders forgets senders whose connection is gone (closed idle by
// the peer, or the peer died or restarted), so that the next transfer dials
// afresh instead of failing on a dead connection, and the map holds only
// live peers.
func (w *workerActor) pruneSenders() {
	for key, s := range w.senders {
		select {
		case <-s.Done():
			s.Close()
			delete(w.senders, key)
		default:
		}
	}
}

// startDecode starts a job's sequence (handoff.Begin checks its first
// token against the pages), streams the first token, and keeps the
// sequence for the steps to come, if any.
func (w *workerActor) startDecode(c actor.Context, job DecodeJob) {
	owner := job.Manifest.Owner
	s, err := handoff.Begin(w.engine, w.kv, job.StartDecode, w.stop)
	if err != nil {
		var first *FirstTokenError
		if errors.As(err, &first) {
			w.stats.firstRefused.Add(1)
		}
		c.Send(job.ReplyTo, DecodeDone{Owner: owner, Err: err})
		return
	}
	if job.Resume { // a moved job's first token streamed where it was
		c.Send(job.ReplyTo, JobResumed{Owner: owner})
	} else {
		c.Send(job.ReplyTo, TokenOut{Owner: owner, Token: job.Next})
	}
	if s.Ended() {
		c.Send(job.ReplyTo, DecodeDone{Owner: owner, Err: s.Close(w.kv)})
		return
	}
	w.seqs = append(w.seqs, &sequence{Sequence: s, replyTo: job.ReplyTo})
}

// decodeStep streams the token of s's step, whose outcome is out, and
// reports whether s is finished, and why if it failed.
func (w *workerActor) decodeStep(c actor.Context, s *sequence, out handoff.Stepped) (done bool, err error) {
	if out.Err == nil {
		c.Send(s.replyTo, TokenOut{Owner: s.Owner(), Token: out.Token})
	}
	return out.Done, out.Err
}

// finish closes sequence idx (giving back its leases) and reports it.
func (w *workerActor) finish(c actor.Context, idx int, cause error) {
	s := w.seqs[idx]
	w.seqs = append(w.seqs[:idx], w.seqs[idx+1:]...)
	c.Send(s.replyTo, DecodeDone{Owner: s.Owner(), Err: errors.Join(cause, s.Close(w.kv))})
}

// pause takes job m.Owner out of the steps and answers its request with
// its pages and tail; a job that cannot give them steps on.
func (w *workerActor) pause(c actor.Context, m PauseJob) {
	o := m.Owner
	for i, s := range w.seqs {
		if s.Owner() == o {
			p := s.Paused()
			p.MoveID = m.MoveID
			if p.Err == nil {
				w.seqs = append(w.seqs[:i], w.seqs[i+1:]...)
				w.paused[o] = s
			}
			c.Send(s.replyTo, JobPaused{Owner: o, Paused: p})
			return
		}
	}
	// No such job: it has ended, and its DecodeDone, on its way, ends the
	// request and its move.
}

func (w *workerActor) cancel(c actor.Context, o kv.Owner) {
	if s := w.paused[o]; s != nil {
		delete(w.paused, o)
		c.Send(s.replyTo, DecodeDone{Owner: o, Err: errors.Join(ErrCancelled, s.Close(w.kv))})
		return
	}
	for i, s := range w.seqs {
		if s.Owner() == o {
			w.finish(c, i, ErrCancelled)
			return
		}
	}
}
