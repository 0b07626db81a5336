package dataplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/trust"
)

// SenderStats are a sender's counters since it dialed.
type SenderStats struct {
	// Batches, frames and bytes (batch headers included) handed to the
	// connection: written, or being written.
	BatchesSent, FramesSent, BytesSent uint64
	// Batches acknowledged, and of them refused (any status but OK).
	BatchesAcked, BatchesRefused uint64
	// InFlight is the batches encoded for the connection (written, or
	// queued to be) and not yet acknowledged: at most InFlightMax.
	InFlight uint64
	// WindowWaits counts the times a Send found InFlightMax batches
	// unacknowledged and waited.
	WindowWaits uint64
}

type dpSenderCounters struct {
	batches, frames, bytes atomic.Uint64
	acked, refused         atomic.Uint64
	windowWaits            atomic.Uint64
}

// dpPending is one batch written and not yet acknowledged.
type dpPending struct {
	seq          uint64
	call         *dpCall
	first, count int
}

// dpCall is one Send: its acknowledgements arrive on acks, and a token on
// wrote each time the writer is done with one of its batches (written, or
// its write failed). Each holds one slot per batch of the call so that
// neither the reader nor the writer ever waits on it.
type dpCall struct {
	acks  chan dpResult
	wrote chan struct{}
}

type dpResult struct {
	p   dpPending
	ack dpAck
}

// Sender writes batches to one receiver over one connection. Send
// is safe for concurrent use: batches from concurrent calls interleave on
// the connection, each batch written whole, and share one window of
// InFlightMax unacknowledged batches. A lost connection is final: Done is
// closed, every Send fails with a *LostError, and the owner dials
// again (after learning the peer's current incarnation). A refused batch
// loses the connection too, since the receiver closes it.
type Sender struct {
	cfg  Config
	addr string
	peer uint64
	lim  kv.BatchLimits // the smaller of both sides' batch bounds
	// conn carries the batches: raw, or TLS over it (and over coalesce).
	// fail closes raw, so that closing never waits to write a TLS alert
	// to a peer that does not read.
	conn, raw net.Conn
	coalesce  *dpCoalescer // nil when insecure
	c         dpSenderCounters

	// window holds one token per batch in flight; a Send puts one in before
	// it writes and the acknowledgement reader takes one out.
	window chan struct{}

	// Encode buffers hold a batch's headers (payloads are written from
	// where the caller has them), so that a Send encodes its next batch,
	// checksums included, while the writer goroutine writes and before its
	// place in the window is free. bufs keeps free ones for reuse; queue
	// holds the encoded batches that have their place in the window, in
	// order, so it never fills.
	bufs  chan *dpEncoded
	queue chan *dpEncoded
	// wdone is closed when the writer goroutine has returned: it touches
	// no payload after that.
	wdone chan struct{}

	// mu guards next, ring and err, and orders the writer's queue as the
	// ring; dead is closed when err is set.
	mu   sync.Mutex
	next uint64
	ring []dpPending // FIFO of size batches from head, capacity InFlightMax
	head int
	size int
	err  *LostError
	dead chan struct{}

	loops sync.WaitGroup // the acknowledgement reader and the writer

	// testWindowFull, when set, is called each time a Send finds the window
	// full, before it waits.
	testWindowFull func()
}

// Dial validates cfg, connects to the receiver at addr, checks
// in the TLS handshake that it is want (the node that planned the
// transfer; *PeerError otherwise, before a byte of the hello is
// written), and exchanges hellos: the receiver refuses
// (*HelloError) when it is not incarnation peer, when its frame
// limits differ from cfg's, when it is busy, or when this node's role does
// not prefill. DialTimeout bounds the whole of it. An insecure cfg.Auth
// dials plain TCP and checks no identity: want must then be zero, since
// nothing could prove it.
func Dial(cfg Config, addr string, peer uint64, want trust.Identity) (*Sender, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if peer == 0 {
		return nil, errors.New("dataplane: data plane peer incarnation must be non-zero")
	}
	if cfg.Auth.Insecure() != want.IsZero() {
		return nil, fmt.Errorf("dataplane: data plane dial %s: expected identity %q with an authority that is insecure=%t: want one exactly when secure",
			addr, want.String(), cfg.Auth.Insecure())
	}
	deadline := time.Now().Add(cfg.DialTimeout)
	raw, err := (&net.Dialer{Deadline: deadline}).Dial("tcp", addr)
	if err != nil {
		return nil, &DialError{Addr: addr, Stage: "dial", Err: err}
	}
	cfg.tuneSocket(raw)
	raw.SetDeadline(deadline)
	conn, coalesce, err := dpClientTLS(raw, cfg, addr, want)
	var lim kv.BatchLimits
	if err == nil {
		lim, err = dpHandshake(conn, cfg, addr, peer)
	}
	if err != nil {
		raw.Close()
		return nil, err
	}
	raw.SetDeadline(time.Time{})
	s := &Sender{
		cfg: cfg, addr: addr, peer: peer, lim: lim, conn: conn, raw: raw, coalesce: coalesce,
		window: make(chan struct{}, cfg.InFlightMax),
		bufs:   make(chan *dpEncoded, cfg.InFlightMax+dpSendBuffers),
		queue:  make(chan *dpEncoded, cfg.InFlightMax),
		wdone:  make(chan struct{}),
		ring:   make([]dpPending, cfg.InFlightMax),
		dead:   make(chan struct{}),
	}
	for range dpSendBuffers {
		s.bufs <- s.newEncoded()
	}
	s.loops.Go(s.readAcks)
	s.loops.Go(s.writeLoop)
	return s, nil
}

// dpClientTLS runs the client side of TLS over raw, unless insecure, and
// checks that the receiver is want. It returns the connection to carry
// batches and, when secure, the coalescer under its TLS.
func dpClientTLS(raw net.Conn, cfg Config, addr string, want trust.Identity) (net.Conn, *dpCoalescer, error) {
	if cfg.Auth.Insecure() {
		return raw, nil, nil
	}
	b := cfg.Auth.Bundle()
	tcfg := b.ClientTLS()
	// Bulk bytes: full-size records from the first one, rather than small
	// ones for the first 128 KiB as for a web page.
	tcfg.DynamicRecordSizingDisabled = true
	coalesce := newDPCoalescer(raw)
	tc := tls.Client(coalesce, tcfg)
	if err := tc.Handshake(); err != nil {
		return nil, nil, &DialError{Addr: addr, Stage: "TLS handshake", Err: err}
	}
	// ClientTLS's VerifyConnection has checked this already; this reads
	// the result.
	have, _, err := b.PeerIdentity(tc.ConnectionState(), x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, nil, fmt.Errorf("dataplane: data plane TLS handshake with %s: %w", addr, err)
	}
	if have != want {
		cfg.Auth.Refuse(trust.RefusedDataPlane, "data plane receiver is not the node expected", "addr", addr,
			"want", want.String(), "have", have.String())
		return nil, nil, &PeerError{Addr: addr, Want: want, Have: have}
	}
	return tc, coalesce, nil
}

// dpHandshake writes the hello, reads the reply and returns the batch
// bounds both sides accept. The caller bounds it with a deadline.
func dpHandshake(conn net.Conn, cfg Config, addr string, peer uint64) (kv.BatchLimits, error) {
	h := dpHello{version: dpVersion, incarnation: cfg.Incarnation, expect: peer, limits: cfg.Batch, model: cfg.Model}
	b := h.encode()
	if _, err := conn.Write(b[:]); err != nil {
		return kv.BatchLimits{}, &DialError{Addr: addr, Stage: "hello", Err: err}
	}
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return kv.BatchLimits{}, &DialError{Addr: addr, Stage: "hello reply", Err: err}
	}
	r, err := decodeDPHello(b[:], true)
	if err != nil {
		return kv.BatchLimits{}, err
	}
	herr := &HelloError{Addr: addr, Status: r.status, Want: peer, Have: r.incarnation, Local: cfg.Batch, Remote: r.limits,
		Self: cfg.Auth.Self(), Ours: cfg.Model, Theirs: r.model}
	switch {
	case r.status != StatusOK:
		return kv.BatchLimits{}, herr
	case r.version != dpVersion || r.reserved || r.limits.Validate() != nil || r.model.IsZero():
		herr.Status = StatusHelloMalformed
		return kv.BatchLimits{}, herr
	case r.incarnation != peer:
		herr.Status = StatusHelloIncarnation
		return kv.BatchLimits{}, herr
	case r.model != cfg.Model:
		herr.Status = StatusHelloModel
		return kv.BatchLimits{}, herr
	case r.limits.Frame != cfg.Batch.Frame:
		herr.Status = StatusHelloLimits
		return kv.BatchLimits{}, herr
	}
	// Both sides' bounds hold a full-page frame of the same geometry, so
	// their minimum does too.
	return kv.BatchLimits{
		PagesMax: min(cfg.Batch.PagesMax, r.limits.PagesMax),
		BytesMax: min(cfg.Batch.BytesMax, r.limits.BytesMax),
		Frame:    cfg.Batch.Frame,
	}, nil
}

// Peer is the receiver's incarnation, as the hello confirmed it.
func (s *Sender) Peer() uint64 { return s.peer }

// Limits are the batch bounds Send packs within: the smaller of both
// sides'.
func (s *Sender) Limits() kv.BatchLimits { return s.lim }

// Done is closed when the connection is lost or the sender closed.
func (s *Sender) Done() <-chan struct{} { return s.dead }

// Err is the *LostError once Done is closed, else nil.
func (s *Sender) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		return nil
	}
	return s.err
}

// Close closes the connection; Sends in progress fail with a
// *LostError whose cause is ErrClosed.
func (s *Sender) Close() error {
	s.fail(ErrClosed)
	s.loops.Wait()
	return nil
}

// Stats reads the counters; each is read atomically, the set is not.
func (s *Sender) Stats() SenderStats {
	s.mu.Lock()
	inFlight := s.size
	s.mu.Unlock()
	return SenderStats{
		BatchesSent: s.c.batches.Load(), FramesSent: s.c.frames.Load(), BytesSent: s.c.bytes.Load(),
		BatchesAcked: s.c.acked.Load(), BatchesRefused: s.c.refused.Load(),
		InFlight: uint64(inFlight), WindowWaits: s.c.windowWaits.Load(),
	}
}

// Send packs frames, in order, into batches within Limits, writes them and
// waits for every batch's acknowledgement. It blocks while InFlightMax
// batches are unacknowledged. It returns nil only when the receiver's
// handler accepted every frame. Otherwise:
//   - a frame that cannot be encoded (owner, token range, payload length)
//     fails with kv's *kv.FrameError before anything is written;
//   - a refused batch yields a *RefusedError naming the frames it
//     held, and ends the connection: batches written after it are lost
//     (joined as a *LostError), the ones before it were
//     acknowledged and may have been accepted;
//   - a lost connection yields a *LostError;
//   - ctx ending yields its error, wrapped: batches already written stay
//     written and their outcome is unknown to the caller.
//
// Payloads are written from where they lie, not copied: they must not
// change until Send returns. Send sets each frame's Checksum; the caller may
// reuse the frames and their payloads as soon as Send returns, which it
// does only once the connection is done with every batch of the call it
// wrote. So when ctx ends, Send still waits for the batches it has queued
// to be written (each within WriteTimeout, or the connection is lost).
func (s *Sender) Send(ctx context.Context, frames []kv.Frame) error {
	// A chaos build's fault points: the frames as its injector lets them
	// go, dropped, duplicated, reordered or misdirected (in a copy, whose
	// Checksums are then the ones set), and each payload, below, with a bit
	// flipped after its checksum. A production build has none: Current is
	// nil there, and both calls return what they are given.
	frames = faults.Current().Frames(frames)
	cuts, err := s.pack(frames)
	if err != nil || len(cuts) == 0 {
		return err
	}
	call := &dpCall{acks: make(chan dpResult, len(cuts)), wrote: make(chan struct{}, len(cuts))}
	written := 0
	defer func() { s.released(call, written) }()
	var refused error
	take := func(r dpResult) {
		if r.ack.status != StatusOK && refused == nil {
			refused = s.refusal(r)
		}
	}
	got, lo := 0, 0
	var stop error
	drain := func() {
		for {
			select {
			case r := <-call.acks:
				got++
				take(r)
			default:
				return
			}
		}
	}
	for _, hi := range cuts {
		// Encoded first, so that the checksums of the next batch are
		// computed while the window is full.
		var e *dpEncoded
		if e, stop = s.encode(ctx, frames[lo:hi], lo); stop != nil {
			break
		}
		if stop = s.acquire(ctx); stop != nil {
			s.free(e)
			break
		}
		// The acknowledgement that opened the window may be a refusal of
		// this call's: it is delivered before its place is given back.
		if drain(); refused != nil {
			s.free(e)
			<-s.window
			break
		}
		if stop = s.enqueue(call, e, lo); stop != nil {
			break
		}
		written++
		lo = hi
	}
	for got < written {
		select {
		case r := <-call.acks:
			got++
			take(r)
		case <-s.dead:
			// Acknowledgements that arrived before the loss still count.
			if drain(); got < written {
				return dpJoin(refused, s.Err())
			}
		case <-ctx.Done():
			return dpJoin(refused, fmt.Errorf("dataplane: data plane send to %s: %d of %d batches written, %d acknowledged: %w",
				s.addr, written, len(cuts), got, ctx.Err()))
		}
	}
	if stop != nil && !errors.Is(stop, ErrLost) {
		stop = fmt.Errorf("dataplane: data plane send to %s: %d of %d batches written and acknowledged: %w",
			s.addr, written, len(cuts), stop)
	}
	return dpJoin(refused, stop)
}

// dpJoin is errors.Join that returns a lone error as itself, so that the
// common case keeps its type.
func dpJoin(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return errors.Join(a, b)
}

// released waits until the writer is done with the first n batches of
// call: each written (or its write failed), or the writer gone, so that
// nothing reads the call's payloads any more.
func (s *Sender) released(call *dpCall, n int) {
	for range n {
		select {
		case <-call.wrote:
		case <-s.wdone:
			return
		}
	}
}

// pack checks every frame as kv.AppendFrameHeader will, and cuts frames into
// batches greedily; cuts[i] is the end of batch i. A frame's size is
// bounded by its payload plus the largest header, so a batch never exceeds
// the bytes bound and a full-page frame always fits alone.
func (s *Sender) pack(frames []kv.Frame) ([]int, error) {
	fl := s.lim.Frame
	over := dpFrameOverhead(fl)
	var cuts []int
	n, bytes := 0, 0
	for i := range frames {
		f := &frames[i]
		if err := f.Owner.Validate(); err != nil {
			return nil, fmt.Errorf("dataplane: data plane frame %d: %w", i, err)
		}
		switch {
		case f.Tokens < 1 || f.Tokens > fl.PageTokens:
			return nil, fmt.Errorf("dataplane: data plane frame %d: %w", i,
				&kv.FrameError{Field: "token count", Value: uint64(max(f.Tokens, 0)), Limit: uint64(fl.PageTokens)})
		case f.FirstToken < 0 || f.FirstToken > kv.SequenceTokensMax:
			return nil, fmt.Errorf("dataplane: data plane frame %d: %w", i,
				&kv.FrameError{Field: "first token", Value: uint64(max(f.FirstToken, 0)), Limit: kv.SequenceTokensMax})
		case len(f.Payload) != f.Tokens*fl.BytesPerToken:
			return nil, fmt.Errorf("dataplane: data plane frame %d: %w", i,
				&kv.FrameError{Field: "payload length", Value: uint64(len(f.Payload)), Limit: uint64(f.Tokens * fl.BytesPerToken)})
		}
		size := over + len(f.Payload)
		if n == s.lim.PagesMax || bytes+size > s.lim.BytesMax {
			cuts = append(cuts, i)
			n, bytes = 0, 0
		}
		n++
		bytes += size
	}
	if n > 0 {
		cuts = append(cuts, len(frames))
	}
	return cuts, nil
}

// acquire takes a place in the window, waiting while it is full.
func (s *Sender) acquire(ctx context.Context) error {
	select {
	case s.window <- struct{}{}:
		return nil
	default:
	}
	s.c.windowWaits.Add(1)
	if s.testWindowFull != nil {
		s.testWindowFull()
	}
	select {
	case s.window <- struct{}{}:
		return nil
	case <-s.dead:
		return s.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dpSendBuffers is the number of encode buffers a sender allocates ahead;
// it allocates more while more batches are encoded at once.
const dpSendBuffers = 2

// dpHeaderBufferBytes caps what a sender allocates ahead for the headers
// of one batch.
const dpHeaderBufferBytes = 64 << 10

// dpEncoded is one batch encoded and queued for the writer: hdr holds the
// batch header and every frame header back to back, and vec the pieces
// to write in order (the header bytes before each payload, then the
// payload itself). vec aliases hdr and the caller's payloads.
type dpEncoded struct {
	hdr    []byte
	vec    [][]byte
	bytes  int
	frames int
	call   *dpCall
}

// encode fills e with frames as one batch: kv.AppendBatchHeader, then
// kv.AppendFrameHeader for each frame (which sets its Checksum), with the
// payloads left where they are. The bytes are those kv.AppendBatch writes.
func (e *dpEncoded) encode(frames []kv.Frame, lim kv.BatchLimits) error {
	body := 0
	for i := range frames {
		body += kv.FrameBytes(&frames[i])
	}
	hdr, err := kv.AppendBatchHeader(e.hdr[:0], len(frames), body, lim)
	if err != nil {
		return err
	}
	for i := range frames {
		if hdr, frames[i].Checksum, err = kv.AppendFrameHeader(hdr, &frames[i], lim.Frame); err != nil {
			return err
		}
	}
	e.hdr = hdr
	vec, at := e.vec[:0], 0
	for i := range frames {
		f := &frames[i]
		end := at + kv.FrameBytes(f) - len(f.Payload)
		if i == 0 {
			end += dpBatchHeaderBytes
		}
		vec = append(vec, hdr[at:end:end], faults.Current().Corrupt(f.Payload))
		at = end
	}
	if at != len(hdr) {
		return fmt.Errorf("dataplane: data plane batch headers take %d bytes, frame lengths say %d", len(hdr), at)
	}
	e.vec, e.bytes, e.frames = vec, dpBatchHeaderBytes+body, len(frames)
	return nil
}

// encode takes a free buffer and encodes frames (frames [first, …) of the
// call) into it as one batch.
func (s *Sender) encode(ctx context.Context, frames []kv.Frame, first int) (*dpEncoded, error) {
	select {
	case <-s.dead:
		return nil, s.Err()
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var e *dpEncoded
	select {
	case e = <-s.bufs:
	default:
		e = s.newEncoded()
	}
	if err := e.encode(frames, s.lim); err != nil {
		// pack checked what kv checks; should it ever differ, the fault is
		// in these frames, not in the connection.
		s.free(e)
		return nil, fmt.Errorf("dataplane: data plane encoding frames [%d, %d): %w", first, first+len(frames), err)
	}
	return e, nil
}

// newEncoded allocates an encode buffer for the headers of a batch of
// PagesMax frames with the longest tenants, up to dpHeaderBufferBytes; one
// that needs more grows once and keeps it.
func (s *Sender) newEncoded() *dpEncoded {
	hdr := min(dpBatchHeaderBytes+s.lim.PagesMax*dpFrameOverhead(s.lim.Frame), dpHeaderBufferBytes)
	return &dpEncoded{hdr: make([]byte, 0, hdr), vec: make([][]byte, 0, 2*min(s.lim.PagesMax, 64))}
}

// free gives an encode buffer back for reuse, or drops it when enough are
// kept.
func (s *Sender) free(e *dpEncoded) {
	e.reset()
	select {
	case s.bufs <- e:
	default:
	}
}

// enqueue queues an encoded batch for the writer, once it has its place
// in the window. The batch joins the ring of unacknowledged batches before
// it is written, since its acknowledgement may come back before the write
// returns; ring and queue are kept in one order under mu.
func (s *Sender) enqueue(call *dpCall, e *dpEncoded, first int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		s.free(e)
		return s.err
	}
	if s.size == 0 {
		s.conn.SetReadDeadline(time.Now().Add(s.cfg.AckTimeout))
	}
	s.ring[(s.head+s.size)%len(s.ring)] = dpPending{seq: s.next, call: call, first: first, count: e.frames}
	s.size++
	s.next++
	e.call = call
	// Never waits: the queue holds InFlightMax batches, and e has its
	// place in the window.
	s.queue <- e
	return nil
}

// reset drops e's references to a call and its payloads, so that a free
// buffer pins no caller memory.
func (e *dpEncoded) reset() {
	clear(e.vec)
	e.vec, e.call = e.vec[:0], nil
}

// writeLoop writes queued batches, each whole, in order: with one writev
// of headers and payloads over plain TCP; over TLS, which writes each piece
// as its own records, through the coalescer.
func (s *Sender) writeLoop() {
	defer close(s.wdone)
	for {
		select {
		case e := <-s.queue:
			// Counted before the write, which the acknowledgement may beat.
			s.c.batches.Add(1)
			s.c.frames.Add(uint64(e.frames))
			s.c.bytes.Add(uint64(e.bytes))
			s.conn.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			if dpRaceEnabled {
				// The race detector orders what a goroutine did before a
				// socket write before what a reader of that socket does
				// after its read, but sees this only in syscall.Write, not
				// in the writev below. An empty Write restores it, so that
				// a handler still sees what preceded its Send.
				s.raw.Write(nil)
			}
			err := s.write(e)
			e.call.wrote <- struct{}{}
			s.free(e)
			if err != nil {
				s.fail(err)
				return
			}
		case <-s.dead:
			return
		}
	}
}

// write writes one batch's pieces.
func (s *Sender) write(e *dpEncoded) error {
	v := net.Buffers(e.vec)
	if s.coalesce == nil {
		_, err := v.WriteTo(s.conn)
		return err
	}
	s.coalesce.hold()
	_, err := v.WriteTo(s.conn)
	return errors.Join(err, s.coalesce.flush())
}

// readAcks matches acknowledgements to batches in order until the
// connection ends. The read deadline is AckTimeout from the oldest
// unacknowledged batch's write or the previous acknowledgement, and none
// while nothing is in flight.
func (s *Sender) readAcks() {
	var b [dpAckBytes]byte
	for {
		if _, err := io.ReadFull(s.conn, b[:]); err != nil {
			s.fail(err)
			return
		}
		a, err := decodeDPAck(b[:])
		if err != nil {
			s.fail(err)
			return
		}
		s.mu.Lock()
		if s.size == 0 || s.ring[s.head].seq != a.seq {
			want := "none"
			if s.size > 0 {
				want = fmt.Sprint(s.ring[s.head].seq)
			}
			s.mu.Unlock()
			s.fail(fmt.Errorf("dataplane: data plane acknowledgement for batch %d, expected %s", a.seq, want))
			return
		}
		p := s.ring[s.head]
		s.ring[s.head] = dpPending{}
		s.head = (s.head + 1) % len(s.ring)
		s.size--
		if s.size == 0 {
			s.conn.SetReadDeadline(time.Time{})
		} else {
			s.conn.SetReadDeadline(time.Now().Add(s.cfg.AckTimeout))
		}
		s.mu.Unlock()
		s.c.acked.Add(1)
		if a.status != StatusOK {
			s.c.refused.Add(1)
		}
		p.call.acks <- dpResult{p: p, ack: a}
		<-s.window
		if a.status != StatusOK {
			// The receiver closes the connection after a refusal and reads
			// nothing more on it: the batches behind this one are lost.
			s.fail(fmt.Errorf("dataplane: data plane receiver refused batch %d (%s) and closes the connection", a.seq, a.status))
			return
		}
	}
}

func (s *Sender) refusal(r dpResult) error {
	e := &RefusedError{Addr: s.addr, Seq: r.ack.seq, Status: r.ack.status,
		First: r.p.first, Count: r.p.count, Frame: -1, Detail: r.ack.detail}
	if r.ack.frame != dpNoFrame && int(r.ack.frame) < r.p.count {
		e.Frame = r.p.first + int(r.ack.frame)
	}
	return e
}

// fail records the first cause of the connection's end and closes it.
func (s *Sender) fail(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	s.err = &LostError{Addr: s.addr, Unacked: s.size, Err: cause}
	close(s.dead)
	s.raw.Close()
}
