package trust

import (
	"bytes"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"
)

// A stranger who makes a node refuse a thousand times in a burst is
// counted a thousand times and logged a few: the log is no weapon.
func TestRefusalsAreAllCountedAndLoggedAtABoundedRate(t *testing.T) {
	var out bytes.Buffer
	a := Insecure(slog.New(slog.NewTextHandler(&out, nil)))
	start := time.Now()
	for range 1000 {
		a.Refuse(RefusedStranger, "tokens from a stranger", "remote", "10.0.0.9:1")
	}
	a.Refuse(RefusedBatch, "a malformed batch")
	took := time.Since(start)
	if got := a.Refused(); got[RefusedStranger] != 1000 || got[RefusedBatch] != 1 || got.Total() != 1001 {
		t.Fatalf("counted %v, want 1000 stranger and 1 batch refusals", got)
	}
	lines := strings.Count(out.String(), "\n")
	perKind := DefaultConfig().RefusalLinesPerSecond
	// A slow machine refills the budget while the burst goes on.
	most := perKind + 1 + int(math.Ceil(took.Seconds()*float64(perKind)))
	if lines < perKind+1 || lines > most {
		t.Fatalf("%d log lines for 1001 refusals of 2 kinds in %s, want %d to %d:\n%s", lines, took, perKind+1, most, out.String())
	}
	if !strings.Contains(out.String(), "a malformed batch") {
		t.Fatal("a refusal of another kind was not logged: one kind's flood silenced it")
	}
}
