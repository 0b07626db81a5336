package actors

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// TestLateTransferDoneWhileDecodingIgnored: a TransferDone that arrives
// while the request decodes (a duplicate, or a slow peer of an abandoned
// attempt answering at last) must change nothing: the answer is still the
// reference, and the message is counted as ignored.
func TestLateTransferDoneWhileDecodingIgnored(t *testing.T) {
	cfg := testConfig()
	// The large model's decode steps take milliseconds: the request is
	// still decoding when the test, after its first two tokens, looks it
	// up, even on a loaded machine.
	cfg.Model = engine.LargeModelConfig()
	cfg.Model.ContextTokens = cfg.ContextTokens
	n := startNode(t, cfg)
	c := localClient(n)
	const prompt, maxTokens = "a request that decodes for a while", 60
	tokens := make(chan int, maxTokens)
	done := make(chan error, 1)
	var got []int
	go func() {
		res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: maxTokens},
			func(tok int) { tokens <- tok })
		got = res.Tokens
		done <- err
	}()
	testwait.Recv(t, "the first token", time.Minute, tokens)
	testwait.Recv(t, "the second token", time.Minute, tokens) // decoding has begun
	pid, ok := n.registry.Load(uint64(1))
	if !ok {
		t.Fatal("request 1 is not registered")
	}
	late := &messages.TransferDone{RequestID: 1, Tenant: "acme", Err: &messages.WireError{Code: messages.CodeBusy}}
	n.Root().Send(pid.(*actor.PID), late)
	n.Root().Send(pid.(*actor.PID), &messages.TransferDone{RequestID: 1, Tenant: "acme", First: 7, Frames: 1})
	if err := testwait.Recv(t, "the answer", time.Minute, done); err != nil {
		t.Fatal(err)
	}
	if want := reference(t, cfg, prompt, maxTokens); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("answer after late TransferDones: %v, reference %v", got, want)
	}
	if ignored := n.counters.ignored.Load(); ignored < 2 {
		t.Fatalf("%d messages counted as ignored, want at least 2", ignored)
	}
}

// TestReadRefusedAfterReclaim: a reader that still holds a lease when its
// page is reclaimed (released, deadline passed) and reallocated to another
// tenant gets a stale-tag error, never the new tenant's bytes.
func TestReadRefusedAfterReclaim(t *testing.T) {
	cfg := testConfig()
	cfg.ReclaimAfter = 20 * time.Millisecond
	n := startNode(t, cfg)
	pool := n.Pools()[len(n.Pools())-1]
	alice, bob := kv.Owner{Request: 1 << 40, Tenant: "alice"}, kv.Owner{Request: 1<<40 + 1, Tenant: "bob"}
	c := newPageClient(pool, n.Root())
	fill := func(o kv.Owner, b byte) kv.Tag {
		t.Helper()
		tags, err := pool.Reserve(n.Root(), o, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		row := make([]byte, pool.Geometry.BytesPerToken())
		for i := range row {
			row[i] = b
		}
		if err := c.Write(tags[0], o, 0, row); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Seal(tags[0], o); err != nil {
			t.Fatal(err)
		}
		return tags[0]
	}
	tag := fill(alice, 'A')
	l, err := c.Lease(tag, alice)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(tag, alice); err != nil {
		t.Fatal(err)
	}
	// Wait for the reclaim: the page's generation moves on.
	waitFor(t, "the page reclaimed", time.Minute, func() bool { return pool.gens[tag.Index].Load() != tag.Generation })
	// Bob may now hold the very same physical page.
	bobTag := fill(bob, 'B')
	b, _, err := c.Read(l)
	if !errors.As(err, new(*kv.StaleTagError)) {
		t.Fatalf("read through a reclaimed lease (bob has page %d, alice had %d): %d bytes starting %q, %v",
			bobTag.Index, tag.Index, len(b), b[:min(len(b), 4)], err)
	}
	if err := c.Unlease(l); err == nil {
		t.Fatal("unlease of a reclaimed lease accepted")
	}
	if len(c.held) != 0 || len(c.views) != 0 {
		t.Fatalf("client still records the reclaimed lease: %d held, %d views", len(c.held), len(c.views))
	}
	if err := c.Release(bobTag, bob); err != nil {
		t.Fatal(err)
	}
}

// lateRequester delivers every request but loses every answer, as a pool
// actor too slow for the caller's timeout would.
type lateRequester struct{ *actor.RootContext }

func (l lateRequester) RequestFuture(pid *actor.PID, msg any, timeout time.Duration) *actor.Future {
	l.RootContext.Send(pid, msg) // handled; the answer goes to no one
	return l.RootContext.RequestFuture(actor.NewPID(pid.Address, "nobody"), struct{}{}, timeout)
}

// TestReserveTimeoutIsUndone: a reservation whose answer never reaches the
// caller is undone, so no page is left with an owner that gave up on it.
func TestReserveTimeoutIsUndone(t *testing.T) {
	n := startNode(t, testConfig())
	pool := n.Pools()[0]
	_, err := pool.Reserve(lateRequester{n.Root()}, kv.Owner{Request: 1 << 40, Tenant: "acme"}, 0, 4)
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("reserve whose answer is lost: %v", err)
	}
	// A node too loaded to answer itself in time is busy to the client,
	// which may be served elsewhere, not an internal failure.
	if w := handoff.Wire(err); w.Code != messages.CodeBusy || w.Where != "node overloaded" {
		t.Fatalf("a reserve whose answer is lost reaches the client as %+v, want busy", w)
	}
	// The undo travels pool → pages → pool; wait for the frees to land.
	testwait.Report(t, "every page free after an undone reservation", time.Minute, func() (bool, string) {
		s, err := pool.Status(n.Root())
		if err != nil {
			t.Fatal(err)
		}
		return s.Free == s.Capacity && s.Reservations == 4, fmt.Sprintf("%+v", s)
	})
}
