package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/kv"
)

// Messages between request actors and GPU-worker actors, inside a node.
type (
	// PrefillJob asks a prefill worker to compute Prompt's KV and stream it
	// as frames to Dest, the pages decode reserved, in order.
	PrefillJob struct {
		Owner   kv.Owner
		Prompt  []int
		Dest    []kv.Tag
		ReplyTo *actor.PID
	}
	// FrameBatch is one bounded batch of encoded frames (kv.AppendBatch).
	FrameBatch struct {
		Owner kv.Owner
		Data  []byte
	}
	// PrefillDone ends a prefill job: the first generated token and the
	// number of frames sent, or why it failed.
	PrefillDone struct {
		Owner  kv.Owner
		First  int
		Frames int
		Err    error
	}
	// TransferAck tells the prefill worker that decode sealed and verified
	// every page: the source pages may go. TransferAbort tells it decode
	// will not read them.
	TransferAck   struct{ Owner kv.Owner }
	TransferAbort struct{ Owner kv.Owner }

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
	// CancelJob withdraws whatever a worker does for Owner.
	CancelJob struct{ Owner kv.Owner }

	// WorkerStatus asks a worker for a WorkerStatusReply.
	WorkerStatus       struct{}
	WorkerStatusReply struct {
		Role                           string
		Queued, Active, AwaitingAck    int
		FramesSent, BatchesSent, Steps uint64
	}

	step struct{}
)

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
	log      *slog.Logger
	stats    *workerCounters

	queue    []PrefillJob
	seqs     []*sequence
	next     int                    // round-robin start among seqs
	sources  map[uint64][]kv.Tag    // prefill: pages sent, awaiting the ack
	owners   map[uint64]kv.Owner    // prefill: owner of each entry of sources
	stepping bool
}

func (w *workerActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		w.kv = newPageClient(w.pool, c)
		w.sources = map[uint64][]kv.Tag{}
		w.owners = map[uint64]kv.Owner{}
	case PrefillJob:
		if len(w.queue) >= w.queueMax {
			c.Send(m.ReplyTo, PrefillDone{Owner: m.Owner, Err: &BusyError{Where: w.role + " queue", Limit: w.queueMax}})
			return
		}
		w.queue = append(w.queue, m)
		w.kick(c)
	case DecodeJob:
		w.startDecode(c, m)
		w.kick(c)
	case step:
		w.stepping = false
		w.runStep(c)
		w.kick(c)
	case TransferAck:
		w.dropSources(m.Owner)
	case TransferAbort:
		w.dropSources(m.Owner)
	case CancelJob:
		w.cancel(c, m.Owner)
	case WorkerStatus:
		c.Respond(WorkerStatusReply{Role: w.role, Queued: len(w.queue), Active: len(w.seqs), AwaitingAck: len(w.sources),
			FramesSent: w.stats.framesSent.Load(), BatchesSent: w.stats.batchesSent.Load(), Steps: w.stats.steps.Load()})
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
func (w *workerActor) prefill(c actor.Context, job PrefillJob) {
	pages := w.pool.Geometry.PagesFor(len(job.Prompt))
	tags, err := w.pool.Reserve(c, job.Owner, 0, pages)
	if err != nil {
		c.Send(job.ReplyTo, PrefillDone{Owner: job.Owner, Err: err})
		return
	}
	pre, err := w.engine.Prefill(w.kv, job.Owner, tags, job.Prompt)
	if err == nil {
		var frames int
		frames, err = w.stream(c, job, pre.Manifest)
		if err == nil {
			w.sources[job.Owner.Request] = tags
			w.owners[job.Owner.Request] = job.Owner
			c.Send(job.ReplyTo, PrefillDone{Owner: job.Owner, First: pre.First, Frames: frames})
			return
		}
	}
	w.releaseAll(job.Owner, tags)
	c.Send(job.ReplyTo, PrefillDone{Owner: job.Owner, Err: err})
}

// stream sends the prefilled pages as frames addressed to job.Dest,
// marking each source page as awaiting decode's acknowledgement.
func (w *workerActor) stream(c actor.Context, job PrefillJob, m *kv.Manifest) (int, error) {
	if len(job.Dest) != len(m.Pages) {
		return 0, fmt.Errorf("actors: plan has %d destination pages for %d prompt pages", len(job.Dest), len(m.Pages))
	}
	var batch []kv.Frame
	var leases []kv.Lease
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		data, err := kv.AppendBatch(nil, batch, w.limits)
		for _, l := range leases {
			err = errors.Join(err, w.kv.Unlease(l))
		}
		if err != nil {
			return err
		}
		c.Send(job.ReplyTo, FrameBatch{Owner: job.Owner, Data: data})
		w.stats.batchesSent.Add(1)
		w.stats.framesSent.Add(uint64(len(batch)))
		batch, leases = batch[:0], leases[:0]
		return nil
	}
	pos, bytes := 0, 0
	for i, mp := range m.Pages {
		l, err := w.kv.Lease(mp.Tag, job.Owner)
		if err != nil {
			return 0, errors.Join(err, flush())
		}
		payload, _, _ := w.kv.Read(l)
		if len(batch) == w.limits.PagesMax || bytes+w.limits.Frame.FrameBytesMax() > w.limits.BytesMax {
			if err := flush(); err != nil {
				return 0, errors.Join(err, w.kv.Unlease(l))
			}
			bytes = 0
		}
		batch = append(batch, kv.Frame{Owner: job.Owner, Source: mp.Tag, Dest: job.Dest[i], FirstToken: pos,
			Tokens: mp.Tokens, Payload: payload})
		leases = append(leases, l)
		bytes += w.limits.Frame.FrameBytesMax()
		pos += mp.Tokens
		if err := w.pool.Page(c, mp.Tag, PageAwaitAck{Tag: mp.Tag, Owner: job.Owner}).Err; err != nil {
			return 0, errors.Join(err, flush())
		}
	}
	return len(m.Pages), flush()
}

// dropSources ends the wait for decode's acknowledgement of one request:
// acknowledged or abandoned, the source pages go.
func (w *workerActor) dropSources(o kv.Owner) {
	tags, ok := w.sources[o.Request]
	if !ok || w.owners[o.Request] != o {
		return
	}
	delete(w.sources, o.Request)
	delete(w.owners, o.Request)
	for _, t := range tags {
		if rep := w.pool.Page(w.kv.r, t, PageAck{Tag: t, Owner: o}); rep.Err != nil {
			w.log.Warn("ack of source page refused", "tag", t.String(), "err", rep.Err)
		}
	}
	w.releaseAll(o, tags)
}

func (w *workerActor) releaseAll(o kv.Owner, tags []kv.Tag) {
	for _, t := range tags {
		if err := w.kv.release(t, o); err != nil {
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
	for i, job := range w.queue {
		if job.Owner == o {
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			break
		}
	}
	for i, s := range w.seqs {
		if s.job.Manifest.Owner == o {
			w.finish(c, i, ErrCancelled)
			break
		}
	}
	w.dropSources(o)
}
