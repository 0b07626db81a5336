//go:build !race

// heldNode serves protoactor remote; see inflight_test.go.

package actors

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// TestSenderLostCancelsItsRequests: when the router serving at a routed
// request's sender's address is lost for good, the requests it routed
// before it went missing are cancelled and their pages freed. A loss at
// another address, a loss dated before the request came (a later run at
// that address routed it) and a request its client sent itself from that
// address cancel none.
func TestSenderLostCancelsItsRequests(t *testing.T) {
	n := heldNode(t)
	before := time.Now()
	own := make(chan error, 1)
	go func() {
		_, err := localClient(n).Generate(context.Background(), "acme", "sent by its client", client.GenerateOptions{MaxTokens: 4}, nil)
		own <- err
	}()
	routed := make(chan *messages.GenerateResult, 1)
	go func() {
		m := &messages.RoutedRequest{RequestID: 9, Tenant: "globex", Prompt: "routed here", MaxTokens: 4, Prefill: "127.0.0.1:1",
			PrefillIncarnation: 7, DecodeIncarnation: n.Config().Incarnation}
		res, err := n.Root().RequestFuture(n.Admission(), m, time.Minute).Result()
		if err != nil {
			t.Error(err)
		}
		r, _ := res.(*messages.GenerateResult)
		routed <- r
	}()
	list := func() *messages.InFlightList { return listOf(t, n, 0) }
	testwait.Report(t, "2 requests waiting for prefill", time.Minute, func() (bool, string) {
		l := list()
		return len(l.Requests) == 2, fmt.Sprintf("%+v", l)
	})
	// Admission handles messages in order: once it has answered a list
	// after a loss, the loss was handled.
	n.SenderLost("127.0.0.1:9", time.Now()) // nothing came from there
	n.SenderLost(n.Address(), before)       // lost before either came
	if l := list(); len(l.Requests) != 2 {
		t.Fatalf("a loss at another address, or before the requests came, cancelled some: %+v", l)
	}
	n.SenderLost(n.Address(), time.Now())
	if r := testwait.Recv(t, "the routed request's answer", time.Minute, routed); r == nil || r.Err == nil || r.Err.Code != messages.CodeCancelled {
		t.Fatalf("the lost router's request ended with %+v, want cancelled", r)
	}
	l := list()
	if len(l.Requests) != 1 || l.Requests[0].Tenant != "acme" {
		t.Fatalf("after the router's loss: %+v, want the request its client sent itself", l)
	}
	cancelOf(t, n, l.Requests[0].Number)
	var we *messages.WireError
	if err := testwait.Recv(t, "the client's own request's answer", time.Minute, own); !errors.As(err, &we) || we.Code != messages.CodeCancelled {
		t.Fatalf("the client's own request ended with %v, want cancelled by the operator", err)
	}
	testwait.Report(t, "every page free after the loss", time.Minute, func() (bool, string) {
		inUse, err := n.PagesInUse()
		return err == nil && inUse == 0, fmt.Sprintf("%d pages in use (%v)", inUse, err)
	})
}
