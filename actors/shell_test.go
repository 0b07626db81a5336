package actors

// The worker shell over handoff.Source: a plan withdrawn from the queue by
// its abort leaves nothing of it in the shell.

import (
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// gatedEngine blocks its first prefill until gate closes, so that the
// worker is busy while more messages queue in its mailbox.
type gatedEngine struct {
	engine.Engine
	entered chan struct{}
	gate    chan struct{}
	first   bool
}

func (g *gatedEngine) PrefillAfter(pool engine.KV, owner kv.Owner, tags []kv.Tag, prompt []int, prefix []kv.Lease) (engine.Prefilled, error) {
	if !g.first {
		g.first = true
		close(g.entered)
		<-g.gate
	}
	return g.Engine.PrefillAfter(pool, owner, tags, prompt, prefix)
}

func TestAbortedQueuedPlanLeavesNothingInTheWorker(t *testing.T) {
	cfg := testConfig()
	n := startNode(t, cfg)
	eng := &gatedEngine{Engine: n.Model().Engine(), entered: make(chan struct{}), gate: make(chan struct{})}
	pool := nodePool(t, n, "gated-prefill/pool", 8, cfg.CallTimeout)
	w := newWorker("prefill", n.Model(), pool, &cfg, slog.New(slog.DiscardHandler), planPolicy{auth: n.Auth()})
	w.engine = eng
	worker, err := n.Root().SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return w },
		actor.WithMailbox(n.Mailbox())), "gated-prefill")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Root().StopFuture(worker).Wait() })
	done := make(chan *messages.TransferDone, 4)
	decoder := n.Root().Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*messages.TransferDone); ok {
			done <- m
		}
	}))
	plan := func(id uint64) *messages.TransferPlan {
		return &messages.TransferPlan{RequestID: id, Tenant: "acme", TokenCount: 3, PromptTokens: []uint32{'a', 'b', 'c'},
			PageTokens: uint32(cfg.PageTokens), DestTags: []kv.Tag{{Incarnation: 9, Index: 0, Generation: 1}},
			Model: n.Model().Fingerprint().String()}
	}
	n.Root().RequestWithCustomSender(worker, plan(1), decoder)
	testwait.Recv(t, "the worker computing plan 1", time.Minute, eng.entered) // what follows waits in its mailbox
	n.Root().RequestWithCustomSender(worker, plan(2), decoder)
	n.Root().RequestWithCustomSender(worker, &messages.TransferAbort{RequestID: 2, Tenant: "acme",
		Reason: messages.WireError{Code: messages.CodeCancelled, Message: "cancelled"}}, decoder)
	close(eng.gate)
	select {
	case m := <-done:
		if m.RequestID != 1 || m.Err != nil {
			t.Fatalf("transfer done %+v, want plan 1's", m)
		}
	case <-time.After(time.Minute):
		t.Fatal("no transfer done for plan 1")
	}
	n.Root().RequestWithCustomSender(worker, &messages.TransferAck{RequestID: 1, Tenant: "acme", TokenCount: 3, Pages: 1}, decoder)
	st, err := ask[WorkerStatusReply](n.Root(), worker, WorkerStatus{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if st.Queued != 0 || st.Sending != 0 || st.AwaitingAck != 0 {
		t.Fatalf("worker status %+v, want nothing in hand", st)
	}
	// The status reply is the worker's last message: it is idle, and its
	// state can be read.
	if len(w.jobs) != 0 {
		t.Fatalf("the worker shell still keeps %d jobs (%v) with no plan in its source", len(w.jobs), w.jobs)
	}
	if s, err := pool.Status(n.Root()); err != nil || s.Free != s.Capacity {
		t.Fatalf("gated pool: %+v, %v; want every page free", s, err)
	}
}

// A request routed to an earlier run of this node, at the same address,
// is answered node_lost: for the client, the node it was sent to is gone.
func TestRoutedToAnEarlierRunIsNodeLost(t *testing.T) {
	n := startNode(t, testConfig())
	m := &messages.RoutedRequest{RequestID: 4, Tenant: "a", Prompt: "p", MaxTokens: 1, Prefill: "127.0.0.1:1",
		PrefillIncarnation: 1, DecodeIncarnation: n.Config().Incarnation + 1}
	res, err := n.Root().RequestFuture(n.Admission(), m, time.Minute).Result()
	if err != nil {
		t.Fatal(err)
	}
	if e := res.(*messages.GenerateResult).Err; e == nil || e.Code != messages.CodeNodeLost {
		t.Fatalf("routed to another run: %+v, want node_lost", e)
	}
}
