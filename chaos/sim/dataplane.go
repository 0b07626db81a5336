package sim

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// The data plane, as package cluster runs it: one connection per send, to
// the run of the decode node the plan names (the hello expects its
// incarnation). Batches go in order, BatchPagesMax frames each; the
// receiver decodes each with kv.DecodeBatch, refuses one with bad bytes or
// a frame addressed to another incarnation (which closes the connection
// and fails the send), and hands the frames to their requests before it
// acknowledges. The send ends when every batch is acknowledged, so that
// prefill's TransferDone, sent after it, never overtakes the frames.
// Faults are the sender's, as a chaos build's injector draws them: a batch
// not sent, sent twice, swapped with the next, its bits flipped after its
// checksums, delayed, or frames readdressed to another request's page or
// owner (with valid checksums: a sender's mistake).

// send is one plan's frames on their way: a prefill's, or a running
// request's that moves to another decode node. label is the oracle's
// label of a frame's rows, and end what the sender does, once, when the
// send ended.
type send struct {
	frames    []kv.Frame
	label     func(kv.Frame) label
	end       func(error)
	to        *node
	toInc     uint64
	next      int    // frames put in batches so far
	held      *batch // a batch held back to swap with the next
	inflight  int    // batches on the wire, not yet acknowledged
	last      time.Time
	departed  bool // every batch left
	cancelled bool // by the source: nothing more leaves
	ended     bool
}

// batch is one encoded batch, as sent (for the oracle) and on the wire,
// with the labels of its frames' rows.
type batch struct {
	body, sent []byte
	shadow     []label
}

var (
	errReset     = errors.New("sim: data plane connection reset by a partition")
	errCancelled = errors.New("sim: send cancelled")
)

// refusedError is the receiver's refusal of a batch, as the sender hears
// it: like package cluster's, it matches kv.ErrRefused.
type refusedError struct {
	addr string
	err  error
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("sim: data plane at %s refused a batch: %v", e.addr, e.err)
}

func (e *refusedError) Is(target error) bool { return target == kv.ErrRefused }

func (e *refusedError) Unwrap() error { return e.err }

// recentMax is how many frames a sending run remembers to misdirect
// others to.
const recentMax = 16

func (n *node) startSend(e handoff.SendFrames) {
	p := n.ready[e.Key]
	delete(n.ready, e.Key)
	to, err := n.w.node(e.Plan.DataPlane)
	if p == nil || err != nil || len(e.Plan.DestTags) == 0 {
		n.w.fail("effects", "%s sends frames of %s/%d: prefilled %t, data plane %q: %v", n.addr, e.Key.Sender, e.Key.ID, p != nil, e.Plan.DataPlane, err)
		return
	}
	j := n.byKey[e.Key]
	s := &send{frames: p.frames.Frames, label: func(f kv.Frame) label { return n.sourceLabel(j, f) },
		to: to, toInc: e.Plan.DestTags[0].Incarnation}
	s.end = func(err error) {
		delete(n.sends, e.Key)
		err = errors.Join(err, p.frames.Unlease(n.pages))
		if err != nil {
			j.failed = true
		}
		n.runSource(handoff.Sent{Key: e.Key, Err: err}, nil, 0)
	}
	n.sends[e.Key] = s
	n.startBatches(s)
}

// startBatches puts s's first batch on its way.
func (n *node) startBatches(s *send) {
	n.at(n.w.opt.Timing.BatchGap, "send a batch", func() { n.sendBatch(s) })
}

// sendBatch encodes the next batch from the source pages' bytes, where
// they lie, and puts it on the connection.
func (n *node) sendBatch(s *send) {
	w := n.w
	if s.ended || s.cancelled {
		return
	}
	if w.partitioned(n, s.to) {
		w.count[PartitionCut]++
		n.endSend(s, errReset)
		return
	}
	fs := s.frames
	frames := append([]kv.Frame(nil), fs[s.next:min(s.next+w.opt.BatchPagesMax, len(fs))]...)
	s.next += len(frames)
	b := &batch{shadow: make([]label, len(frames))}
	for i := range frames {
		b.shadow[i] = s.label(frames[i])
		n.readdress(&frames[i])
	}
	body, err := kv.AppendBatch(nil, frames, w.batch)
	if err != nil {
		n.endSend(s, err)
		return
	}
	b.body, b.sent = body, body
	n.transmitFaulty(s, b)
	if s.next < len(fs) {
		n.at(w.opt.Timing.BatchGap, "send a batch", func() { n.sendBatch(s) })
		return
	}
	if s.held != nil {
		n.transmit(s, s.held)
		s.held = nil
	}
	s.departed = true
	if s.inflight == 0 {
		n.endSend(s, nil)
	}
}

// readdress is the misdirect fault on a frame: the destination page, the
// owner or both of a frame of another request sent lately.
func (n *node) readdress(f *kv.Frame) {
	w := n.w
	defer func() {
		n.recent = append(n.recent, *f)
		if len(n.recent) > recentMax {
			n.recent = n.recent[1:]
		}
	}()
	if !w.chance(Misdirect) {
		return
	}
	for _, r := range n.recent {
		if r.Owner.Request == f.Owner.Request && r.Dest.Incarnation == f.Dest.Incarnation {
			continue
		}
		which := w.rng.IntN(3) // the page, the owner, or both
		if which != 1 {
			f.Dest = r.Dest
		}
		if which != 0 {
			f.Owner = r.Owner
		}
		w.count[Misdirected]++
		w.trace.line(fmt.Sprintf("  data plane: frame readdressed to %d/%s %s", f.Owner.Request, f.Owner.Tenant, f.Dest))
		return
	}
}

// transmitFaulty draws the sender's faults on one batch.
func (n *node) transmitFaulty(s *send, b *batch) {
	w := n.w
	if w.chance(Drop) {
		w.count[FramesDropped]++
		w.trace.line("  data plane: batch not sent")
		return
	}
	if w.chance(Corrupt) {
		b.body = bytes.Clone(b.body)
		for range 1 + w.rng.IntN(3) {
			b.body[w.rng.IntN(len(b.body))] ^= 1 << w.rng.IntN(8)
		}
		w.count[BatchCorrupted]++
		w.trace.line("  data plane: batch corrupted")
	}
	if s.held == nil && s.next < len(s.frames) && w.chance(Reorder) {
		w.count[Reordered]++
		w.trace.line("  data plane: batch held back behind the next")
		s.held = b
		return
	}
	n.transmit(s, b)
	if w.chance(Duplicate) {
		w.count[Duplicated]++
		w.trace.line("  data plane: batch sent twice")
		n.transmit(s, b)
	}
	if s.held != nil {
		n.transmit(s, s.held)
		s.held = nil
	}
}

// transmit puts b on the connection: it arrives after the one before it.
func (n *node) transmit(s *send, b *batch) {
	w := n.w
	t := w.opt.Timing
	lat := w.between(t.Latency, t.Latency+t.Jitter)
	if d, delayed := w.delay("data plane: batch"); delayed {
		lat += d
	}
	at := w.now.Add(lat)
	if at.Before(s.last) {
		at = s.last
	}
	s.last = at
	s.inflight++
	w.after(at.Sub(w.now), fmt.Sprintf("deliver frames %s/%x -> %s", n.addr, n.inc, s.to.addr), func() {
		err := s.to.dataIn(s, b, handoff.Peer{Address: n.addr, Incarnation: n.inc})
		n.at(w.between(t.Latency, t.Latency+t.Jitter), "batch acknowledged", func() { n.acked(s, err) })
	})
}

// acked is the receiver's acknowledgement of one batch: a refusal fails
// the send, the last one ends it.
func (n *node) acked(s *send, err error) {
	s.inflight--
	switch {
	case err != nil:
		n.endSend(s, err)
	case s.departed && s.inflight == 0:
		n.endSend(s, nil)
	}
}

// endSend ends the send, once.
func (n *node) endSend(s *send, err error) {
	if s.ended {
		return
	}
	s.ended = true
	s.end(err)
}

// dataIn is the receiving data plane: the connection's run, the batch's
// bytes and the frames' incarnation are checked before the frames reach
// their requests.
func (n *node) dataIn(s *send, b *batch, from handoff.Peer) error {
	if s.ended {
		return nil // the connection is closed: nothing more is read
	}
	if n.inc == 0 || n.inc != s.toInc {
		n.w.count[DeadRunDropped]++
		return &messages.WireError{Code: messages.CodeNodeLost, Message: "data plane refused the connection: the run it expects is gone",
			Where: n.addr, Have: n.inc, Limit: s.toInc}
	}
	frames, err := n.w.decodeBatch(b)
	if err != nil {
		return &refusedError{addr: n.addr, err: err}
	}
	for _, f := range frames {
		if f.Dest.Incarnation != n.inc {
			return &refusedError{addr: n.addr, err: &kv.StaleTagError{Page: f.Dest.Index, Have: f.Dest}}
		}
	}
	n.framesIn(frames, b.shadow, from)
	return nil
}

// decodeBatch is the data plane's decoder with the oracle's check around
// it: a batch is refused exactly when its bytes are not those sent.
func (w *world) decodeBatch(b *batch) ([]kv.Frame, error) {
	frames, _, err := kv.DecodeBatch(b.body, w.batch)
	intact := bytes.Equal(b.body, b.sent)
	var sum *kv.ChecksumMismatchError
	switch {
	case err == nil && !intact:
		w.fail("corruption refused", "a batch whose bytes were changed on the way passed the decoder with %d frames", len(frames))
	case err != nil && intact:
		w.fail("corruption refused", "an intact batch was refused: %v", err)
	case errors.As(err, &sum):
		w.count[BatchRefusedChecksum]++
	case err != nil:
		w.count[BatchRefusedMalformed]++
	}
	if err != nil {
		w.trace.line("  data plane: batch refused: " + err.Error())
	}
	return frames, err
}
