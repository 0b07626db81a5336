package dataplane

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/trust"
)

// Batch is one batch as the receiver hands it to its handler: the
// frames decoded, checksums verified, every destination tag naming the
// receiver's incarnation.
type Batch struct {
	// From is the sender's incarnation, from its hello.
	From uint64
	// Peer is the sender's identity, proven by its certificate in the TLS
	// handshake; zero when the node is insecure. The handler checks it
	// against the prefill node the transfer was planned with.
	Peer trust.Identity
	// Remote is the sender's network address.
	Remote net.Addr
	// Seq is the batch's position on its connection, from 0.
	Seq uint64
	// Frames alias one of the connection's read buffers: their payloads
	// are valid only until the handler returns; a later batch overwrites
	// them.
	Frames []kv.Frame
}

// Handler does the page writes of one batch (kv.Pool.Accept, or a
// message to each page's actor) and returns nil when all of them were
// accepted. An error matching kv.ErrRefused is acknowledged as
// StatusRejected, any other as StatusHandlerFailed; either way the
// connection is closed after that acknowledgement. The handler is called from one goroutine per
// connection, so from several at once, but never twice at once for one
// connection, and in the connection's batch order. It must copy what it
// keeps, and it must return: the connection reads at most one more batch
// while it runs, acknowledges nothing until it returns, and Close waits
// for every handler call in progress.
type Handler func(b Batch) error

// ServerStats are a server's counters since it started.
type ServerStats struct {
	// Connections whose hello was accepted, and of them those served now.
	ConnectionsAccepted, ConnectionsActive uint64
	// Connections closed before their hello: HandshakesMax were already
	// waiting for theirs, or all but HandshakesReserved for a stranger's
	// address (RefusedHandshakes), or HandshakesPerAddrMax from its
	// address (RefusedHandshakesAddr); the TLS handshake failed (no
	// certificate, one not of this cluster, not TLS at all), no hello came
	// within HelloTimeout, or the peer closed first (ClosedBeforeHello, as
	// membership's probes of the address do after their handshake).
	RefusedHandshakes, RefusedHandshakesAddr, HandshakesFailed, HelloTimeouts, ClosedBeforeHello uint64
	// Connections refused in the hello, by reason: ConnectionsMax served
	// (RefusedBusy) or ConnectionsPerPeerMax from this peer
	// (RefusedPeerBusy), a role that holds no KV (RefusedForbidden).
	RefusedBusy, RefusedPeerBusy, RefusedForbidden                                          uint64
	RefusedHelloIncarnation, RefusedHelloVersion, RefusedHelloLimits, RefusedHelloMalformed uint64
	// RefusedHelloModel counts hellos from senders of another model.
	RefusedHelloModel uint64
	// Batches, frames and bytes (batch headers included) decoded.
	BatchesReceived, FramesReceived, BytesReceived uint64
	// Batches and frames the handler accepted.
	BatchesAccepted, FramesAccepted uint64
	// Batches refused, by reason; each closes its connection.
	RefusedWrongIncarnation, RefusedByHandler, HandlerFailed uint64
	// Connections closed for a malformed batch: a checksum mismatch, or
	// anything else the decoder refused (header, frame fields, limits).
	MalformedChecksum, MalformedOther uint64
	// Connections closed otherwise: no batch for IdleTimeout; a read that
	// failed mid-batch or timed out; an acknowledgement that could not be
	// written.
	IdleClosed, ReadErrors, WriteErrors uint64
}

type dpServerCounters struct {
	accepted, active                                                         atomic.Uint64
	handshakesBusy, handshakesAddr, handshakesFailed, helloTimeouts, noHello atomic.Uint64
	busy, peerBusy, forbidden                                                atomic.Uint64
	helloIncarnation, helloVersion, helloLimits, helloMalformed, helloModel  atomic.Uint64
	batches, frames, bytes                                                   atomic.Uint64
	batchesOK, framesOK                                                      atomic.Uint64
	wrongIncarnation, rejected, handlerFailed                                atomic.Uint64
	malformedChecksum, malformedOther                                        atomic.Uint64
	idle, readErrors, writeErrors                                            atomic.Uint64
}

// Server receives batches on one listener. Its methods are safe
// for concurrent use.
type Server struct {
	cfg     Config
	handler Handler
	ln      net.Listener
	tls     *tls.Config // nil when insecure
	log     *slog.Logger
	c       dpServerCounters

	mu      sync.Mutex
	conns   map[net.Conn]struct{} // every TCP connection open, for Close
	hellos  *trust.Strangers      // connections before their hello
	served  int                   // connections past it
	perPeer map[string]int        // served connections by dpPeer.key
	closed  bool
	wg      sync.WaitGroup
}

// Listen validates cfg, listens on addr ("127.0.0.1:0" picks a
// port; see Addr) and serves connections until Close.
func Listen(cfg Config, addr string, handler Handler) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if handler == nil {
		return nil, errors.New("dataplane: data plane handler must not be nil")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dataplane: data plane listen on %s: %w", addr, err)
	}
	s := &Server{cfg: cfg, handler: handler, ln: ln, log: cfg.logger(),
		conns: make(map[net.Conn]struct{}), perPeer: make(map[string]int),
		hellos: trust.NewStrangers(trust.StrangerLimits{Max: cfg.HandshakesMax, PerAddrMax: cfg.HandshakesPerAddrMax,
			Reserved: cfg.HandshakesReserved})}
	if !cfg.Auth.Insecure() {
		s.tls = cfg.Auth.Bundle().ServerTLS()
	}
	s.wg.Go(s.accept)
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops accepting, closes every connection, and waits for their
// goroutines, handler calls in progress included.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// Stats reads the counters; each is read atomically, the set is not.
func (s *Server) Stats() ServerStats {
	c := &s.c
	return ServerStats{
		ConnectionsAccepted: c.accepted.Load(), ConnectionsActive: c.active.Load(),
		RefusedHandshakes: c.handshakesBusy.Load(), RefusedHandshakesAddr: c.handshakesAddr.Load(),
		HandshakesFailed: c.handshakesFailed.Load(),
		HelloTimeouts:    c.helloTimeouts.Load(), ClosedBeforeHello: c.noHello.Load(),
		RefusedBusy: c.busy.Load(), RefusedPeerBusy: c.peerBusy.Load(), RefusedForbidden: c.forbidden.Load(),
		RefusedHelloIncarnation: c.helloIncarnation.Load(),
		RefusedHelloVersion:     c.helloVersion.Load(), RefusedHelloLimits: c.helloLimits.Load(),
		RefusedHelloMalformed: c.helloMalformed.Load(), RefusedHelloModel: c.helloModel.Load(),
		BatchesReceived: c.batches.Load(), FramesReceived: c.frames.Load(), BytesReceived: c.bytes.Load(),
		BatchesAccepted: c.batchesOK.Load(), FramesAccepted: c.framesOK.Load(),
		RefusedWrongIncarnation: c.wrongIncarnation.Load(), RefusedByHandler: c.rejected.Load(),
		HandlerFailed:     c.handlerFailed.Load(),
		MalformedChecksum: c.malformedChecksum.Load(), MalformedOther: c.malformedOther.Load(),
		IdleClosed: c.idle.Load(), ReadErrors: c.readErrors.Load(), WriteErrors: c.writeErrors.Load(),
	}
}

func (s *Server) accept() {
	var backoff time.Duration
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait, as net/http does,
			// rather than spin or give up.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.cfg.Auth.Warn(s.log, "data_plane_accept", "dataplane: data plane accept failed", "addr", s.ln.Addr(), "err", err,
				"retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.cfg.tuneSocket(conn)
		if !s.admit(conn) {
			continue
		}
		s.wg.Go(func() { s.serve(conn) })
	}
}

// admit registers conn as waiting for its hello, or closes it when the
// server is closed or the connections waiting already fill the bounds
// (trust.Strangers) for its address. Nothing is written to it: before the
// TLS handshake there is no way to say why.
func (s *Server) admit(conn net.Conn) bool {
	proven := s.cfg.Auth.IsProven(conn.RemoteAddr().String())
	s.mu.Lock()
	closed := s.closed
	r, ok := trust.Refusal(0), false
	if !closed {
		r, ok = s.hellos.Take(trust.HostOf(conn.RemoteAddr().String()), proven)
	}
	if ok {
		s.conns[conn] = struct{}{}
	}
	s.mu.Unlock()
	if !ok {
		if !closed {
			if r == trust.RefusedHandshakesAddr {
				s.c.handshakesAddr.Add(1)
			} else {
				s.c.handshakesBusy.Add(1)
			}
			s.cfg.Auth.Refuse(r, "data plane connection before its hello", "remote", conn.RemoteAddr(),
				"handshakes_max", s.cfg.HandshakesMax, "handshakes_per_addr_max", s.cfg.HandshakesPerAddrMax,
				"handshakes_reserved", s.cfg.HandshakesReserved, "hello_timeout", s.cfg.HelloTimeout)
		}
		conn.Close()
	}
	return ok
}

func (s *Server) drop(conn net.Conn) {
	conn.Close()
	s.mu.Lock()
	delete(s.conns, conn)
	s.mu.Unlock()
}

// dpPeer is the sender at the other end of one connection.
type dpPeer struct {
	raw  net.Conn // the TCP connection
	conn net.Conn // what batches are read from: raw, or TLS over it
	id   trust.Identity
	// key names the peer for ConnectionsPerPeerMax: its identity when
	// secure, its IP address when insecure.
	key  string
	from uint64 // its incarnation, from its hello
}

func (s *Server) reply(conn net.Conn, st Status) error {
	h := dpHello{reply: true, version: dpVersion, status: st, incarnation: s.cfg.Incarnation, limits: s.cfg.Batch,
		model: s.cfg.Model}
	b := h.encode()
	conn.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	_, err := conn.Write(b[:])
	return err
}

// greet runs a connection up to its first batch, all of it within
// HelloTimeout of the accept: the TLS handshake, the hello and the reply.
// It returns the peer once the connection holds a serving slot (release
// gives it back), or false once the connection is to be closed.
func (s *Server) greet(raw net.Conn) (*dpPeer, bool) {
	defer func() {
		s.mu.Lock()
		s.hellos.Give(trust.HostOf(raw.RemoteAddr().String()))
		s.mu.Unlock()
	}()
	raw.SetDeadline(time.Now().Add(s.cfg.HelloTimeout))
	p := &dpPeer{raw: raw, conn: raw}
	if host, _, err := net.SplitHostPort(raw.RemoteAddr().String()); err == nil {
		p.key = host
	}
	if s.tls != nil && !s.handshake(p) {
		return nil, false
	}
	h, ok := s.readHello(p)
	if !ok {
		return nil, false
	}
	p.from = h.incarnation
	st := s.check(p, h)
	if err := s.reply(p.conn, st); err != nil {
		s.c.writeErrors.Add(1)
		s.cfg.Auth.Warn(s.log, "data_plane_reply", "dataplane: data plane hello reply not written", "remote", raw.RemoteAddr(),
			"err", err)
		if st == StatusOK {
			s.release(p)
		}
		return nil, false
	}
	if st != StatusOK {
		return nil, false
	}
	if s.tls == nil {
		// Insecure, a hello that knew the incarnation and the model is
		// all the proof there is.
		s.cfg.Auth.Proven(raw.RemoteAddr().String())
	}
	raw.SetDeadline(time.Time{})
	return p, true
}

// handshake runs the server side of TLS on p and learns who the peer is.
func (s *Server) handshake(p *dpPeer) bool {
	tc := tls.Server(p.raw, s.tls)
	err := tc.Handshake()
	var id trust.Identity
	if err == nil {
		// VerifyConnection has checked this already; this reads the result.
		id, _, err = s.cfg.Auth.Bundle().PeerIdentity(tc.ConnectionState(), x509.ExtKeyUsageClientAuth)
	}
	switch {
	case err == nil:
		p.conn, p.id, p.key = tc, id, id.String()
		if id.Role.IsCluster() {
			s.cfg.Auth.Proven(p.raw.RemoteAddr().String())
		}
		return true
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.tooSlow(p.raw)
	case err == io.EOF:
		// Closed without a byte: a port check, not a credential refused.
		s.c.noHello.Add(1)
	default:
		s.c.handshakesFailed.Add(1)
		s.cfg.Auth.Refuse(trust.RefusedCertificate, "data plane TLS handshake", "remote", p.raw.RemoteAddr(), "err", err)
	}
	return false
}

// tooSlow counts a connection that did not say hello within HelloTimeout.
func (s *Server) tooSlow(conn net.Conn) {
	s.c.helloTimeouts.Add(1)
	s.cfg.Auth.Refuse(trust.RefusedDataPlane, "data plane connection without a hello in time", "remote", conn.RemoteAddr(),
		"hello_timeout", s.cfg.HelloTimeout)
}

// readHello reads the sender's hello; false when there is none to answer.
func (s *Server) readHello(p *dpPeer) (dpHello, bool) {
	var b [dpHelloBytes]byte
	if _, err := io.ReadFull(p.conn, b[:]); err != nil {
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.tooSlow(p.raw)
		case err == io.EOF:
			s.c.noHello.Add(1)
		default:
			s.c.readErrors.Add(1)
			s.cfg.Auth.Warn(s.log, "data_plane_hello_read", "dataplane: data plane hello not read", "remote", p.raw.RemoteAddr(),
				"err", err)
		}
		return dpHello{}, false
	}
	h, err := decodeDPHello(b[:], false)
	if err != nil {
		// Not a data plane peer: no reply, since it would not read one.
		s.c.helloMalformed.Add(1)
		s.cfg.Auth.Warn(s.log, "data_plane_hello_malformed", "dataplane: data plane connection closed", "remote", p.raw.RemoteAddr(),
			"reason", err)
		return dpHello{}, false
	}
	return h, true
}

// check decides the hello reply: who the peer is first, then what its
// hello says, then whether a serving slot is free, which it takes.
func (s *Server) check(p *dpPeer, h dpHello) Status {
	if s.tls != nil && !p.id.Role.Prefills() && !p.id.Role.Decodes() {
		s.c.forbidden.Add(1)
		s.cfg.Auth.Refuse(trust.RefusedDataPlane, "data plane hello from a role that holds no KV",
			"remote", p.raw.RemoteAddr(), "identity", p.id.String())
		return StatusForbidden
	}
	st, counter := StatusOK, (*atomic.Uint64)(nil)
	switch {
	case h.version != dpVersion:
		st, counter = StatusHelloVersion, &s.c.helloVersion
	case h.reserved || h.status != StatusOK || h.incarnation == 0 || h.limits.Validate() != nil || h.model.IsZero():
		st, counter = StatusHelloMalformed, &s.c.helloMalformed
	case h.expect != s.cfg.Incarnation:
		st, counter = StatusHelloIncarnation, &s.c.helloIncarnation
	case h.model != s.cfg.Model:
		st, counter = StatusHelloModel, &s.c.helloModel
	case h.limits.Frame != s.cfg.Batch.Frame:
		st, counter = StatusHelloLimits, &s.c.helloLimits
	}
	if st != StatusOK {
		counter.Add(1)
		s.cfg.Auth.Warn(s.log, "data_plane_hello", "dataplane: data plane refused hello", "remote", p.raw.RemoteAddr(), "reason", st,
			"version", h.version, "sender", fmt.Sprintf("%x", h.incarnation),
			"expected", fmt.Sprintf("%x", h.expect), "incarnation", fmt.Sprintf("%x", s.cfg.Incarnation),
			"page_tokens", h.limits.Frame.PageTokens, "bytes_per_token", h.limits.Frame.BytesPerToken,
			"model", h.model.String(), "own_model", s.cfg.Model.String())
		return st
	}
	return s.take(p)
}

// take gives p a serving slot, unless ConnectionsMax are taken or
// ConnectionsPerPeerMax by p's peer.
func (s *Server) take(p *dpPeer) Status {
	s.mu.Lock()
	served, mine := s.served, s.perPeer[p.key]
	ok := served < s.cfg.ConnectionsMax && mine < s.cfg.ConnectionsPerPeerMax
	if ok {
		s.served++
		s.perPeer[p.key]++
	}
	s.mu.Unlock()
	switch {
	case ok:
		s.c.accepted.Add(1)
		s.c.active.Add(1)
		return StatusOK
	case served >= s.cfg.ConnectionsMax:
		s.c.busy.Add(1)
		s.cfg.Auth.Warn(s.log, "data_plane_busy", "dataplane: data plane refused a connection: busy", "remote", p.raw.RemoteAddr(),
			"connections_max", s.cfg.ConnectionsMax)
	default:
		s.c.peerBusy.Add(1)
		s.cfg.Auth.Refuse(trust.RefusedDataPlane, "data plane connection over the per-peer cap", "remote", p.raw.RemoteAddr(),
			"peer", p.key, "connections_per_peer_max", s.cfg.ConnectionsPerPeerMax)
	}
	return StatusBusy
}

// release gives back the serving slot take gave p.
func (s *Server) release(p *dpPeer) {
	s.mu.Lock()
	s.served--
	if s.perPeer[p.key]--; s.perPeer[p.key] == 0 {
		delete(s.perPeer, p.key)
	}
	s.mu.Unlock()
	s.c.active.Add(^uint64(0))
}

// serve runs one accepted connection: greet, then a reader goroutine
// (dpReader) reads batch N+1 into one buffer while this goroutine decodes
// batch N from the other, hands it to the handler and acknowledges it.
// Batches, handler calls and acknowledgements stay in the connection's
// order, and the first batch not accepted is the last one read.
func (s *Server) serve(raw net.Conn) {
	defer s.drop(raw)
	p, ok := s.greet(raw)
	if !ok {
		return
	}
	defer s.release(p)
	r := s.startReader(p.conn)
	defer r.stop()
	for seq := uint64(0); ; seq++ {
		in := <-r.full
		if in.err != nil {
			r.stop()
			s.closing(p, seq, in.err)
			return
		}
		frames, n, err := kv.DecodeBatch(in.buf[:in.n], s.cfg.Batch)
		if err == nil && n != in.n {
			err = fmt.Errorf("dataplane: kv.DecodeBatch took %d of the %d bytes its header announced", n, in.n)
		}
		if err != nil {
			r.stop()
			s.closing(p, seq, &dpReadError{err: err, malformed: true})
			return
		}
		s.c.batches.Add(1)
		s.c.frames.Add(uint64(len(frames)))
		s.c.bytes.Add(uint64(n))
		a := s.handle(Batch{From: p.from, Peer: p.id, Remote: raw.RemoteAddr(), Seq: seq, Frames: frames})
		// The handler is done with the payloads: the buffer may take a batch.
		r.free <- in.buf
		err = s.ack(p.conn, a)
		r.acked()
		if err != nil {
			s.c.writeErrors.Add(1)
			s.cfg.Auth.Warn(s.log, "data_plane_ack", "dataplane: data plane connection closed", "remote", raw.RemoteAddr(),
				"reason", "acknowledgement not written", "batch", seq, "err", err)
			return
		}
		if a.status != StatusOK {
			r.stop()
			s.linger(p.conn)
			return
		}
	}
}

// handle checks the batch's destination incarnations, then hands it on.
func (s *Server) handle(b Batch) dpAck {
	for i := range b.Frames {
		if inc := b.Frames[i].Dest.Incarnation; inc != s.cfg.Incarnation {
			s.c.wrongIncarnation.Add(1)
			s.cfg.Auth.Refuse(trust.RefusedDataPlane, "data plane batch with a frame for another incarnation",
				"remote", b.Remote, "peer", b.Peer.String(), "batch", b.Seq, "frame", i, "dest", b.Frames[i].Dest,
				"incarnation", fmt.Sprintf("%x", s.cfg.Incarnation))
			return dpAck{seq: b.Seq, status: StatusWrongIncarnation, frame: uint32(i), detail: inc}
		}
	}
	err := s.handler(b)
	switch {
	case err == nil:
		s.c.batchesOK.Add(1)
		s.c.framesOK.Add(uint64(len(b.Frames)))
		return dpAck{seq: b.Seq, status: StatusOK, frame: dpNoFrame}
	case errors.Is(err, kv.ErrRefused):
		s.c.rejected.Add(1)
		s.cfg.Auth.Refuse(trust.RefusedDataPlane, "data plane batch rejected by the page checks",
			"remote", b.Remote, "peer", b.Peer.String(), "batch", b.Seq, "err", err)
		return dpAck{seq: b.Seq, status: StatusRejected, frame: dpNoFrame}
	default:
		s.c.handlerFailed.Add(1)
		s.cfg.Auth.Warn(s.log, "data_plane_handler", "dataplane: data plane handler failed", "remote", b.Remote, "batch", b.Seq,
			"err", err)
		return dpAck{seq: b.Seq, status: StatusHandlerFailed, frame: dpNoFrame}
	}
}

func (s *Server) ack(conn net.Conn, a dpAck) error {
	b := a.encode()
	conn.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	_, err := conn.Write(b[:])
	return err
}

// dpReadError says why a batch was not read: idle says no byte of it came
// before IdleTimeout, eof that the peer closed between batches.
type dpReadError struct {
	err       error
	malformed bool
	idle, eof bool
}

func (e *dpReadError) Error() string { return e.err.Error() }

// dpConnBuffers is the number of batch buffers a server connection reads
// into: one is handled while the next batch is read into the other.
const dpConnBuffers = 2

// dpRead is one batch read whole into buf[:n], not yet decoded, or the
// error that ended reading (buf then is free for the connection's use).
type dpRead struct {
	buf []byte
	n   int
	err *dpReadError
}

// dpReader reads one connection's batches ahead of its handler, into
// dpConnBuffers buffers allocated once.
type dpReader struct {
	s    *Server
	conn net.Conn
	free chan []byte // buffers the reader may read into
	full chan dpRead // batches read, in order; the last one may be an error
	done chan struct{}
	// busy is the batches handed on and not yet acknowledged, and last the
	// time (UnixNano) of the latest acknowledgement: the connection is idle
	// only once nothing is handed on and IdleTimeout has passed since.
	busy atomic.Int64
	last atomic.Int64

	mu      sync.Mutex // orders stop against the reader's deadlines
	stopped bool
	quit    chan struct{}
}

func (s *Server) startReader(conn net.Conn) *dpReader {
	r := &dpReader{
		s: s, conn: conn,
		free: make(chan []byte, dpConnBuffers),
		full: make(chan dpRead, dpConnBuffers),
		done: make(chan struct{}),
		quit: make(chan struct{}),
	}
	r.last.Store(time.Now().UnixNano())
	for range dpConnBuffers {
		r.free <- make([]byte, s.cfg.batchBufferBytes())
	}
	go r.run()
	return r
}

// stop ends the reader and waits for it; the caller then owns the
// connection's reads. A read in progress fails at once on a past deadline.
func (r *dpReader) stop() {
	r.mu.Lock()
	if !r.stopped {
		r.stopped = true
		close(r.quit)
		r.conn.SetReadDeadline(time.Unix(1, 0))
	}
	r.mu.Unlock()
	<-r.done
}

// deadline sets the read deadline unless the reader was stopped.
func (r *dpReader) deadline(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return false
	}
	r.conn.SetReadDeadline(t)
	return true
}

// acked records that the oldest batch handed on has been acknowledged.
func (r *dpReader) acked() {
	r.last.Store(time.Now().UnixNano())
	r.busy.Add(-1)
}

// idleUntil is when the connection becomes idle if no batch starts: never
// (ok false) while a batch is being handled, counted from then on.
func (r *dpReader) idleUntil() (time.Time, bool) {
	if r.busy.Load() > 0 {
		return time.Time{}, false
	}
	return time.Unix(0, r.last.Load()).Add(r.s.cfg.IdleTimeout), true
}

func (r *dpReader) run() {
	defer close(r.done)
	for {
		var buf []byte
		select {
		case buf = <-r.free:
		case <-r.quit:
			return
		}
		n, err := r.read(buf)
		if err != nil {
			r.full <- dpRead{buf: buf, err: err}
			return
		}
		r.busy.Add(1)
		r.full <- dpRead{buf: buf, n: n}
	}
}

var errDPReaderStopped = errors.New("dataplane: data plane reader stopped")

// read reads exactly one batch into buf, without decoding its frames: the
// header, which kv.DecodeBatch checks and which bounds the body by
// Batch.BytesMax, then the body. It never reads into the next batch and
// never past the buffer.
func (r *dpReader) read(buf []byte) (int, *dpReadError) {
	s, conn := r.s, r.conn
	hdr := buf[:dpBatchHeaderBytes]
	for t := time.Now().Add(s.cfg.IdleTimeout); ; {
		if !r.deadline(t) {
			return 0, &dpReadError{err: errDPReaderStopped}
		}
		got, err := io.ReadFull(conn, hdr)
		if err == nil {
			break
		}
		first := got == 0
		if first && errors.Is(err, os.ErrDeadlineExceeded) {
			// Not idle while the previous batch is handled, nor before
			// IdleTimeout has passed since its acknowledgement.
			until, ok := r.idleUntil()
			if now := time.Now(); !ok {
				t = now.Add(s.cfg.IdleTimeout)
				continue
			} else if until.After(now) {
				t = until
				continue
			}
		}
		return 0, &dpReadError{err: err, eof: first && err == io.EOF,
			idle: first && errors.Is(err, os.ErrDeadlineExceeded)}
	}
	need := len(hdr)
	_, _, err := kv.DecodeBatch(hdr, s.cfg.Batch)
	var short *kv.FrameShortError
	switch {
	case errors.As(err, &short):
		need = short.Need
	case err != nil:
		return 0, &dpReadError{err: err, malformed: true}
	}
	if need < len(hdr) || need > len(buf) {
		// The header bounds the body by BytesMax, so this cannot happen
		// with kv as it is; if kv changes, the bytes decide it, and bytes
		// close a connection rather than stop the node.
		return 0, &dpReadError{malformed: true, err: fmt.Errorf(
			"dataplane: kv.DecodeBatch needs %d bytes with %d read into a %d-byte buffer", need, len(hdr), len(buf))}
	}
	if need > len(hdr) {
		if !r.deadline(time.Now().Add(s.cfg.ReadTimeout)) {
			return 0, &dpReadError{err: errDPReaderStopped}
		}
		if _, err := io.ReadFull(conn, buf[len(hdr):need]); err != nil {
			return 0, &dpReadError{err: err}
		}
	}
	return need, nil
}

// closing counts and logs why a connection ends. A malformed batch is
// acknowledged with StatusMalformed first (best effort), so that the
// sender's error says what happened rather than only that the connection
// was lost.
func (s *Server) closing(p *dpPeer, seq uint64, e *dpReadError) {
	switch {
	case e.eof:
		return
	case e.malformed:
		var sum *kv.ChecksumMismatchError
		if errors.As(e.err, &sum) {
			s.c.malformedChecksum.Add(1)
		} else {
			s.c.malformedOther.Add(1)
		}
		s.cfg.Auth.Refuse(trust.RefusedDataPlane, "malformed data plane batch", "remote", p.raw.RemoteAddr(),
			"peer", p.id.String(), "batch", seq, "err", e.err)
		if s.ack(p.conn, dpAck{seq: seq, status: StatusMalformed, frame: dpNoFrame}) == nil {
			s.linger(p.conn)
		}
	case e.idle:
		s.c.idle.Add(1)
		s.log.Info("dataplane: data plane connection closed", "remote", p.raw.RemoteAddr(),
			"reason", "idle", "idle_timeout", s.cfg.IdleTimeout)
	default:
		s.c.readErrors.Add(1)
		s.cfg.Auth.Warn(s.log, "data_plane_read", "dataplane: data plane connection closed", "remote", p.raw.RemoteAddr(),
			"reason", "read failed", "batch", seq, "err", e.err)
	}
}

// linger closes conn's write side (TCP FIN, or TLS close_notify) and
// discards what the sender still writes, until it closes too, for at most
// ReadTimeout and InFlightMax batches' bytes. Closing a socket with unread
// bytes resets the connection, and a reset can destroy the refusal in the
// sender's receive queue before it is read.
func (s *Server) linger(conn net.Conn) {
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok {
		return
	}
	cw.CloseWrite()
	conn.SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout))
	io.Copy(io.Discard, io.LimitReader(conn, int64(s.cfg.InFlightMax)*int64(s.cfg.batchBufferBytes())))
}
