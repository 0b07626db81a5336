package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// dpGeom is a small geometry: 128 bytes a token, 512 bytes a page.
var dpGeom = kv.Geometry{Layers: 2, KVHeads: 2, HeadDim: 8, PageTokens: 4, DType: kv.F16}

const (
	dpSenderInc   = 0x5e4d
	dpReceiverInc = 0xdec0de
)

// dpTestConfig: batches of at most 3 full pages, 2 batches in flight,
// plain TCP (dpSecure makes it TLS).
func dpTestConfig(t testing.TB, inc uint64) Config {
	c := DefaultLocalConfig(dpGeom, inc)
	c.Model = testModel
	c.Batch.PagesMax = 3
	c.Batch.BytesMax = 3 * c.Batch.Frame.FrameBytesMax()
	c.InFlightMax = 2
	c.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	c.Auth = trust.Insecure(c.Logger)
	return c
}

// dpSecure is cfg with credentials for role/name from ca.
func dpSecure(t testing.TB, cfg Config, ca *trusttest.CA, role trust.Role, name string) Config {
	cfg.Auth = ca.Authority(t, role, name, cfg.Logger)
	return cfg
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// dpFrames makes n frames of request req for pages of incarnation dest,
// with random payloads and token counts (the last page of a prompt is
// often partial).
func dpFrames(rng *rand.Rand, n int, req uint64, dest uint64) []kv.Frame {
	frames := make([]kv.Frame, n)
	bpt := dpGeom.BytesPerToken()
	for i := range frames {
		tokens := 1 + rng.IntN(dpGeom.PageTokens)
		payload := make([]byte, tokens*bpt)
		for j := range payload {
			payload[j] = byte(rng.Uint32())
		}
		frames[i] = kv.Frame{
			Owner:      kv.Owner{Request: req, Tenant: fmt.Sprintf("tenant-%d", req%3)},
			Source:     kv.Tag{Incarnation: dpSenderInc, Index: uint32(i), Generation: 1 + rng.Uint64N(100)},
			Dest:       kv.Tag{Incarnation: dest, Index: uint32(100 + i), Generation: 1 + rng.Uint64N(100)},
			FirstToken: i * dpGeom.PageTokens,
			Tokens:     tokens,
			Payload:    payload,
		}
	}
	return frames
}

// dpRecorder is a handler that keeps a deep copy of every frame it is
// given, in arrival order.
type dpRecorder struct {
	mu     sync.Mutex
	frames []kv.Frame
	from   []uint64
	peer   []trust.Identity
}

func (r *dpRecorder) handle(b Batch) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range b.Frames {
		f.Payload = bytes.Clone(f.Payload)
		r.frames = append(r.frames, f)
		r.from = append(r.from, b.From)
		r.peer = append(r.peer, b.Peer)
	}
	return nil
}

func (r *dpRecorder) got() []kv.Frame {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]kv.Frame(nil), r.frames...)
}

func dpListen(t *testing.T, cfg Config, h Handler) *Server {
	t.Helper()
	s, err := Listen(cfg, "127.0.0.1:0", h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// dpDial dials srv expecting its identity (none when cfg is insecure).
func dpDial(t *testing.T, cfg Config, s *Server, peer uint64) *Sender {
	t.Helper()
	d, err := Dial(cfg, s.Addr().String(), peer, dpWant(cfg, s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// dpWant is the identity a sender configured by cfg expects at srv.
func dpWant(cfg Config, srv *Server) trust.Identity {
	if cfg.Auth.Insecure() {
		return trust.Identity{}
	}
	return srv.cfg.Auth.Self()
}

func dpEqualFrames(t *testing.T, got, want []kv.Frame) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("received %d frames, sent %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Owner != w.Owner || g.Source != w.Source || g.Dest != w.Dest || g.FirstToken != w.FirstToken ||
			g.Tokens != w.Tokens || g.Checksum != w.Checksum || !bytes.Equal(g.Payload, w.Payload) {
			t.Fatalf("frame %d: received %+v (payload %d bytes), sent %+v (payload %d bytes)",
				i, g, len(g.Payload), w, len(w.Payload))
		}
		if w.Checksum == 0 {
			t.Fatalf("frame %d: Send left the checksum zero", i)
		}
	}
}

// Over TLS with certificates of one cluster: every byte arrives, and every
// batch is handed on with the sender's proven identity.
func TestDataPlaneRoundTrip(t *testing.T) {
	ca := trusttest.New(t)
	rec := &dpRecorder{}
	srv := dpListen(t, dpSecure(t, dpTestConfig(t, dpReceiverInc), ca, trust.RoleDecode, "d0"), rec.handle)
	scfg := dpSecure(t, dpTestConfig(t, dpSenderInc), ca, trust.RolePrefill, "p0")
	snd := dpDial(t, scfg, srv, dpReceiverInc)
	rng := rand.New(rand.NewPCG(1, 2))
	frames := dpFrames(rng, 10, 42, dpReceiverInc)
	if err := snd.Send(context.Background(), frames); err != nil {
		t.Fatal(err)
	}
	dpEqualFrames(t, rec.got(), frames)
	for i, from := range rec.from {
		if from != dpSenderInc || rec.peer[i] != scfg.Auth.Self() {
			t.Fatalf("frame %d handed on as from %x, %s; sender is %x, %s", i, from, rec.peer[i], dpSenderInc, scfg.Auth.Self())
		}
	}
	ss, rs := snd.Stats(), srv.Stats()
	if ss.BatchesSent != 4 || ss.FramesSent != 10 || ss.BatchesAcked != 4 || ss.InFlight != 0 {
		t.Fatalf("sender stats %+v, want 4 batches (3+3+3+1 frames) sent and acknowledged", ss)
	}
	if rs.BatchesReceived != 4 || rs.BatchesAccepted != 4 || rs.FramesAccepted != 10 || rs.BytesReceived != ss.BytesSent {
		t.Fatalf("server stats %+v, sender sent %d bytes", rs, ss.BytesSent)
	}
	if err := snd.Send(context.Background(), nil); err != nil {
		t.Fatalf("empty Send: %v", err)
	}
}

// Several goroutines share one sender; each request's frames arrive whole
// and in order.
func TestDataPlaneConcurrentSend(t *testing.T) {
	rec := &dpRecorder{}
	srv := dpListen(t, dpTestConfig(t, dpReceiverInc), rec.handle)
	snd := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	const senders, rounds = 6, 5
	calls := make(map[uint64][][]kv.Frame)
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := range senders {
		rng := rand.New(rand.NewPCG(uint64(g), 7))
		req := uint64(g + 1)
		var all [][]kv.Frame
		for range rounds {
			fs := dpFrames(rng, 1+rng.IntN(8), req, dpReceiverInc)
			all = append(all, fs)
		}
		calls[req] = all
		wg.Go(func() {
			for _, fs := range all {
				if err := snd.Send(context.Background(), fs); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := make(map[uint64][]kv.Frame)
	for _, f := range rec.got() {
		got[f.Owner.Request] = append(got[f.Owner.Request], f)
	}
	// Compared after the Sends, which set the checksums.
	for req, all := range calls {
		dpEqualFrames(t, got[req], slices.Concat(all...))
	}
}

func TestDataPlaneWrongDestIncarnation(t *testing.T) {
	rec := &dpRecorder{}
	srv := dpListen(t, dpTestConfig(t, dpReceiverInc), rec.handle)
	snd := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	rng := rand.New(rand.NewPCG(3, 4))
	frames := dpFrames(rng, 5, 9, dpReceiverInc)
	const stale = dpReceiverInc - 1 // the receiver's previous self
	frames[4].Dest.Incarnation = stale

	err := snd.Send(context.Background(), frames)
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("Send = %v, want a *RefusedError", err)
	}
	if refused.Status != StatusWrongIncarnation || refused.Frame != 4 || refused.Detail != stale ||
		refused.First != 3 || refused.Count != 2 || !errors.Is(err, kv.ErrRefused) {
		t.Fatalf("refusal %+v: want frame 4 of batch [3, 5) naming incarnation %x", refused, stale)
	}
	t.Log(err)
	// The first batch was accepted; nothing of the refused one was handed on.
	dpEqualFrames(t, rec.got(), frames[:3])
	if rs := srv.Stats(); rs.RefusedWrongIncarnation != 1 || rs.BatchesAccepted != 1 {
		t.Fatalf("server stats %+v: want 1 batch refused for its incarnation, 1 accepted", rs)
	}
	// A refusal ends the connection; a sender dialed afresh is served.
	dpRequireLost(t, snd)
	more := dpFrames(rng, 2, 10, dpReceiverInc)
	if err := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc).Send(context.Background(), more); err != nil {
		t.Fatalf("Send on a new connection after a refusal: %v", err)
	}
}

// dpRequireLost checks that snd's connection is gone and Send says so.
func dpRequireLost(t *testing.T, snd *Sender) {
	t.Helper()
	select {
	case <-snd.Done():
	default:
		t.Fatal("sender still open after a refusal")
	}
	if err := snd.Send(context.Background(), dpFrames(rand.New(rand.NewPCG(1, 1)), 1, 1, dpReceiverInc)); !errors.Is(err, ErrLost) {
		t.Fatalf("Send after a refusal = %v, want the connection lost", err)
	}
}

func TestDataPlaneHandlerRefusal(t *testing.T) {
	stale := &kv.StaleTagError{Page: 3}
	var fail error = stale
	srv := dpListen(t, dpTestConfig(t, dpReceiverInc), func(Batch) error { return fail })
	snd := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	rng := rand.New(rand.NewPCG(5, 6))
	err := snd.Send(context.Background(), dpFrames(rng, 7, 1, dpReceiverInc))
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Status != StatusRejected || refused.First != 0 || refused.Frame != -1 {
		t.Fatalf("Send = %v, want batch [0, 3) rejected", err)
	}
	// The call stops writing after the refusal it sees; the window lets one
	// more batch out before the refusal comes back.
	if sent := snd.Stats().BatchesSent; sent > 2 {
		t.Fatalf("%d batches written, want at most InFlightMax (2) after a refusal", sent)
	}
	dpRequireLost(t, snd)
	fail = errors.New("disk on fire")
	snd = dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	err = snd.Send(context.Background(), dpFrames(rng, 1, 1, dpReceiverInc))
	if !errors.As(err, &refused) || refused.Status != StatusHandlerFailed {
		t.Fatalf("Send = %v, want handler failed", err)
	}
	if rs := srv.Stats(); rs.RefusedByHandler != 1 || rs.HandlerFailed != 1 {
		t.Fatalf("server stats %+v", rs)
	}
	dpRequireLost(t, snd)
}

func TestDataPlaneHelloRefused(t *testing.T) {
	rec := &dpRecorder{}
	srv := dpListen(t, dpTestConfig(t, dpReceiverInc), rec.handle)
	addr := srv.Addr().String()

	// A sender that still believes in the receiver's previous incarnation
	// (the node restarted) is refused: its destination tags are stale.
	_, err := Dial(dpTestConfig(t, dpSenderInc), addr, dpReceiverInc-1, trust.Identity{})
	var herr *HelloError
	if !errors.As(err, &herr) || herr.Status != StatusHelloIncarnation || herr.Want != dpReceiverInc-1 ||
		herr.Have != dpReceiverInc || !errors.Is(err, ErrRefused) {
		t.Fatalf("dial = %v, want hello refused for incarnation", err)
	}
	t.Log(err)

	// Another geometry.
	other := dpTestConfig(t, dpSenderInc)
	g := dpGeom
	g.PageTokens = 8
	other.Batch.Frame = g.Limits()
	other.Batch.BytesMax = other.Batch.Frame.FrameBytesMax()
	_, err = Dial(other, addr, dpReceiverInc, trust.Identity{})
	if !errors.As(err, &herr) || herr.Status != StatusHelloLimits {
		t.Fatalf("dial = %v, want hello refused for limits", err)
	}
	t.Log(err)

	// Another model: refused with both fingerprints, told to the client as
	// model_mismatch.
	otherModel := dpTestConfig(t, dpSenderInc)
	otherModel.Model = engine.Fingerprint{0xee}
	_, err = Dial(otherModel, addr, dpReceiverInc, trust.Identity{})
	var fp *engine.FingerprintError
	if !errors.As(err, &herr) || herr.Status != StatusHelloModel || !errors.As(err, &fp) ||
		fp.Ours != otherModel.Model || fp.Theirs != testModel || handoff.Wire(err).Code != messages.CodeModelMismatch ||
		!strings.Contains(err.Error(), testModel.String()) || !strings.Contains(err.Error(), otherModel.Model.String()) {
		t.Fatalf("dial = %v, want hello refused for the model, naming both fingerprints", err)
	}
	t.Log(err)

	// Not the protocol at all, and another version.
	for _, tc := range []struct {
		name  string
		hello func([]byte)
		reply bool
	}{
		{"garbage", func(b []byte) { copy(b, "GET / HTTP/1.1\r\n") }, false},
		{"version", func(b []byte) { b[4] = dpVersion + 1 }, true},
		{"zero sender", func(b []byte) { clear(b[8:16]) }, true},
		{"no model", func(b []byte) { clear(b[48:64]) }, true},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		h := dpHello{version: dpVersion, incarnation: dpSenderInc, expect: dpReceiverInc, limits: dpTestConfig(t, 1).Batch,
			model: testModel}
		b := h.encode()
		tc.hello(b[:])
		conn.Write(b[:])
		r, err := io.ReadAll(conn)
		conn.Close()
		if !tc.reply {
			if len(r) != 0 || err != nil {
				t.Fatalf("%s: reply %q, %v; want the connection closed without a reply", tc.name, r, err)
			}
			continue
		}
		hr, derr := decodeDPHello(r, true)
		if derr != nil || hr.status == StatusOK {
			t.Fatalf("%s: reply %+v, %v; want a refusal", tc.name, hr, derr)
		}
	}

	rs := srv.Stats()
	if rs.RefusedHelloIncarnation != 1 || rs.RefusedHelloLimits != 1 || rs.RefusedHelloVersion != 1 ||
		rs.RefusedHelloMalformed != 3 || rs.RefusedHelloModel != 1 || rs.BatchesReceived != 0 {
		t.Fatalf("server stats %+v", rs)
	}
	// Still serving.
	snd := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	if err := snd.Send(context.Background(), dpFrames(rand.New(rand.NewPCG(1, 1)), 1, 1, dpReceiverInc)); err != nil {
		t.Fatal(err)
	}
}

// dpRawConn dials srv as a sender configured by cfg and completes the
// hello by hand, so that the test can write any bytes as batches.
func dpRawConn(t *testing.T, srv *Server, cfg Config) net.Conn {
	t.Helper()
	raw, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	raw.SetDeadline(time.Now().Add(5 * time.Second))
	conn, _, err := dpClientTLS(raw, cfg, "raw", dpWant(cfg, srv))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dpHandshake(conn, cfg, "raw", dpReceiverInc); err != nil {
		t.Fatal(err)
	}
	raw.SetDeadline(time.Time{})
	return conn
}

func readAck(t *testing.T, conn net.Conn) dpAck {
	t.Helper()
	var b [dpAckBytes]byte
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		t.Fatalf("reading acknowledgement: %v", err)
	}
	a, err := decodeDPAck(b[:])
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Corrupted bytes on the wire close that connection only, counted; the
// server keeps serving another sender over the corruption.
func TestDataPlaneCorruptBatch(t *testing.T) {
	rec := &dpRecorder{}
	cfg := dpTestConfig(t, dpReceiverInc)
	srv := dpListen(t, cfg, rec.handle)
	good := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	rng := rand.New(rand.NewPCG(9, 9))
	frames := dpFrames(rng, 3, 77, dpReceiverInc)
	for i := range frames {
		frames[i].Tokens = dpGeom.PageTokens
		frames[i].Payload = make([]byte, dpGeom.PageBytes())
		for j := range frames[i].Payload {
			frames[i].Payload[j] = byte(rng.Uint32())
		}
	}
	batch, err := kv.AppendBatch(nil, frames, cfg.Batch)
	if err != nil {
		t.Fatal(err)
	}
	frameBytes := (len(batch) - dpBatchHeaderBytes) / 3

	type corruption struct {
		name string
		bit  int // bit of the batch to flip
	}
	var cases []corruption
	for _, bit := range []int{
		0,                                     // batch magic
		4 * 8,                                 // frame count
		8*8 + 3,                               // body length
		8*(dpBatchHeaderBytes+8) + 1,          // frame 0: request id
		8 * (dpBatchHeaderBytes + 36),         // frame 0: destination incarnation
		8*(dpBatchHeaderBytes+frameBytes) + 7, // frame 1: magic
		8*(len(batch)-1) + 5,                  // frame 2: last payload byte
	} {
		cases = append(cases, corruption{name: fmt.Sprintf("bit %d", bit), bit: bit})
	}
	for range 20 {
		cases = append(cases, corruption{name: "random", bit: rng.IntN(8 * len(batch))})
	}
	for _, c := range cases {
		before := srv.Stats()
		conn := dpRawConn(t, srv, dpTestConfig(t, dpSenderInc))
		// One good batch first: the connection works until the corruption.
		conn.Write(batch)
		if a := readAck(t, conn); a.seq != 0 || a.status != StatusOK {
			t.Fatalf("%s: good batch acknowledged %+v", c.name, a)
		}
		bad := bytes.Clone(batch)
		bad[c.bit/8] ^= 1 << (c.bit % 8)
		conn.Write(bad)
		// A body length made shorter leaves the server waiting for a
		// batch that never comes whole: closing the write side ends it.
		conn.(*net.TCPConn).CloseWrite()
		var b [dpAckBytes]byte
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := io.ReadFull(conn, b[:])
		if n == dpAckBytes {
			a, derr := decodeDPAck(b[:])
			if derr != nil || a.seq != 1 || a.status != StatusMalformed {
				t.Fatalf("%s: corrupted batch acknowledged %+v (%v)", c.name, a, derr)
			}
			if rest, _ := io.ReadAll(conn); len(rest) != 0 {
				t.Fatalf("%s: %d bytes after the refusal, want the connection closed", c.name, len(rest))
			}
		} else if n != 0 || err != io.EOF {
			t.Fatalf("%s: read %d bytes, %v; want a refusal or a close", c.name, n, err)
		}
		after := srv.Stats()
		closed := (after.MalformedChecksum + after.MalformedOther + after.ReadErrors) -
			(before.MalformedChecksum + before.MalformedOther + before.ReadErrors)
		if closed != 1 || after.BatchesAccepted != before.BatchesAccepted+1 {
			// The counter moves before the acknowledgement is written or the
			// connection closed, so it has moved by now.
			t.Fatalf("%s: stats before %+v after %+v: want one connection closed for its bytes", c.name, before, after)
		}
		// The other connection is unaffected.
		if err := good.Send(context.Background(), dpFrames(rng, 2, 5, dpReceiverInc)); err != nil {
			t.Fatalf("%s: good sender after corruption: %v", c.name, err)
		}
	}
	rs := srv.Stats()
	t.Logf("server stats after %d corruptions: %+v", len(cases), rs)
	if rs.MalformedChecksum == 0 || rs.MalformedOther == 0 {
		t.Fatalf("want both checksum and other malformed batches counted: %+v", rs)
	}
}

// A batch cut short by the sender's close is a read error, not a crash.
func TestDataPlaneTruncatedBatch(t *testing.T) {
	cfg := dpTestConfig(t, dpReceiverInc)
	srv := dpListen(t, cfg, (&dpRecorder{}).handle)
	batch, err := kv.AppendBatch(nil, dpFrames(rand.New(rand.NewPCG(1, 3)), 2, 1, dpReceiverInc), cfg.Batch)
	if err != nil {
		t.Fatal(err)
	}
	conn := dpRawConn(t, srv, dpTestConfig(t, dpSenderInc))
	conn.Write(batch[:len(batch)/2])
	conn.(*net.TCPConn).CloseWrite()
	if n, err := io.ReadAll(conn); len(n) != 0 || err != nil {
		t.Fatalf("read %d bytes, %v; want a close", len(n), err)
	}
	if rs := srv.Stats(); rs.ReadErrors != 1 || rs.BatchesReceived != 0 {
		t.Fatalf("server stats %+v", rs)
	}
}

// With a handler that blocks, Send blocks once InFlightMax batches are
// unacknowledged, and so does a second Send on the same sender; releasing
// the handler lets both finish.
func TestDataPlaneBackPressure(t *testing.T) {
	cfg := dpTestConfig(t, dpReceiverInc)
	entered := make(chan uint64, 16)
	release := make(chan struct{})
	rec := &dpRecorder{}
	srv := dpListen(t, cfg, func(b Batch) error {
		entered <- b.Seq
		<-release
		return rec.handle(b)
	})
	scfg := dpTestConfig(t, dpSenderInc)
	scfg.Batch.PagesMax = 1 // one frame a batch
	snd := dpDial(t, scfg, srv, dpReceiverInc)
	windowFull := make(chan struct{}, 16)
	snd.testWindowFull = func() { windowFull <- struct{}{} }

	rng := rand.New(rand.NewPCG(11, 12))
	first := dpFrames(rng, 5, 1, dpReceiverInc)
	second := dpFrames(rng, 1, 2, dpReceiverInc)
	done1, done2 := make(chan error, 1), make(chan error, 1)
	go func() { done1 <- snd.Send(context.Background(), first) }()

	if seq := testwait.Recv(t, "the handler entered", eventDeadline, entered); seq != 0 {
		t.Fatalf("handler entered for batch %d first", seq)
	}
	testwait.Recv(t, "the window full", eventDeadline, windowFull)
	if st := snd.Stats(); st.InFlight != uint64(scfg.InFlightMax) || st.BatchesSent > uint64(scfg.InFlightMax) {
		t.Fatalf("window full with stats %+v, want exactly InFlightMax (%d) batches in flight", st, scfg.InFlightMax)
	}
	select {
	case err := <-done1:
		t.Fatalf("Send returned (%v) while its batches wait for a blocked handler", err)
	default:
	}

	go func() { done2 <- snd.Send(context.Background(), second) }()
	testwait.Recv(t, "the window full", eventDeadline, windowFull)
	if st := snd.Stats(); st.InFlight != uint64(scfg.InFlightMax) || st.BatchesSent > uint64(scfg.InFlightMax) {
		t.Fatalf("second Send found the window full with stats %+v", st)
	}
	select {
	case err := <-done2:
		t.Fatalf("second Send returned (%v) past a full window", err)
	case err := <-done1:
		t.Fatalf("first Send returned (%v) past a full window", err)
	default:
	}
	// A Send whose context ends while it waits for the window gives up.
	ctx, cancel := context.WithCancel(context.Background())
	done3 := make(chan error, 1)
	go func() { done3 <- snd.Send(ctx, dpFrames(rng, 1, 3, dpReceiverInc)) }()
	testwait.Recv(t, "the window full", eventDeadline, windowFull)
	cancel()
	if err := testwait.Recv(t, "the cancelled Send", eventDeadline, done3); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Send = %v", err)
	}

	close(release)
	if err := testwait.Recv(t, "the first Send", eventDeadline, done1); err != nil {
		t.Fatal(err)
	}
	if err := testwait.Recv(t, "the second Send", eventDeadline, done2); err != nil {
		t.Fatal(err)
	}
	if got := len(rec.got()); got != 6 {
		t.Fatalf("handler accepted %d frames, want 6", got)
	}
	if st := snd.Stats(); st.InFlight != 0 || st.BatchesAcked != 6 {
		t.Fatalf("stats after release %+v", st)
	}
}

// Closing the server closes its connections at once, even while a handler
// is busy: the sender's Send fails with the connection lost.
func TestDataPlaneServerClosed(t *testing.T) {
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	srv, err := Listen(dpTestConfig(t, dpReceiverInc), "127.0.0.1:0", func(b Batch) error {
		entered <- struct{}{}
		<-release
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	snd := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	done := make(chan error, 1)
	go func() {
		done <- snd.Send(context.Background(), dpFrames(rand.New(rand.NewPCG(1, 1)), 2, 1, dpReceiverInc))
	}()
	testwait.Recv(t, "the handler entered", eventDeadline, entered)
	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()

	err = testwait.Recv(t, "Send to return", eventDeadline, done)
	var lost *LostError
	if !errors.As(err, &lost) || !errors.Is(err, ErrLost) || lost.Unacked != 1 {
		t.Fatalf("Send = %v, want the connection lost with 1 batch unacknowledged", err)
	}
	t.Log(err)
	testwait.Recv(t, "the sender done", eventDeadline, snd.Done())
	close(release)
	if err := testwait.Recv(t, "the server closed", eventDeadline, closed); err != nil {
		t.Fatal(err)
	}
	// Every later Send fails the same way, without waiting.
	if err := snd.Send(context.Background(), dpFrames(rand.New(rand.NewPCG(1, 1)), 1, 1, dpReceiverInc)); !errors.Is(err, ErrLost) {
		t.Fatalf("Send after loss = %v", err)
	}
	if _, err := Dial(dpTestConfig(t, dpSenderInc), srv.Addr().String(), dpReceiverInc, trust.Identity{}); err == nil {
		t.Fatal("dial to a closed server succeeded")
	}
}

func TestDataPlaneBusyAndIdle(t *testing.T) {
	cfg := dpTestConfig(t, dpReceiverInc)
	cfg.ConnectionsMax, cfg.ConnectionsPerPeerMax = 1, 1
	cfg.IdleTimeout = 200 * time.Millisecond
	entered, release := make(chan struct{}, 1), make(chan struct{})
	srv := dpListen(t, cfg, func(Batch) error { entered <- struct{}{}; <-release; return nil })
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free) // before the server's Close, which waits for the handler
	first := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	sent := make(chan error, 1)
	go func() {
		sent <- first.Send(context.Background(), dpFrames(rand.New(rand.NewPCG(1, 1)), 1, 1, dpReceiverInc))
	}()
	// While its batch is handled, the first connection is served and not
	// idle, however long the second dial takes: that one is busy.
	testwait.Recv(t, "the handler entered", eventDeadline, entered)
	_, err := Dial(dpTestConfig(t, dpSenderInc), srv.Addr().String(), dpReceiverInc, trust.Identity{})
	var herr *HelloError
	if !errors.As(err, &herr) || herr.Status != StatusBusy {
		t.Fatalf("second dial = %v, want busy", err)
	}
	if w := herr.Wire(); w.Code != messages.CodeBusy || w.Where != "data plane" {
		t.Fatalf("a busy receiver reaches the client as %+v, want busy from the data plane", w)
	}
	free()
	if err := testwait.Recv(t, "Send on the served connection", eventDeadline, sent); err != nil {
		t.Fatalf("Send on the served connection: %v", err)
	}
	// Then nothing is sent: the connection idles out.
	select {
	case <-first.Done():
	case <-time.After(eventDeadline):
		t.Fatalf("connection not closed within %s of IdleTimeout (%s) without batches", eventDeadline, cfg.IdleTimeout)
	}
	if !errors.Is(first.Err(), ErrLost) {
		t.Fatalf("idle sender Err = %v", first.Err())
	}
	if rs := srv.Stats(); rs.RefusedBusy != 1 || rs.IdleClosed != 1 {
		t.Fatalf("server stats %+v", rs)
	}
}

// TestDataPlaneHelloCut: a receiver that takes the connection and closes
// or resets it before it answers the hello (an overloaded process whose
// HelloTimeout ran out, or one at HandshakesMax) cut it, which a prefill
// worker dials again a few times; one that refuses the connection did not.
// Either is lost to the transfer when it gives up, never internal.
func TestDataPlaneHelloCut(t *testing.T) {
	for _, reset := range []bool{false, true} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(eventDeadline))
			io.ReadFull(c, make([]byte, dpHelloBytes))
			if reset {
				c.(*net.TCPConn).SetLinger(0) // the close sends RST
			}
			c.Close()
		}()
		_, err = Dial(dpTestConfig(t, dpSenderInc), ln.Addr().String(), dpReceiverInc, trust.Identity{})
		var derr *DialError
		if !errors.As(err, &derr) || derr.Stage != "hello reply" {
			t.Fatalf("reset %t: dial = %v, want the hello reply cut", reset, err)
		}
		if w := derr.Wire(); !derr.Cut() || w.Code != messages.CodeNodeLost {
			t.Fatalf("reset %t: a hello cut is cut %t and reaches the client as %+v, want cut and node_lost", reset, derr.Cut(), w)
		}
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close() // nothing listens there now
	_, err = Dial(dpTestConfig(t, dpSenderInc), closed.Addr().String(), dpReceiverInc, trust.Identity{})
	var derr *DialError
	if !errors.As(err, &derr) || derr.Stage != "dial" || derr.Cut() || derr.Wire().Code != messages.CodeNodeLost {
		t.Fatalf("dial where nothing listens = %v, want the receiver lost", err)
	}
}

func TestDataPlaneAckTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := dpListen(t, dpTestConfig(t, dpReceiverInc), func(Batch) error { <-release; return nil })
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for the handler
	scfg := dpTestConfig(t, dpSenderInc)
	scfg.AckTimeout = 50 * time.Millisecond
	snd := dpDial(t, scfg, srv, dpReceiverInc)
	err := snd.Send(context.Background(), dpFrames(rand.New(rand.NewPCG(1, 1)), 1, 1, dpReceiverInc))
	if !errors.Is(err, ErrLost) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Send = %v, want lost on a timeout", err)
	}
}

func TestDataPlaneConfigValidate(t *testing.T) {
	def := DefaultConfig(kv.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, PageTokens: 16, DType: kv.F16}, 1)
	def.Auth, def.Model = trust.Insecure(nil), testModel
	if err := def.Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	for _, tc := range []struct {
		want string
		edit func(*Config)
	}{
		{"Incarnation must be non-zero", func(c *Config) { c.Incarnation = 0 }},
		{"Model (the model fingerprint) must be set", func(c *Config) { c.Model = engine.Fingerprint{} }},
		{"InFlightMax (0)", func(c *Config) { c.InFlightMax = 0 }},
		{"InFlightMax (5000)", func(c *Config) { c.InFlightMax = 5000 }},
		{"PagesMax (0)", func(c *Config) { c.Batch.PagesMax = 0 }},
		{"BytesMax (100) must hold one full-page frame", func(c *Config) { c.Batch.BytesMax = 100 }},
		{"page tokens 0", func(c *Config) { c.Batch.Frame.PageTokens = 0 }},
		{"WriteTimeout (0s)", func(c *Config) { c.WriteTimeout = 0 }},
		{"IdleTimeout (-1s)", func(c *Config) { c.IdleTimeout = -time.Second }},
		{"ConnectionsMax (0)", func(c *Config) { c.ConnectionsMax = 0 }},
		{"HelloTimeout (0s)", func(c *Config) { c.HelloTimeout = 0 }},
		{"ConnectionsPerPeerMax (0) must be in [1, ConnectionsMax (32)]", func(c *Config) { c.ConnectionsPerPeerMax = 0 }},
		{"ConnectionsPerPeerMax (33) must be in [1, ConnectionsMax (32)]", func(c *Config) { c.ConnectionsPerPeerMax = 33 }},
		{"HandshakesMax (0)", func(c *Config) { c.HandshakesMax = 0 }},
		{"HandshakesReserved (128) must be in [0, HandshakesMax (128))", func(c *Config) { c.HandshakesReserved = 128 }},
		{"HandshakesPerAddrMax (97) must be in [1, HandshakesMax (128) - HandshakesReserved (32)]",
			func(c *Config) { c.HandshakesPerAddrMax = 97 }},
		{"Auth is required", func(c *Config) { c.Auth = nil }},
		{"exceeds ServerBufferBytesMax (1000)", func(c *Config) { c.ServerBufferBytesMax = 1000 }},
	} {
		c := dpTestConfig(t, 1)
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want %q", err, tc.want)
		}
		if _, lerr := Listen(c, "127.0.0.1:0", (&dpRecorder{}).handle); lerr == nil {
			t.Errorf("Listen accepted a config with %q", tc.want)
		}
	}
}

// Frames that kv would refuse to encode fail before anything is written.
func TestDataPlaneSendInvalidFrame(t *testing.T) {
	srv := dpListen(t, dpTestConfig(t, dpReceiverInc), (&dpRecorder{}).handle)
	snd := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	rng := rand.New(rand.NewPCG(1, 1))
	for name, edit := range map[string]func(*kv.Frame){
		"payload": func(f *kv.Frame) { f.Payload = f.Payload[1:] },
		"tokens":  func(f *kv.Frame) { f.Tokens = dpGeom.PageTokens + 1 },
		"owner":   func(f *kv.Frame) { f.Owner.Tenant = "" },
	} {
		frames := dpFrames(rng, 4, 1, dpReceiverInc)
		edit(&frames[3])
		if err := snd.Send(context.Background(), frames); err == nil {
			t.Fatalf("%s: Send accepted an invalid frame", name)
		}
		if sent := snd.Stats().BatchesSent; sent != 0 {
			t.Fatalf("%s: %d batches written before the invalid frame was refused", name, sent)
		}
	}
}

// Payloads are written from where they lie: frames of one batch with
// tenants of different lengths (so headers of different lengths), payloads
// that overlap in one buffer, and a payload sent twice all arrive intact,
// and the handler is called once at a time, in batch order.
func TestDataPlaneAliasedPayloads(t *testing.T) {
	var (
		mu     sync.Mutex
		inside int
		next   uint64
		bad    error
	)
	rec := &dpRecorder{}
	srv := dpListen(t, dpTestConfig(t, dpReceiverInc), func(b Batch) error {
		mu.Lock()
		inside++
		if inside > 1 && bad == nil {
			bad = fmt.Errorf("handler entered for batch %d while another call runs", b.Seq)
		}
		if b.Seq != next && bad == nil {
			bad = fmt.Errorf("handler called for batch %d, want %d", b.Seq, next)
		}
		next++
		mu.Unlock()
		time.Sleep(time.Millisecond) // let the reader get ahead
		err := rec.handle(b)
		mu.Lock()
		inside--
		mu.Unlock()
		return err
	})
	snd := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	rng := rand.New(rand.NewPCG(21, 22))
	bpt := dpGeom.BytesPerToken()
	arena := make([]byte, 3*dpGeom.PageBytes())
	for i := range arena {
		arena[i] = byte(rng.Uint32())
	}
	frames := dpFrames(rng, 11, 7, dpReceiverInc)
	for i := range frames {
		f := &frames[i]
		f.Owner.Tenant = strings.Repeat(string(rune('a'+i)), 1+(i*23)%kv.TenantBytesMax)
		off := (i * bpt / 2) % (len(arena) - len(f.Payload))
		f.Payload = arena[off : off+len(f.Payload)]
	}
	frames[5].Payload = frames[2].Payload[:len(frames[5].Payload):len(frames[5].Payload)]
	frames[5].Tokens = len(frames[5].Payload) / bpt
	if len(frames[5].Payload) > len(frames[2].Payload) {
		frames[5].Payload, frames[5].Tokens = frames[2].Payload, frames[2].Tokens
	}
	snapshot := bytes.Clone(arena)
	for round := range 3 {
		rec.mu.Lock()
		rec.frames, rec.from, rec.peer = nil, nil, nil
		rec.mu.Unlock()
		if err := snd.Send(context.Background(), frames); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		dpEqualFrames(t, rec.got(), frames)
	}
	if !bytes.Equal(arena, snapshot) {
		t.Fatal("Send changed the payloads it was given")
	}
	mu.Lock()
	defer mu.Unlock()
	if bad != nil {
		t.Fatal(bad)
	}
	if want := uint64(3 * 4); next != want { // 11 frames in batches of 3
		t.Fatalf("handler called for %d batches, want %d", next, want)
	}
}

// A handler that runs longer than IdleTimeout does not make its connection
// idle: the reader, waiting for the next batch meanwhile, counts idleness
// only from the last acknowledgement. A batch sent while the handler is
// busy, after more than IdleTimeout without one, is still read.
func TestDataPlaneSlowHandlerNotIdle(t *testing.T) {
	cfg := dpTestConfig(t, dpReceiverInc)
	cfg.IdleTimeout = 200 * time.Millisecond
	entered, release := make(chan struct{}, 1), make(chan struct{})
	rec := &dpRecorder{}
	srv := dpListen(t, cfg, func(b Batch) error {
		if b.Seq == 0 {
			entered <- struct{}{}
			<-release
		}
		return rec.handle(b)
	})
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free)
	snd := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	rng := rand.New(rand.NewPCG(5, 5))
	first, second := dpFrames(rng, 1, 1, dpReceiverInc), dpFrames(rng, 1, 2, dpReceiverInc)
	done := make(chan error, 2)
	go func() { done <- snd.Send(context.Background(), first) }()
	testwait.Recv(t, "the handler entered", eventDeadline, entered)
	// The pause is the scenario: more than IdleTimeout without an
	// acknowledgement. However long it lasts, the handler is still busy:
	// it holds the first batch until the second is being written.
	time.Sleep(2 * cfg.IdleTimeout)
	go func() { done <- snd.Send(context.Background(), second) }()
	testwait.For(t, "the second batch written while the handler is busy", eventDeadline, func() bool {
		return snd.Stats().BatchesSent == 2
	})
	free()
	for range 2 {
		if err := testwait.Recv(t, "Send to return", eventDeadline, done); err != nil {
			t.Fatalf("Send while the handler is busy past IdleTimeout: %v", err)
		}
	}
	dpEqualFrames(t, rec.got(), slices.Concat(first, second))
	if rs := srv.Stats(); rs.IdleClosed != 0 {
		t.Fatalf("server stats %+v: connection closed as idle while its handler ran", rs)
	}
	// Then, with nothing sent, it is idle.
	select {
	case <-snd.Done():
	case <-time.After(eventDeadline):
		t.Fatal("connection not closed after IdleTimeout without batches")
	}
	if rs := srv.Stats(); rs.IdleClosed != 1 {
		t.Fatalf("server stats %+v, want the connection closed as idle", rs)
	}
}

// A Send whose context ends after its batches were written returns the
// context's error while the handler still holds them; the sender stays
// usable.
func TestDataPlaneSendCancelledAfterWrite(t *testing.T) {
	entered := make(chan struct{}, 4)
	release := make(chan struct{})
	srv := dpListen(t, dpTestConfig(t, dpReceiverInc), func(Batch) error {
		entered <- struct{}{}
		<-release
		return nil
	})
	snd := dpDial(t, dpTestConfig(t, dpSenderInc), srv, dpReceiverInc)
	rng := rand.New(rand.NewPCG(8, 8))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- snd.Send(ctx, dpFrames(rng, 6, 1, dpReceiverInc)) }()
	testwait.Recv(t, "the handler entered", eventDeadline, entered)
	cancel()
	if err := testwait.Recv(t, "the cancelled Send", eventDeadline, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Send = %v, want cancelled", err)
	}
	close(release)
	if err := snd.Send(context.Background(), dpFrames(rng, 2, 2, dpReceiverInc)); err != nil {
		t.Fatalf("Send after a cancelled one: %v", err)
	}
}

// A dial to a data plane nobody serves fails with a DialError.
func TestDialNobodyIsADialError(t *testing.T) {
	_, err := Dial(dpTestConfig(t, dpSenderInc), trusttest.ClosedAddr(t), dpReceiverInc, trust.Identity{})
	var de *DialError
	if !errors.As(err, &de) || de.Stage != "dial" || handoff.Wire(err).Code != messages.CodeNodeLost {
		t.Fatalf("dial of a closed port: %v, want a dial error told as node_lost", err)
	}
}
