package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
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

	// DecodeJob asks a decode worker to generate from the verified
	// Manifest: Next is the token to feed first (prefill's first token),
	// Last the prompt's last token, MaxNew the most tokens to generate
	// after Next, Spare the pages reserved for generated KV, in sequence
	// order. The worker recomputes Next from Last and the pages before it
	// streams Next as the job's first TokenOut.
	DecodeJob struct {
		Manifest *kv.Manifest
		Next     int
		Last     int
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
		job    jobKey
		peer   string
		sender FrameSender
		dialed bool
		err    error
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
// new jobs and cancellations get in between steps. A prefilled transfer to
// another node's data plane is sent from a goroutine of its own (at most
// sendsMax at once), whose outcome comes back as a message: a slow or
// silent peer holds up its own transfer, never the worker.
type workerActor struct {
	role     string
	engine   gpu.Engine
	pool     *Pool
	kv       *pageClient
	limits   kv.BatchLimits
	batchMax int
	queueMax int
	// timeout (PrefillTimeout) bounds one transfer's dial and send.
	timeout time.Duration
	// reclaimAfter is the pools' reclaim deadline, after which a source
	// page awaiting an ack that never came is gone anyway.
	reclaimAfter time.Duration
	sendsMax     int
	dial         Dialer
	policy       planPolicy
	log          *slog.Logger
	stats        *workerCounters
	// done remembers plans acknowledged or aborted here.
	done *donePlans

	queue     []*prefillJob
	sending   map[jobKey]*prefillJob // frames in flight from their goroutine
	awaiting  map[jobKey]*prefillJob // sent, waiting for decode's ack
	senders   map[string]FrameSender // data planes by peerKey
	nextLocal uint64
	seqs      []*sequence
	next      int // round-robin start among seqs
	stepping  bool
	fault     func([]kv.Frame)
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
	// While its frames are sent: the leases that keep their payloads
	// (the pages' bytes) unchanged, and the frames.
	leases []kv.Lease
	frames []kv.Frame
	marked int      // sources marked as awaiting decode's ack
	first  int      // the first generated token
	sums   []uint64 // the sources' seal checksums, in order
	// cancel ends the send in flight, if any.
	cancel  context.CancelFunc
	expires time.Time // when the sources' reclaim deadline has passed
}

func (w *workerActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		w.kv = newPageClient(w.pool, c)
		w.sending = map[jobKey]*prefillJob{}
		w.awaiting = map[jobKey]*prefillJob{}
		w.senders = map[string]FrameSender{}
	case *actor.Stopping:
		for _, j := range w.sending {
			j.cancel()
		}
		for _, s := range w.senders {
			s.Close()
		}
	case *messages.TransferPlan:
		w.plan(c, m)
	case transferSent:
		w.transferSent(c, m)
		w.kick(c)
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
	case injectFault:
		w.fault = m.frames
	case WorkerStatus:
		c.Respond(WorkerStatusReply{Role: w.role, Queued: len(w.queue), Sending: len(w.sending), Active: len(w.seqs),
			AwaitingAck: len(w.awaiting), FramesSent: w.stats.framesSent.Load(), BatchesSent: w.stats.batchesSent.Load(),
			Steps: w.stats.steps.Load(), FirstTokensRefused: w.stats.firstRefused.Load()})
	}
}

// plan queues a transfer plan, or answers at once why it cannot run.
func (w *workerActor) plan(c actor.Context, m *messages.TransferPlan) {
	key := jobKey{sender: senderKey(c), id: m.RequestID}
	if c.Sender() == nil {
		w.log.Warn("transfer plan without a sender dropped", "request", m.RequestID)
		return
	}
	err := w.policy.check(c, m)
	switch {
	case err != nil:
	case int(m.PageTokens) != w.pool.Geometry.PageTokens:
		err = &BadRequestError{Reason: fmt.Sprintf("plan pages of %d tokens, this pool's hold %d", m.PageTokens, w.pool.Geometry.PageTokens)}
	case w.holds(key) || w.done.has(key, time.Now()):
		// A duplicate of a plan in hand, or of one that ended: answering
		// it with an error would make the request abandon the transfer
		// under way, and running it again would prefill for nobody.
		w.log.Warn("duplicate transfer plan dropped", "request", m.RequestID, "from", key.sender)
		return
	case len(w.queue) >= w.queueMax:
		err = &BusyError{Where: w.role + " queue", Have: len(w.queue), Limit: w.queueMax}
	}
	if err != nil {
		if err := refusePlan(c, m, err); err != nil {
			w.log.Error("transfer done refused by its own validation", "err", err)
		}
		return
	}
	w.nextLocal++
	w.queue = append(w.queue, &prefillJob{key: key, plan: m, owner: m.Owner(),
		local: kv.Owner{Request: w.nextLocal, Tenant: m.Tenant}, replyTo: c.Sender()})
	w.kick(c)
}

// holds says whether the plan of key is queued, being sent or awaiting
// its ack.
func (w *workerActor) holds(key jobKey) bool {
	return w.sending[key] != nil || w.awaiting[key] != nil || slices.ContainsFunc(w.queue, func(j *prefillJob) bool {
		return j.key == key
	})
}

// reply answers a plan with a TransferDone: the job's outcome, with the
// first token and the sources' seal checksums when it succeeded.
func (w *workerActor) reply(c actor.Context, job *prefillJob, err error) {
	done := &messages.TransferDone{RequestID: job.owner.Request, Tenant: job.owner.Tenant}
	if err != nil {
		done.Err = wireError(err)
	} else {
		done.First, done.Frames, done.Source, done.Sums = uint32(job.first), uint32(len(job.sums)), job.local.Request, job.sums
	}
	if err := messages.Send(c, job.replyTo, done); err != nil {
		w.log.Error("transfer done refused by its own validation", "err", err)
	}
}

// kick makes sure a step message is on its way while there is work a step
// can do: a running sequence, or a queued plan that can start.
func (w *workerActor) kick(c actor.Context) {
	if !w.stepping && (len(w.seqs) > 0 || w.startable() >= 0) {
		w.stepping = true
		c.Send(c.Self(), step{})
	}
}

// startable is the index of the first queued plan that can start now, or
// -1: a plan for another node's data plane waits while sendsMax transfers
// are being sent.
func (w *workerActor) startable() int {
	return slices.IndexFunc(w.queue, func(j *prefillJob) bool {
		return j.plan.DataPlane == "" || len(w.sending) < w.sendsMax
	})
}

func (w *workerActor) runStep(c actor.Context) {
	if i := w.startable(); i >= 0 {
		job := w.queue[i]
		w.queue = slices.Delete(w.queue, i, i+1)
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

// prefill computes the job's KV into this worker's pool, reads every page
// under a lease into frames addressed to the plan's destination tags, and
// sends them: to a request actor here at once, to another node's data
// plane from a goroutine (see sendRemote). Either way sent finishes the
// job.
func (w *workerActor) prefill(c actor.Context, job *prefillJob) {
	prompt := make([]int, len(job.plan.PromptTokens))
	for i, t := range job.plan.PromptTokens {
		prompt[i] = int(t)
	}
	tags, err := w.pool.Reserve(c, job.local, 0, w.pool.Geometry.PagesFor(len(prompt)))
	if err != nil {
		w.reply(c, job, err)
		return
	}
	job.sources = tags
	pre, err := w.engine.Prefill(w.kv, job.local, tags, prompt)
	if err == nil {
		err = w.frame(c, job, pre)
	}
	switch {
	case err != nil:
		w.sent(c, job, err)
	case job.plan.DataPlane == "":
		w.sent(c, job, w.sendLocal(c, job))
	default:
		w.sendRemote(c, job)
	}
}

// frame leases every prefilled page, makes its frame (payload read through
// the lease, addressed to the plan's destination tag) and marks it as
// awaiting decode's acknowledgement. The leases are held until the frames
// are sent: the payloads are the pages' bytes.
func (w *workerActor) frame(c actor.Context, job *prefillJob, pre gpu.Prefilled) error {
	m := pre.Manifest
	if len(job.plan.DestTags) != len(m.Pages) {
		return fmt.Errorf("actors: plan has %d destination pages for %d prompt pages", len(job.plan.DestTags), len(m.Pages))
	}
	job.first = pre.First
	pos := 0
	for i, mp := range m.Pages {
		l, err := w.kv.Lease(mp.Tag, job.local)
		if err != nil {
			return err
		}
		job.leases = append(job.leases, l)
		payload, _, err := w.kv.Read(l)
		if err != nil {
			return err
		}
		job.frames = append(job.frames, kv.Frame{Owner: job.owner, Source: mp.Tag, Dest: job.plan.DestTags[i],
			FirstToken: pos, Tokens: mp.Tokens, Payload: payload})
		job.sums = append(job.sums, mp.Checksum)
		pos += mp.Tokens
		if err := w.pool.Page(c, mp.Tag, PageAwaitAck{Tag: mp.Tag, Owner: job.local}).Err; err != nil {
			return err
		}
		job.marked++
	}
	if w.fault != nil {
		w.fault(job.frames)
	}
	return nil
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
func (w *workerActor) sendLocal(c actor.Context, job *prefillJob) error {
	for _, b := range w.batches(job.frames) {
		data, err := kv.AppendBatch(nil, b, w.limits)
		if err != nil {
			return err
		}
		c.Send(job.replyTo, FrameBatch{Owner: job.owner, Data: data})
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
func (w *workerActor) sendRemote(c actor.Context, job *prefillJob) {
	if w.dial == nil {
		w.sent(c, job, fmt.Errorf("actors: plan names data plane %s and this node has none", job.plan.DataPlane))
		return
	}
	addr, inc := job.plan.DataPlane, job.plan.DestTags[0].Incarnation
	key := peerKey(addr, inc)
	w.pruneSenders()
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	job.cancel = cancel
	w.sending[job.key] = job
	out := transferSent{job: job.key, peer: key, sender: w.senders[key]}
	dial, frames, self, root := w.dial, job.frames, c.Self(), c.ActorSystem().Root
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
}

// dialWithin dials, waiting no longer than ctx: a dialer that does not
// return in time is left to finish, and what it returns then is closed.
func dialWithin(ctx context.Context, dial Dialer, addr string, inc uint64) (FrameSender, error) {
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
		return nil, fmt.Errorf("actors: dial of data plane %s: %w", addr, ctx.Err())
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
	job := w.sending[m.job]
	if job == nil {
		return
	}
	delete(w.sending, m.job)
	w.sent(c, job, m.err)
}

// sent finishes a job whose frames went (err nil) or did not: the leases
// go back, the source pages are released, and decode is told. Released
// now, a source page awaiting the ack is freed when decode acknowledges,
// or at its reclaim deadline if decode never answers (a dead decode node
// strands nothing). A failed transfer will not be acknowledged, so its
// pages are acknowledged here.
func (w *workerActor) sent(c actor.Context, job *prefillJob, err error) {
	for _, l := range job.leases {
		err = errors.Join(err, w.kv.Unlease(l))
	}
	frames := job.frames
	job.leases, job.frames, job.cancel = nil, nil, nil
	if err != nil {
		w.ack(c, job.local, job.sources[:job.marked])
	}
	w.releaseAll(job.local, job.sources)
	if err != nil {
		w.reply(c, job, err)
		return
	}
	w.stats.batchesSent.Add(uint64(len(w.batches(frames))))
	w.stats.framesSent.Add(uint64(len(frames)))
	now := time.Now()
	if w.done.has(job.key, now) {
		// Aborted while its frames were on their way: nobody will
		// acknowledge them.
		w.ack(c, job.local, job.sources)
		return
	}
	w.prune(now)
	job.expires = now.Add(w.reclaimAfter)
	w.awaiting[job.key] = job
	w.reply(c, job, nil)
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

// drop ends a plan, acknowledged or abandoned, and remembers it so that
// a duplicate is not run again: a queued plan is withdrawn, a send in
// flight is cancelled (its outcome frees the pages), and a plan awaiting
// its ack has its source pages (released already) freed.
func (w *workerActor) drop(c actor.Context, key jobKey, tenant string) {
	if i := slices.IndexFunc(w.queue, func(j *prefillJob) bool { return j.key == key }); i >= 0 {
		if w.queue[i].owner.Tenant == tenant {
			w.queue = slices.Delete(w.queue, i, i+1)
			w.done.add(key, time.Now())
		}
		return
	}
	if job := w.sending[key]; job != nil {
		if job.owner.Tenant == tenant {
			job.cancel()
			w.done.add(key, time.Now())
		}
		return
	}
	job := w.awaiting[key]
	if job == nil || job.owner.Tenant != tenant {
		return
	}
	delete(w.awaiting, key)
	w.done.add(key, time.Now())
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

// startDecode starts a job's sequence, checks its first token against the
// pages and streams it, and keeps the sequence for the steps to come, if
// any.
func (w *workerActor) startDecode(c actor.Context, job DecodeJob) {
	owner := job.Manifest.Owner
	seq, err := w.engine.Decode(w.kv, job.Manifest, job.Next)
	if err == nil {
		if err = w.confirmFirst(seq, job); err != nil {
			err = errors.Join(err, seq.Close(w.kv))
		}
	}
	if err != nil {
		c.Send(job.ReplyTo, DecodeDone{Owner: owner, Err: err})
		return
	}
	c.Send(job.ReplyTo, TokenOut{Owner: owner, Token: job.Next})
	if job.Next == gpu.EOS || job.MaxNew == 0 {
		c.Send(job.ReplyTo, DecodeDone{Owner: owner, Err: seq.Close(w.kv)})
		return
	}
	w.seqs = append(w.seqs, &sequence{job: job, seq: seq})
}

// confirmFirst recomputes the job's first token from the prompt's last
// token and the KV decode received, and refuses one prefill sent that the
// KV does not give.
func (w *workerActor) confirmFirst(seq gpu.Sequence, job DecodeJob) error {
	tok, err := seq.First(w.kv, job.Last)
	if err == nil && tok == job.Next {
		return nil
	}
	w.stats.firstRefused.Add(1)
	return &FirstTokenError{Prefill: job.Next, Decode: tok, Err: err}
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
