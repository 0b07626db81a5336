//go:build !race

// The node serves protoactor remote (an InFlight names the decode node by
// its address), and several protoactor remote instances in one process
// race inside protoactor and gRPC; see remote_test.go.

package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// heldNode is a decode node whose only prefill peer is an address nothing
// listens on: no plan reaches it, so every request waits in its prefill
// phase (up to PrefillTimeout) until it is cancelled.
func heldNode(t *testing.T) *Node {
	cfg := testConfig()
	cfg.Role = RoleDecode
	nowhere := PrefillPeer{PID: actor.NewPID("127.0.0.1:1", PrefillName), Incarnation: 7, Pages: cfg.PrefillPages}
	return startNodeWith(t, cfg, Options{Listen: "127.0.0.1:0", Auth: trust.Insecure(nil), DataPlane: "127.0.0.1:2",
		Pick: func(exclude map[uint64]bool) (PrefillPeer, bool) { return nowhere, !exclude[nowhere.Incarnation] }})
}

func listOf(t *testing.T, n *Node, limit int) *messages.InFlightList {
	t.Helper()
	l, err := ask[*messages.InFlightList](n.Root(), n.Admission(), ListRequests{Max: limit}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func cancelOf(t *testing.T, n *Node, number uint64) *messages.CancelInFlightReply {
	t.Helper()
	r, err := ask[*messages.CancelInFlightReply](n.Root(), n.Admission(), CancelNumber{Number: number, By: "test"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestOperatorListsAndCancels: admission lists its requests in flight,
// oldest first and at most as many as asked, with their tenant, phase and
// path; a cancel by number answers that request's client "cancelled" and
// frees its pages; a number not in flight is refused, naming it.
func TestOperatorListsAndCancels(t *testing.T) {
	n := heldNode(t)
	c := localClient(n)
	tenants := []string{"acme", "globex", "initech"}
	ended := map[string]chan error{}
	for i, tenant := range tenants {
		ended[tenant] = make(chan error, 1)
		go func() {
			_, err := c.Generate(context.Background(), tenant, fmt.Sprintf("request %d of %s", i, tenant),
				client.GenerateOptions{MaxTokens: 4}, nil)
			ended[tenant] <- err
		}()
		// One at a time, so that their ages order them; a request is
		// queued from admission to its first step.
		testwait.Report(t, fmt.Sprintf("%d requests waiting for prefill", i+1), time.Minute, func() (bool, string) {
			l := listOf(t, n, 0)
			return len(l.Requests) == i+1 && l.Requests[i].Phase == messages.PhasePrefill, fmt.Sprintf("%+v", l)
		})
	}

	l := listOf(t, n, 2)
	if l.Incarnation != n.Config().Incarnation || len(l.Requests) != 2 || l.Omitted != 1 {
		t.Fatalf("list of 2 of 3 requests: %+v", l)
	}
	for i, r := range l.Requests {
		if r.Tenant != tenants[i] || r.Phase != messages.PhasePrefill || r.Prefill != "127.0.0.1:1" || r.Decode != n.Address() ||
			r.Tokens != 0 || r.ClientID == 0 {
			t.Errorf("request %d listed as %+v, want tenant %s waiting for prefill node 127.0.0.1:1", i, r, tenants[i])
		}
	}

	globex := l.Requests[1].Number
	if rep := cancelOf(t, n, globex); rep.Err != nil || rep.Request.Tenant != "globex" {
		t.Fatalf("cancel of globex's request: %+v", rep)
	}
	var we *messages.WireError
	if err := testwait.Recv(t, "globex's answer", time.Minute, ended["globex"]); !errors.As(err, &we) || we.Code != messages.CodeCancelled {
		t.Fatalf("globex's client got %v, want cancelled", err)
	}
	// Its client has the answer; admission forgets the request when its
	// actor has stopped, a moment later.
	testwait.For(t, "the cancelled request out of the list", time.Minute, func() bool {
		for _, r := range listOf(t, n, 0).Requests {
			if r.Number == globex {
				return false
			}
		}
		return true
	})
	for _, number := range []uint64{globex, 999} {
		rep := cancelOf(t, n, number)
		if rep.Err == nil || rep.Err.Code != messages.CodeBadRequest || !strings.Contains(rep.Err.Message, fmt.Sprintf("request %d of", number)) {
			t.Fatalf("cancel of request %d, not in flight: %+v", number, rep)
		}
	}
	if l := listOf(t, n, 0); len(l.Requests) != 2 || l.Omitted != 0 || l.Requests[0].Tenant != "acme" || l.Requests[1].Tenant != "initech" {
		t.Fatalf("after the cancel: %+v", l)
	}

	for _, r := range listOf(t, n, 0).Requests {
		cancelOf(t, n, r.Number)
	}
	for _, tenant := range []string{"acme", "initech"} {
		if err := testwait.Recv(t, tenant+"'s answer", time.Minute, ended[tenant]); !errors.As(err, &we) || we.Code != messages.CodeCancelled {
			t.Fatalf("%s's client got %v, want cancelled", tenant, err)
		}
	}
	testwait.Report(t, "every page free after the cancels", time.Minute, func() (bool, string) {
		inUse, err := n.PagesInUse()
		return err == nil && inUse == 0, fmt.Sprintf("%d pages in use (%v)", inUse, err)
	})
	if l := listOf(t, n, 0); len(l.Requests) != 0 || l.Omitted != 0 {
		t.Fatalf("nothing in flight, listed %+v", l)
	}
}

// TestMoveOfARequestEndingAnswers: a move asked of a request as it ends
// (cancelled, its actor stopping with the move waiting in its mailbox) is
// answered, never left to its timeout: not in flight, or refused.
func TestMoveOfARequestEndingAnswers(t *testing.T) {
	n := heldNode(t)
	c := localClient(n)
	for i := range 3 {
		ended := make(chan error, 1)
		go func() {
			_, err := c.Generate(context.Background(), "acme", fmt.Sprintf("request %d that ends", i), client.GenerateOptions{MaxTokens: 4}, nil)
			ended <- err
		}()
		var number uint64
		testwait.Report(t, "the request waiting for prefill", time.Minute, func() (bool, string) {
			l := listOf(t, n, 0)
			if len(l.Requests) != 1 {
				return false, fmt.Sprintf("%+v", l)
			}
			number = l.Requests[0].Number
			return true, ""
		})
		// The cancel reaches admission first, which hands it on; the move
		// comes right after.
		n.Root().Send(n.Admission(), CancelNumber{Number: number, By: "test"})
		moved := make(chan error, 1)
		go func() { moved <- n.Move(number, handoff.Peer{Address: "127.0.0.1:2", Incarnation: 7}, 10*time.Minute) }()
		err := testwait.Recv(t, "the move's answer", time.Minute, moved)
		var gone *NotInFlightError
		var refused *handoff.MoveRefusedError
		if !errors.As(err, &gone) && !errors.As(err, &refused) {
			t.Fatalf("move of a request ending: %v, want not in flight or refused", err)
		}
		testwait.Recv(t, "the cancelled request's answer", time.Minute, ended)
	}
}
