package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

func TestDialRefusesBadAddresses(t *testing.T) {
	// Something listens here, so that Dial gets past the endpoint's probe.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	live := ln.Addr().String()
	// Just closed: nothing listens there.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nothing := gone.Addr().String()
	gone.Close()
	var tooMany []string
	for i := range EndpointsMax + 1 {
		tooMany = append(tooMany, fmt.Sprintf("127.0.0.1:%d", 10000+i))
	}
	for _, tc := range []struct {
		endpoints []string
		listen    string
		want      []string
	}{
		{[]string{"no-port"}, "", []string{`endpoint "no-port"`}},
		{[]string{live, "127.0.0.1"}, "", []string{`endpoint "127.0.0.1"`}},
		{[]string{live, live}, "", []string{`endpoint "` + live + `" given twice`}},
		{nil, "", []string{"0 endpoints given; want 1 to 64"}},
		{tooMany, "", []string{"65 endpoints given; want 1 to 64"}},
		{[]string{live}, "127.0.0.1:notaport", []string{`port "notaport" must be 0 to 65535`}},
		{[]string{live}, "256.0.0.1:0", []string{"cannot listen on 256.0.0.1:0"}},
		{[]string{nothing}, "", []string{"no node reachable at " + nothing}},
	} {
		c, err := DialEndpoints(context.Background(), tc.endpoints, Options{Listen: tc.listen, Auth: trust.Insecure(nil)})
		for _, want := range tc.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("DialEndpoints(%q, listen %q): %v, want error containing %q", tc.endpoints, tc.listen, err, want)
			}
		}
		if c != nil {
			c.Close()
		}
	}
}

func TestGenerateValidatesBeforeSending(t *testing.T) {
	sys := messages.NewActorSystem(nil)
	got := make(chan any, 1)
	target := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*messages.GenerateRequest); ok {
			got <- c.Message()
		}
	}))
	c := New(sys, target, Options{})
	for _, tc := range []struct {
		tenant string
		max    int
	}{{"acme", 0}, {"acme", messages.GenerateTokensMax + 1}, {"", 4}, {strings.Repeat("t", 65), 4}} {
		if _, err := c.Generate(context.Background(), tc.tenant, "hi", GenerateOptions{MaxTokens: tc.max}, nil); err == nil {
			t.Errorf("tenant %q, max %d: accepted", tc.tenant, tc.max)
		}
	}
	select {
	case m := <-got:
		t.Fatalf("an invalid request reached the node: %+v", m)
	default:
	}
}

// TestNoAnswerIsNodeLost: Generate gives a request up as lost once the
// node has sent nothing for NoAnswerAfter (zero: DefaultNoAnswerAfter),
// counted from its last message. The node here streams a token two
// minutes in and then falls silent. The test runs in a synctest bubble,
// whose clock moves only when every goroutine in it waits: the minutes
// pass at once, and exactly.
func TestNoAnswerIsNodeLost(t *testing.T) {
	const late = 2 * time.Minute
	for _, tc := range []struct {
		patience, lostAfter time.Duration
		streamed            []int
	}{
		{0, late + DefaultNoAnswerAfter, []int{7}},
		{time.Minute, time.Minute, nil}, // given up before the token
	} {
		synctest.Test(t, func(t *testing.T) {
			sys := messages.NewActorSystem(nil)
			defer sys.Shutdown()
			node := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
				if m, ok := c.Message().(*messages.GenerateRequest); ok {
					to := c.Sender()
					time.AfterFunc(late, func() {
						sys.Root.Send(to, &messages.TokenChunk{RequestID: m.RequestID, Seq: 1, Tokens: []uint32{7}})
					})
				}
			}))
			c := New(sys, node, Options{NoAnswerAfter: tc.patience})
			var streamed []int
			start := time.Now()
			_, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 4},
				func(tok int) { streamed = append(streamed, tok) })
			if took := time.Since(start); !errors.Is(err, ErrNoAnswer) || took != tc.lostAfter || !slices.Equal(streamed, tc.streamed) {
				t.Fatalf("NoAnswerAfter %s: %v after %s, streamed %v; want node lost after %s, streamed %v",
					tc.patience, err, took, streamed, tc.lostAfter, tc.streamed)
			}
		})
	}
}

// A request cancelled after the node had answered it (the cancel crossed
// the result) ends with the context's error alone.
func TestCancelCrossingTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sys := messages.NewActorSystem(nil)
		defer sys.Shutdown()
		ctx, cancel := context.WithCancel(context.Background())
		node := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if m, ok := c.Message().(*messages.GenerateRequest); ok {
				to := c.Sender()
				cancel()
				time.AfterFunc(time.Second, func() {
					sys.Root.Send(to, &messages.GenerateResult{RequestID: m.RequestID, Tokens: []uint32{7},
						FinishReason: messages.FinishLength})
				})
			}
		}))
		_, err := New(sys, node, Options{}).Generate(ctx, "acme", "hi", GenerateOptions{MaxTokens: 1}, nil)
		if !errors.Is(err, context.Canceled) || err.Error() != context.Canceled.Error() {
			t.Fatalf("cancelled, then answered: %v, want the context's error", err)
		}
	})
}

// TestNewClientWhileEventsArePublished: clients made while the actor
// system publishes events (a node's dead letters, in a process that runs a
// node and its clients) share the event stream without a data race; under
// -race, a subscription whose predicate is set after it is published was
// reported here.
func TestNewClientWhileEventsArePublished(t *testing.T) {
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				sys.EventStream.Publish(&actor.DeadLetterEvent{Message: "late"})
			}
		}
	}()
	target := actor.NewPID("127.0.0.1:1", "admission")
	for range 200 {
		c := New(sys, target, Options{Auth: trust.Insecure(nil)})
		c.Close()
	}
	close(stop)
	testwait.Recv(t, "the publisher's end", time.Minute, done)
}
