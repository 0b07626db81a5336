package client

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// fakeRouter is an endpoint of a fake network held in the test's hand: the
// client's actor system resolves PIDs at its address to it (as protoactor
// remote would to a connection), and it answers from its script, sending
// as a process at that address would.
type fakeRouter struct {
	addr string
	sys  *actor.ActorSystem
	// answer is the tokens it streams, one chunk each, their text one
	// letter per token ('a' + token).
	answer []uint32
	// stopAfter, when positive, is how many tokens it streams before it
	// falls silent; then, if delivered is set, its connection ends once
	// delivered is closed (the caller has the tokens).
	stopAfter int
	delivered <-chan struct{}
	// err, if set, is its answer instead of tokens.
	err *messages.WireError
	// stops says it answers a CancelRequest that stops a request with the
	// tokens it streamed, as stopped; lostOnStop that its connection ends
	// instead.
	stops, lostOnStop bool

	mu       sync.Mutex
	requests []*messages.GenerateRequest
	cancels  []*messages.CancelRequest
}

func (f *fakeRouter) SendUserMessage(_ *actor.PID, message any) {
	m, sender := message, (*actor.PID)(nil)
	if env, ok := message.(*actor.MessageEnvelope); ok {
		m, sender = env.Message, env.Sender
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch m := m.(type) {
	case *messages.GenerateRequest:
		f.requests = append(f.requests, m)
		go f.serve(m, sender)
	case *messages.CancelRequest:
		f.cancels = append(f.cancels, m)
		streamed := f.answer[:f.stopAfter]
		switch {
		case m.Reason != messages.CancelStop:
		case f.stops:
			go f.send(sender, &messages.GenerateResult{RequestID: m.RequestID, Tokens: streamed, Text: text(streamed),
				FinishReason: messages.FinishStopSequence})
		case f.lostOnStop:
			go f.sys.EventStream.Publish(&remote.EndpointTerminatedEvent{Address: f.addr})
		}
	}
}

func (f *fakeRouter) SendSystemMessage(*actor.PID, any) {}
func (f *fakeRouter) Stop(*actor.PID)                   {}

func (f *fakeRouter) send(to *actor.PID, m any) {
	f.sys.Root.RequestWithCustomSender(to, m, actor.NewPID(f.addr, "relay"))
}

func (f *fakeRouter) serve(req *messages.GenerateRequest, to *actor.PID) {
	if f.err != nil {
		f.send(to, &messages.GenerateResult{RequestID: req.RequestID, FinishReason: messages.FinishError, Err: f.err})
		return
	}
	for i, tok := range f.answer {
		if i == f.stopAfter && f.stopAfter > 0 {
			if f.delivered != nil {
				<-f.delivered
				f.sys.EventStream.Publish(&remote.EndpointTerminatedEvent{Address: f.addr})
			}
			return
		}
		f.send(to, &messages.TokenChunk{RequestID: req.RequestID, Seq: uint32(i + 1), Tokens: []uint32{tok}, Text: letter(tok)})
	}
	f.send(to, &messages.GenerateResult{RequestID: req.RequestID, Tokens: f.answer, Text: text(f.answer),
		FinishReason: messages.FinishLength})
}

func letter(tok uint32) string { return string(rune('a' + tok)) }

func text(tokens []uint32) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString(letter(t))
	}
	return b.String()
}

func (f *fakeRouter) seen() ([]*messages.GenerateRequest, []*messages.CancelRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests), slices.Clone(f.cancels)
}

// fakeNetwork is a client in its own actor system whose endpoints are the
// fake routers.
func fakeNetwork(t *testing.T, routers ...*fakeRouter) *Client {
	t.Helper()
	sys := messages.NewActorSystem(nil)
	t.Cleanup(sys.Shutdown)
	byAddr := map[string]*fakeRouter{}
	var targets []*actor.PID
	for _, f := range routers {
		f.sys, byAddr[f.addr] = sys, f
		targets = append(targets, actor.NewPID(f.addr, AdmissionName))
	}
	sys.ProcessRegistry.RegisterAddressResolver(func(pid *actor.PID) (actor.Process, bool) {
		f, ok := byAddr[pid.Address]
		return f, ok
	})
	c := newClient(sys, targets, Options{NoAnswerAfter: time.Minute})
	t.Cleanup(c.Close)
	return c
}

// collector is what a caller of Generate receives.
type collector struct {
	mu     sync.Mutex
	tokens []int
	text   strings.Builder
	waits  map[int]chan struct{}
}

func (c *collector) token(t int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tokens = append(c.tokens, t)
	if ch, ok := c.waits[len(c.tokens)]; ok {
		close(ch)
		delete(c.waits, len(c.tokens))
	}
}

// at is closed once n tokens have been delivered.
func (c *collector) at(n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	if len(c.tokens) >= n {
		close(ch)
		return ch
	}
	if c.waits == nil {
		c.waits = map[int]chan struct{}{}
	}
	c.waits[n] = ch
	return ch
}

func (c *collector) onText(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.text.WriteString(s)
}

var reference = []uint32{7, 3, 1, 4, 1, 5, 9, 2}

func ints(ts []uint32) []int {
	out := make([]int, len(ts))
	for i, t := range ts {
		out[i] = int(t)
	}
	return out
}

// TestContinuesThroughAnotherEndpoint: the router a request streams
// through loses its connection after 3 tokens; the request goes on through
// the other router under a new id, with the same prompt and max_tokens, and
// the caller receives every token and every byte of text exactly once.
// The next request goes to the live router only.
func TestContinuesThroughAnotherEndpoint(t *testing.T) {
	got := &collector{}
	a := &fakeRouter{addr: "router-a:1", answer: reference, stopAfter: 3, delivered: got.at(3)}
	b := &fakeRouter{addr: "router-b:1", answer: reference}
	c := fakeNetwork(t, a, b)
	var told []string
	onContinue := func(lost *messages.WireError, next string) { told = append(told, lost.Where+" to "+next) }
	res, err := c.Generate(context.Background(), "acme", "hi",
		GenerateOptions{MaxTokens: len(reference), OnText: got.onText, OnContinue: onContinue}, got.token)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(told, []string{"router-a:1 to router-b:1"}) {
		t.Errorf("OnContinue told %q, want a to b once", told)
	}
	if !slices.Equal(got.tokens, ints(reference)) || got.text.String() != text(reference) || res.Text != text(reference) ||
		!slices.Equal(res.Tokens, ints(reference)) {
		t.Fatalf("delivered %v %q, result %v %q; want %v %q once each", got.tokens, got.text.String(), res.Tokens, res.Text,
			reference, text(reference))
	}
	if res.Continued != 1 || res.Replayed != 3 {
		t.Errorf("continued %d, replayed %d; want 1 continuation that replayed the 3 tokens delivered", res.Continued, res.Replayed)
	}
	ra, _ := a.seen()
	rb, _ := b.seen()
	if len(ra) != 1 || len(rb) != 1 || ra[0].RequestID == rb[0].RequestID || rb[0].Prompt != "hi" || rb[0].MaxTokens != uint32(len(reference)) {
		t.Fatalf("requests at a %+v, at b %+v; want one each, the same prompt and max_tokens under new ids", ra, rb)
	}
	for range 3 {
		if _, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: len(reference)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if ra, _ := a.seen(); len(ra) != 1 {
		t.Errorf("the lost router received %d requests in its backoff, want none after the first", len(ra))
	}
}

// TestReplayThatDiffersIsRefused: a continuation whose tokens differ from
// those delivered ends the request with an integrity error; the caller has
// the tokens of the first router only, and the second is told to cancel.
func TestReplayThatDiffersIsRefused(t *testing.T) {
	got := &collector{}
	other := slices.Clone(reference)
	other[1]++
	a := &fakeRouter{addr: "router-a:1", answer: reference, stopAfter: 3, delivered: got.at(3)}
	b := &fakeRouter{addr: "router-b:1", answer: other}
	c := fakeNetwork(t, a, b)
	_, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: len(reference), OnText: got.onText}, got.token)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeIntegrity || !strings.Contains(we.Message, "token 1 is 4, delivered as 3") {
		t.Fatalf("Generate: %v, want an integrity error naming token 1", err)
	}
	if !slices.Equal(got.tokens, ints(reference[:3])) || got.text.String() != text(reference[:3]) {
		t.Errorf("delivered %v %q, want only the first router's %v", got.tokens, got.text.String(), reference[:3])
	}
	testwaitCancel(t, b)
}

// testwaitCancel waits for a router to receive a cancel.
func testwaitCancel(t *testing.T, f *fakeRouter) {
	t.Helper()
	testwait.For(t, f.addr+" receives a cancel", time.Minute, func() bool {
		_, cancels := f.seen()
		return len(cancels) > 0
	})
}

// TestNoEndpointLeftFailsFast: when every router a request went through
// is lost, it fails with node_lost naming them, and a new request finds no
// live endpoint at once.
func TestNoEndpointLeftFailsFast(t *testing.T) {
	got := &collector{}
	a := &fakeRouter{addr: "router-a:1", answer: reference, stopAfter: 2, delivered: got.at(2)}
	b := &fakeRouter{addr: "router-b:1", answer: reference, stopAfter: 4, delivered: got.at(4)}
	c := fakeNetwork(t, a, b)
	_, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: len(reference)}, got.token)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeNodeLost || !strings.Contains(we.Message, "tried router-a:1, router-b:1") {
		t.Fatalf("Generate: %v, want node_lost naming both routers", err)
	}
	if !slices.Equal(got.tokens, ints(reference[:4])) {
		t.Errorf("delivered %v, want %v", got.tokens, reference[:4])
	}
	_, err = c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 1}, nil)
	if !errors.As(err, &we) || we.Code != messages.CodeNodeLost || !strings.Contains(we.Message, "no live endpoint: router-a:1 (its connection ended") {
		t.Fatalf("a request with both routers in their backoff: %v, want node_lost naming them", err)
	}
}

// TestOnlyNodeLostIsContinued: busy, too long, bad request go back to the
// caller as they came; node_lost from a router (a node on its path gone)
// is continued through the other.
func TestOnlyNodeLostIsContinued(t *testing.T) {
	for _, code := range []messages.ErrorCode{messages.CodeBusy, messages.CodePromptTooLong, messages.CodeBadRequest} {
		a := &fakeRouter{addr: "router-a:1", err: &messages.WireError{Code: code, Message: "no"}}
		b := &fakeRouter{addr: "router-b:1", err: &messages.WireError{Code: code, Message: "no"}}
		c := fakeNetwork(t, a, b)
		_, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 4}, nil)
		ra, _ := a.seen()
		rb, _ := b.seen()
		if !errors.Is(err, &messages.WireError{Code: code}) || len(ra)+len(rb) != 1 {
			t.Errorf("%s: %v after %d requests, want the error as it came after one", code, err, len(ra)+len(rb))
		}
	}
	a := &fakeRouter{addr: "router-a:1", err: &messages.WireError{Code: messages.CodeNodeLost, Message: "decode gone"}}
	b := &fakeRouter{addr: "router-b:1", err: &messages.WireError{Code: messages.CodeNodeLost, Message: "decode gone"}}
	c := fakeNetwork(t, a, b)
	_, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 4}, nil)
	ra, _ := a.seen()
	rb, _ := b.seen()
	if !errors.Is(err, ErrNoAnswer) || len(ra) != 1 || len(rb) != 1 {
		t.Errorf("node_lost: %v after %d and %d requests, want node_lost after one through each", err, len(ra), len(rb))
	}
}

// TestRoundRobin: new requests alternate between live endpoints.
func TestRoundRobin(t *testing.T) {
	a := &fakeRouter{addr: "router-a:1", answer: reference[:1]}
	b := &fakeRouter{addr: "router-b:1", answer: reference[:1]}
	c := fakeNetwork(t, a, b)
	for range 6 {
		if _, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 1}, nil); err != nil {
			t.Fatal(err)
		}
	}
	ra, _ := a.seen()
	rb, _ := b.seen()
	if len(ra) != 3 || len(rb) != 3 {
		t.Errorf("%d requests at a and %d at b, want 3 each", len(ra), len(rb))
	}
}

// TestCancelReachesTheContinuation: a request cancelled after it was
// continued is cancelled on the router that holds it now.
func TestCancelReachesTheContinuation(t *testing.T) {
	got := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	a := &fakeRouter{addr: "router-a:1", answer: reference, stopAfter: 2, delivered: got.at(2)}
	// b streams one token more than was delivered and falls silent, as a
	// node that has not seen the cancel yet.
	b := &fakeRouter{addr: "router-b:1", answer: reference, stopAfter: 3}
	c := fakeNetwork(t, a, b)
	done := make(chan error, 1)
	go func() {
		_, err := c.Generate(ctx, "acme", "hi", GenerateOptions{MaxTokens: len(reference)}, got.token)
		done <- err
	}()
	testwait.Recv(t, "the third token", time.Minute, got.at(3))
	cancel()
	testwaitCancel(t, b)
	if _, cancels := a.seen(); len(cancels) != 0 {
		t.Errorf("the lost router was sent %d cancels, want none", len(cancels))
	}
	rb, cancels := b.seen()
	if cancels[0].RequestID != rb[0].RequestID {
		t.Errorf("b was told to cancel request %d, it holds %d", cancels[0].RequestID, rb[0].RequestID)
	}
	// b's connection ends before it answers: the request is over.
	b.sys.EventStream.Publish(&remote.EndpointTerminatedEvent{Address: b.addr})
	if err := testwait.Recv(t, "Generate to return", time.Minute, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Generate: %v, want the context's error", err)
	}
}

// TestCancelledBeforeAnAttemptSendsNothing: a request whose context is
// done before it is sent is not sent: it ends with the context's error,
// and no node reserves anything for it.
func TestCancelledBeforeAnAttemptSendsNothing(t *testing.T) {
	a := &fakeRouter{addr: "router-a:1", answer: reference}
	c := fakeNetwork(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Generate(ctx, "acme", "hi", GenerateOptions{MaxTokens: len(reference)}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Generate: %v, want the context's error", err)
	}
	if ra, _ := a.seen(); len(ra) != 0 {
		t.Errorf("the router was sent %d requests, want none", len(ra))
	}
}

// TestCancelNeverConfirmedIsTheContextsError: a request cancelled on a
// router that then says nothing more ends, after the silence bound, with
// the context's error (joined with node_lost), and is not continued
// through another router.
func TestCancelNeverConfirmedIsTheContextsError(t *testing.T) {
	got := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	a := &fakeRouter{addr: "router-a:1", answer: reference, stopAfter: 2}
	b := &fakeRouter{addr: "router-b:1", answer: reference}
	c := fakeNetwork(t, a, b)
	c.timeout = 50 * time.Millisecond // what the silence bound is does not matter here, only that it passes
	_, err := c.Generate(ctx, "acme", "hi", GenerateOptions{MaxTokens: len(reference)}, func(tok int) {
		got.token(tok)
		if len(got.tokens) == 2 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("Generate: %v, want the context's error joined with node_lost", err)
	}
	if rb, _ := b.seen(); len(rb) != 0 {
		t.Errorf("the cancelled request was continued through b (%d requests)", len(rb))
	}
	if _, cancels := a.seen(); len(cancels) != 1 {
		t.Errorf("a was sent %d cancels, want 1", len(cancels))
	}
}

// TestNoMoreTokensThanAsked: a node that streams more tokens than
// MaxTokens has the caller handed MaxTokens of them at most, and its
// answer ends as an integrity failure.
func TestNoMoreTokensThanAsked(t *testing.T) {
	got := &collector{}
	a := &fakeRouter{addr: "router-a:1", answer: reference}
	c := fakeNetwork(t, a)
	const asked = 3
	_, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: asked, OnText: got.onText}, got.token)
	if !errors.Is(err, &messages.WireError{Code: messages.CodeIntegrity}) {
		t.Fatalf("Generate: %v, want an integrity error", err)
	}
	if !slices.Equal(got.tokens, ints(reference[:asked])) || got.text.String() != text(reference[:asked]) {
		t.Errorf("delivered %v %q, want the first %d only", got.tokens, got.text.String(), asked)
	}
	if c.Refused() == 0 {
		t.Errorf("no chunk past MaxTokens refused")
	}
}

// TestDrainingRouterBusyIsContinued: a draining router's busy goes on to
// the other router, which answers; when every router drains, the busy
// comes back as it came, not as node_lost.
func TestDrainingRouterBusyIsContinued(t *testing.T) {
	draining := &messages.WireError{Code: messages.CodeBusy, Message: "draining", Where: messages.WhereDrainingRouter}
	a := &fakeRouter{addr: "router-a:1", err: draining}
	b := &fakeRouter{addr: "router-b:1", answer: reference[:3]}
	c := fakeNetwork(t, a, b)
	res, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 3}, nil)
	ra, _ := a.seen()
	if err != nil || res.Text != text(reference[:3]) || len(ra) != 1 || res.Continued != 1 {
		t.Fatalf("through a draining router and a live one: %+v, %v after %d requests to the draining one", res, err, len(ra))
	}
	a2 := &fakeRouter{addr: "router-a:1", err: draining}
	b2 := &fakeRouter{addr: "router-b:1", err: draining}
	c = fakeNetwork(t, a2, b2)
	_, err = c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 3}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeBusy || we.Where != messages.WhereDrainingRouter {
		t.Fatalf("every router draining: %v, want the draining router's busy", err)
	}
}

// TestStopEndsTheRequestAsStopped: closing Stop asks the router to stop
// the request, not to cancel it, and the request ends with its answer as
// the router ended it, finish stop_sequence; one whose router is lost once
// Stop is closed ends with what was delivered, as stopped, and is not
// continued through another router.
func TestStopEndsTheRequestAsStopped(t *testing.T) {
	got := &collector{}
	stop := make(chan struct{})
	a := &fakeRouter{addr: "router-a:1", answer: reference, stopAfter: 3, stops: true}
	c := fakeNetwork(t, a)
	go func() { <-got.at(2); close(stop) }()
	res, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: len(reference), Stop: stop,
		OnText: got.onText}, got.token)
	if err != nil || res.Finish != "stop_sequence" || !slices.Equal(res.Tokens, ints(reference[:3])) ||
		res.Text != text(reference[:3]) {
		t.Fatalf("Generate: %+v, %v; want the 3 tokens streamed, finish stop_sequence", res, err)
	}
	ra, cancels := a.seen()
	if len(cancels) != 1 || cancels[0].Reason != messages.CancelStop || cancels[0].RequestID != ra[0].RequestID {
		t.Fatalf("the router was sent %+v, want one stop of request %d", cancels, ra[0].RequestID)
	}

	got = &collector{}
	stop = make(chan struct{})
	a = &fakeRouter{addr: "router-a:1", answer: reference, stopAfter: 3, lostOnStop: true}
	b := &fakeRouter{addr: "router-b:1", answer: reference}
	c = fakeNetwork(t, a, b)
	go func() { <-got.at(3); close(stop) }()
	res, err = c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: len(reference), Stop: stop,
		OnText: got.onText}, got.token)
	if err != nil || res.Finish != "stop_sequence" || !slices.Equal(res.Tokens, ints(reference[:3])) ||
		res.Text != text(reference[:3]) || res.Continued != 0 {
		t.Fatalf("a stopped request whose router was lost: %+v, %v; want the 3 tokens delivered, as stopped", res, err)
	}
	if rb, _ := b.seen(); len(rb) != 0 {
		t.Errorf("the stopped request was continued through b (%d requests)", len(rb))
	}
}

// TestUnavailableIsContinued: a router that sees no decode node answers
// unavailable; the request goes on through another router, which may see
// one; when none does, unavailable comes back as it came.
func TestUnavailableIsContinued(t *testing.T) {
	none := &messages.WireError{Code: messages.CodeUnavailable, Message: "no decode node in sight", Where: "decode nodes"}
	a := &fakeRouter{addr: "router-a:1", err: none}
	b := &fakeRouter{addr: "router-b:1", answer: reference[:3]}
	c := fakeNetwork(t, a, b)
	res, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 3}, nil)
	if ra, _ := a.seen(); err != nil || res.Text != text(reference[:3]) || len(ra) != 1 || res.Continued != 1 {
		t.Fatalf("through a router without decode nodes and one with: %+v, %v after %d requests to the first", res, err, len(ra))
	}
	c = fakeNetwork(t, &fakeRouter{addr: "router-a:1", err: none}, &fakeRouter{addr: "router-b:1", err: none})
	_, err = c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 3}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeUnavailable || we.Where != "decode nodes" {
		t.Fatalf("no router with decode nodes: %v, want unavailable as it came", err)
	}
}
