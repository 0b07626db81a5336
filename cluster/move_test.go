//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// itself (see race_test.go); these tests run without the race detector.

package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// TestRequestMovesBetweenDecodeNodes: a long request through a router runs
// on one of two decode nodes; once its first tokens reached the client, it
// moves, KV and all, to the other, which streams the rest. The client gets
// one uninterrupted stream whose tokens and text are the model's answer, the node it left
// counts it moved and the other completed, the router followed the stream,
// and every pool of the four nodes is free again.
func TestRequestMovesBetweenDecodeNodes(t *testing.T) {
	const maxTokens = 1800 // the answer ends at its stop token, long enough for the move to land well before
	long := func(cfg *NodeConfig) { cfg.Actors.ContextTokens, cfg.Actors.MaxTokensMax = 2048, maxTokens }
	p := startNodeTuned(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, nil, long)
	decodes := []*Node{
		startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, func(cfg *NodeConfig) {
			long(cfg)
			cfg.Actors.DecodePages = 160
		}, p.GossipAddr()),
		startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, func(cfg *NodeConfig) {
			long(cfg)
			cfg.Actors.DecodePages = 160
		}, p.GossipAddr()),
	}
	r := startNodeTuned(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, nil, long, p.GossipAddr())
	nodes := append([]*Node{p, r}, decodes...)
	for _, n := range nodes {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 4 && routable(n) })
	}
	c, err := client.Dial(r.Address(), client.Options{Auth: tenantAuth(t, "acme")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	const prompt = "a request that moves"
	want, err := p.Actors().Model().Answer(prompt, maxTokens)
	if err != nil {
		t.Fatal(err)
	}

	first := make(chan struct{})
	type answer struct {
		res  client.Result
		text string
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		var text string
		var tokens int
		res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: maxTokens,
			OnText: func(s string) { text += s }},
			func(int) {
				if tokens++; tokens == 1 {
					close(first)
				}
			})
		answered <- answer{res, text, err}
	}()
	testwait.Recv(t, "the first token at the client", time.Minute, first)

	// The decode node it runs on, and its number there.
	var from, to *Node
	var number uint64
	for i, d := range decodes {
		res, err := d.Actors().Root().RequestFuture(d.Actors().Admission(), actors.ListRequests{}, time.Minute).Result()
		if err != nil {
			t.Fatal(err)
		}
		if l := res.(*messages.InFlightList); len(l.Requests) == 1 {
			from, to, number = d, decodes[1-i], l.Requests[0].Number
		}
	}
	if from == nil {
		t.Fatal("the request is on neither decode node")
	}
	if err := from.Actors().Move(number, handoff.Peer{Address: to.Address(), Incarnation: to.Incarnation()}, time.Minute); err != nil {
		t.Fatalf("move: %v", err)
	}
	a := testwait.Recv(t, "the moved request's answer", 2*time.Minute, answered)
	if a.err != nil {
		t.Fatal(a.err)
	}
	tokens := a.res.Tokens
	if !slices.Equal(tokens, want) {
		t.Fatalf("the moved request answered %d tokens, want the answer's %d (first difference at %d)", len(tokens),
			len(want), firstDifference(tokens, want))
	}
	if a.text != a.res.Text {
		t.Fatalf("the stream's text (%d bytes) is not the answer's (%d bytes)", len(a.text), len(a.res.Text))
	}
	fs, err := from.Actors().Status()
	if err != nil {
		t.Fatal(err)
	}
	ts, err := to.Actors().Status()
	if err != nil {
		t.Fatal(err)
	}
	if fs.Completed != 0 || fs.Failed != 0 || ts.Completed != 1 || ts.Failed != 0 || r.rc.moved.Load() != 1 {
		t.Fatalf("left node completed %d failed %d; new node completed %d failed %d; router moved %d streams",
			fs.Completed, fs.Failed, ts.Completed, ts.Failed, r.rc.moved.Load())
	}
	freeEverywhere(t, nodes...)
}

func firstDifference(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
