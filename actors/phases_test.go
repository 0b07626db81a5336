package actors

// The Queue phase (admission to the plan leaving, decode pages reserved)
// of requests that completed includes the reservation's own time: the
// shells step each answered effect at the time it came.

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testwait"
)

func TestQueuePhaseCountsTheReservation(t *testing.T) {
	n := startNode(t, testConfig())
	c := localClient(n)
	for range 4 {
		if _, err := c.Generate(context.Background(), "acme", "hello", client.GenerateOptions{MaxTokens: 2}, nil); err != nil {
			t.Fatal(err)
		}
	}
	st, err := ask[AdmissionStatusReply](n.Root(), n.Admission(), AdmissionStatus{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("phases of %d requests: %+v", st.Phases.Count, st.Phases)
	if st.Phases.Count != 4 || st.Phases.Queue <= 0 {
		t.Fatalf("phases %+v: the decode pages' reservation took no time", st.Phases)
	}
}

// A request that completes normally leaves no late message behind: the
// node's ignored counter counts only what comes after an answer.
func TestCompletedRequestIgnoresNothing(t *testing.T) {
	n := startNode(t, testConfig())
	c := localClient(n)
	if _, err := c.Generate(context.Background(), "acme", "hello", client.GenerateOptions{MaxTokens: 4}, nil); err != nil {
		t.Fatal(err)
	}
	// The request actor deletes its registry entry when it stops.
	waitFor(t, "request actor stopped", time.Minute, func() bool {
		empty := true
		n.registry.Range(func(any, any) bool { empty = false; return false })
		return empty
	})
	st, err := ask[AdmissionStatusReply](n.Root(), n.Admission(), AdmissionStatus{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.counters.ignored.Load(); got != 0 {
		t.Fatalf("one request that completed (%d completed, %d in flight) counted %d ignored messages", st.Completed, st.InFlight, got)
	}
}

// TestOneLogLinePerRequest: every request that ends is one info line with
// its id, tenant, outcome (and code when it failed), tokens and, when it
// completed, its time to first token.
func TestOneLogLinePerRequest(t *testing.T) {
	var logs testwait.Buffer
	n := startNodeWith(t, testConfig(), Options{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	c := localClient(n)
	if _, err := c.Generate(context.Background(), "acme", "hello", client.GenerateOptions{MaxTokens: 3}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Generate(context.Background(), "acme", strings.Repeat("x", 600), client.GenerateOptions{MaxTokens: 3}, nil); err == nil {
		t.Fatal("a prompt beyond the window was answered")
	}
	waitFor(t, "the request's line", time.Minute, func() bool { return strings.Contains(logs.String(), `msg="request ended"`) })
	lines := regexp.MustCompile(`(?m)^.*msg="request ended".*$`).FindAllString(logs.String(), -1)
	if len(lines) != 1 || !strings.Contains(lines[0], "tenant=acme") || !strings.Contains(lines[0], "outcome=completed") ||
		!strings.Contains(lines[0], "tokens=3") || !strings.Contains(lines[0], "ttft=") || !strings.Contains(lines[0], "finish=length") {
		t.Fatalf("request lines (a refused prompt ends before it is a request): %q", lines)
	}
}
