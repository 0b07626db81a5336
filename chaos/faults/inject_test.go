//go:build chaos

package faults

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/kvwarden/kvwarden/kv"
)

// geometry is a small page geometry for encoded frames.
var geometry = kv.Geometry{Layers: 1, KVHeads: 1, HeadDim: 4, PageTokens: 4, DType: kv.F32}

// transfer is the frames of one request's transfer: pages frames of
// request req of tenant, payload bytes derived from req.
func transfer(req uint64, tenant string, pages int) []kv.Frame {
	bpt := geometry.BytesPerToken()
	frames := make([]kv.Frame, pages)
	for i := range frames {
		payload := bytes.Repeat([]byte{byte(req), byte(i)}, geometry.PageTokens*bpt/2)
		frames[i] = kv.Frame{Owner: kv.Owner{Request: req, Tenant: tenant},
			Source:     kv.Tag{Incarnation: 1, Index: uint32(i), Generation: req},
			Dest:       kv.Tag{Incarnation: 2, Index: uint32(100*req) + uint32(i), Generation: 1},
			FirstToken: i * geometry.PageTokens, Tokens: geometry.PageTokens, Payload: payload}
	}
	return frames
}

func injector(t *testing.T, s string) *Injector {
	t.Helper()
	sp, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	in, err := New(sp)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestNilInjectsNothing(t *testing.T) {
	var in *Injector
	frames := transfer(1, "acme", 3)
	if got := in.Frames(frames); &got[0] != &frames[0] || len(got) != 3 {
		t.Fatal("nil injector changed the frames")
	}
	if got := in.Corrupt(frames[0].Payload); &got[0] != &frames[0].Payload[0] {
		t.Fatal("nil injector copied a payload")
	}
	if in.DropAck() || in.Counts() != (Counts{}) || in.Spec() != (Spec{}) {
		t.Fatal("nil injector injected")
	}
	if !Available {
		t.Fatal("a chaos build says it has no fault points")
	}
}

func TestInstall(t *testing.T) {
	in := injector(t, "seed=3,ack-drop=1")
	Install(in)
	t.Cleanup(func() { Install(nil) })
	if Current() != in || !Current().DropAck() {
		t.Fatal("Current is not the injector installed")
	}
	Install(nil)
	if Current() != nil || Current().DropAck() {
		t.Fatal("Current after Install(nil)")
	}
}

func TestNothingAtProbabilityZero(t *testing.T) {
	in := injector(t, "seed=9")
	frames := transfer(1, "acme", 8)
	for range 100 {
		if got := in.Frames(frames); &got[0] != &frames[0] || len(got) != len(frames) {
			t.Fatal("frames changed at probability 0")
		}
		if in.DropAck() {
			t.Fatal("ack dropped at probability 0")
		}
	}
	if c := in.Counts(); c.Total() != 0 {
		t.Fatalf("counts %v at probability 0", c)
	}
}

func TestEachKindAtProbabilityOne(t *testing.T) {
	frames := transfer(1, "acme", 5)
	orig := slices.Clone(frames)

	drop := injector(t, "frame-drop=1")
	if got := drop.Frames(frames); len(got) != 0 || drop.Counts()[FrameDrop] != 5 {
		t.Errorf("drop: %d frames sent, counts %v", len(got), drop.Counts())
	}

	dup := injector(t, "frame-dup=1")
	got := dup.Frames(frames)
	if len(got) != 10 || dup.Counts()[FrameDup] != 5 {
		t.Errorf("dup: %d frames sent, counts %v", len(got), dup.Counts())
	}
	for i := range got {
		if got[i].Dest != frames[i/2].Dest {
			t.Errorf("dup: frame %d is for %s, want %s", i, got[i].Dest, frames[i/2].Dest)
		}
	}

	// Each frame swaps with the next in turn: the first goes to the end.
	reorder := injector(t, "frame-reorder=1")
	got = reorder.Frames(frames)
	want := append(slices.Clone(frames[1:]), frames[0])
	for i := range got {
		if got[i].Dest != want[i].Dest {
			t.Errorf("reorder: frame %d is for %s, want %s", i, got[i].Dest, want[i].Dest)
		}
	}
	if reorder.Counts()[FrameReorder] != 4 {
		t.Errorf("reorder counts %v, want 4 swaps", reorder.Counts())
	}
	for i := range frames {
		if frames[i].Dest != orig[i].Dest || frames[i].Owner != orig[i].Owner {
			t.Fatalf("the caller's frame %d changed", i)
		}
	}

	ack := injector(t, "ack-drop=1")
	for range 3 {
		if !ack.DropAck() {
			t.Error("ack kept at probability 1")
		}
	}
	if ack.Counts()[AckDrop] != 3 {
		t.Errorf("ack counts %v", ack.Counts())
	}
}

// TestMisdirect: a frame is readdressed only to another request seen
// before, in each of the three ways, and never to its own.
func TestMisdirect(t *testing.T) {
	in := injector(t, "seed=5,frame-misdirect=1")
	first := transfer(1, "acme", 4)
	if got := in.Frames(first); &got[0] != &first[0] {
		t.Fatal("misdirected with no other request seen")
	}
	// Where earlier requests' frames went: the only places a frame may
	// be readdressed to.
	dests, owners := map[kv.Tag]bool{}, map[kv.Owner]bool{}
	for _, f := range first {
		dests[f.Dest], owners[f.Owner] = true, true
	}
	ways := map[string]int{}
	for round := range 30 {
		frames := transfer(uint64(2+round), "globex", 4)
		got := in.Frames(frames)
		if len(got) != len(frames) {
			t.Fatalf("round %d: %d frames, want %d", round, len(got), len(frames))
		}
		for i, g := range got {
			f := frames[i]
			switch {
			case g.Dest != f.Dest && g.Owner != f.Owner:
				ways["both"]++
			case g.Dest != f.Dest:
				ways["dest"]++
			case g.Owner != f.Owner:
				ways["owner"]++
			default:
				t.Fatalf("round %d frame %d not misdirected", round, i)
			}
			if (g.Dest != f.Dest && !dests[g.Dest]) || (g.Owner != f.Owner && !owners[g.Owner]) {
				t.Fatalf("round %d frame %d readdressed to %s of %s, seen from no earlier request", round, i, g.Dest, g.Owner)
			}
			if !bytes.Equal(g.Payload, f.Payload) {
				t.Fatalf("round %d frame %d: payload changed", round, i)
			}
		}
		for _, f := range frames {
			dests[f.Dest], owners[f.Owner] = true, true
		}
	}
	if ways["both"] == 0 || ways["dest"] == 0 || ways["owner"] == 0 {
		t.Errorf("ways of misdirection %v: want all three", ways)
	}
	if n := in.Counts()[FrameMisdirect]; n != 120 {
		t.Errorf("counted %d misdirections, want 120", n)
	}
}

// TestCorruptCaughtByChecksum encodes a batch as the data plane's sender
// does, headers over the true payloads and the payloads as Corrupt gives
// them, and checks that kv's decoder refuses it by checksum.
func TestCorruptCaughtByChecksum(t *testing.T) {
	in := injector(t, "seed=11,frame-corrupt=1")
	frames := transfer(1, "acme", 3)
	orig := slices.Clone(frames[1].Payload)
	lim := kv.BatchLimits{PagesMax: 8, BytesMax: 1 << 20, Frame: geometry.Limits()}
	body := 0
	for i := range frames {
		body += kv.FrameBytes(&frames[i])
	}
	b, err := kv.AppendBatchHeader(nil, len(frames), body, lim)
	if err != nil {
		t.Fatal(err)
	}
	for i := range frames {
		if b, _, err = kv.AppendFrameHeader(b, &frames[i], lim.Frame); err != nil {
			t.Fatal(err)
		}
		p := in.Corrupt(frames[i].Payload)
		if diff := bitsDiffer(p, frames[i].Payload); diff != 1 {
			t.Fatalf("frame %d: %d bits differ, want 1", i, diff)
		}
		b = append(b, p...)
	}
	if !bytes.Equal(frames[1].Payload, orig) {
		t.Fatal("Corrupt changed the page's own bytes")
	}
	var mismatch *kv.ChecksumMismatchError
	if _, _, err := kv.DecodeBatch(b, lim); !errors.As(err, &mismatch) {
		t.Fatalf("corrupted batch decoded: %v", err)
	}
	if in.Counts()[FrameCorrupt] != 3 {
		t.Fatalf("counts %v", in.Counts())
	}
}

func bitsDiffer(a, b []byte) int {
	n := 0
	for i := range a {
		for x := a[i] ^ b[i]; x != 0; x &= x - 1 {
			n++
		}
	}
	return n
}

// TestSeedReplays: the same seed and calls give the same faults; another
// seed gives others.
func TestSeedReplays(t *testing.T) {
	run := func(seed int) (string, Counts) {
		in := injector(t, fmt.Sprintf("seed=%d,frame-drop=0.2,frame-dup=0.2,frame-reorder=0.2,frame-misdirect=0.2,frame-corrupt=0.2,ack-drop=0.5", seed))
		var trace []string
		for r := range 50 {
			for _, f := range in.Frames(transfer(uint64(r+1), fmt.Sprintf("t%d", r%3), 4)) {
				trace = append(trace, fmt.Sprintf("%s/%d/%d", f.Dest, f.Owner.Request, in.Corrupt(f.Payload)[0]))
			}
			trace = append(trace, fmt.Sprint(in.DropAck()))
		}
		return fmt.Sprint(trace), in.Counts()
	}
	a, ca := run(1)
	b, cb := run(1)
	if a != b || ca != cb {
		t.Fatal("the same seed gave different faults")
	}
	c, cc := run(2)
	if a == c || ca == cc {
		t.Fatal("seeds 1 and 2 gave the same faults")
	}
	for k, n := range ca {
		if n == 0 {
			t.Errorf("kind %s never injected in 200 frames at 0.2: %v", Kind(k), ca)
		}
	}
}

// TestRates: over many frames each kind happens about as often as asked.
func TestRates(t *testing.T) {
	in := injector(t, "seed=13,frame-drop=0.02,frame-dup=0.05,frame-corrupt=0.01,ack-drop=0.1")
	const rounds, pages = 5000, 4
	for r := range rounds {
		for _, f := range in.Frames(transfer(uint64(r+1), "acme", pages)) {
			in.Corrupt(f.Payload)
		}
		in.DropAck()
	}
	c := in.Counts()
	sent := float64(rounds*pages) - float64(c[FrameDrop])
	for _, tc := range []struct {
		k    Kind
		over float64
		p    float64
	}{
		{FrameDrop, rounds * pages, 0.02}, {FrameDup, sent, 0.05}, {FrameCorrupt, sent + float64(c[FrameDup]), 0.01}, {AckDrop, rounds, 0.1},
	} {
		if got := float64(c[tc.k]) / tc.over; got < 0.8*tc.p || got > 1.2*tc.p {
			t.Errorf("%s at %.4f, asked %.4f", tc.k, got, tc.p)
		}
	}
}

// TestConcurrentUse: senders in many goroutines share one injector; every
// fault is counted once (run with -race).
func TestConcurrentUse(t *testing.T) {
	in := injector(t, "seed=17,frame-drop=1,ack-drop=1")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for r := range 100 {
				if got := in.Frames(transfer(uint64(g*1000+r+1), "acme", 3)); len(got) != 0 {
					t.Errorf("%d frames sent at drop 1", len(got))
				}
				in.DropAck()
			}
		})
	}
	wg.Wait()
	if c := in.Counts(); c[FrameDrop] != 8*100*3 || c[AckDrop] != 8*100 {
		t.Fatalf("counts %v, want 2400 drops and 800 acks dropped", c)
	}
}
