package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

func TestDialRefusesBadAddresses(t *testing.T) {
	for _, tc := range []struct{ endpoint, listen, want string }{
		{"no-port", "", `endpoint "no-port"`},
		{"127.0.0.1:7070", "127.0.0.1:notaport", `port "notaport" must be 0 to 65535`},
		{"127.0.0.1:7070", "256.0.0.1:0", "cannot listen on 256.0.0.1:0"},
	} {
		c, err := Dial(tc.endpoint, Options{Listen: tc.listen, Auth: trust.Insecure(nil)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			if c != nil {
				c.Close()
			}
			t.Errorf("Dial(%q, listen %q): %v, want error containing %q", tc.endpoint, tc.listen, err, tc.want)
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

// TestNoAnswerIsNodeLost: a node that never answers is reported as lost,
// with the stable code, after NoAnswerAfter.
func TestNoAnswerIsNodeLost(t *testing.T) {
	sys := messages.NewActorSystem(nil)
	silent := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	c := New(sys, silent, Options{NoAnswerAfter: 50 * time.Millisecond})
	_, err := c.Generate(context.Background(), "acme", "hi", GenerateOptions{MaxTokens: 4}, nil)
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("silent node: %v", err)
	}
}
