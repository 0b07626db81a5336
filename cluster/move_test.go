//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// itself (see race_test.go); these tests run without the race detector.

package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/messages/messagestest"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// TestRequestMovesBetweenDecodeNodes: a long request through a router runs
// on one of two decode nodes; once its first tokens reached the client, it
// moves, KV and all, to the other, which streams the rest. The client gets
// one uninterrupted stream whose tokens and text are the model's answer, the node it left
// counts it moved and the other completed, the router followed the stream,
// and every pool of the four nodes is free again.
func TestRequestMovesBetweenDecodeNodes(t *testing.T) {
	m := startMoving(t)
	prompt := "a request that moves"
	a := m.generate(prompt)
	testwait.Recv(t, "the first token at the client", time.Minute, a.first)
	from, to, numbers := m.holder()
	if len(numbers) != 1 {
		t.Fatalf("%d requests on the decode node, want 1", len(numbers))
	}
	if err := from.Actors().Move(numbers[0], handoff.Peer{Address: to.Address(), Incarnation: to.Incarnation()}, time.Minute); err != nil {
		t.Fatalf("move: %v", err)
	}
	m.answeredRight(a, prompt)
	fs, err := from.Actors().Status()
	if err != nil {
		t.Fatal(err)
	}
	ts, err := to.Actors().Status()
	if err != nil {
		t.Fatal(err)
	}
	if fs.Completed != 0 || fs.Failed != 0 || ts.Completed != 1 || ts.Failed != 0 || m.r.rc.moved.Load() != 1 {
		t.Fatalf("left node completed %d failed %d; new node completed %d failed %d; router moved %d streams",
			fs.Completed, fs.Failed, ts.Completed, ts.Failed, m.r.rc.moved.Load())
	}
	// Each side's status counts its part of the move, and nothing else.
	for _, c := range []struct {
		n                    *Node
		out, in, streamsMove uint64
	}{{from, 1, 0, 0}, {to, 0, 1, 0}, {m.r, 0, 0, 1}, {m.p, 0, 0, 0}} {
		s := c.n.Status().Node
		if s.MovedOut != c.out || s.MovedIn != c.in || s.StreamsMoved != c.streamsMove {
			t.Errorf("%s: status moved out %d, in %d, streams %d; want %d, %d, %d",
				s.Role, s.MovedOut, s.MovedIn, s.StreamsMoved, c.out, c.in, c.streamsMove)
		}
	}
	freeEverywhere(t, m.nodes...)
}

// TestDrainMovesRequests: an operator drains the decode node that holds
// long requests; it moves each to the other decode node and leaves, long
// before they would have ended: every client gets the model's answer in
// one stream, and every pool left is free. An operator's migrate of a
// number not in flight is answered with it.
func TestDrainMovesRequests(t *testing.T) {
	m := startMoving(t)
	// Prompts whose answers run long (524, 675 and 403 tokens): the drain
	// comes while they stream.
	prompts := []string{"request 0 of a drain", "request 1 of a drain", "request 3 of a drain"}
	var answers []*answer
	for _, p := range prompts {
		answers = append(answers, m.generate(p))
	}
	for _, a := range answers {
		testwait.Recv(t, "a first token at the client", time.Minute, a.first)
	}
	from, _, numbers := m.holder()
	if len(numbers) == 0 {
		t.Fatal("no request on a decode node")
	}
	op := messagestest.StartAwaiting(t, trusttest.Shared(t).Authority(t, trust.RoleOperator, "op", nil))
	rep := operatorAsk(t, op, from.Address(), &messages.MigrateRequest{Number: 1 << 50, Incarnation: from.Incarnation()}).(*messages.MigrateReply)
	if rep.Moved != 0 || rep.Stayed != 1 || rep.Err == nil || rep.Err.Code != messages.CodeBadRequest {
		t.Fatalf("migrate of a number not in flight: %+v (%v)", rep, rep.Err)
	}
	operatorAsk(t, op, from.Address(), &messages.DrainRequest{})
	testwait.Recv(t, "the drained node's stop", time.Minute, from.Stopped())
	for i, a := range answers {
		m.answeredRight(a, prompts[i])
	}
	// A request may end before the drain comes to it; most do not.
	if moved := m.r.rc.moved.Load(); moved < 1 || moved > uint64(len(numbers)) {
		t.Fatalf("the router followed %d streams, %d were on the drained node", moved, len(numbers))
	}
	var left []*Node
	for _, n := range m.nodes {
		if n != from {
			left = append(left, n)
		}
	}
	freeEverywhere(t, left...)
}

// moving is a prefill node, a router and two decode nodes, for requests of
// up to moveTokens tokens, and a client of the router.
type moving struct {
	t       *testing.T
	p, r    *Node
	decodes []*Node
	nodes   []*Node
	c       *client.Client
}

// moveTokens is the most an answer runs to; the tests' answers end at
// their stop token before (the large model's, 403 to 675 tokens), long
// enough for a move to land well before their end.
const moveTokens = 700

func startMoving(t *testing.T) *moving {
	t.Helper()
	// The large model steps slowly enough (a millisecond a token, alone)
	// that a stream lasts a second or more.
	long := func(cfg *NodeConfig) {
		cfg.Actors.Model = engine.LargeModelConfig()
		cfg.Actors.ContextTokens, cfg.Actors.MaxTokensMax = 1024, moveTokens
	}
	decode := func(cfg *NodeConfig) {
		long(cfg)
		cfg.Actors.DecodePages = 240
	}
	m := &moving{t: t}
	m.p = startNodeTuned(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, nil, long)
	m.decodes = []*Node{
		startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, decode, m.p.GossipAddr()),
		startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, decode, m.p.GossipAddr()),
	}
	m.r = startNodeTuned(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, nil, long, m.p.GossipAddr())
	m.nodes = append([]*Node{m.p, m.r}, m.decodes...)
	for _, n := range m.nodes {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 4 && routable(n) })
	}
	var err error
	if m.c, err = client.Dial(m.r.Address(), client.Options{Auth: tenantAuth(t, "acme")}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.c.Close)
	return m
}

// answer is a request's answer on its way: first is closed at its first
// token, and done gives the result with the text its stream carried.
type answer struct {
	first chan struct{}
	done  chan answered
}

type answered struct {
	res  client.Result
	text string
	err  error
}

// generate sends prompt through the router for up to moveTokens tokens.
func (m *moving) generate(prompt string) *answer {
	a := &answer{first: make(chan struct{}), done: make(chan answered, 1)}
	go func() {
		var text string
		var tokens int
		res, err := m.c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: moveTokens,
			OnText: func(s string) { text += s }},
			func(int) {
				if tokens++; tokens == 1 {
					close(a.first)
				}
			})
		a.done <- answered{res, text, err}
	}()
	return a
}

// holder is the decode node holding the most requests, the other, and the
// numbers of its requests.
func (m *moving) holder() (from, to *Node, numbers []uint64) {
	m.t.Helper()
	for i, d := range m.decodes {
		res, err := d.Actors().Root().RequestFuture(d.Actors().Admission(), actors.ListRequests{}, time.Minute).Result()
		if err != nil {
			m.t.Fatal(err)
		}
		var ns []uint64
		for _, r := range res.(*messages.InFlightList).Requests {
			ns = append(ns, r.Number)
		}
		if len(ns) > len(numbers) {
			from, to, numbers = d, m.decodes[1-i], ns
		}
	}
	return from, to, numbers
}

// answeredRight waits for a's answer and checks it is the model's answer
// to prompt, in tokens and in the text its stream carried.
func (m *moving) answeredRight(a *answer, prompt string) {
	m.t.Helper()
	got := testwait.Recv(m.t, "an answer", 2*time.Minute, a.done)
	if got.err != nil {
		m.t.Fatal(got.err)
	}
	if err := checkAnswer(m.p, prompt, moveTokens, got.res.Tokens); err != nil {
		m.t.Fatal(err)
	}
	if got.text != got.res.Text {
		m.t.Fatalf("the stream's text (%d bytes) is not the answer's (%d bytes)", len(got.text), len(got.res.Text))
	}
}

// checkAnswer says whether tokens are the model's answer to prompt, of up
// to maxTokens tokens.
func checkAnswer(n *Node, prompt string, maxTokens int, tokens []int) error {
	want, err := n.Actors().Model().Answer(prompt, maxTokens)
	if err != nil {
		return err
	}
	if !slices.Equal(tokens, want) {
		return fmt.Errorf("%q: answered %d tokens, want the model's %d (first difference at %d)", prompt, len(tokens), len(want),
			firstDifference(tokens, want))
	}
	return nil
}

func firstDifference(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestMoveInRefusals: a decode node takes a running request moved to it
// only from a node that decodes, for its own run, of its model and page
// size, and not while it drains; each refusal is a TransferAbort naming
// the move, with the code that says why, so that its source decodes on at
// once.
func TestMoveInRefusals(t *testing.T) {
	n := startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, nil)
	ca := trusttest.Shared(t)
	peer := messagestest.StartAwaiting(t, ca.Authority(t, trust.RoleDecode, "other-decode", nil))
	tenant := messagestest.StartAwaiting(t, ca.Authority(t, trust.RoleTenant, "acme", nil))
	move := func(edit func(*messages.MoveRequest)) *messages.MoveRequest {
		m := &messages.MoveRequest{MoveID: 77, Tenant: "acme", ClientID: 9, Receiver: "127.0.0.1:1", ReceiverID: "relay",
			Prompt: []uint32{1, 2, 3, 4, 5}, Tokens: []uint32{6, 7, 8}, MaxTokens: 16, Seq: 3,
			PageTokens: uint32(n.cfg.Actors.PageTokens), Layout: []uint32{7}, SourceIncarnation: 0xabc,
			TargetIncarnation: n.Incarnation(), Model: n.Actors().Model().Fingerprint().String(), TimeLeftMs: 1000}
		if edit != nil {
			edit(m)
		}
		return m
	}
	ask := func(from *messagestest.Peer, m *messages.MoveRequest) *messages.TransferAbort {
		t.Helper()
		rep, err := messages.Request(from.Sys.Root, actor.NewPID(n.Address(), actors.AdmissionName), m, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		abort, ok := rep.(*messages.TransferAbort)
		if !ok || abort.RequestID != m.MoveID || abort.Tenant != m.Tenant {
			t.Fatalf("a refused move answered %T %+v, want a TransferAbort naming move %d", rep, rep, m.MoveID)
		}
		return abort
	}
	for _, c := range []struct {
		name string
		from *messagestest.Peer
		edit func(*messages.MoveRequest)
		want messages.ErrorCode
	}{
		{"from a tenant", tenant, nil, messages.CodeForbidden},
		{"for another run", peer, func(m *messages.MoveRequest) { m.TargetIncarnation++ }, messages.CodeNodeLost},
		{"of another model", peer, func(m *messages.MoveRequest) { m.Model = strings.Repeat("0", messages.FingerprintDigits) },
			messages.CodeModelMismatch},
		{"in pages of another size", peer, func(m *messages.MoveRequest) { m.PageTokens, m.Layout = 4, []uint32{4, 3} },
			messages.CodeBadRequest},
	} {
		if a := ask(c.from, move(c.edit)); a.Reason.Code != c.want {
			t.Errorf("a move %s: refused with %s (%s), want %s", c.name, a.Reason.Code, a.Reason.Message, c.want)
		}
	}
	if _, err := n.Actors().Drain(); err != nil {
		t.Fatal(err)
	}
	if a := ask(peer, move(nil)); a.Reason.Code != messages.CodeUnavailable {
		t.Errorf("a move to a draining node: refused with %s (%s), want unavailable", a.Reason.Code, a.Reason.Message)
	}
	freeEverywhere(t, n)
}
