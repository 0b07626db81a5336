//go:build chaos

package faults

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/kvwarden/kvwarden/kv"
)

// Available says whether this build has fault points: true, since it was
// built with -tags chaos.
const Available = true

// recentMax is how many frames' destinations an Injector remembers for
// misdirection: enough to span a few transfers of other requests.
const recentMax = 64

// pcgStream fixes the second word of the PCG state, so that the seed
// alone decides every draw.
const pcgStream = 0x6b7677617264656e // "kvwarden"

// target is where a frame was addressed: its destination page and owner.
type target struct {
	dest  kv.Tag
	owner kv.Owner
}

// Injector decides every fault of one process from one seeded generator.
// The zero value is not usable: make one with New. A nil *Injector injects
// nothing, so that callers may use Current without a check.
type Injector struct {
	spec Spec

	mu     sync.Mutex
	rng    *rand.Rand
	counts Counts
	recent [recentMax]target // a ring of the last frames' targets
	seen   int               // targets written to recent, over the injector's life
}

// New makes an Injector for sp, after checking it.
func New(sp Spec) (*Injector, error) {
	if err := sp.Validate(); err != nil {
		return nil, err
	}
	return &Injector{spec: sp, rng: rand.New(rand.NewPCG(sp.Seed, pcgStream))}, nil
}

// current is the process's injector: a process serves one node, whose
// data plane and actors all ask the same one.
var current atomic.Pointer[Injector]

// Install makes in the process's injector, which Current returns from then
// on; nil removes it.
func Install(in *Injector) { current.Store(in) }

// Current is the process's injector, nil when none is installed.
func Current() *Injector { return current.Load() }

// Spec is what in injects; the zero Spec for nil.
func (in *Injector) Spec() Spec {
	if in == nil {
		return Spec{}
	}
	return in.spec
}

// hit draws whether a fault of kind k happens and counts it; a kind of
// probability 0 draws nothing. Called with mu held.
func (in *Injector) hit(k Kind) bool {
	p := in.spec.Prob[k]
	if p == 0 || in.rng.Float64() >= p {
		return false
	}
	in.counts[k]++
	return true
}

// Frames returns the frames to send in place of frames: each frame is
// dropped, misdirected and duplicated with the spec's probabilities, in
// that order, then each frame of the result swaps places with the next with
// the reorder probability. frames itself is not changed, nor are the
// payloads, which the result shares; it is returned as it is when nothing
// was injected. Nil injects nothing.
func (in *Injector) Frames(frames []kv.Frame) []kv.Frame {
	if in == nil || len(frames) == 0 {
		return frames
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	before := in.counts
	out := make([]kv.Frame, 0, len(frames))
	for _, f := range frames {
		if in.hit(FrameDrop) {
			continue
		}
		if in.spec.Prob[FrameMisdirect] > 0 {
			in.misdirect(&f)
		}
		out = append(out, f)
		if in.hit(FrameDup) {
			out = append(out, f)
		}
	}
	for i := 0; i+1 < len(out); i++ {
		if in.hit(FrameReorder) {
			out[i], out[i+1] = out[i+1], out[i]
		}
	}
	for _, f := range frames {
		in.recent[in.seen%recentMax] = target{dest: f.Dest, owner: f.Owner}
		in.seen++
	}
	if in.counts == before {
		return frames
	}
	return out
}

// misdirect, with the misdirect probability, readdresses f to a frame of
// another request seen recently: its destination page, its owner, or both,
// chosen at random, so that each check on the receiving side (the page's
// owner, the request's own frames, both at once) meets the fault. A frame
// with no other request in sight is left as it is, and not counted. Called
// with mu held.
func (in *Injector) misdirect(f *kv.Frame) {
	n := min(in.seen, recentMax)
	if n == 0 || in.rng.Float64() >= in.spec.Prob[FrameMisdirect] {
		return
	}
	start := in.rng.IntN(n)
	for i := range n {
		t := in.recent[(start+i)%n]
		if t.owner.Request == f.Owner.Request {
			continue
		}
		switch in.rng.IntN(3) {
		case 0:
			f.Dest = t.dest
		case 1:
			f.Owner = t.owner
		default:
			f.Dest, f.Owner = t.dest, t.owner
		}
		in.counts[FrameMisdirect]++
		return
	}
}

// Corrupt returns payload with one bit flipped, in a copy (the payload is
// a page's own bytes), with the corrupt probability, and payload itself
// otherwise. A sender calls it after the frame's checksum was computed
// over payload, so that the receiver's checksum catches the flip. Nil
// injects nothing.
func (in *Injector) Corrupt(payload []byte) []byte {
	if in == nil || len(payload) == 0 {
		return payload
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.hit(FrameCorrupt) {
		return payload
	}
	c := bytes.Clone(payload)
	c[in.rng.IntN(len(c))] ^= 1 << in.rng.IntN(8)
	return c
}

// DropAck says whether to leave a transfer acknowledgement unsent, with
// the ack-drop probability. Nil never drops.
func (in *Injector) DropAck() bool {
	if in == nil {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.hit(AckDrop)
}

// Counts are the faults injected so far, by kind; zero for nil.
func (in *Injector) Counts() Counts {
	if in == nil {
		return Counts{}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.counts
}
