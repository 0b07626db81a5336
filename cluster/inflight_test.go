//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC; see node_test.go.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testnet"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/messages/messagestest"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// heldTrio is a prefill, a decode and a router node whose prefill node
// its peers reach only through a gate, shut once all three see each
// other: every request then waits for its prefill node (the plan never
// arrives) until it is cancelled, or its 20 s of PrefillTimeout pass,
// while membership, which gossips directly, still sees the prefill node
// alive.
func heldTrio(t *testing.T) (p, d, r *Node) {
	t.Helper()
	gate := testnet.NewGate(t)
	listen := trusttest.ClosedAddr(t)
	gate.Open(listen)
	long := func(cfg *NodeConfig) { cfg.Actors.PrefillTimeout = 20 * time.Second }
	p = startNodeTuned(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, nil, func(cfg *NodeConfig) {
		long(cfg)
		cfg.Listen, cfg.Advertise = listen, gate.Addr()
	})
	d = startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, long, p.GossipAddr())
	r = startNodeTuned(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, nil, long, p.GossipAddr())
	for _, n := range []*Node{p, d, r} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 && routable(n) })
	}
	gate.Shut()
	return p, d, r
}

// operatorAsk sends m to the control actor of the node at addr and waits
// for the answer.
func operatorAsk(t *testing.T, asker *messagestest.Peer, addr string, m messages.Message) messages.Message {
	t.Helper()
	rep, err := messages.Request(asker.Sys.Root, actor.NewPID(addr, ControlName), m, 10*time.Second)
	if err != nil {
		t.Fatalf("%s to %s: %v", m.TypeCode(), addr, err)
	}
	return rep
}

// TestOperatorCancelsInFlight: a request held before its prefill node is
// listed by the router (routed to the decode node) and by the decode node
// (waiting for the prefill node); an operator's cancel by the number
// either lists answers the client "cancelled" and frees the decode node's
// pages; a number not in flight, or of another node's run, is refused
// with both numbers.
func TestOperatorCancelsInFlight(t *testing.T) {
	p, d, r := heldTrio(t)
	op := messagestest.StartAwaiting(t, trusttest.Shared(t).Authority(t, trust.RoleOperator, "admin", nil))
	list := func(n *Node) *messages.InFlightList {
		return operatorAsk(t, op, n.Address(), &messages.ListInFlight{}).(*messages.InFlightList)
	}
	c := tenantClient(t, r.Address(), "acme")
	for _, via := range []*Node{r, d} {
		done := make(chan error, 1)
		go func() {
			_, err := c.Generate(context.Background(), "acme", "a request held before its prefill node",
				client.GenerateOptions{MaxTokens: 8}, nil)
			done <- err
		}()
		var routed, held messages.InFlight
		waitFor(t, "the request listed by the router and the decode node", time.Minute, func() bool {
			rl, dl := list(r), list(d)
			if len(rl.Requests) != 1 || len(dl.Requests) != 1 || dl.Requests[0].Phase != messages.PhasePrefill {
				return false
			}
			routed, held = rl.Requests[0], dl.Requests[0]
			return rl.Incarnation == r.Incarnation() && dl.Incarnation == d.Incarnation()
		})
		if routed.Tenant != "acme" || routed.Phase != messages.PhaseRouted || routed.Decode != d.Address() || routed.Prefill != p.Address() {
			t.Errorf("the router lists %+v, want acme's request routed to %s with prefill node %s", routed, d.Address(), p.Address())
		}
		if held.Tenant != "acme" || held.Decode != d.Address() || held.Prefill != p.Address() || held.ClientID != routed.ClientID {
			t.Errorf("the decode node lists %+v, want acme's request %d waiting for %s", held, routed.ClientID, p.Address())
		}
		number := routed.Number
		if via == d {
			number = held.Number
		}
		rep := operatorAsk(t, op, via.Address(), &messages.CancelInFlight{Incarnation: via.Incarnation(), Number: number}).(*messages.CancelInFlightReply)
		if rep.Err != nil || rep.Request.Tenant != "acme" {
			t.Fatalf("cancel of request %d on %s: %+v", number, via.cfg.Actors.Role, rep)
		}
		var we *messages.WireError
		if err := testwait.Recv(t, "the cancelled request's answer", time.Minute, done); !errors.As(err, &we) || we.Code != messages.CodeCancelled {
			t.Fatalf("cancelled on the %s node, the client got %v, want cancelled", via.cfg.Actors.Role, err)
		}
		waitFor(t, "the decode node's pages free", time.Minute, func() bool { return allFree(d) })
	}
	for _, tc := range []struct {
		m    *messages.CancelInFlight
		want string
	}{
		{&messages.CancelInFlight{Incarnation: d.Incarnation(), Number: 999}, "request 999 of incarnation"},
		{&messages.CancelInFlight{Incarnation: r.Incarnation(), Number: 1}, "this node is incarnation"},
	} {
		rep := operatorAsk(t, op, d.Address(), tc.m).(*messages.CancelInFlightReply)
		if rep.Err == nil || rep.Err.Code != messages.CodeBadRequest || !strings.Contains(rep.Err.Message, tc.want) {
			t.Errorf("cancel %+v: %+v, want bad_request saying %q", tc.m, rep, tc.want)
		}
	}
}

// TestInFlightOnlyForOperators: a tenant asking a node for its requests in
// flight, or to cancel one, gets no answer and is counted; a node that
// only prefills lists none.
func TestInFlightOnlyForOperators(t *testing.T) {
	ca := trusttest.Shared(t)
	n := startClusterNode(t, actors.RolePrefill)
	before := n.cfg.Auth.Refused()[trust.RefusedRole]
	tenant := messagestest.StartAwaiting(t, ca.Authority(t, trust.RoleTenant, "mallory", nil))
	for _, m := range []messages.Message{&messages.ListInFlight{}, &messages.CancelInFlight{Incarnation: n.Incarnation(), Number: 1}} {
		if _, err := messages.Request(tenant.Sys.Root, actor.NewPID(n.Address(), ControlName), m, time.Second); err == nil {
			t.Errorf("a tenant's %s was answered", m.TypeCode())
		}
	}
	if got := n.cfg.Auth.Refused()[trust.RefusedRole]; got != before+2 {
		t.Errorf("role refusals went from %d to %d, want two more", before, got)
	}
	op := messagestest.StartAwaiting(t, ca.Authority(t, trust.RoleOperator, "admin", nil))
	if l := operatorAsk(t, op, n.Address(), &messages.ListInFlight{}).(*messages.InFlightList); l.Incarnation != n.Incarnation() ||
		len(l.Requests) != 0 || l.Omitted != 0 {
		t.Errorf("a prefill node lists %+v, want nothing", l)
	}
}

// TestStatusCountsTokensOut: a node's status counts every token it
// streamed, and a router every token it relayed.
func TestStatusCountsTokensOut(t *testing.T) {
	_, d, r, c := startTrio(t)
	total := 0
	for i, maxTokens := range []int{5, 9} {
		res, err := c.Generate(context.Background(), "acme", fmt.Sprintf("count my tokens, %d", i),
			client.GenerateOptions{MaxTokens: maxTokens}, nil)
		if err != nil {
			t.Fatal(err)
		}
		total += len(res.Tokens)
	}
	for _, n := range []*Node{d, r} {
		if got := n.status().Node.TokensOut; got != uint64(total) {
			t.Errorf("%s node: %d tokens out, its clients got %d", n.cfg.Actors.Role, got, total)
		}
	}
}

// TestCacheSummaryOnlyForRouters: a prefilling node tells a router what
// its prefix caches hold, and answers a tenant or an operator asking the
// same nothing, counting each refusal.
func TestCacheSummaryOnlyForRouters(t *testing.T) {
	ca := trusttest.Shared(t)
	n := startClusterNode(t, actors.RolePrefill)
	before := n.cfg.Auth.Refused()[trust.RefusedRole]
	for _, role := range []trust.Role{trust.RoleTenant, trust.RoleOperator} {
		asker := messagestest.StartAwaiting(t, ca.Authority(t, role, "mallory", nil))
		if _, err := messages.Request(asker.Sys.Root, actor.NewPID(n.Address(), ControlName), &messages.CacheSummaryRequest{}, time.Second); err == nil {
			t.Errorf("a cache summary request of a %s was answered", role)
		}
	}
	if got := n.cfg.Auth.Refused()[trust.RefusedRole]; got != before+2 {
		t.Errorf("role refusals went from %d to %d, want two more", before, got)
	}
	router := messagestest.StartAwaiting(t, ca.Authority(t, trust.RoleRouter, "r", nil))
	rep, err := messages.Request(router.Sys.Root, actor.NewPID(n.Address(), ControlName), &messages.CacheSummaryRequest{}, time.Minute)
	if s, ok := rep.(*messages.CacheSummary); err != nil || !ok || s.Incarnation != n.Incarnation() || len(s.Keys) != 0 {
		t.Fatalf("a router's request: %+v, %v; want the node's empty summary", rep, err)
	}
}
