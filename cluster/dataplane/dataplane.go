package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// The data plane carries KV frames (kv.AppendBatch / kv.DecodeBatch) from a
// sender (prefill) to a receiver (decode) over TLS 1.3 with client
// certificates (plain TCP when the node is insecure); control messages
// travel on the actor system instead. One connection, one direction of
// bytes, acknowledgements coming back:
//
//	sender                                   receiver
//	TLS handshake ◀───────────────────────▶  both certificates checked
//	hello (48 B) ─────────────────────────▶  checks role, version, incarnation,
//	                                          limits, connection caps
//	             ◀─────────────────────────  hello reply (48 B): status, its limits
//	batch 0 (kv batch) ───────────────────▶  decode, check tags, handler
//	batch 1 ──────────────────────────────▶
//	             ◀─────────────────────────  ack 0 (24 B): sequence, status
//	…  at most InFlightMax batches unacknowledged
//
// Batches are numbered from 0 by their position on the connection; TCP keeps
// them in order, so the sequence number is not sent with the batch, only
// echoed in its acknowledgement, where the sender checks it. An
// acknowledgement other than StatusOK is the last one on its connection:
// the receiver closes it after writing it, so a peer that sent one bad
// batch sends nothing more on that connection.
//
// Hello and hello reply, little-endian:
//
//	off  size  field
//	  0     4  magic "KVH1" (hello) or "KVR1" (reply)
//	  4     1  version (2)
//	  5     1  status (reply only; zero in a hello)
//	  6     2  reserved, zero
//	  8     8  incarnation of the side that writes it
//	 16     8  incarnation it expects of the other side (zero in a reply)
//	 24     4  batch pages max
//	 28     4  frame page tokens
//	 32     4  frame bytes per token
//	 36     4  reserved, zero
//	 40     8  batch bytes max
//	 48    16  fingerprint of the model the writer computes (non-zero)
//
// Acknowledgement:
//
//	off  size  field
//	  0     8  batch sequence number
//	  8     1  status
//	  9     3  reserved, zero
//	 12     4  index of the frame in the batch the status is about, or 0xFFFFFFFF
//	 16     8  detail: the incarnation a refused frame named, else zero
const (
	dpHelloMagic   = "KVH1"
	dpReplyMagic   = "KVR1"
	dpVersion      = 2
	dpHelloBytes   = 64
	dpAckBytes     = 24
	dpNoFrame      = 0xFFFFFFFF
	dpInFlightMax  = 1 << 12
	dpBatchBytesUp = 1 << 30
	dpPagesMaxUp   = 1 << 16
)

// dpBatchHeaderBytes is the size of kv's batch header. kv does not export
// it; it says it instead: an empty buffer is a batch whose header has not
// arrived, and DecodeBatch answers how many bytes the header needs.
var dpBatchHeaderBytes = func() int {
	_, _, err := kv.DecodeBatch(nil, kv.BatchLimits{})
	var short *kv.FrameShortError
	if !errors.As(err, &short) || short.Need < 1 {
		panic(fmt.Sprintf("dataplane: kv.DecodeBatch(nil) answered %v, want a *kv.FrameShortError naming the header size", err))
	}
	return short.Need
}()

// dpFrameOverhead bounds the bytes a frame takes beyond its payload (fixed
// header and the longest tenant), from what kv exports.
func dpFrameOverhead(l kv.FrameLimits) int {
	return l.FrameBytesMax() - l.PageTokens*l.BytesPerToken
}

// Config bounds one node's data plane, both as a sender and as a
// receiver. Every field must be set; Validate runs in Listen and
// Dial before any buffer is allocated.
type Config struct {
	// Batch bounds one batch in frames (PagesMax) and body bytes (BytesMax),
	// and each frame by the KV geometry (Frame). Sender and receiver must
	// share Frame; a sender packs batches within the smaller of the two
	// sides' PagesMax and BytesMax. BytesMax is at most 1 GiB.
	Batch kv.BatchLimits
	// InFlightMax is the most batches a sender may have written on one
	// connection and not yet seen acknowledged; Send blocks beyond it. This
	// is the back-pressure window. 1 to 4096.
	InFlightMax int
	// DialTimeout bounds connecting, the TLS handshake and the hello
	// exchange, sender side.
	DialTimeout time.Duration
	// HelloTimeout bounds, receiver side, the time from accepting a
	// connection to having read its hello, the TLS handshake included. It
	// is short because until then the peer is a stranger: a connection
	// that sends nothing is closed when it passes.
	HelloTimeout time.Duration
	// WriteTimeout bounds writing one batch (sender) or one acknowledgement
	// or hello reply (receiver); past it the connection is closed.
	WriteTimeout time.Duration
	// ReadTimeout bounds reading the rest of a batch once its header has
	// arrived (receiver).
	ReadTimeout time.Duration
	// AckTimeout bounds how long the oldest unacknowledged batch waits for
	// its acknowledgement, the receiver's handler time included; past it the
	// sender declares the connection lost.
	AckTimeout time.Duration
	// IdleTimeout is how long a receiver keeps a connection that brings no
	// new batch before it closes it. A sender then sees the connection lost
	// and dials again.
	IdleTimeout time.Duration
	// SocketBufferBytes sets the kernel's send and receive buffers of every
	// data plane socket, in bytes; zero leaves the operating system's
	// default (and its autotuning). At most 1 GiB.
	SocketBufferBytes int
	// ConnectionsMax is the most connections a server serves at once (past
	// their hello); one more is refused in its hello reply with
	// StatusBusy.
	ConnectionsMax int
	// ConnectionsPerPeerMax is the most of them one peer may hold: one
	// identity when secure, one IP address when insecure. One more is
	// refused with StatusBusy, so that one peer cannot take every slot.
	// 1 to ConnectionsMax.
	ConnectionsPerPeerMax int
	// HandshakesMax is the most connections a server holds before their
	// hello (in the TLS handshake or waiting for the hello), each for at
	// most HelloTimeout; one more is closed at once. They hold no batch
	// buffer and no serving slot, so strangers that connect and send
	// nothing delay no transfer until there are HandshakesMax of them.
	HandshakesMax int
	// HandshakesPerAddrMax is the most of those one IP address may hold,
	// unless a node or an operator connected from it lately
	// (trust.Authority.IsProven); HandshakesReserved is the share of
	// HandshakesMax only such addresses may take. So strangers holding
	// every slot they may, from any number of addresses, leave a
	// restarted prefill node room for its first transfers.
	HandshakesPerAddrMax int
	HandshakesReserved   int
	// ServerBufferBytesMax bounds the read buffers of all of a server's
	// connections together, in bytes: each connection allocates two batch
	// buffers (header plus Batch.BytesMax each; it reads the next batch
	// into one while the handler has the other) when its hello is
	// accepted, so ConnectionsMax times that must fit.
	ServerBufferBytesMax int64
	// Model is the fingerprint of the model this node computes: a
	// receiver refuses a hello from a sender of another model, whose KV
	// would decode into a wrong answer. Must be non-zero.
	Model engine.Fingerprint
	// Incarnation is this node's incarnation: a receiver refuses a hello
	// that expects another, and a frame whose destination tag names
	// another. Must be non-zero.
	Incarnation uint64
	// Auth is who this node is and whom it trusts: the receiver serves
	// TLS with its certificate and requires a client certificate of the
	// cluster naming a role that prefills; the sender checks that the
	// receiver is the node it expects. trust.Insecure runs plain TCP and
	// checks nobody. Required. Refusals of peers are counted in it
	// (trust.RefusedDataPlane, trust.RefusedCertificate).
	Auth *trust.Authority
	// Logger receives one line per connection closed for a reason other
	// than the peer's orderly close. Nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig sizes batches for geometry g to about
// BatchBytesTarget (at least one full-page frame), with 4 batches
// in flight, 32 connections (8 from one peer) and 1 GiB of server
// buffers. Auth is left for the caller to set.
func DefaultConfig(g kv.Geometry, incarnation uint64) Config {
	fl := g.Limits()
	pages := max(1, min(BatchBytesTarget/fl.FrameBytesMax(), dpPagesMaxUp))
	return Config{
		Batch:                 kv.BatchLimits{PagesMax: pages, BytesMax: pages * fl.FrameBytesMax(), Frame: fl},
		InFlightMax:           4,
		DialTimeout:           5 * time.Second,
		HelloTimeout:          2 * time.Second,
		WriteTimeout:          10 * time.Second,
		ReadTimeout:           10 * time.Second,
		AckTimeout:            30 * time.Second,
		IdleTimeout:           2 * time.Minute,
		ConnectionsMax:        32,
		ConnectionsPerPeerMax: 8,
		HandshakesMax:         128,
		HandshakesPerAddrMax:  16,
		HandshakesReserved:    32,
		ServerBufferBytesMax:  1 << 30,
		Incarnation:           incarnation,
	}
}

// BatchBytesTarget is the batch size DefaultConfig aims
// for: 2 MiB. On a 2-CPU loopback (BenchmarkThroughput) batches
// this size, whose payloads stay in cache between the checksum and the
// socket write, kept 0.84–0.97 of raw TCP's throughput, against 0.76–0.85
// for 8 MiB batches and 0.49–0.61 for 64 KiB ones (per-batch costs).
const BatchBytesTarget = 2 << 20

// DefaultLocalConfig is DefaultConfig with short timers,
// for tests and a local cluster.
func DefaultLocalConfig(g kv.Geometry, incarnation uint64) Config {
	c := DefaultConfig(g, incarnation)
	c.DialTimeout = 2 * time.Second
	c.HelloTimeout = time.Second
	c.WriteTimeout = 5 * time.Second
	c.ReadTimeout = 5 * time.Second
	c.AckTimeout = 10 * time.Second
	c.IdleTimeout = 30 * time.Second
	return c
}

// batchBufferBytes is one server read buffer: a whole batch.
func (c Config) batchBufferBytes() int { return dpBatchHeaderBytes + c.Batch.BytesMax }

// connBufferBytes is what one server connection allocates to read batches.
func (c Config) connBufferBytes() int64 { return dpConnBuffers * int64(c.batchBufferBytes()) }

func (c Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// Validate reports the first field out of range, with its value.
func (c Config) Validate() error {
	fl := c.Batch.Frame
	switch {
	case c.Model.IsZero():
		return errors.New("dataplane: data plane Model (the model fingerprint) must be set")
	case fl.PageTokens < 1 || fl.BytesPerToken < 1:
		return fmt.Errorf("dataplane: data plane Batch.Frame (page tokens %d, bytes per token %d) must be at least 1 each",
			fl.PageTokens, fl.BytesPerToken)
	case int64(fl.PageTokens)*int64(fl.BytesPerToken) > dpBatchBytesUp:
		return fmt.Errorf("dataplane: data plane page of %d tokens × %d bytes exceeds %d bytes",
			fl.PageTokens, fl.BytesPerToken, dpBatchBytesUp)
	case c.Batch.PagesMax > dpPagesMaxUp:
		return fmt.Errorf("dataplane: data plane Batch.PagesMax (%d) must be at most %d", c.Batch.PagesMax, dpPagesMaxUp)
	case c.Batch.BytesMax > dpBatchBytesUp:
		return fmt.Errorf("dataplane: data plane Batch.BytesMax (%d) must be at most %d", c.Batch.BytesMax, dpBatchBytesUp)
	}
	if err := c.Batch.Validate(); err != nil {
		return fmt.Errorf("dataplane: data plane: %w", err)
	}
	if c.InFlightMax < 1 || c.InFlightMax > dpInFlightMax {
		return fmt.Errorf("dataplane: data plane InFlightMax (%d) must be in [1, %d]", c.InFlightMax, dpInFlightMax)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"DialTimeout", c.DialTimeout}, {"HelloTimeout", c.HelloTimeout}, {"WriteTimeout", c.WriteTimeout},
		{"ReadTimeout", c.ReadTimeout},
		{"AckTimeout", c.AckTimeout}, {"IdleTimeout", c.IdleTimeout},
	} {
		if d.v <= 0 {
			return fmt.Errorf("dataplane: data plane %s (%s) must be positive", d.name, d.v)
		}
	}
	if c.SocketBufferBytes < 0 || c.SocketBufferBytes > dpBatchBytesUp {
		return fmt.Errorf("dataplane: data plane SocketBufferBytes (%d) must be in [0, %d]", c.SocketBufferBytes, dpBatchBytesUp)
	}
	if c.ConnectionsMax < 1 {
		return fmt.Errorf("dataplane: data plane ConnectionsMax (%d) must be at least 1", c.ConnectionsMax)
	}
	if c.ConnectionsPerPeerMax < 1 || c.ConnectionsPerPeerMax > c.ConnectionsMax {
		return fmt.Errorf("dataplane: data plane ConnectionsPerPeerMax (%d) must be in [1, ConnectionsMax (%d)]",
			c.ConnectionsPerPeerMax, c.ConnectionsMax)
	}
	if c.HandshakesMax < 1 {
		return fmt.Errorf("dataplane: data plane HandshakesMax (%d) must be at least 1", c.HandshakesMax)
	}
	if c.HandshakesReserved < 0 || c.HandshakesReserved >= c.HandshakesMax {
		return fmt.Errorf("dataplane: data plane HandshakesReserved (%d) must be in [0, HandshakesMax (%d))",
			c.HandshakesReserved, c.HandshakesMax)
	}
	if c.HandshakesPerAddrMax < 1 || c.HandshakesPerAddrMax > c.HandshakesMax-c.HandshakesReserved {
		return fmt.Errorf("dataplane: data plane HandshakesPerAddrMax (%d) must be in [1, HandshakesMax (%d) - HandshakesReserved (%d)]",
			c.HandshakesPerAddrMax, c.HandshakesMax, c.HandshakesReserved)
	}
	if need := int64(c.ConnectionsMax) * c.connBufferBytes(); need > c.ServerBufferBytesMax {
		return fmt.Errorf("dataplane: data plane ConnectionsMax (%d) × %d batch buffers (%d bytes each) = %d bytes exceeds ServerBufferBytesMax (%d)",
			c.ConnectionsMax, dpConnBuffers, c.batchBufferBytes(), need, c.ServerBufferBytesMax)
	}
	if c.Incarnation == 0 {
		return fmt.Errorf("dataplane: data plane Incarnation must be non-zero")
	}
	if c.Auth == nil {
		return errors.New("dataplane: data plane Auth is required (trust.Insecure runs plain TCP without credentials)")
	}
	return nil
}

// Status is the outcome of a hello or a batch, as the receiver
// reports it. The numbers are stable: they cross the wire. Every status
// but StatusOK ends its connection: the receiver closes it after the
// reply or acknowledgement that carries it.
type Status uint8

const (
	// StatusOK: the hello was accepted, or every frame of the batch was
	// handed to the handler and it returned nil.
	StatusOK Status = 0
	// StatusMalformed: the batch did not decode (bad header, bad frame,
	// checksum mismatch, over the limits).
	StatusMalformed Status = 1
	// StatusWrongIncarnation: a frame's destination tag names another
	// incarnation than the receiver's. No frame of the batch was handed on.
	StatusWrongIncarnation Status = 2
	// StatusRejected: the handler refused the batch with an error that
	// matches kv.ErrRefused (stale tag, wrong owner or tenant, bad range).
	StatusRejected Status = 3
	// StatusHandlerFailed: the handler failed with any other error.
	StatusHandlerFailed Status = 4
	// StatusHelloIncarnation: the hello expected another incarnation
	// of the receiver (the sender's tags are from a node that restarted).
	StatusHelloIncarnation Status = 5
	// StatusHelloVersion: the receiver does not speak the hello's version.
	StatusHelloVersion Status = 6
	// StatusHelloLimits: the two sides' frame limits (KV geometry)
	// differ.
	StatusHelloLimits Status = 7
	// StatusHelloMalformed: a hello field is out of range (zero sender
	// incarnation, reserved bytes set, limits that cannot carry a page).
	StatusHelloMalformed Status = 8
	// StatusBusy: the receiver serves ConnectionsMax connections
	// already, or ConnectionsPerPeerMax from this peer.
	StatusBusy Status = 9
	// StatusForbidden: the sender's certificate names a role that neither
	// prefills nor decodes, so it has no KV to send.
	StatusForbidden Status = 10
	// StatusHelloModel: the two sides compute different models (their
	// fingerprints differ).
	StatusHelloModel Status = 11

	dpStatusCount = 12
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusMalformed:
		return "malformed batch"
	case StatusWrongIncarnation:
		return "frame for another incarnation"
	case StatusRejected:
		return "rejected by the page checks"
	case StatusHandlerFailed:
		return "handler failed"
	case StatusHelloIncarnation:
		return "hello for another incarnation"
	case StatusHelloVersion:
		return "hello version not spoken"
	case StatusHelloLimits:
		return "hello with other frame limits"
	case StatusHelloMalformed:
		return "malformed hello"
	case StatusBusy:
		return "busy"
	case StatusForbidden:
		return "sender's role may not send KV"
	case StatusHelloModel:
		return "hello from a node of another model"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// ErrRefused is matched by every refusal the receiver reports
// (*RefusedError, *HelloError).
var ErrRefused = errors.New("dataplane: data plane refused")

// ErrLost is matched by *LostError: the connection is
// gone and the outcome of its unacknowledged batches is unknown.
var ErrLost = errors.New("dataplane: data plane connection lost")

// ErrClosed is the cause of a *LostError on a sender
// closed by its owner.
var ErrClosed = errors.New("dataplane: data plane sender closed")

// RefusedError: the receiver refused one batch of a Send. Frames
// [First, First+Count) of the slice given to Send were in it; Frame is the
// index in that slice of the frame the status is about, or -1 when it is
// about the whole batch. Detail is the incarnation a StatusWrongIncarnation
// frame named.
type RefusedError struct {
	Addr         string
	Seq          uint64
	Status       Status
	First, Count int
	Frame        int
	Detail       uint64
}

func (e *RefusedError) Error() string {
	s := fmt.Sprintf("dataplane: data plane %s refused batch %d (frames [%d, %d)): %s",
		e.Addr, e.Seq, e.First, e.First+e.Count, e.Status)
	if e.Frame >= 0 {
		s += fmt.Sprintf(" at frame %d", e.Frame)
	}
	if e.Status == StatusWrongIncarnation {
		s += fmt.Sprintf(" naming incarnation %x", e.Detail)
	}
	return s
}

// Is matches ErrRefused, and kv.ErrRefused: a refused batch is a
// refused page access.
func (e *RefusedError) Is(target error) bool {
	return target == ErrRefused || target == kv.ErrRefused
}

// HelloError: the receiver refused the connection in its hello
// reply, or the reply did not match the hello. Want is the receiver
// incarnation the sender expected, Have the one the receiver named (zero if
// it named none); Local and Remote are the two sides' batch limits.
type HelloError struct {
	Addr          string
	Status        Status
	Want, Have    uint64
	Local, Remote kv.BatchLimits
	// Self is the sender's own identity (zero when insecure), which a
	// StatusForbidden refusal is about.
	Self trust.Identity
	// Ours and Theirs are the sender's and the receiver's model
	// fingerprints.
	Ours, Theirs engine.Fingerprint
}

func (e *HelloError) Error() string {
	switch e.Status {
	case StatusHelloIncarnation:
		return fmt.Sprintf("dataplane: data plane %s refused hello: expected incarnation %x, receiver is %x", e.Addr, e.Want, e.Have)
	case StatusHelloLimits:
		return fmt.Sprintf("dataplane: data plane %s refused hello: frame limits differ: local %d tokens × %d bytes, remote %d tokens × %d bytes",
			e.Addr, e.Local.Frame.PageTokens, e.Local.Frame.BytesPerToken, e.Remote.Frame.PageTokens, e.Remote.Frame.BytesPerToken)
	case StatusForbidden:
		return fmt.Sprintf("dataplane: data plane %s refused hello: %s (this node is %s)", e.Addr, e.Status, e.Self)
	case StatusHelloModel:
		return fmt.Sprintf("dataplane: data plane %s refused hello: the receiver computes model %s, this node %s", e.Addr, e.Theirs, e.Ours)
	}
	return fmt.Sprintf("dataplane: data plane %s refused hello: %s", e.Addr, e.Status)
}

// Unwrap gives, for a hello refused for its model, the
// *engine.FingerprintError that reaches the client as model_mismatch.
func (e *HelloError) Unwrap() error {
	if e.Status != StatusHelloModel {
		return nil
	}
	return &engine.FingerprintError{Ours: e.Ours, Theirs: e.Theirs}
}

func (e *HelloError) Is(target error) bool { return target == ErrRefused }

// Wire is what a client is told of e: a receiver at its connection limit
// is busy, one that restarted since the plan is lost to this transfer, one
// of another model is model_mismatch; any other refusal (a version, limits
// or certificate the two sides disagree on) is the cluster's own fault.
func (e *HelloError) Wire() *messages.WireError {
	w := &messages.WireError{Code: messages.CodeInternal, Message: e.Error(), Where: "data plane"}
	switch e.Status {
	case StatusBusy:
		w.Code = messages.CodeBusy
	case StatusHelloIncarnation:
		w.Code = messages.CodeNodeLost
	case StatusHelloModel:
		w.Code, w.Where = messages.CodeModelMismatch, "model fingerprint"
	}
	return w
}

// LostError: the connection broke (read or write error, timeout,
// protocol violation, the receiver closed it, or the sender was closed).
// Unacked batches were written and not acknowledged: the receiver may or
// may not have handed them on.
type LostError struct {
	Addr    string
	Unacked int
	Err     error
}

func (e *LostError) Error() string {
	return fmt.Sprintf("dataplane: data plane connection to %s lost with %d batches unacknowledged: %v", e.Addr, e.Unacked, e.Err)
}

func (e *LostError) Unwrap() error { return e.Err }

func (e *LostError) Is(target error) bool { return target == ErrLost }

// Wire is what a client is told of e: the node its KV was on its way to
// is lost to this transfer.
func (e *LostError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeNodeLost, Message: e.Error(), Where: "data plane"}
}

// DialError: no connection to the data plane at Addr came to be:
// the dial, the TLS handshake or the exchange of hellos (Stage) failed,
// with Err (refused, reset, cut short, timed out). Wire says what that
// makes the receiver to the transfer that needed it: busy or lost.
type DialError struct {
	Addr, Stage string
	Err         error
}

func (e *DialError) Error() string {
	return fmt.Sprintf("dataplane: data plane %s with %s: %v", e.Stage, e.Addr, e.Err)
}

func (e *DialError) Unwrap() error { return e.Err }

// Wire is what a client is told of e: the receiver is lost to the
// transfer that needed it.
func (e *DialError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeNodeLost, Message: e.Error(), Where: "data plane"}
}

// Cut says whether the receiver took the connection and then cut it
// (closed or reset it) in the TLS handshake or the hellos. An overloaded
// receiver does that to a handshake past its HelloTimeout, and one at
// HandshakesMax to a new connection, so a sender may dial again a few
// times; a receiver that refused the connection or never answered, or
// that cuts every one (it speaks no data plane, or not with TLS), is lost.
func (e *DialError) Cut() bool { return e.Stage != "dial" && dpCut(e.Err) }

// dpCut says whether err is the peer closing or resetting the connection.
func dpCut(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}

// ErrPeer is matched by *PeerError.
var ErrPeer = errors.New("dataplane: data plane receiver is not the node expected")

// PeerError: the receiver at Addr proved in the TLS handshake to
// be Have, and the sender expected Want (the node that planned the
// transfer). The sender wrote nothing on the connection, not even its
// hello: tags and tenants go only to the node that owns them.
type PeerError struct {
	Addr       string
	Want, Have trust.Identity
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("dataplane: data plane %s is %s, expected %s", e.Addr, e.Have, e.Want)
}

func (e *PeerError) Is(target error) bool { return target == ErrPeer }

// dpHello is a hello or a hello reply.
type dpHello struct {
	reply       bool
	version     uint8
	status      Status
	incarnation uint64 // the writer's
	expect      uint64 // the other side's, as the writer expects it
	limits      kv.BatchLimits
	model       engine.Fingerprint // the writer's
	reserved    bool               // a reserved field was non-zero
}

func (h *dpHello) encode() [dpHelloBytes]byte {
	var b [dpHelloBytes]byte
	le := binary.LittleEndian
	copy(b[:4], dpHelloMagic)
	if h.reply {
		copy(b[:4], dpReplyMagic)
	}
	b[4], b[5] = h.version, byte(h.status)
	le.PutUint64(b[8:], h.incarnation)
	le.PutUint64(b[16:], h.expect)
	le.PutUint32(b[24:], uint32(h.limits.PagesMax))
	le.PutUint32(b[28:], uint32(h.limits.Frame.PageTokens))
	le.PutUint32(b[32:], uint32(h.limits.Frame.BytesPerToken))
	le.PutUint64(b[40:], uint64(h.limits.BytesMax))
	copy(b[48:], h.model[:])
	return b
}

// decodeDPHello reads a hello (reply false) or a reply; it fails only on
// the wrong magic, and leaves range checks to the caller, which answers
// them with a status.
func decodeDPHello(b []byte, reply bool) (dpHello, error) {
	magic := dpHelloMagic
	if reply {
		magic = dpReplyMagic
	}
	if len(b) != dpHelloBytes || string(b[:4]) != magic {
		return dpHello{}, fmt.Errorf("dataplane: data plane hello: %d bytes starting %q, want %d starting %q",
			len(b), b[:min(4, len(b))], dpHelloBytes, magic)
	}
	le := binary.LittleEndian
	// Limits are read as uint32/uint64 and clamped so that int conversion
	// cannot wrap on any platform; the caller checks them against its own.
	clamp := func(v uint64) int { return int(min(v, 1<<40)) }
	var model engine.Fingerprint
	copy(model[:], b[48:])
	return dpHello{
		model:       model,
		reply:       reply,
		version:     b[4],
		status:      Status(b[5]),
		incarnation: le.Uint64(b[8:]),
		expect:      le.Uint64(b[16:]),
		limits: kv.BatchLimits{
			PagesMax: clamp(uint64(le.Uint32(b[24:]))),
			BytesMax: clamp(le.Uint64(b[40:])),
			Frame:    kv.FrameLimits{PageTokens: clamp(uint64(le.Uint32(b[28:]))), BytesPerToken: clamp(uint64(le.Uint32(b[32:])))},
		},
		reserved: le.Uint16(b[6:]) != 0 || le.Uint32(b[36:]) != 0,
	}, nil
}

// dpAck acknowledges one batch.
type dpAck struct {
	seq    uint64
	status Status
	frame  uint32 // dpNoFrame when the status is about the whole batch
	detail uint64
}

func (a *dpAck) encode() [dpAckBytes]byte {
	var b [dpAckBytes]byte
	le := binary.LittleEndian
	le.PutUint64(b[:], a.seq)
	b[8] = byte(a.status)
	le.PutUint32(b[12:], a.frame)
	le.PutUint64(b[16:], a.detail)
	return b
}

func decodeDPAck(b []byte) (dpAck, error) {
	le := binary.LittleEndian
	a := dpAck{seq: le.Uint64(b), status: Status(b[8]), frame: le.Uint32(b[12:]), detail: le.Uint64(b[16:])}
	if a.status >= dpStatusCount || b[9] != 0 || b[10] != 0 || b[11] != 0 {
		return dpAck{}, fmt.Errorf("dataplane: data plane acknowledgement of batch %d malformed: status %d, reserved %x",
			a.seq, b[8], b[9:12])
	}
	return a, nil
}

// tuneSocket applies SocketBufferBytes; a failure only leaves the default.
func (c Config) tuneSocket(conn net.Conn) {
	tc, ok := conn.(*net.TCPConn)
	if !ok || c.SocketBufferBytes == 0 {
		return
	}
	tc.SetReadBuffer(c.SocketBufferBytes)
	tc.SetWriteBuffer(c.SocketBufferBytes)
}
