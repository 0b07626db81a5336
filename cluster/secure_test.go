//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC; see node_test.go.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/messages/messagestest"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// refusedAtLeast waits until auth has counted at least n refusals of kind r.
func refusedAtLeast(t *testing.T, auth *trust.Authority, r trust.Refusal, n uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d %s refusals", n, r), time.Minute, func() bool { return auth.Refused()[r] >= n })
}

// spawnRelay spawns on router a relay of request 7 of tenant acme, for up
// to maxTokens tokens, routed to admission and relaying to client.
func spawnRelay(t *testing.T, router *messagestest.Peer, admission, client *actor.PID, maxTokens uint32) (*actor.PID,
	*routerCounters, *messages.Streams) {
	t.Helper()
	counters := &routerCounters{}
	counters.routed.Add(1)
	streams, err := messages.NewStreams(router.Sys)
	if err != nil {
		t.Fatal(err)
	}
	rl := &relay{client: client, id: 7, decode: 1, stream: handoff.NewStream(7, admission.Address),
		counters: counters, auth: router.Auth,
		request: &messages.RoutedRequest{RequestID: 7, Tenant: "acme", Prompt: "hi", MaxTokens: maxTokens,
			Prefill: "127.0.0.1:1", PrefillIncarnation: 1, DecodeIncarnation: 1},
		timeout: time.Minute, log: slog.New(slog.DiscardHandler), streams: streams}
	pid, err := router.Sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return rl }),
		messages.BatchedName(trust.SecretName()))
	if err != nil {
		t.Fatal(err)
	}
	return pid, counters, streams
}

// TestRelayTakesOnlyTheRoutedDecodeNode plays the forged-answer attack on a
// router's relay whose secret name leaked: another authenticated peer (a
// tenant's client) sends it a result and a token for the right request id;
// the decode node itself sends a chunk out of sequence and one for another
// request. None reaches the client, each is counted, and the decode node's
// own answer does.
func TestRelayTakesOnlyTheRoutedDecodeNode(t *testing.T) {
	ca := trusttest.New(t)
	router := messagestest.Start(t, ca.Authority(t, trust.RoleRouter, "r", nil))
	decode := messagestest.Start(t, ca.Authority(t, trust.RoleDecode, "d", nil))
	mallory := messagestest.Start(t, ca.Authority(t, trust.RoleTenant, "mallory", nil))
	admission, routed := decode.Inbox(t, actors.AdmissionName)
	clientPID, toClient := router.Inbox(t, "client")

	_, counters, streams := spawnRelay(t, router, admission, clientPID, 2)
	e := messagestest.Next(t, "routed request at the decode node", routed, 10*time.Second)
	relayPID := e.Sender
	if !messages.WantsBatches(relayPID) {
		t.Fatalf("the relay (%s) did not ask for its answer in batches", relayPID.Id)
	}
	inbox := actor.NewPID(router.Addr, messages.InboxName)
	// The relay's answer comes in batches to the router's Inbox, or alone:
	// a stranger's is refused either way.
	forged := []messages.Message{
		&messages.GenerateResult{RequestID: 7, Text: "PWND", FinishReason: messages.FinishStop},
		&messages.TokenChunk{RequestID: 7, Seq: 1, Tokens: []uint32{666}},
		&messages.TokenBatch{Items: []messages.StreamItem{{To: relayPID.Id, Chunk: &messages.TokenChunk{RequestID: 7, Seq: 1, Tokens: []uint32{666}}}}},
	}
	// Each system gets its own copy of a PID: a PID caches the process
	// (here, the remote endpoint) of the first system that used it.
	for _, m := range forged {
		to := relayPID
		if _, ok := m.(*messages.TokenBatch); ok {
			to = inbox
		}
		if err := messages.Send(mallory.Sys.Root, messagestest.PID(to), m); err != nil {
			t.Fatal(err)
		}
	}
	refusedAtLeast(t, router.Auth, trust.RefusedStranger, 3)
	// The decode node's answer, in one batch as it sends one: an item for
	// no relay at all (counted before the result is handed on), a chunk,
	// one out of sequence, one for another request, and the result.
	item := func(m messages.Message) messages.StreamItem {
		it := messages.StreamItem{To: relayPID.Id}
		switch m := m.(type) {
		case *messages.TokenChunk:
			it.Chunk = m
		case *messages.GenerateResult:
			it.Result = m
		}
		return it
	}
	lost := item(&messages.TokenChunk{RequestID: 7, Seq: 2, Tokens: []uint32{5}})
	lost.To = "router/no-such-relay"
	batch := &messages.TokenBatch{Items: []messages.StreamItem{lost}}
	for _, m := range []messages.Message{
		&messages.TokenChunk{RequestID: 7, Seq: 1, Tokens: []uint32{5}},
		&messages.TokenChunk{RequestID: 7, Seq: 3, Tokens: []uint32{6}},
		&messages.TokenChunk{RequestID: 8, Seq: 2, Tokens: []uint32{7}},
		&messages.GenerateResult{RequestID: 7, Tokens: []uint32{5}, Text: "ok", FinishReason: messages.FinishLength},
	} {
		batch.Items = append(batch.Items, item(m))
	}
	if err := messages.Send(decode.Sys.Root, messagestest.PID(inbox), batch); err != nil {
		t.Fatal(err)
	}
	chunk := messagestest.Next(t, "the decode node's chunk", toClient, 10*time.Second).Message.(*messages.TokenChunk)
	if chunk.Seq != 1 || chunk.Tokens[0] != 5 {
		t.Fatalf("client got chunk %+v, want the decode node's seq 1 token 5", chunk)
	}
	res := messagestest.Next(t, "the decode node's result", toClient, 10*time.Second).Message.(*messages.GenerateResult)
	if res.Text != "ok" {
		t.Fatalf("client got result %+v, want the decode node's", res)
	}
	if got := counters.strangers.Load(); got != 5 {
		t.Errorf("relay refused %d messages, want 5 (3 forged, 1 out of sequence, 1 for another request)", got)
	}
	if got := router.Auth.Refused()[trust.RefusedStranger]; got != 5 {
		t.Errorf("router counted %d stranger refusals, want 5", got)
	}
	if got := streams.Unknown.Load(); got != 1 {
		t.Errorf("the router's Inbox counted %d items for no stream, want 1", got)
	}
}

// TestClientTakesOnlyItsNode: a forged result sent to a client's receiver
// (its secret name leaked) by another tenant's client is dropped and
// counted; the client returns its node's answer.
func TestClientTakesOnlyItsNode(t *testing.T) {
	ca := trusttest.New(t)
	node := messagestest.Start(t, ca.Authority(t, trust.RoleAll, "n", nil))
	mallory := messagestest.Start(t, ca.Authority(t, trust.RoleTenant, "mallory", nil))
	_, requests := node.Inbox(t, actors.AdmissionName)
	c, err := client.Dial(node.Addr, client.Options{Auth: ca.Authority(t, trust.RoleTenant, "acme", nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	type answer struct {
		res client.Result
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		res, err := c.Generate(context.Background(), "acme", "hello", client.GenerateOptions{MaxTokens: 1}, nil)
		answered <- answer{res, err}
	}()
	e := messagestest.Next(t, "the request at the node", requests, 10*time.Second)
	req := e.Message.(*messages.GenerateRequest)
	if err := messages.Send(mallory.Sys.Root, messagestest.PID(e.Sender), &messages.GenerateResult{RequestID: req.RequestID, Text: "PWND",
		FinishReason: messages.FinishStop}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the forged result refused", time.Minute, func() bool { return c.Refused() == 1 })
	if err := messages.Send(node.Sys.Root, messagestest.PID(e.Sender), &messages.GenerateResult{RequestID: req.RequestID, Tokens: []uint32{104},
		Text: "h", FinishReason: messages.FinishLength}); err != nil {
		t.Fatal(err)
	}
	a := testwait.Recv(t, "Generate to return", time.Minute, answered)
	if a.err != nil || a.res.Text != "h" {
		t.Fatalf("Generate = %+v, %v; want the node's answer %q", a.res, a.err, "h")
	}
}

// TestCredentialsDecide plays what a client may and may not do against a
// secure node: a tenant generates as itself only; no other role generates;
// only a router routes; only an operator asks for status. Each refusal is
// answered (forbidden) or, for status, left unanswered, and counted.
func TestCredentialsDecide(t *testing.T) {
	ca := trusttest.Shared(t)
	n := startClusterNode(t, actors.RoleAll)
	dial := func(role trust.Role, name string) *client.Client {
		c, err := client.Dial(n.Address(), client.Options{Auth: ca.Authority(t, role, name, nil), NoAnswerAfter: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	acme := dial(trust.RoleTenant, "acme")
	gen := func(c *client.Client, tenant string) error {
		_, err := c.Generate(context.Background(), tenant, "hello", client.GenerateOptions{MaxTokens: 4}, nil)
		return err
	}
	forbidden := &messages.WireError{Code: messages.CodeForbidden}
	res, err := acme.Generate(context.Background(), "acme", "hello", client.GenerateOptions{MaxTokens: 4}, nil)
	if want, _ := n.actors.Model().Answer("hello", 4); err != nil || fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
		t.Fatalf("acme as acme: %v, %v; want the reference %v", res.Tokens, err, want)
	}
	if err := gen(acme, "globex"); !errors.Is(err, forbidden) {
		t.Errorf("acme as globex: %v, want forbidden", err)
	}
	for _, role := range []trust.Role{trust.RoleDecode, trust.RoleOperator, trust.RoleRouter} {
		if err := gen(dial(role, "x"), "acme"); !errors.Is(err, forbidden) {
			t.Errorf("a %s generating for acme: %v, want forbidden", role, err)
		}
	}
	if got := n.cfg.Auth.Refused(); got[trust.RefusedTenant] != 1 || got[trust.RefusedRole] != 3 {
		t.Errorf("refusals %v, want 1 tenant and 3 role", got)
	}

	// A tenant routing a request itself: forbidden, counted.
	roleRefusals := n.cfg.Auth.Refused()[trust.RefusedRole]
	m := messagestest.Start(t, ca.Authority(t, trust.RoleTenant, "mallory", nil))
	inbox, answers := m.Inbox(t, "inbox")
	routed := &messages.RoutedRequest{RequestID: 1, Tenant: "acme", Prompt: "hi", MaxTokens: 2, Prefill: n.Address(),
		PrefillIncarnation: n.Incarnation(), DecodeIncarnation: n.Incarnation()}
	m.Sys.Root.RequestWithCustomSender(actor.NewPID(n.Address(), actors.AdmissionName), routed, inbox)
	r := messagestest.Next(t, "answer to a tenant's routed request", answers, 10*time.Second).Message.(*messages.GenerateResult)
	if !errors.Is(r.Err, forbidden) {
		t.Errorf("a tenant's routed request answered %+v, want forbidden", r)
	}
	// Status from a tenant: no answer (an answer would reach the waiting
	// future), counted.
	asker := messagestest.StartAwaiting(t, ca.Authority(t, trust.RoleTenant, "mallory", nil))
	if _, err := messages.Request(asker.Sys.Root, actor.NewPID(n.Address(), ControlName), &messages.StatusRequest{}, time.Second); err == nil {
		t.Error("a tenant got the node's status")
	}
	if got := n.cfg.Auth.Refused()[trust.RefusedRole]; got < roleRefusals+2 {
		t.Errorf("role refusals went from %d to %d, want at least 2 more (routed, status)", roleRefusals, got)
	}
	freeEverywhere(t, n)
}

// TestRelayFollowsAMovedStream: the decode node a request runs on says the
// stream moved to another before its last chunk arrives; the relay passes
// that chunk on, then hands the stream over: it tells the request at the
// new node to stream from there, drops what the old node sends later, and
// takes the rest from the new node alone, to which a cancel now goes. The
// same word from anyone else is refused and counted.
func TestRelayFollowsAMovedStream(t *testing.T) {
	ca := trusttest.New(t)
	router := messagestest.Start(t, ca.Authority(t, trust.RoleRouter, "r", nil))
	from := messagestest.Start(t, ca.Authority(t, trust.RoleDecode, "d1", nil))
	to := messagestest.Start(t, ca.Authority(t, trust.RoleDecode, "d2", nil))
	mallory := messagestest.Start(t, ca.Authority(t, trust.RoleDecode, "d3", nil))
	admission, routed := from.Inbox(t, actors.AdmissionName)
	_, cancels := to.Inbox(t, actors.AdmissionName)
	_, takes := to.Inbox(t, "moved-request")
	clientPID, toClient := router.Inbox(t, "client")
	relayPID, counters, _ := spawnRelay(t, router, admission, clientPID, 8)
	messagestest.Next(t, "routed request at the decode node", routed, 10*time.Second)
	chunk := func(seq uint32, tok uint32) *messages.TokenChunk {
		return &messages.TokenChunk{RequestID: 7, Seq: seq, Tokens: []uint32{tok}}
	}
	send := func(n *messagestest.Peer, m messages.Message) {
		t.Helper()
		if err := messages.Send(n.Sys.Root, messagestest.PID(relayPID), m); err != nil {
			t.Fatal(err)
		}
	}
	moved := &messages.StreamMoved{RequestID: 7, Seq: 2, To: to.Addr, ToID: "moved-request", ToIncarnation: 2}
	send(from, chunk(1, 10))
	send(mallory, moved)
	refusedAtLeast(t, router.Auth, trust.RefusedStranger, 1) // mallory's word, refused before the node's comes
	send(from, moved)                                        // before chunk 2: the relay waits for it
	send(from, chunk(2, 11))
	take := messagestest.Next(t, "the take at the new node", takes, 10*time.Second)
	if m, ok := take.Message.(*messages.StreamTake); !ok || *m != (messages.StreamTake{RequestID: 7, Seq: 2}) ||
		take.Sender == nil || take.Sender.Id != relayPID.Id {
		t.Fatalf("take %+v from %v, want request 7 at chunk 2 from the relay", take.Message, take.Sender)
	}
	send(from, chunk(3, 666)) // the node left: dropped
	send(to, chunk(3, 12))
	// A cancel now goes to the new node.
	send(router, &messages.CancelRequest{RequestID: 7, Tenant: "acme"})
	if e := messagestest.Next(t, "the cancel at the new node", cancels, 10*time.Second); e.Message.(*messages.CancelRequest).RequestID != 7 {
		t.Fatalf("the new node's admission got %+v", e.Message)
	}
	send(to, &messages.GenerateResult{RequestID: 7, Tokens: []uint32{10, 11, 12}, Text: "abc", FinishReason: messages.FinishLength})
	for i, want := range []uint32{10, 11, 12} {
		c := messagestest.Next(t, "a chunk at the client", toClient, 10*time.Second).Message.(*messages.TokenChunk)
		if c.Seq != uint32(i+1) || c.Tokens[0] != want {
			t.Fatalf("client got %+v, want seq %d token %d", c, i+1, want)
		}
	}
	if res := messagestest.Next(t, "the result", toClient, 10*time.Second).Message.(*messages.GenerateResult); res.Text != "abc" {
		t.Fatalf("client got %+v, want the new node's result", res)
	}
	if got := counters.strangers.Load(); got != 1 || counters.moved.Load() != 1 {
		t.Errorf("relay refused %d messages (want mallory's 1), moved %d streams (want 1)", got, counters.moved.Load())
	}
}
