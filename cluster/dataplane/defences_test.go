package dataplane

// Checks of the data plane's wire that the other side usually makes
// first: a sender checks the receiver's hello reply although an honest
// receiver refuses a mismatched hello itself; a reply, a hello and an
// acknowledgement with a reserved field set are refused. Each is played
// here against a peer that does not make the other side's check.

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
)

// scriptedReceiver answers one hello over a pipe with an honest
// receiver's reply changed by edit, then by raw on its bytes (either may be
// nil), and returns the sender's side of the pipe.
func scriptedReceiver(t *testing.T, edit func(*dpHello), raw func([]byte)) net.Conn {
	t.Helper()
	snd, rcv := net.Pipe()
	t.Cleanup(func() { snd.Close(); rcv.Close() })
	deadline := time.Now().Add(time.Minute)
	snd.SetDeadline(deadline)
	rcv.SetDeadline(deadline)
	cfg := dpTestConfig(t, dpReceiverInc)
	r := dpHello{reply: true, version: dpVersion, incarnation: dpReceiverInc, expect: dpSenderInc, limits: cfg.Batch,
		model: cfg.Model}
	if edit != nil {
		edit(&r)
	}
	out := r.encode()
	if raw != nil {
		raw(out[:])
	}
	go func() {
		var b [dpHelloBytes]byte
		if _, err := io.ReadFull(rcv, b[:]); err == nil { // else the sender's side fails the test
			rcv.Write(out[:])
		}
	}()
	return snd
}

// TestDataPlaneSenderChecksTheReply: a hello reply that says OK is still
// refused by the sender when it names another incarnation, model or frame
// geometry than the sender's, another version, or a reserved field set;
// and the limits the sender packs within are the smaller of both sides'.
func TestDataPlaneSenderChecksTheReply(t *testing.T) {
	g := dpGeom
	g.PageTokens *= 2
	for _, tc := range []struct {
		name string
		edit func(*dpHello)
		raw  func([]byte)
		want Status
	}{
		{"another incarnation", func(h *dpHello) { h.incarnation = dpReceiverInc + 1 }, nil, StatusHelloIncarnation},
		{"another model", func(h *dpHello) { h.model = engine.Fingerprint{0xee} }, nil, StatusHelloModel},
		{"another geometry", func(h *dpHello) {
			h.limits.Frame = g.Limits()
			h.limits.BytesMax = h.limits.Frame.FrameBytesMax()
		}, nil, StatusHelloLimits},
		{"another version", func(h *dpHello) { h.version = dpVersion + 1 }, nil, StatusHelloMalformed},
		{"reserved bytes 6-7", nil, func(b []byte) { b[6] = 1 }, StatusHelloMalformed},
		{"reserved bytes 36-39", nil, func(b []byte) { b[38] = 1 }, StatusHelloMalformed},
	} {
		conn := scriptedReceiver(t, tc.edit, tc.raw)
		_, err := dpHandshake(conn, dpTestConfig(t, dpSenderInc), "scripted", dpReceiverInc)
		var herr *HelloError
		if !errors.As(err, &herr) || herr.Status != tc.want {
			t.Errorf("%s: %v, want refused as %s", tc.name, err, tc.want)
		}
	}

	own := dpTestConfig(t, dpSenderInc).Batch
	for _, tc := range []struct {
		name               string
		pagesMax, bytesMax int
	}{
		{"a receiver of smaller batches", own.PagesMax - 1, own.BytesMax - own.Frame.FrameBytesMax()},
		{"a receiver of larger batches", own.PagesMax + 5, own.BytesMax * 4},
	} {
		conn := scriptedReceiver(t, func(h *dpHello) { h.limits.PagesMax, h.limits.BytesMax = tc.pagesMax, tc.bytesMax }, nil)
		lim, err := dpHandshake(conn, dpTestConfig(t, dpSenderInc), "scripted", dpReceiverInc)
		want := kv.BatchLimits{PagesMax: min(own.PagesMax, tc.pagesMax), BytesMax: min(own.BytesMax, tc.bytesMax), Frame: own.Frame}
		if err != nil || lim != want {
			t.Errorf("%s: limits %+v, %v; want the smaller of both sides', %+v", tc.name, lim, err, want)
		}
	}
}

// TestDataPlaneHelloReservedRefused: a hello with a reserved field set is
// answered malformed, and counted, however right the rest of it is.
func TestDataPlaneHelloReservedRefused(t *testing.T) {
	srv := dpListen(t, dpTestConfig(t, dpReceiverInc), (&dpRecorder{}).handle)
	for i, at := range []int{6, 7, 36, 39} {
		conn, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(time.Minute))
		h := dpHello{version: dpVersion, incarnation: dpSenderInc, expect: dpReceiverInc, limits: dpTestConfig(t, 1).Batch,
			model: testModel}
		b := h.encode()
		b[at] = 1
		conn.Write(b[:])
		var r [dpHelloBytes]byte
		_, err = io.ReadFull(conn, r[:])
		conn.Close()
		reply, derr := decodeDPHello(r[:], true)
		if err != nil || derr != nil || reply.status != StatusHelloMalformed {
			t.Fatalf("hello with byte %d set: reply %+v (%v, %v), want malformed", at, reply, err, derr)
		}
		if n := srv.Stats().RefusedHelloMalformed; n != uint64(i+1) {
			t.Fatalf("%d malformed hellos counted after %d", n, i+1)
		}
	}
}

// TestDataPlaneAckReservedRefused: an acknowledgement with a reserved byte
// set, or a status past the last, is refused by the sender's decoder.
func TestDataPlaneAckReservedRefused(t *testing.T) {
	good := (&dpAck{seq: 7, status: StatusOK, frame: dpNoFrame}).encode()
	if a, err := decodeDPAck(good[:]); err != nil || a.seq != 7 || a.status != StatusOK {
		t.Fatalf("a good acknowledgement: %+v, %v", a, err)
	}
	for _, at := range []int{9, 10, 11} {
		b := good
		b[at] = 1
		if a, err := decodeDPAck(b[:]); err == nil {
			t.Errorf("acknowledgement with byte %d set: %+v", at, a)
		}
	}
	b := good
	b[8] = byte(dpStatusCount)
	if a, err := decodeDPAck(b[:]); err == nil {
		t.Errorf("acknowledgement of status %d: %+v", dpStatusCount, a)
	}
	binary.LittleEndian.PutUint32(b[12:], 0) // any frame index decodes
	b[8] = byte(StatusRejected)
	if _, err := decodeDPAck(b[:]); err != nil {
		t.Errorf("a refusal: %v", err)
	}
}
