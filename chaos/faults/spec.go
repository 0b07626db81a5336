package faults

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Kind is one kind of fault. Kinds are numbered in a fixed order, which is
// the order of Counts and of node status's fault counts: a kind is never
// renumbered, and a new kind goes at the end.
type Kind uint8

const (
	// FrameDrop: a KV frame is not sent.
	FrameDrop Kind = iota
	// FrameDup: a KV frame is sent twice.
	FrameDup
	// FrameReorder: a KV frame swaps places with the one after it.
	FrameReorder
	// FrameCorrupt: one bit of a KV frame's payload is flipped after its
	// checksum was computed.
	FrameCorrupt
	// FrameMisdirect: a KV frame is sent with the destination page, the
	// owner (request and tenant) or both of a frame of another request
	// sent recently: a frame delivered to the wrong request.
	FrameMisdirect
	// AckDrop: a transfer acknowledgement is not sent.
	AckDrop
)

// NumKinds is the number of kinds.
const NumKinds = int(AckDrop) + 1

// kindNames are the kinds' stable names, which are also their keys in a
// spec.
var kindNames = [NumKinds]string{"frame-drop", "frame-dup", "frame-reorder", "frame-corrupt", "frame-misdirect", "ack-drop"}

func (k Kind) String() string {
	if int(k) < NumKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Counts are faults injected, by Kind.
type Counts [NumKinds]uint64

// Total is the sum over all kinds.
func (c Counts) Total() uint64 {
	var t uint64
	for _, n := range c {
		t += n
	}
	return t
}

// SpecBytesMax bounds a spec's text, in bytes: every canonical spec (seed
// and every kind at its longest) takes less than 300.
const SpecBytesMax = 512

// Spec is which faults to inject and how often, and the seed of the
// generator that decides each one.
type Spec struct {
	Seed uint64
	// Prob is the probability of each kind, by Kind, in [0, 1]: per frame
	// for the frame kinds, per acknowledgement for AckDrop.
	Prob [NumKinds]float64
}

// seedKey is the spec key of Spec.Seed.
const seedKey = "seed"

// KindNames are the kinds' names, in kind order.
func KindNames() []string { return kindNames[:] }

// Keys are the keys a spec may hold: seed, then every kind's name in kind
// order.
func Keys() []string { return append([]string{seedKey}, kindNames[:]...) }

// SyntaxError is an item of a spec that is not key=value, a key given
// twice, or a value that is not a number.
type SyntaxError struct {
	Item   string
	Reason string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("faults: %q: %s", e.Item, e.Reason) }

// UnknownKeyError is a key that names no kind.
type UnknownKeyError struct {
	Key   string
	Known []string
}

func (e *UnknownKeyError) Error() string {
	return fmt.Sprintf("faults: unknown key %q: known keys are %s", e.Key, strings.Join(e.Known, ", "))
}

// ProbabilityError is a probability outside [Min, Max].
type ProbabilityError struct {
	Key      string
	Value    float64
	Min, Max float64
}

func (e *ProbabilityError) Error() string {
	return fmt.Sprintf("faults: %s=%g: a probability must be in [%g, %g]", e.Key, e.Value, e.Min, e.Max)
}

// SpecLengthError is a spec longer than SpecBytesMax.
type SpecLengthError struct{ Bytes, Max int }

func (e *SpecLengthError) Error() string {
	return fmt.Sprintf("faults: spec of %d bytes, at most %d", e.Bytes, e.Max)
}

// Parse reads a spec: comma-separated key=value items, seed=N (an unsigned
// 64-bit integer; 0 when absent) and kind=probability for any kinds (the
// others are 0), for example
// "seed=7,frame-drop=0.02,frame-dup=0.02,frame-corrupt=0.01,ack-drop=0.02".
// Each key may be given once. Spaces around items are ignored.
func Parse(s string) (Spec, error) {
	var sp Spec
	if len(s) > SpecBytesMax {
		return sp, &SpecLengthError{Bytes: len(s), Max: SpecBytesMax}
	}
	if strings.TrimSpace(s) == "" {
		return sp, &SyntaxError{Item: s, Reason: "empty: want key=value items, comma-separated, among " + strings.Join(Keys(), ", ")}
	}
	seen := map[string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		key, val, ok := strings.Cut(item, "=")
		switch {
		case !ok:
			return sp, &SyntaxError{Item: item, Reason: "want key=value"}
		case seen[key]:
			return sp, &SyntaxError{Item: item, Reason: "key " + key + " given twice"}
		}
		seen[key] = true
		if err := sp.set(key, val, item); err != nil {
			return Spec{}, err
		}
	}
	return sp, nil
}

// set sets key to val, from item.
func (sp *Spec) set(key, val, item string) error {
	if key == seedKey {
		seed, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return &SyntaxError{Item: item, Reason: fmt.Sprintf("the seed must be an integer in [0, %d]", uint64(math.MaxUint64))}
		}
		sp.Seed = seed
		return nil
	}
	k, ok := kindOf(key)
	if !ok {
		return &UnknownKeyError{Key: key, Known: Keys()}
	}
	p, err := strconv.ParseFloat(val, 64)
	if err != nil {
		return &SyntaxError{Item: item, Reason: "the probability is not a number"}
	}
	sp.Prob[k] = p
	return checkProb(k, p)
}

func kindOf(name string) (Kind, bool) {
	for k, n := range kindNames {
		if n == name {
			return Kind(k), true
		}
	}
	return 0, false
}

func checkProb(k Kind, p float64) error {
	if !(p >= 0 && p <= 1) { // NaN included
		return &ProbabilityError{Key: k.String(), Value: p, Min: 0, Max: 1}
	}
	return nil
}

// Validate reports the first probability outside [0, 1].
func (sp Spec) Validate() error {
	for k, p := range sp.Prob {
		if err := checkProb(Kind(k), p); err != nil {
			return err
		}
	}
	return nil
}

// String is the spec as Parse reads it: the seed, then every kind of
// non-zero probability in kind order, each probability in the fewest
// digits that read back as the same number. Parse(sp.String()) is sp for
// every valid sp.
func (sp Spec) String() string {
	b := []byte(seedKey + "=")
	b = strconv.AppendUint(b, sp.Seed, 10)
	for k, p := range sp.Prob {
		if p > 0 {
			b = append(b, ',')
			b = append(b, kindNames[k]...)
			b = append(b, '=')
			b = strconv.AppendFloat(b, p, 'g', -1, 64)
		}
	}
	return string(b)
}
