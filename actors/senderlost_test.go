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

// TestSenderLostCancelsItsRequests: when the node serving at a request's
// sender's address (a router) is lost for good, its requests are
// cancelled and their pages freed; a loss at another address cancels
// none.
func TestSenderLostCancelsItsRequests(t *testing.T) {
	n := heldNode(t)
	c := localClient(n)
	ended := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := c.Generate(context.Background(), "acme", fmt.Sprintf("request %d", i), client.GenerateOptions{MaxTokens: 4}, nil)
			ended <- err
		}()
	}
	waiting := func() (bool, string) {
		l := listOf(t, n, 0)
		return len(l.Requests) == 2, fmt.Sprintf("%+v", l)
	}
	testwait.Report(t, "2 requests waiting for prefill", time.Minute, waiting)
	n.SenderLost("127.0.0.1:9") // no request of ours came from there
	// Admission handles messages in order: once it has answered a list
	// after the loss, the loss was handled.
	if ok, saw := waiting(); !ok {
		t.Fatalf("a loss at another address cancelled requests: %s", saw)
	}
	n.SenderLost(n.Address())
	var we *messages.WireError
	for range 2 {
		if err := <-ended; !errors.As(err, &we) || we.Code != messages.CodeCancelled {
			t.Fatalf("a request of the lost sender ended with %v, want cancelled", err)
		}
	}
	testwait.Report(t, "every page free after the loss", time.Minute, func() (bool, string) {
		inUse, err := n.PagesInUse()
		return err == nil && inUse == 0, fmt.Sprintf("%d pages in use (%v)", inUse, err)
	})
}
