//go:build !chaos

package main

import (
	"strings"
	"testing"
)

// TestRunRefusesFaultsWithoutFaultPoints: a production binary refuses
// --faults at start-up as a usage error that says how to build one that
// has fault points.
func TestRunRefusesFaultsWithoutFaultPoints(t *testing.T) {
	code, out := runNode("run", "--listen", "127.0.0.1:0", "--faults", "seed=7,frame-drop=0.02")
	if code != exitUsage || strings.Contains(out, "serving on") {
		t.Fatalf("exit %d, want %d without serving; output:\n%s", code, exitUsage, out)
	}
	for _, want := range []string{"--faults", "no fault points", "go build -tags chaos ./cmd/node"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
