//go:build !chaos

package faults

import (
	"fmt"

	"github.com/kvwarden/kvwarden/kv"
)

// Available says whether this build has fault points: false, since it
// was built without -tags chaos.
const Available = false

// Injector has no fault points in this build: New never makes one and
// Current is always nil, so its methods, which change nothing, are calls
// the compiler removes.
type Injector struct{}

// UnavailableError refuses a spec in a build without fault points.
type UnavailableError struct{ Spec string }

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("faults %q: this binary has no fault points; build one with: go build -tags chaos ./cmd/node", e.Spec)
}

// New refuses every spec: this build has no fault points.
func New(sp Spec) (*Injector, error) { return nil, &UnavailableError{Spec: sp.String()} }

// Install is here so that a node starts by one code path in both builds
// (node run calls New, then Install). Since New makes no Injector in this
// build, only nil reaches it; anything else was made by hand, which is a
// bug, and it panics rather than leave a caller believing faults are on.
// Absent, it would split that start-up path by build tag.
func Install(in *Injector) {
	if in != nil {
		panic("faults: Install of an injector in a build without fault points")
	}
}

// Current is nil: this build has no fault points.
func Current() *Injector { return nil }

// Spec is the zero Spec.
func (*Injector) Spec() Spec { return Spec{} }

// Frames returns frames as they are.
func (*Injector) Frames(frames []kv.Frame) []kv.Frame { return frames }

// Corrupt returns payload as it is.
func (*Injector) Corrupt(payload []byte) []byte { return payload }

// DropAck is false.
func (*Injector) DropAck() bool { return false }

// Counts is zero.
func (*Injector) Counts() Counts { return Counts{} }
