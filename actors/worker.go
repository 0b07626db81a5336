package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
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
	// FramesIn is frames the KV data plane received for a request actor;
	// answered with a FramesInReply once they are written (or refused).
	FramesIn struct{ Frames []kv.Frame }
	// FramesInReply carries the outcome of a FramesIn.
	FramesInReply struct{ Err error }

	// DecodeJob asks a decode worker to generate from the verified
	// Manifest: Next is the token to feed first, MaxNew the most tokens to
	// generate after it, Spare the pages reserved for generated KV, in
	// sequence order.
	DecodeJob struct {
		Manifest *kv.Manifest
		Next     int
		MaxNew   int
		Spare    []kv.Tag
		ReplyTo  *actor.PID
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
	// CancelJob withdraws a decode job.
	CancelJob struct{ Owner kv.Owner }

	// WorkerStatus asks a worker for a WorkerStatusReply.
	WorkerStatus      struct{}
	WorkerStatusReply struct {
		Role                           string
		Queued, Active, AwaitingAck    int
		FramesSent, BatchesSent, Steps uint64
	}

	step struct{}
)

// FrameSender sends frames to one peer's KV data plane and returns once
// the peer has accepted (or refused) them. Done is closed when its
// connection is gone for good (the peer closed it idle, or died).
type FrameSender interface {
	Send(ctx context.Context, frames []kv.Frame) error
	Done() <-chan struct{}
	Close() error
}

// Dialer opens a FrameSender to the data plane at addr of the node run
// whose incarnation is given.
type Dialer func(addr string, incarnation uint64) (FrameSender, error)

// workerCounters are read by tests and status from other goroutines.
type workerCounters struct {
	framesSent, batchesSent, steps atomic.Uint64
}

// sequence is one running decode job.
type sequence struct {
	job       DecodeJob
	seq       gpu.Sequence
	generated int
}

// workerActor is one GPU worker: the engine and the pool of one device.
// It runs prefill jobs and decode steps interleaved (continuous batching):
// each step message runs at most one queued prefill, then one decode step
// of up to BatchMax running sequences, then yields to its mailbox so that
// new jobs and cancellations get in between steps.
type workerActor struct {
	role     string
	engine   gpu.Engine
	pool     *Pool
	kv       *pageClient
	limits   kv.BatchLimits
	batchMax int
	queueMax int
	timeout  time.Duration
	// reclaimAfter is the pools' reclaim deadline, after which a source
	// page awaiting an ack that never came is gone anyway.
	reclaimAfter time.Duration
	dial         Dialer
	log          *slog.Logger
	stats        *workerCounters

	queue     []*prefillJob
	awaiting  map[jobKey]*prefillJob // sent, waiting for decode's ack
	senders   map[string]FrameSender // data planes by address
	nextLocal uint64
	seqs      []*sequence
	next      int // round-robin start among seqs
	stepping  bool
}

// jobKey names a plan as its sender does: the request actor and its
// request id. Request ids are unique only per decode node, so the pages a
// plan takes here belong to a local owner of their own.
type jobKey struct {
	sender string
	id     uint64
}

// prefillJob is one plan, from arrival until decode acknowledges it.
type prefillJob struct {
	key     jobKey
	plan    *messages.TransferPlan
	owner   kv.Owner // decode's: every frame carries it
	local   kv.Owner // this pool's owner of the source pages
	replyTo *actor.PID
	sources []kv.Tag
	marked  int       // sources marked as awaiting decode's ack
	expires time.Time // when the sources' reclaim deadline has passed
}

func (w *workerActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		w.kv = newPageClient(w.pool, c)
		w.awaiting = map[jobKey]*prefillJob{}
		w.senders = map[string]FrameSender{}
	case *actor.Stopping:
		for _, s := range w.senders {
			s.Close()
		}
	case *messages.TransferPlan:
		w.plan(c, m)
	case DecodeJob:
		w.startDecode(c, m)
		w.kick(c)
	case step:
		w.stepping = false
		w.runStep(c)
		w.kick(c)
	case *messages.TransferAck:
		w.drop(c, jobKey{sender: senderKey(c), id: m.RequestID}, m.Tenant)
	case *messages.TransferAbort:
		w.drop(c, jobKey{sender: senderKey(c), id: m.RequestID}, m.Tenant)
	case CancelJob:
		w.cancel(c, m.Owner)
	case WorkerStatus:
		c.Respond(WorkerStatusReply{Role: w.role, Queued: len(w.queue), Active: len(w.seqs), AwaitingAck: len(w.awaiting),
			FramesSent: w.stats.framesSent.Load(), BatchesSent: w.stats.batchesSent.Load(), Steps: w.stats.steps.Load()})
	}
}

// plan queues a transfer plan, or answers at once why it cannot run.
func (w *workerActor) plan(c actor.Context, m *messages.TransferPlan) {
	key := jobKey{sender: senderKey(c), id: m.RequestID}
	var err error
	switch {
	case c.Sender() == nil:
		w.log.Warn("transfer plan without a sender dropped", "request", m.RequestID)
		return
	case int(m.PageTokens) != w.pool.Geometry.PageTokens:
		err = &BadRequestError{Reason: fmt.Sprintf("plan pages of %d tokens, this pool's hold %d", m.PageTokens, w.pool.Geometry.PageTokens)}
	case len(w.queue) >= w.queueMax:
		err = &BusyError{Where: w.role + " queue", Have: len(w.queue), Limit: w.queueMax}
	case w.awaiting[key] != nil || w.queued(key):
		// A duplicate of a plan in hand: answering it with an error would
		// make the request abandon the transfer under way.
		w.log.Warn("duplicate transfer plan dropped", "request", m.RequestID, "from", key.sender)
		return
	}
	if err != nil {
		w.reply(c, c.Sender(), m.Owner(), 0, 0, err)
		return
	}
	w.nextLocal++
	w.queue = append(w.queue, &prefillJob{key: key, plan: m, owner: m.Owner(),
		local: kv.Owner{Request: w.nextLocal, Tenant: m.Tenant}, replyTo: c.Sender()})
	w.kick(c)
}

func (w *workerActor) queued(key jobKey) bool {
	for _, j := range w.queue {
		if j.key == key {
			return true
		}
	}
	return false
}

// reply answers a plan with a TransferDone.
func (w *workerActor) reply(c actor.Context, to *actor.PID, o kv.Owner, first, frames int, err error) {
	done := &messages.TransferDone{RequestID: o.Request, Tenant: o.Tenant, First: uint32(first), Frames: uint32(frames)}
	if err != nil {
		done.First, done.Frames, done.Err = 0, 0, wireError(err)
	}
	if err := messages.Send(c, to, done); err != nil {
		w.log.Error("transfer done refused by its own validation", "err", err)
	}
}

// kick makes sure a step message is on its way while there is work.
func (w *workerActor) kick(c actor.Context) {
	if !w.stepping && (len(w.queue) > 0 || len(w.seqs) > 0) {
		w.stepping = true
		c.Send(c.Self(), step{})
	}
}

func (w *workerActor) runStep(c actor.Context) {
	if len(w.queue) > 0 {
		job := w.queue[0]
		w.queue = w.queue[1:]
		w.prefill(c, job)
	}
	n := min(len(w.seqs), w.batchMax)
	for i := 0; i < n && len(w.seqs) > 0; i++ {
		idx := (w.next + i) % len(w.seqs)
		if done, err := w.decodeStep(c, w.seqs[idx]); done {
			w.finish(c, idx, err)
			i-- // the slice shrank under the loop
			n--
		}
	}
	if len(w.seqs) > 0 {
		w.next = (w.next + n) % len(w.seqs)
	}
	w.stats.steps.Add(1)
}

// prefill computes the job's KV into this worker's pool, then streams it
// to decode in bounded batches and keeps the source pages until decode
// acknowledges.
func (w *workerActor) prefill(c actor.Context, job *prefillJob) {
	prompt := make([]int, len(job.plan.PromptTokens))
	for i, t := range job.plan.PromptTokens {
		prompt[i] = int(t)
	}
	tags, err := w.pool.Reserve(c, job.local, 0, w.pool.Geometry.PagesFor(len(prompt)))
	if err != nil {
		w.reply(c, job.replyTo, job.owner, 0, 0, err)
		return
	}
	job.sources = tags
	pre, err := w.engine.Prefill(w.kv, job.local, tags, prompt)
	var frames int
	if err == nil {
		frames, err = w.stream(c, job, pre.Manifest)
	}
	// Released now, freed when decode acknowledges: a source page awaiting
	// the ack stays until then, or until its reclaim deadline if decode
	// never answers (a dead decode node strands nothing). A failed transfer
	// will not be acknowledged, so its pages are acknowledged here.
	if err != nil {
		w.ack(c, job.local, tags[:job.marked])
	}
	w.releaseAll(job.local, tags)
	if err != nil {
		w.reply(c, job.replyTo, job.owner, 0, 0, err)
		return
	}
	w.prune(time.Now())
	job.expires = time.Now().Add(w.reclaimAfter)
	w.awaiting[job.key] = job
	w.reply(c, job.replyTo, job.owner, pre.First, frames, nil)
}

// prune forgets plans whose pages have been reclaimed: their decode node
// will never answer.
func (w *workerActor) prune(now time.Time) {
	for k, j := range w.awaiting {
		if now.After(j.expires) {
			delete(w.awaiting, k)
		}
	}
}

// sink is where a job's frames go: back to the request actor as a message
// when it is in this process, else to its node's KV data plane.
func (w *workerActor) sink(c actor.Context, job *prefillJob) (func([]kv.Frame) error, error) {
	if job.plan.DataPlane == "" {
		return func(frames []kv.Frame) error {
			data, err := kv.AppendBatch(nil, frames, w.limits)
			if err == nil {
				c.Send(job.replyTo, FrameBatch{Owner: job.owner, Data: data})
			}
			return err
		}, nil
	}
	addr, inc := job.plan.DataPlane, job.plan.DestTags[0].Incarnation
	// Keyed by incarnation too: a decode node restarted at the same address
	// is another peer, and refuses a connection made for its old self.
	key := fmt.Sprintf("%s#%x", addr, inc)
	w.pruneSenders()
	s := w.senders[key]
	if s == nil {
		if w.dial == nil {
			return nil, fmt.Errorf("actors: plan names data plane %s and this node has none", addr)
		}
		var err error
		if s, err = w.dial(addr, inc); err != nil {
			return nil, err
		}
		w.senders[key] = s
	}
	return func(frames []kv.Frame) error {
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		defer cancel()
		err := s.Send(ctx, frames)
		if err != nil {
			s.Close()
			delete(w.senders, key) // dial afresh next time
		}
		return err
	}, nil
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

// stream sends the prefilled pages as frames addressed to the plan's
// destination tags, in groups of at most one batch, each page read under a
// lease held until its group is sent, and marks each source page as
// awaiting decode's acknowledgement.
func (w *workerActor) stream(c actor.Context, job *prefillJob, m *kv.Manifest) (int, error) {
	if len(job.plan.DestTags) != len(m.Pages) {
		return 0, fmt.Errorf("actors: plan has %d destination pages for %d prompt pages", len(job.plan.DestTags), len(m.Pages))
	}
	send, err := w.sink(c, job)
	if err != nil {
		return 0, err
	}
	var batch []kv.Frame
	var leases []kv.Lease
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := send(batch)
		for _, l := range leases {
			err = errors.Join(err, w.kv.Unlease(l))
		}
		if err == nil {
			w.stats.batchesSent.Add(1)
			w.stats.framesSent.Add(uint64(len(batch)))
		}
		batch, leases = batch[:0], leases[:0]
		return err
	}
	pos, bytes := 0, 0
	for i, mp := range m.Pages {
		if len(batch) == w.limits.PagesMax || bytes+w.limits.Frame.FrameBytesMax() > w.limits.BytesMax {
			if err := flush(); err != nil {
				return 0, err
			}
			bytes = 0
		}
		l, err := w.kv.Lease(mp.Tag, job.local)
		if err != nil {
			return 0, errors.Join(err, flush())
		}
		payload, _, _ := w.kv.Read(l)
		batch = append(batch, kv.Frame{Owner: job.owner, Source: mp.Tag, Dest: job.plan.DestTags[i], FirstToken: pos,
			Tokens: mp.Tokens, Payload: payload})
		leases = append(leases, l)
		bytes += w.limits.Frame.FrameBytesMax()
		pos += mp.Tokens
		if err := w.pool.Page(c, mp.Tag, PageAwaitAck{Tag: mp.Tag, Owner: job.local}).Err; err != nil {
			return 0, errors.Join(err, flush())
		}
		job.marked++
	}
	return len(m.Pages), flush()
}

// drop ends the wait for decode's acknowledgement of one plan, or
// withdraws it from the queue: acknowledged or abandoned, its source pages
// (released already) are freed.
func (w *workerActor) drop(c actor.Context, key jobKey, tenant string) {
	for i, j := range w.queue {
		if j.key == key && j.owner.Tenant == tenant {
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			return
		}
	}
	job := w.awaiting[key]
	if job == nil || job.owner.Tenant != tenant {
		return
	}
	delete(w.awaiting, key)
	w.ack(c, job.local, job.sources)
}

// ack records decode's acknowledgement of source pages, which frees them
// (they were released when sent).
func (w *workerActor) ack(c actor.Context, o kv.Owner, tags []kv.Tag) {
	for _, t := range tags {
		if rep := w.pool.Page(c, t, PageAck{Tag: t, Owner: o}); rep.Err != nil {
			ownsOrPanic(rep.Err, w.role+" worker", t, o)
			w.log.Warn("ack of source page refused", "tag", t.String(), "err", rep.Err)
		}
	}
}

func (w *workerActor) releaseAll(o kv.Owner, tags []kv.Tag) {
	for _, t := range tags {
		if err := w.kv.release(t, o); err != nil {
			ownsOrPanic(err, w.role+" worker", t, o)
			w.log.Warn("release of page refused", "tag", t.String(), "err", err)
		}
	}
}

func (w *workerActor) startDecode(c actor.Context, job DecodeJob) {
	seq, err := w.engine.Decode(w.kv, job.Manifest, job.Next)
	if err != nil {
		c.Send(job.ReplyTo, DecodeDone{Owner: job.Manifest.Owner, Err: err})
		return
	}
	w.seqs = append(w.seqs, &sequence{job: job, seq: seq})
}

// decodeStep runs one step of s and reports whether s is finished, and
// why if it failed.
func (w *workerActor) decodeStep(c actor.Context, s *sequence) (done bool, err error) {
	if s.generated >= s.job.MaxNew {
		return true, nil
	}
	if first, need := s.seq.NeedsPage(); need {
		if len(s.job.Spare) == 0 {
			return true, fmt.Errorf("actors: sequence needs a page at position %d and none is reserved", first)
		}
		if err := s.seq.GrantPage(s.job.Spare[0]); err != nil {
			return true, err
		}
		s.job.Spare = s.job.Spare[1:]
	}
	tok, err := s.seq.Step(w.kv)
	if err != nil {
		return true, err
	}
	s.generated++
	c.Send(s.job.ReplyTo, TokenOut{Owner: s.job.Manifest.Owner, Token: tok})
	return tok == gpu.EOS || s.generated >= s.job.MaxNew, nil
}

// finish closes sequence idx (giving back its leases) and reports it.
func (w *workerActor) finish(c actor.Context, idx int, cause error) {
	s := w.seqs[idx]
	w.seqs = append(w.seqs[:idx], w.seqs[idx+1:]...)
	err := errors.Join(cause, s.seq.Close(w.kv))
	c.Send(s.job.ReplyTo, DecodeDone{Owner: s.job.Manifest.Owner, Err: err})
}

func (w *workerActor) cancel(c actor.Context, o kv.Owner) {
	for i, s := range w.seqs {
		if s.job.Manifest.Owner == o {
			w.finish(c, i, ErrCancelled)
			return
		}
	}
}
