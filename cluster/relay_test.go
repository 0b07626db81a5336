package cluster

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/cluster/membership"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// fakeDecode is a decode node of a network held in the test's hand: the
// router's actor system resolves PIDs at its address to it, as protoactor
// remote would to a connection. It answers each routed request from its
// script, as a process at its address would.
type fakeDecode struct {
	addr string
	sys  *actor.ActorSystem
	// busyTwice answers every request busy twice, as a duplicated
	// message would; otherwise the request is held until answer.
	busyTwice bool

	mu       sync.Mutex
	requests []*actor.PID // the relays that sent a request, in order
	cancels  int
}

func (f *fakeDecode) SendUserMessage(_ *actor.PID, message any) {
	env, ok := message.(*actor.MessageEnvelope)
	if !ok {
		return
	}
	if _, ok := env.Message.(*messages.CancelRequest); ok {
		f.mu.Lock()
		f.cancels++
		f.mu.Unlock()
	}
	req, ok := env.Message.(*messages.RoutedRequest)
	if !ok {
		return
	}
	f.mu.Lock()
	f.requests = append(f.requests, env.Sender)
	f.mu.Unlock()
	if f.busyTwice {
		// Sent from within the relay's own send: both are in its mailbox
		// before it handles the first.
		for range 2 {
			f.send(env.Sender, &messages.GenerateResult{RequestID: req.RequestID, FinishReason: messages.FinishError,
				Err: &messages.WireError{Code: messages.CodeBusy, Message: "decode pool is full", Where: f.addr}})
		}
	}
}

func (f *fakeDecode) SendSystemMessage(*actor.PID, any) {}
func (f *fakeDecode) Stop(*actor.PID)                   {}

func (f *fakeDecode) send(to *actor.PID, m any) {
	f.sys.Root.RequestWithCustomSender(to, m, actor.NewPID(f.addr, "request"))
}

// held is how many requests f has been sent.
func (f *fakeDecode) held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

// cancelled is how many cancels f has been sent.
func (f *fakeDecode) cancelled() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cancels
}

// answer streams tokens, one chunk each, and the result to the relay of
// f's first request, whose id is id.
func (f *fakeDecode) answer(id uint64, tokens []uint32) {
	f.mu.Lock()
	to := f.requests[0]
	f.mu.Unlock()
	for i, t := range tokens {
		f.send(to, &messages.TokenChunk{RequestID: id, Seq: uint32(i + 1), Tokens: []uint32{t}})
	}
	f.send(to, &messages.GenerateResult{RequestID: id, Tokens: tokens, FinishReason: messages.FinishLength})
}

// received is a client: every message it gets, in order.
type received struct {
	mu  sync.Mutex
	all []any
}

func (r *received) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *messages.TokenChunk, *messages.GenerateResult:
		r.mu.Lock()
		r.all = append(r.all, m)
		r.mu.Unlock()
	}
}

func (r *received) result() *messages.GenerateResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.all {
		if res, ok := m.(*messages.GenerateResult); ok {
			return res
		}
	}
	return nil
}

// fakeRoute is a router in its own actor system routing to fake decode
// nodes (the prefill node it names is never reached), and a client.
type fakeRoute struct {
	sys      *actor.ActorSystem
	router   *actor.PID
	client   *actor.PID
	got      *received
	counters *routerCounters
	members  []Member
}

// startFakeRoute starts a router whose decode nodes are ds, the first
// with pages free for the request and the others with capacity for it
// but, by gossip, too few free, so that routing picks the first first.
func startFakeRoute(t *testing.T, ds ...*fakeDecode) *fakeRoute {
	t.Helper()
	cfg := DefaultLocalNodeConfig(actors.RoleRouter).Actors
	model := modeltest.Builtin(t, cfg.Model)
	sys := messages.NewActorSystem(nil)
	t.Cleanup(sys.Shutdown)
	byAddr := map[string]*fakeDecode{}
	member := func(role Role, inc uint64, addr string, free uint32) Member {
		return Member{State: StateAlive, Verified: true, Meta: membership.Meta{Role: role, Incarnation: inc, RemoteAddr: addr,
			CapacityPages: 1000, FreePages: free, Model: model.Fingerprint()}}
	}
	f := &fakeRoute{sys: sys, got: &received{}, counters: &routerCounters{},
		members: []Member{member(RolePrefill, 100, "prefill:1", 1000)}}
	for i, d := range ds {
		d.sys, byAddr[d.addr] = sys, d
		free := uint32(0)
		if i == 0 {
			free = 1000
		}
		f.members = append(f.members, member(RoleDecode, uint64(i+1), d.addr, free))
	}
	sys.ProcessRegistry.RegisterAddressResolver(func(pid *actor.PID) (actor.Process, bool) {
		d, ok := byAddr[pid.Address]
		return d, ok
	})
	streams, err := messages.NewStreams(sys)
	if err != nil {
		t.Fatal(err)
	}
	r := &routerActor{cfg: &cfg, model: model, members: func() []Member { return slices.Clone(f.members) },
		draining: func() bool { return false }, log: slog.New(slog.DiscardHandler), counters: f.counters,
		auth: trust.Insecure(nil), mailbox: actor.Unbounded(), routing: NewRouting(rand.NewPCG(1, 2)), streams: streams}
	if f.router, err = sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return r }), "router"); err != nil {
		t.Fatal(err)
	}
	if f.client, err = sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return f.got }), "client"); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestRelayDropsADuplicatedBusy: the first decode node's busy answer comes
// twice; the relay holds the first and asks the router for another decode
// node once, so that the router follows the request where it went: when
// that node is lost, the relay hears of it and the request goes on to the
// third, whose answer the client gets.
func TestRelayDropsADuplicatedBusy(t *testing.T) {
	d0 := &fakeDecode{addr: "decode-0:1", busyTwice: true}
	d1, d2 := &fakeDecode{addr: "decode-1:1"}, &fakeDecode{addr: "decode-2:1"}
	f := startFakeRoute(t, d0, d1, d2)
	const id = 7
	f.sys.Root.RequestWithCustomSender(f.router, &messages.GenerateRequest{RequestID: id, Tenant: "acme",
		Prompt: "a duplicated busy answer", MaxTokens: 4}, f.client)
	testwait.For(t, "decode-1 or decode-2 holds the request", time.Minute, func() bool { return d1.held()+d2.held() > 0 })
	first, second, inc := d1, d2, uint64(2)
	if d2.held() > 0 {
		first, second, inc = d2, d1, 3
	}
	f.sys.Root.Send(f.router, memberLost{incarnation: inc})
	testwait.For(t, fmt.Sprintf("%s receives the request once %s is lost", second.addr, first.addr), time.Minute,
		func() bool { return second.held() > 0 })
	answer := []uint32{5, 6, 7, 8}
	second.answer(id, answer)
	testwait.For(t, "the client gets the result", time.Minute, func() bool { return f.got.result() != nil })
	if res := f.got.result(); res.Err != nil || !slices.Equal(res.Tokens, answer) {
		t.Fatalf("the client got %+v, want %v", res, answer)
	}
	if got := f.counters.retried.Load(); got != 2 {
		t.Errorf("sent again %d times, want 2 (decode-0 busy, then the lost node)", got)
	}
	if first.held() != 1 || d0.held() != 1 {
		t.Errorf("decode-0 sent %d requests, the lost node %d; want one each", d0.held(), first.held())
	}
}

// TestStoppedRelayAnswersNodeLost: a relay stopped before its request
// ended (a panic, which its router's supervisor answers by stopping it, or
// its router stopping) tells the client node lost, which a client of
// several routers continues through another, and cancels the request on
// its decode node; neither waits for its own timeout.
func TestStoppedRelayAnswersNodeLost(t *testing.T) {
	d0 := &fakeDecode{addr: "decode-0:1"}
	f := startFakeRoute(t, d0)
	f.sys.Root.RequestWithCustomSender(f.router, &messages.GenerateRequest{RequestID: 9, Tenant: "acme",
		Prompt: "a relay that stops", MaxTokens: 4}, f.client)
	testwait.For(t, "decode-0 holds the request", time.Minute, func() bool { return d0.held() > 0 })
	d0.mu.Lock()
	relay := d0.requests[0]
	d0.mu.Unlock()
	f.sys.Root.Stop(relay)
	testwait.For(t, "the client gets an answer", time.Minute, func() bool { return f.got.result() != nil })
	if res := f.got.result(); res.Err == nil || res.Err.Code != messages.CodeNodeLost || res.RequestID != 9 {
		t.Fatalf("the client got %+v, want node_lost for request 9", res)
	}
	testwait.For(t, "decode-0 is told to cancel", time.Minute, func() bool { return d0.cancelled() == 1 })
	if lost := f.counters.lost.Load(); lost != 1 {
		t.Errorf("counted %d lost, want 1", lost)
	}
}
