package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// waitFor polls cond until it holds or d has passed.
// waitFor waits for cond, failing the test if it does not hold within d.
var waitFor = testwait.For

// TestFullMailboxAnswersBusy: an actor blocked with a full mailbox of 2
// does not make its senders wait. A request that expects an answer
// (GenerateRequest, RoutedRequest, TransferPlan) is answered "busy" at
// once, any other wire message is dropped, each drop is counted, and the
// node's own internal messages still get in; the actor then handles, in
// order, exactly what the mailbox took.
func TestFullMailboxAnswersBusy(t *testing.T) {
	sys := messages.NewActorSystem(nil)
	t.Cleanup(sys.Shutdown)
	var drops atomic.Uint64
	blocked, release := make(chan struct{}), make(chan struct{})
	got := make(chan any, 16)
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case step:
			close(blocked)
			<-release
		case messages.Message, PeerLost:
			got <- m
		}
	}, actor.WithMailbox(NewMailbox(sys, 2, &drops))))
	sys.Root.Send(pid, step{})
	testwait.Recv(t, "the actor blocked in its step", time.Minute, blocked)
	sys.Root.Send(pid, &messages.CancelRequest{RequestID: 1, Tenant: "a"})
	sys.Root.Send(pid, &messages.CancelRequest{RequestID: 2, Tenant: "a"})

	busy := &messages.WireError{Code: messages.CodeBusy}
	for _, tc := range []struct {
		name string
		m    messages.Message
		err  func(any) error
	}{
		{"generate", &messages.GenerateRequest{RequestID: 3, Tenant: "a", Prompt: "p", MaxTokens: 1},
			func(r any) error { return r.(*messages.GenerateResult).Err }},
		{"routed", &messages.RoutedRequest{RequestID: 4, Tenant: "a", Prompt: "p", MaxTokens: 1, Prefill: "127.0.0.1:1",
			PrefillIncarnation: 1, DecodeIncarnation: 1}, func(r any) error { return r.(*messages.GenerateResult).Err }},
		{"plan", &messages.TransferPlan{RequestID: 5, Tenant: "a", TokenCount: 1, PromptTokens: []uint32{1}, PageTokens: 16,
			DestTags: []kv.Tag{{Incarnation: 1, Index: 0, Generation: 1}}, Model: engine.Fingerprint{1}.String()}, func(r any) error { return r.(*messages.TransferDone).Err }},
	} {
		res, err := sys.Root.RequestFuture(pid, tc.m, 5*time.Second).Result()
		if err != nil {
			t.Fatalf("%s to a full mailbox: no answer: %v", tc.name, err)
		}
		if err := tc.err(res); !errors.Is(err, busy) {
			t.Fatalf("%s to a full mailbox answered %v, want busy", tc.name, err)
		}
	}
	sys.Root.Send(pid, &messages.CancelRequest{RequestID: 6, Tenant: "a"}) // no answer expected: dropped
	sys.Root.Send(pid, PeerLost{Incarnation: 7})                           // internal: taken over the bound
	if n := drops.Load(); n != 4 {
		t.Fatalf("%d drops counted, want 4", n)
	}
	close(release)
	var order []string
	for range 3 {
		select {
		case m := <-got:
			order = append(order, fmt.Sprintf("%T", m))
		case <-time.After(5 * time.Second):
			t.Fatalf("after release the actor handled only %v", order)
		}
	}
	if fmt.Sprint(order) != "[*messages.CancelRequest *messages.CancelRequest actors.PeerLost]" {
		t.Fatalf("handled %v", order)
	}
}

// TestOwnedPagesReclaimedByPageActor: pages whose owner died holding them,
// reserved or sealed, are reclaimed by their page actors' timers at
// OwnedPageTimeout, counted by state, and the dead owner's tags are stale.
func TestOwnedPagesReclaimedByPageActor(t *testing.T) {
	sys := messages.NewActorSystem(nil)
	t.Cleanup(sys.Shutdown)
	cfg := testConfig().pool(4, 1)
	cfg.OwnedTimeout = 50 * time.Millisecond
	var drops atomic.Uint64
	pool, err := spawnPool(sys.Root, "p/pool", cfg, NewMailbox(sys, 16, &drops), 5*time.Second, time.Now,
		poolFairness{retry: time.Second}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	dead := kv.Owner{Request: 1, Tenant: "acme"}
	tags, err := pool.Reserve(sys.Root, dead, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	c := newPageClient(pool, sys.Root)
	if err := c.Write(tags[1], dead, cfg.Geometry.PageTokens, make([]byte, cfg.Geometry.BytesPerToken())); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Seal(tags[1], dead); err != nil {
		t.Fatal(err)
	}
	var s PoolStatusReply
	waitFor(t, "pages of a dead owner reclaimed", time.Minute, func() bool {
		if s, err = pool.Status(sys.Root); err != nil {
			t.Fatal(err)
		}
		return s.Free == s.Capacity
	})
	if s.Reclaimed[kv.Reserved] != 1 || s.Reclaimed[kv.Sealed] != 1 || s.Reclaimed.Total() != 2 {
		t.Fatalf("reclaims by state %v, want one reserved and one sealed", s.Reclaimed)
	}
	if err := c.Release(tags[0], dead); !errors.As(err, new(*kv.StaleTagError)) {
		t.Fatalf("release by the dead owner after the reclaim: %v", err)
	}
}

// TestCorruptionBetweenSealAndSendFailsClean: a page whose bytes change
// after prefill sealed it, and before its frame is made, passes every frame
// checksum (computed from the changed bytes) and is caught by decode's seal
// against prefill's checksum: the request fails with the integrity code,
// the refusal is counted, and every page is free afterwards (startNode's
// cleanup). Without the fault the same prompt gets the reference answer.
func TestCorruptionBetweenSealAndSendFailsClean(t *testing.T) {
	cfg := testConfig()
	n := startNode(t, cfg)
	c := localClient(n)
	const prompt = "a prompt long enough to fill a page and a half of KV"
	n.Root().Send(n.prefill[0], injectFault{frames: func(frames []kv.Frame) {
		last := &frames[len(frames)-1]
		b := append([]byte(nil), last.Payload...)
		b[len(b)/2] ^= 0x40
		last.Payload = b
	}})
	_, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 8}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeIntegrity {
		t.Fatalf("a page corrupted between seal and send: %v, want an integrity error", err)
	}
	decode := n.Pools()[len(n.Pools())-1]
	s, err := decode.Status(n.Root())
	if err != nil {
		t.Fatal(err)
	}
	if s.Refused.Checksum == 0 {
		t.Errorf("the refused seal was not counted: %+v", s.Refused)
	}
	n.Root().Send(n.prefill[0], injectFault{})
	res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 8}, nil)
	if want := reference(t, cfg, prompt, 8); err != nil || fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
		t.Fatalf("without the fault: %v, %v; want the reference %v", res.Tokens, err, want)
	}
}

// TestDuplicatePlanAfterAckNotRerun: a plan that arrives again after its
// transfer was acknowledged, at the dispatcher or straight at the worker,
// is dropped: no second prefill, no job, no frame.
func TestDuplicatePlanAfterAckNotRerun(t *testing.T) {
	n := startNode(t, testConfig())
	done := make(chan *messages.TransferDone, 4)
	decoder := n.Root().Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*messages.TransferDone); ok {
			done <- m
		}
	}))
	plan := &messages.TransferPlan{RequestID: 1 << 40, Tenant: "acme", TokenCount: 3, PromptTokens: []uint32{'a', 'b', 'c'},
		PageTokens: uint32(n.Config().PageTokens), DestTags: []kv.Tag{{Incarnation: 9, Index: 0, Generation: 1}},
		Model: n.Model().Fingerprint().String()}
	n.Root().RequestWithCustomSender(n.dispatcher, plan, decoder)
	select {
	case m := <-done:
		if m.Err != nil || len(m.Sums) != 1 {
			t.Fatalf("transfer done: %+v", m)
		}
	case <-time.After(time.Minute):
		t.Fatal("no transfer done")
	}
	n.Root().RequestWithCustomSender(n.dispatcher, &messages.TransferAck{RequestID: plan.RequestID, Tenant: "acme",
		TokenCount: 3, Pages: 1}, decoder)
	status := func() (DispatchStatusReply, WorkerStatusReply) {
		t.Helper()
		// The dispatcher first: what it forwards is then ahead of the
		// worker's status request.
		d, err := ask[DispatchStatusReply](n.Root(), n.dispatcher, DispatchStatus{}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		w, err := ask[WorkerStatusReply](n.Root(), n.prefill[0], WorkerStatus{}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return d, w
	}
	if d, w := status(); d.Outstanding != 0 || w.AwaitingAck != 0 || w.FramesSent != 1 {
		t.Fatalf("after the ack: dispatcher %+v, worker %+v", d, w)
	}
	n.Root().RequestWithCustomSender(n.dispatcher, plan, decoder)
	n.Root().RequestWithCustomSender(n.prefill[0], plan, decoder)
	if d, w := status(); d.Outstanding != 0 || w.Queued != 0 || w.Sending != 0 || w.AwaitingAck != 0 || w.FramesSent != 1 {
		t.Fatalf("after duplicates of an acknowledged plan: dispatcher %+v, worker %+v", d, w)
	}
}
