package kv

import (
	"bytes"
	"errors"
	"testing"
)

var testLimits = testGeom.Limits()

func testFrame(tokens int) Frame {
	payload := make([]byte, tokens*testGeom.BytesPerToken())
	for i := range payload {
		payload[i] = byte(i*7 + 3)
	}
	return Frame{
		Owner:      alice,
		Source:     Tag{Incarnation: 0xBEEF, Index: 3, Generation: 9},
		Dest:       Tag{Incarnation: testIncarnation, Index: 1, Generation: 1},
		FirstToken: 4,
		Tokens:     tokens,
		Payload:    payload,
	}
}

func encode(t testing.TB, f Frame) []byte {
	t.Helper()
	b, _, err := AppendFrame(nil, &f, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFrameRoundTrip(t *testing.T) {
	for tokens := 1; tokens <= testGeom.PageTokens; tokens++ {
		f := testFrame(tokens)
		b, sum, err := AppendFrame([]byte("prefix"), &f, testLimits)
		if err != nil {
			t.Fatal(err)
		}
		got, n, err := DecodeFrame(b[6:], testLimits)
		if err != nil {
			t.Fatal(err)
		}
		if n != len(b)-6 || got.Checksum != sum || got.Owner != f.Owner || got.Source != f.Source ||
			got.Dest != f.Dest || got.FirstToken != 4 || got.Tokens != tokens || !bytes.Equal(got.Payload, f.Payload) {
			t.Fatalf("round trip of %d tokens: %+v", tokens, got)
		}
	}
}

func TestFrameEncodeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*Frame)
	}{
		{"no tokens", func(f *Frame) { f.Tokens = 0; f.Payload = nil }},
		{"more than a page", func(f *Frame) { f.Tokens = 5; f.Payload = make([]byte, 5*testGeom.BytesPerToken()) }},
		{"payload off by one", func(f *Frame) { f.Payload = f.Payload[:len(f.Payload)-1] }},
		{"negative position", func(f *Frame) { f.FirstToken = -1 }},
		{"empty tenant", func(f *Frame) { f.Owner.Tenant = "" }},
		{"request zero", func(f *Frame) { f.Owner.Request = 0 }},
	} {
		f := testFrame(2)
		tc.mut(&f)
		if b, _, err := AppendFrame(nil, &f, testLimits); err == nil || len(b) != 0 {
			t.Errorf("%s: encoded %d bytes, err %v", tc.name, len(b), err)
		}
	}
}

// TestFrameEveryBitFlipRefused flips each bit of a valid frame in turn: the
// decoder must refuse every one, as malformed or by checksum.
func TestFrameEveryBitFlipRefused(t *testing.T) {
	b := encode(t, testFrame(2))
	for bit := 0; bit < len(b)*8; bit++ {
		c := bytes.Clone(b)
		c[bit/8] ^= 1 << (bit % 8)
		f, _, err := DecodeFrame(c, testLimits)
		if err == nil {
			t.Fatalf("bit %d flipped: accepted %+v", bit, f)
		}
		// Lengths that grew ask for more bytes; nothing else may be short.
		if errors.Is(err, ErrFrameShort) {
			c = append(c, make([]byte, testLimits.FrameBytesMax())...)
			if _, _, err = DecodeFrame(c, testLimits); err == nil {
				t.Fatalf("bit %d flipped, padded: accepted", bit)
			}
		}
	}
}

func TestFrameShortAndGarbage(t *testing.T) {
	b := encode(t, testFrame(3))
	for n := 0; n < len(b); n++ {
		_, _, err := DecodeFrame(b[:n], testLimits)
		var short *FrameShortError
		if !errors.As(err, &short) || short.Have != n || short.Need <= n {
			t.Fatalf("prefix of %d bytes: %v", n, err)
		}
	}
	var fe *FrameError
	if _, _, err := DecodeFrame([]byte("GET / HTTP/1.1\r\n"), testLimits); !errors.As(err, &fe) || fe.Field != "magic" {
		t.Fatalf("garbage: %v", err)
	}
	if _, _, err := DecodeFrame([]byte("KVF\x02"), testLimits); !errors.As(err, &fe) {
		t.Fatalf("wrong prefix: %v", err)
	}
	// A frame for bigger pages is refused by a decoder of smaller ones.
	small := testLimits
	small.PageTokens = 2
	if _, _, err := DecodeFrame(b, small); !errors.As(err, &fe) || fe.Field != "payload length" || fe.Value != 384 || fe.Limit != 256 {
		t.Fatalf("oversized frame: %v", err)
	}
}

func TestAcceptChecksDestination(t *testing.T) {
	p := newTestPool(t, 4)
	aTags, _ := p.Reserve(alice, 0, 2, t0)
	bTags, _ := p.Reserve(bob, 0, 1, t0)
	send := func(f Frame) error {
		t.Helper()
		b := encode(t, f)
		got, _, err := DecodeFrame(b, testLimits)
		if err != nil {
			t.Fatal(err)
		}
		return p.Accept(&got)
	}
	f := testFrame(4)
	f.FirstToken = 0
	f.Dest = bTags[0] // misdirected: alice's bytes to bob's page
	if err := send(f); !errors.As(err, new(*WrongTenantError)) {
		t.Fatalf("misdirected frame: %v", err)
	}
	f.Dest = aTags[1] // alice's page for positions 4..7, frame for 0..3
	if err := send(f); !errors.As(err, new(*TokenRangeError)) {
		t.Fatalf("frame for the wrong position: %v", err)
	}
	f.Dest = aTags[0]
	if err := send(f); err != nil {
		t.Fatal(err)
	}
	if err := send(f); !errors.As(err, new(*TokenRangeError)) { // duplicate
		t.Fatalf("duplicate frame: %v", err)
	}
	if _, err := p.Seal(aTags[0], alice); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Release(aTags[0], alice, t0); err != nil {
		t.Fatal(err)
	}
	if err := send(f); !errors.As(err, new(*StaleTagError)) { // late, after release
		t.Fatalf("late frame: %v", err)
	}
}

func TestBatch(t *testing.T) {
	lim := BatchLimits{PagesMax: 3, BytesMax: 3 * testLimits.FrameBytesMax(), Frame: testLimits}
	if err := lim.Validate(); err != nil {
		t.Fatal(err)
	}
	frames := []Frame{testFrame(4), testFrame(1), testFrame(2)}
	b, err := AppendBatch(nil, frames, lim)
	if err != nil {
		t.Fatal(err)
	}
	got, n, err := DecodeBatch(b, lim)
	if err != nil || n != len(b) || len(got) != 3 || got[1].Tokens != 1 || !bytes.Equal(got[2].Payload, frames[2].Payload) {
		t.Fatalf("batch round trip: %d frames, %d of %d bytes, %v", len(got), n, len(b), err)
	}
	if _, err := AppendBatch(nil, append(frames, testFrame(1)), lim); err == nil {
		t.Fatal("batch of 4 frames over PagesMax 3 encoded")
	}
	tight := lim
	tight.BytesMax = testLimits.FrameBytesMax()
	if _, err := AppendBatch(nil, frames, tight); err == nil {
		t.Fatal("batch over BytesMax encoded")
	}
	if _, _, err := DecodeBatch(b, tight); err == nil {
		t.Fatal("batch over BytesMax decoded")
	}
	for bit := 0; bit < BatchHeaderBytes*8; bit++ {
		c := bytes.Clone(b)
		c[bit/8] ^= 1 << (bit % 8)
		if _, _, err := DecodeBatch(append(c, make([]byte, 4096)...), lim); err == nil {
			t.Fatalf("batch header bit %d flipped: accepted", bit)
		}
	}
	if err := (BatchLimits{PagesMax: 1, BytesMax: 10, Frame: testLimits}).Validate(); err == nil {
		t.Fatal("batch limits below one frame validated")
	}
}

func FuzzDecodeFrame(f *testing.F) {
	for tokens := 1; tokens <= 4; tokens++ {
		f.Add(encode(f, testFrame(tokens)), uint8(0))
	}
	f.Add([]byte("KVF1"), uint8(2))
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		fr, n, err := DecodeFrame(b, testLimits)
		if err != nil {
			return
		}
		// An accepted frame re-encodes to the same bytes, is within the
		// limits, and decodes the same when it arrives in two pieces.
		re := encode(t, fr)
		if !bytes.Equal(re, b[:n]) {
			t.Fatalf("re-encoding differs")
		}
		c := min(int(cut), n)
		if _, _, err := DecodeFrame(b[:c], testLimits); c < n && !errors.Is(err, ErrFrameShort) {
			t.Fatalf("first %d of %d bytes: %v", c, n, err)
		}
	})
}

func FuzzDecodeBatch(f *testing.F) {
	lim := BatchLimits{PagesMax: 3, BytesMax: 3 * testLimits.FrameBytesMax(), Frame: testLimits}
	b, err := AppendBatch(nil, []Frame{testFrame(4), testFrame(1)}, lim)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("KVB1\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		frames, n, err := DecodeBatch(b, lim)
		if err != nil {
			return
		}
		re, err := AppendBatch(nil, frames, lim)
		if err != nil || !bytes.Equal(re, b[:n]) {
			t.Fatalf("accepted batch does not re-encode: %v", err)
		}
	})
}

// TestFrameHeaderThenPayload: a header written alone, followed by the
// payload, is the frame AppendFrame writes; and a batch header counted by
// hand leads the same batch as AppendBatch's.
func TestFrameHeaderThenPayload(t *testing.T) {
	f := testFrame(3)
	whole, sum, err := AppendFrame(nil, &f, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	hdr, hsum, err := AppendFrameHeader(nil, &f, testLimits)
	if err != nil || hsum != sum || !bytes.Equal(append(hdr, f.Payload...), whole) || FrameBytes(&f) != len(whole) {
		t.Fatalf("header+payload differs from the whole frame (sums %x, %x; %v)", hsum, sum, err)
	}
	lim := BatchLimits{PagesMax: 2, BytesMax: 2 * testLimits.FrameBytesMax(), Frame: testLimits}
	frames := []Frame{testFrame(2), testFrame(4)}
	batch, err := AppendBatch(nil, frames, lim)
	if err != nil {
		t.Fatal(err)
	}
	bh, err := AppendBatchHeader(nil, 2, FrameBytes(&frames[0])+FrameBytes(&frames[1]), lim)
	if err != nil || !bytes.Equal(bh, batch[:BatchHeaderBytes]) {
		t.Fatalf("batch header by hand differs: %v", err)
	}
	if _, err := AppendBatchHeader(nil, 3, 0, lim); err == nil {
		t.Fatal("batch header over PagesMax encoded")
	}
}
