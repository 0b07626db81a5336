//go:build !chaos

package faults

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/kv"
)

// TestNoFaultPoints: a production build makes no injector, says how to
// build one that does, and its Current changes nothing.
func TestNoFaultPoints(t *testing.T) {
	sp, err := Parse("seed=1,frame-drop=1")
	if err != nil {
		t.Fatal(err)
	}
	in, err := New(sp)
	var un *UnavailableError
	if in != nil || !errors.As(err, &un) || !strings.Contains(err.Error(), "go build -tags chaos ./cmd/node") ||
		!strings.Contains(err.Error(), "seed=1,frame-drop=1") {
		t.Fatalf("New in a production build: %v, %v", in, err)
	}
	if Available || Current() != nil {
		t.Fatal("a production build says it has fault points")
	}
	Install(nil)
	frames := []kv.Frame{{Payload: []byte{1}}}
	if got := Current().Frames(frames); &got[0] != &frames[0] || &Current().Corrupt(frames[0].Payload)[0] != &frames[0].Payload[0] ||
		Current().DropAck() || Current().Counts() != (Counts{}) || Current().Spec() != (Spec{}) {
		t.Fatal("a production build's injector injected")
	}
	defer func() {
		if recover() == nil {
			t.Error("Install of an injector did not panic")
		}
	}()
	Install(&Injector{})
}
