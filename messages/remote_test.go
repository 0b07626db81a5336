//go:build !race

// Several remote.Remote instances in one process race inside protoactor and
// gRPC (logger setup, member list, disthash), so the race detector would
// report upstream races rather than ours; this test runs without -race.
// Code of this package that runs under it (Encode, Decode, the envelope) is
// covered by the other tests, which do run under -race.

package messages

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

const remoteTimeout = 10 * time.Second

// node is one actor system with remote on a free loopback port.
type node struct {
	sys    *actor.ActorSystem
	remote *remote.Remote
}

func startNode(t testing.TB, auth *trust.Authority) *node {
	t.Helper()
	sys := NewActorSystem(nil)
	r, err := StartRemoteAwaiting(sys, "127.0.0.1:0", auth)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{sys, r}
	t.Cleanup(n.stop)
	return n
}

func (n *node) stop() {
	ShutdownRemote(n.sys, n.remote)
	n.sys.Shutdown()
}

// server is the actor on the far node: it answers GenerateRequest with a
// GenerateResult and StatusRequest with the sample StatusReply, echoes a
// TransferPlan back, and reports every message it receives on got, in
// order.
type server struct{ got chan any }

func (s *server) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *GenerateRequest:
		s.got <- m
		_ = Respond(ctx, &GenerateResult{RequestID: m.RequestID, Tokens: []uint32{11, 12, 13}, Text: "ok", FinishReason: FinishLength})
	case *TransferPlan:
		s.got <- m
		_ = Respond(ctx, m)
	case *StatusRequest:
		s.got <- m
		_ = Respond(ctx, sampleOf[*StatusReply]())
	case *CancelRequest, *Undecodable:
		s.got <- m
	}
}

// TestRemoteEndToEnd runs over mutual TLS, through the remote guard.
func TestRemoteEndToEnd(t *testing.T) {
	ca := trusttest.New(t)
	a, b := startNode(t, ca.Authority(t, trust.RoleTenant, "a", nil)), startNode(t, ca.Authority(t, trust.RoleAll, "b", nil))
	got := make(chan any, 16)
	if _, err := b.sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &server{got} }), "server"); err != nil {
		t.Fatal(err)
	}
	pid := actor.NewPID(b.sys.Address(), "server")
	// next is the next message the server received; nothing may arrive
	// that the test did not expect in this order.
	next := func() any {
		t.Helper()
		select {
		case m := <-got:
			return m
		case <-time.After(remoteTimeout):
			t.Fatal("server received nothing")
			return nil
		}
	}

	t.Run("generate request and result", func(t *testing.T) {
		req := &GenerateRequest{RequestID: 42, Tenant: "acme", Prompt: "hello", MaxTokens: 3}
		res, err := Request(a.sys.Root, pid, req, remoteTimeout)
		if err != nil {
			t.Fatal(err)
		}
		want := &GenerateResult{RequestID: 42, Tokens: []uint32{11, 12, 13}, Text: "ok", FinishReason: FinishLength}
		if !reflect.DeepEqual(res, want) {
			t.Fatalf("result %#v, want %#v", res, want)
		}
		if m := next(); !reflect.DeepEqual(m, req) {
			t.Fatalf("server got %#v, want %#v", m, req)
		}
	})

	t.Run("transfer plan with tags", func(t *testing.T) {
		plan := &TransferPlan{RequestID: 1 << 50, Tenant: "globex", TokenCount: 5, PromptTokens: []uint32{1, 2, 3, 4, math.MaxUint32}, PageTokens: 2,
			DestTags: []kv.Tag{{Incarnation: math.MaxUint64, Index: 0, Generation: 1}, {Incarnation: 9, Index: math.MaxUint32, Generation: 2}, {Incarnation: 9, Index: 4, Generation: math.MaxUint64}}, Model: testFingerprint}
		echo, err := Request(a.sys.Root, pid, plan, remoteTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if m := next(); !reflect.DeepEqual(m, plan) {
			t.Fatalf("server got %#v, want %#v", m, plan)
		}
		if !reflect.DeepEqual(echo, plan) {
			t.Fatalf("echo %#v, want %#v", echo, plan)
		}
	})

	t.Run("status request and nested reply", func(t *testing.T) {
		reply, err := Request(a.sys.Root, pid, &StatusRequest{}, remoteTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if want := sampleOf[*StatusReply](); !reflect.DeepEqual(reply, want) {
			t.Fatalf("reply %#v, want %#v", reply, want)
		}
		if m := next(); !reflect.DeepEqual(m, &StatusRequest{}) {
			t.Fatalf("server got %#v, want a StatusRequest", m)
		}
	})

	t.Run("invalid message refused locally, next one arrives", func(t *testing.T) {
		bad := &CancelRequest{RequestID: 1, Tenant: ""}
		err := Send(a.sys.Root, pid, bad)
		var inv *InvalidFieldError
		if !errors.As(err, &inv) || inv.Field != "tenant" {
			t.Fatalf("Send(invalid) = %v, want *InvalidFieldError on tenant", err)
		}
		// Bypassing the helper, the endpoint writer's Serialize refuses it
		// and drops only that message: the stream stays up.
		a.sys.Root.Send(pid, bad)
		good := &CancelRequest{RequestID: 2, Tenant: "acme"}
		if err := Send(a.sys.Root, pid, good); err != nil {
			t.Fatal(err)
		}
		// One stream, in order: had the invalid message arrived, it would
		// come first.
		if m := next(); !reflect.DeepEqual(m, good) {
			t.Fatalf("server got %#v, want %#v", m, good)
		}
	})

	t.Run("undecodable frame delivered as Undecodable, stream survives", func(t *testing.T) {
		// A raw envelope is a proto.Message that is not RootSerializable, so
		// it goes out as is and only the receiver's Decode sees it.
		a.sys.Root.Send(pid, &envelope{Frame: []byte{0, 1, 9, 0x80}})
		m := next()
		u, ok := m.(*Undecodable)
		var ve *VersionError
		if !ok || !errors.As(u.Err, &ve) || ve.Version != 9 {
			t.Fatalf("server got %#v, want *Undecodable with a VersionError", m)
		}
		req := &GenerateRequest{RequestID: 43, Tenant: "acme", Prompt: "again", MaxTokens: 3}
		if _, err := Request(a.sys.Root, pid, req, remoteTimeout); err != nil {
			t.Fatalf("request after an undecodable frame: %v", err)
		}
		if m := next(); !reflect.DeepEqual(m, req) {
			t.Fatalf("server got %#v, want %#v", m, req)
		}
	})

	select {
	case m := <-got:
		t.Fatalf("unexpected message %#v", m)
	default:
	}
}

// BenchmarkRemoteRoundTrip measures request/response round trips (a
// StatusRequest answered with the sample StatusReply) over protoactor
// remote with mutual TLS and without, alternated in one run, and reports
// their ratio. Run with:
//
//	go test ./messages -run '^$' -bench RemoteRoundTrip -benchtime 2000x -count 3
func BenchmarkRemoteRoundTrip(b *testing.B) {
	ca := trusttest.New(b)
	type pair struct {
		from *node
		to   *actor.PID
		took time.Duration
	}
	start := func(ca, cb *trust.Authority) *pair {
		from, to := startNode(b, ca), startNode(b, cb)
		if _, err := to.sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &server{make(chan any, 1<<20)} }), "server"); err != nil {
			b.Fatal(err)
		}
		return &pair{from: from, to: actor.NewPID(to.sys.Address(), "server")}
	}
	plain := start(trust.Insecure(nil), trust.Insecure(nil))
	secure := start(ca.Authority(b, trust.RoleTenant, "a", nil), ca.Authority(b, trust.RoleAll, "b", nil))
	trip := func(p *pair) {
		t0 := time.Now()
		if _, err := Request(p.from.sys.Root, p.to, &StatusRequest{}, remoteTimeout); err != nil {
			b.Fatal(err)
		}
		p.took += time.Since(t0)
	}
	trip(plain) // connect outside the measurement
	trip(secure)
	plain.took, secure.took = 0, 0
	n := 0
	for b.Loop() {
		trip(plain)
		trip(secure)
		n++
	}
	b.ReportMetric(float64(plain.took.Microseconds())/float64(n), "µs/plain")
	b.ReportMetric(float64(secure.took.Microseconds())/float64(n), "µs/mtls")
	b.ReportMetric(float64(secure.took)/float64(plain.took), "mtls/plain")
}

// publishFrom publishes evt on sys's event stream from a goroutine of its
// own, as an endpoint writer does, and says whether the goroutine went on
// after the publish (false: a handler ended it).
func publishFrom(t *testing.T, sys *actor.ActorSystem, evt any) bool {
	t.Helper()
	wentOn, ended := make(chan bool, 1), make(chan struct{})
	go func() {
		defer close(ended)
		sys.EventStream.Publish(evt)
		wentOn <- true
	}()
	testwait.Recv(t, "the publishing goroutine's end", remoteTimeout, ended)
	select {
	case <-wentOn:
		return true
	default:
		return false
	}
}

// TestEndpointEventsGuardedOnceStopping: an endpoint-terminated event
// reaches the endpoint manager while the remote runs; once ShutdownRemote
// has begun, the guard ends the goroutine that publishes one, as a writer
// whose stream failed would, before the stopped manager's handler could
// dereference its connections, which upstream sets to nil.
func TestEndpointEventsGuardedOnceStopping(t *testing.T) {
	n := startNode(t, trust.Insecure(nil))
	if !publishFrom(t, n.sys, &remote.EndpointTerminatedEvent{Address: "127.0.0.1:1"}) {
		t.Fatal("an endpoint event while the remote runs ended its publisher")
	}
	ShutdownRemote(n.sys, n.remote)
	if publishFrom(t, n.sys, &remote.EndpointTerminatedEvent{Address: "127.0.0.1:1"}) {
		t.Fatal("an endpoint event after ShutdownRemote began reached the handlers after the guard")
	}
	if !publishFrom(t, n.sys, "another event") {
		t.Fatal("the guard ended the publisher of an event of another kind")
	}
}

// TestEndpointGuardWaitsForEventsPassing: an endpoint event the guard let
// pass before the remote began to stop holds ShutdownRemote's wait until
// it has passed the endpoint manager's handler too; once stopping, no
// event passes, and the wait ends once none is passing.
func TestEndpointGuardWaitsForEventsPassing(t *testing.T) {
	g := &endpointGuard{drained: make(chan struct{})}
	evt := &remote.EndpointTerminatedEvent{Address: "127.0.0.1:1"}
	g.before(evt) // on its way to the manager's handler
	var drained <-chan struct{}
	g.before(remoteStopping{r: g.r, drained: &drained})
	select {
	case <-drained:
		t.Fatal("the wait ended while an event was on its way to the endpoint manager")
	default:
	}
	g.after("another event")
	select {
	case <-drained:
		t.Fatal("an event of another kind ended the wait")
	default:
	}
	g.after(evt)
	testwait.Recv(t, "the wait's end once the event passed", remoteTimeout, drained)
	var again <-chan struct{}
	g.before(remoteStopping{r: g.r, drained: &again})
	testwait.Recv(t, "a second stop's wait, at once", remoteTimeout, again)
}
