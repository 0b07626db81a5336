//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC (see remote_test.go); these tests need a node and its peers,
// each with remote of its own.

package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/messages/messagestest"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// startRemoteNode starts a node serving remote and, at the end of the
// test, checks it as startNode does.
func startRemoteNode(t *testing.T, cfg Config, opt Options) *Node {
	t.Helper()
	opt.Listen = "127.0.0.1:0"
	return startNodeWith(t, cfg, opt)
}

// TestPlanOnlyFromDecodeToItsDataPlane: a prefill node computes KV only
// for a node that decodes, and sends it only to the data plane membership
// says that node advertises. A router's plan, at the dispatcher or straight
// at a worker, and a decode node's plan naming another data plane are
// refused with a TransferDone error (so decode does not wait) and counted.
func TestPlanOnlyFromDecodeToItsDataPlane(t *testing.T) {
	ca := trusttest.New(t)
	decode := messagestest.Start(t, ca.Authority(t, trust.RoleDecode, "d0", nil))
	router := messagestest.Start(t, ca.Authority(t, trust.RoleRouter, "r0", nil))
	const advertised = "127.0.0.1:7070"
	decodeID := trust.Identity{Cluster: trusttest.Cluster, Role: trust.RoleDecode, Name: "d0"}
	cfg := testConfig()
	cfg.Role = RolePrefill
	auth := ca.Authority(t, trust.RolePrefill, "p0", nil)
	n := startRemoteNode(t, cfg, Options{Auth: auth, DataPlaneOf: func(addr string) (string, trust.Identity, bool) {
		return advertised, decodeID, addr == decode.Addr
	}})
	plan := func(id uint64, dataPlane string) *messages.TransferPlan {
		return &messages.TransferPlan{RequestID: id, Tenant: "acme", TokenCount: 2, PromptTokens: []uint32{'h', 'i'},
			PageTokens: uint32(cfg.PageTokens), DestTags: []kv.Tag{{Incarnation: 9, Index: 0, Generation: 1}}, DataPlane: dataPlane,
			Model: n.Model().Fingerprint().String()}
	}
	forbidden := &messages.WireError{Code: messages.CodeForbidden}
	for i, tc := range []struct {
		name   string
		from   *messagestest.Peer
		to     string
		plan   *messages.TransferPlan
		refuse trust.Refusal
	}{
		{"router to the dispatcher", router, PrefillName, plan(1, advertised), trust.RefusedRole},
		{"router to a worker", router, "prefill-0", plan(2, advertised), trust.RefusedRole},
		{"decode naming another data plane", decode, PrefillName, plan(3, "127.0.0.1:9"), trust.RefusedStranger},
	} {
		before := auth.Refused()[tc.refuse]
		inbox, answers := tc.from.Inbox(t, fmt.Sprintf("request-%d", i))
		tc.from.Sys.Root.RequestWithCustomSender(actor.NewPID(n.Address(), tc.to), tc.plan, inbox)
		done := messagestest.Next(t, tc.name, answers, time.Minute).Message.(*messages.TransferDone)
		if done.RequestID != tc.plan.RequestID || !errors.Is(done.Err, forbidden) {
			t.Errorf("%s: answered %+v, want forbidden", tc.name, done)
		}
		if got := auth.Refused()[tc.refuse]; got != before+1 {
			t.Errorf("%s: %s refusals went from %d to %d", tc.name, tc.refuse, before, got)
		}
	}
	// A decode node of another model: refused before any prefill, both
	// fingerprints named, told as model_mismatch.
	other := plan(5, advertised)
	other.Model = engine.Fingerprint{0xee}.String()
	inbox, answers := decode.Inbox(t, "request-other-model")
	decode.Sys.Root.RequestWithCustomSender(actor.NewPID(n.Address(), PrefillName), other, inbox)
	if done := messagestest.Next(t, "another model's plan", answers, time.Minute).Message.(*messages.TransferDone); done.Err == nil ||
		done.Err.Code != messages.CodeModelMismatch || !strings.Contains(done.Err.Message, other.Model) ||
		!strings.Contains(done.Err.Message, n.Model().Fingerprint().String()) {
		t.Errorf("a plan for model %s answered %+v, want model_mismatch naming both fingerprints", other.Model, done)
	}
	// The decode node's own plan to its own data plane runs (and fails
	// at the send: this node has no data plane dialer).
	inbox, answers = decode.Inbox(t, "request-ok")
	decode.Sys.Root.RequestWithCustomSender(actor.NewPID(n.Address(), PrefillName), plan(4, advertised), inbox)
	if done := messagestest.Next(t, "a decode node's plan", answers, time.Minute).Message.(*messages.TransferDone); done.Err == nil ||
		done.Err.Code == messages.CodeForbidden {
		t.Errorf("a decode node's plan to its data plane answered %+v, want the send's failure", done)
	}
}

// decodeWithPlanner starts a secure decode node whose prefill peer is p,
// a stand-in whose dispatcher only collects plans, and returns the node,
// the plans and the stand-in's identity.
func decodeWithPlanner(t *testing.T, ca *trusttest.CA) (*Node, *messagestest.Peer, <-chan actor.MessageEnvelope, trust.Identity) {
	t.Helper()
	const inc = 0x77
	id := trust.Identity{Cluster: trusttest.Cluster, Role: trust.RolePrefill, Name: "p0"}
	p := messagestest.Start(t, ca.Authority(t, id.Role, id.Name, nil))
	_, plans := p.Inbox(t, PrefillName)
	cfg := testConfig()
	cfg.Role = RoleDecode
	peer := PrefillPeer{PID: actor.NewPID(p.Addr, PrefillName), Incarnation: inc, Pages: cfg.PrefillPages}
	n := startRemoteNode(t, cfg, Options{Auth: ca.Authority(t, trust.RoleDecode, "d0", nil), DataPlane: "127.0.0.1:7070",
		Pick: func(exclude map[uint64]bool) (PrefillPeer, bool) { return peer, !exclude[inc] }})
	return n, p, plans, id
}

// TestTransferOnlyFromThePlannedPeer: a request takes frames and its
// TransferDone only from the prefill node, and incarnation, it planned
// with, played here by a stand-in. A TransferDone of the current attempt
// from another authenticated peer, and frames the data plane got from
// another identity, are refused and counted without ending the request
// (request ids are no secret): the planned peer's transfer that follows
// gets the reference answer. Frames of the planned identity from pages of
// another incarnation, a TransferDone whose seal checksums do not match
// the pages received, and a first token the KV received does not give
// each fail the request with the integrity code; every page ends free.
func TestTransferOnlyFromThePlannedPeer(t *testing.T) {
	ca := trusttest.New(t)
	n, planner, plans, plannerID := decodeWithPlanner(t, ca)
	stranger := messagestest.Start(t, ca.Authority(t, trust.RolePrefill, "p1", nil))
	strangerID := trust.Identity{Cluster: trusttest.Cluster, Role: trust.RolePrefill, Name: "p1"}
	c := localClient(n)
	geo := n.Config().Geometry()
	frame := func(plan *messages.TransferPlan, inc uint64) []kv.Frame {
		tokens := int(plan.TokenCount)
		return []kv.Frame{{Owner: plan.Owner(), Source: kv.Tag{Incarnation: inc, Index: 3, Generation: 1}, Dest: plan.DestTags[0],
			Tokens: tokens, Payload: make([]byte, tokens*geo.BytesPerToken())}}
	}
	integrity := &messages.WireError{Code: messages.CodeIntegrity}
	for _, tc := range []struct {
		name    string
		play    func(plan *messages.TransferPlan, to *actor.PID)
		wantR   uint64 // stranger refusals it adds
		answers bool   // the request gets the reference answer, not an integrity error
	}{
		{"transfer done from a stranger, then the planned peer's", func(plan *messages.TransferPlan, to *actor.PID) {
			stranger.Sys.Root.Send(actor.NewPID(to.Address, to.Id), &messages.TransferDone{RequestID: plan.RequestID,
				Tenant: plan.Tenant, First: 'x', Frames: 1, Source: 1, Sums: []uint64{1}})
			waitStrangers(t, n, 1) // the table's first case: none counted before
			prefillAs(t, n, planner, plannerID, plan, to, 0)
		}, 1, true},
		{"frames from a stranger, then the planned peer's", func(plan *messages.TransferPlan, to *actor.PID) {
			if err := n.AcceptFrames(strangerID, frame(plan, 0x77)); !errors.As(err, new(*StrangerError)) {
				t.Errorf("frames from a stranger: %v", err)
			}
			prefillAs(t, n, planner, plannerID, plan, to, 0)
		}, 1, true},
		{"frames of another incarnation", func(plan *messages.TransferPlan, _ *actor.PID) {
			if err := n.AcceptFrames(plannerID, frame(plan, 0x78)); !errors.As(err, new(*StrangerError)) {
				t.Errorf("frames from pages of another incarnation: %v", err)
			}
		}, 1, false},
		{"checksums that do not match", func(plan *messages.TransferPlan, to *actor.PID) {
			if err := n.AcceptFrames(plannerID, frame(plan, 0x77)); err != nil {
				t.Errorf("frames of the planned peer refused: %v", err)
			}
			planner.Sys.Root.Send(to, &messages.TransferDone{RequestID: plan.RequestID, Tenant: plan.Tenant, First: 'x',
				Frames: 1, Source: 1, Sums: []uint64{1}})
		}, 0, false},
		{"a first token the KV does not give", func(plan *messages.TransferPlan, to *actor.PID) {
			prefillAs(t, n, planner, plannerID, plan, to, 1)
		}, 0, false},
		{"the planned peer's own transfer", func(plan *messages.TransferPlan, to *actor.PID) {
			prefillAs(t, n, planner, plannerID, plan, to, 0)
		}, 0, true},
	} {
		before := n.Auth().Refused()[trust.RefusedStranger]
		type outcome struct {
			tokens []int
			err    error
		}
		done := make(chan outcome, 1)
		go func() {
			res, err := c.Generate(context.Background(), "acme", "hi", client.GenerateOptions{MaxTokens: 4}, nil)
			done <- outcome{res.Tokens, err}
		}()
		e := messagestest.Next(t, tc.name+": the plan", plans, time.Minute)
		for _, ok := e.Message.(*messages.TransferPlan); !ok; _, ok = e.Message.(*messages.TransferPlan) {
			e = messagestest.Next(t, tc.name+": the plan", plans, time.Minute) // the abort of the request before
		}
		tc.play(e.Message.(*messages.TransferPlan), e.Sender)
		got := testwait.Recv(t, tc.name+": the answer", time.Minute, done)
		if tc.answers {
			if want := reference(t, n.Config(), "hi", 4); got.err != nil || fmt.Sprint(got.tokens) != fmt.Sprint(want) {
				t.Errorf("%s: %v, %v; want the reference %v", tc.name, got.tokens, got.err, want)
			}
		} else if !errors.Is(got.err, integrity) {
			t.Errorf("%s: the request ended with %v, want an integrity error", tc.name, got.err)
		}
		if got := n.Auth().Refused()[trust.RefusedStranger]; got != before+tc.wantR {
			t.Errorf("%s: stranger refusals went from %d to %d, want %d more", tc.name, before, got, tc.wantR)
		}
	}
	if s, err := ask[WorkerStatusReply](n.Root(), n.decode[0], WorkerStatus{}, time.Minute); err != nil || s.FirstTokensRefused != 1 {
		t.Errorf("decode worker after one wrong first token: %+v, %v", s, err)
	}
}

// waitStrangers waits until n has counted k stranger refusals in all.
func waitStrangers(t *testing.T, n *Node, k uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d stranger refusals counted", k), time.Minute, func() bool {
		return n.Auth().Refused()[trust.RefusedStranger] >= k
	})
}

// prefillAs plays the planned prefill node p of n, honestly but for the
// first token, which it reports off by firstOff: it computes the plan's KV
// in a pool of its own incarnation, hands the frames to n's data plane
// entry as from id, and sends to (the plan's sender) its TransferDone.
func prefillAs(t *testing.T, n *Node, p *messagestest.Peer, id trust.Identity, plan *messages.TransferPlan, to *actor.PID, firstOff int) {
	t.Helper()
	cfg := n.Config()
	engine, err := engine.NewReferenceEngine(cfg.Model)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kv.NewPool(kv.DefaultConfig(cfg.Geometry(), len(plan.DestTags), 0x77))
	if err != nil {
		t.Fatal(err)
	}
	src := kv.Owner{Request: 5, Tenant: plan.Tenant}
	prompt := make([]int, len(plan.PromptTokens))
	for i, tok := range plan.PromptTokens {
		prompt[i] = int(tok)
	}
	tags, err := pool.Reserve(src, 0, len(plan.DestTags), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pf, err := engine.Prefill(pool, src, tags, prompt)
	if err != nil {
		t.Fatal(err)
	}
	var frames []kv.Frame
	var sums []uint64
	pos := 0
	for i, mp := range pf.Manifest.Pages {
		l, err := pool.Lease(mp.Tag, src)
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := pool.Read(l)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, kv.Frame{Owner: plan.Owner(), Source: mp.Tag, Dest: plan.DestTags[i], FirstToken: pos,
			Tokens: mp.Tokens, Payload: b})
		sums = append(sums, mp.Checksum)
		pos += mp.Tokens
	}
	if err := n.AcceptFrames(id, frames); err != nil {
		t.Fatalf("frames of the planned peer refused: %v", err)
	}
	first := (pf.First + firstOff) % cfg.Model.Vocab
	p.Sys.Root.Send(to, &messages.TransferDone{RequestID: plan.RequestID, Tenant: plan.Tenant, First: uint32(first),
		Frames: uint32(len(frames)), Source: src.Request, Sums: sums})
}

// TestBlackHoleDataPlaneStallsOnlyItsTransfer: a prefill node sending one
// transfer to a data plane that accepts and never reads still serves a
// second decode node at once; the stalled transfer fails at its
// PrefillTimeout, cleanly, and every page of every node is free.
func TestBlackHoleDataPlaneStallsOnlyItsTransfer(t *testing.T) {
	cfg := testConfig()
	// Long enough for the other request, start to end, on a loaded
	// machine: the stalled transfer must not fail first.
	cfg.PrefillTimeout = 15 * time.Second
	lim := cfg.BatchLimits()
	var decodes sync.Map // remote address → data plane
	prefillCfg := cfg
	prefillCfg.Role = RolePrefill
	p := startRemoteNode(t, prefillCfg, Options{Auth: trust.Insecure(nil),
		Dial: func(addr string, inc uint64) (FrameSender, error) { return dialFrames(addr, lim) },
		DataPlaneOf: func(addr string) (string, trust.Identity, bool) {
			dp, ok := decodes.Load(addr)
			if !ok {
				return "", trust.Identity{}, false
			}
			return dp.(string), trust.Identity{}, true
		}})
	decodeCfg := cfg
	decodeCfg.Role = RoleDecode
	startDecode := func(dataPlane string) *Node {
		// A PID caches the process it resolved to, the remote of the first
		// actor system that sent to it: each node needs its own.
		pick := func(exclude map[uint64]bool) (PrefillPeer, bool) {
			inc := p.Config().Incarnation
			return PrefillPeer{PID: actor.NewPID(p.Address(), PrefillName), Incarnation: inc, Pages: cfg.PrefillPages}, !exclude[inc]
		}
		n := startRemoteNode(t, decodeCfg, Options{Auth: trust.Insecure(nil), DataPlane: dataPlane, Pick: pick})
		decodes.Store(n.Address(), dataPlane)
		return n
	}
	var healthy atomic.Pointer[Node]
	d1 := startDecode(serveFrames(t, lim, func(frames []kv.Frame) error {
		return healthy.Load().AcceptFrames(trust.Identity{}, frames)
	}))
	healthy.Store(d1)
	d2 := startDecode(blackHole(t))

	stalled := make(chan error, 1)
	go func() {
		_, err := localClient(d2).Generate(context.Background(), "acme", "to the black hole", client.GenerateOptions{MaxTokens: 4}, nil)
		stalled <- err
	}()
	sending := func() int {
		s, err := ask[WorkerStatusReply](p.Root(), p.prefill[0], WorkerStatus{}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return s.Sending
	}
	waitFor(t, "the transfer to the black hole under way", time.Minute, func() bool { return sending() == 1 })
	const prompt = "to a decode node that reads"
	res, err := localClient(d1).Generate(context.Background(), "globex", prompt, client.GenerateOptions{MaxTokens: 8}, nil)
	if want := reference(t, cfg, prompt, 8); err != nil || fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
		t.Fatalf("beside a stalled transfer: %v, %v; want the reference %v", res.Tokens, err, want)
	}
	select {
	case err := <-stalled:
		t.Fatalf("the transfer to the black hole ended (%v) before the other was answered: it was waited for", err)
	default:
	}
	if n := sending(); n != 1 {
		t.Fatalf("%d transfers being sent after the healthy one, want the stalled one", n)
	}
	var we *messages.WireError
	if err := testwait.Recv(t, "the stalled transfer's end", time.Minute, stalled); !errors.As(err, &we) || we.Code != messages.CodeNodeLost {
		t.Fatalf("the transfer to the black hole: %v, want node lost", err)
	}
}

// A plan from a node membership does not know (yet) is refused, counted,
// and told as busy, not as forbidden: a decode node that just restarted is
// not known everywhere at once, and its request may be retried.
func TestPlanFromAnUnknownNodeIsBusy(t *testing.T) {
	cfg := testConfig()
	prefillCfg := cfg
	prefillCfg.Role = RolePrefill
	auth := trust.Insecure(nil)
	p := startRemoteNode(t, prefillCfg, Options{Auth: auth,
		DataPlaneOf: func(string) (string, trust.Identity, bool) { return "", trust.Identity{}, false }})
	decodeCfg := cfg
	decodeCfg.Role = RoleDecode
	pick := func(exclude map[uint64]bool) (PrefillPeer, bool) {
		inc := p.Config().Incarnation
		return PrefillPeer{PID: actor.NewPID(p.Address(), PrefillName), Incarnation: inc, Pages: cfg.PrefillPages}, !exclude[inc]
	}
	d := startRemoteNode(t, decodeCfg, Options{Auth: trust.Insecure(nil), DataPlane: "127.0.0.1:1", Pick: pick})
	before := auth.Refused()[trust.RefusedStranger]
	_, err := localClient(d).Generate(context.Background(), "acme", "hello", client.GenerateOptions{MaxTokens: 2}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeBusy || we.Where != "membership" {
		t.Fatalf("a plan from a node not yet a member: %v, want busy (membership)", err)
	}
	if got := auth.Refused()[trust.RefusedStranger]; got != before+1 {
		t.Fatalf("stranger refusals went from %d to %d, want one more", before, got)
	}
}
