//go:build !race

// Several protoactor remote instances in one process; see node_test.go.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/messages"
)

// TestRouterRefusesForTheSmallerPrefillPool: with a prefill pool smaller
// than the decode pool, a prompt that fits decode's but not prefill's is
// refused by the router itself, prompt_too_long naming the prefill pool and
// its numbers, before anything is sent to a decode node: the router counts
// it under that bound and routes nothing, and neither the decode nor the
// prefill node hears of it. The decode node cannot make this check (it
// does not know the pool of the prefill node the router chose), so a
// router that checked the wrong pool would hand it a request no prefill
// node can compute. A prompt that fits both pools is answered, so the
// refusal is the bound's, not the cluster's.
func TestRouterRefusesForTheSmallerPrefillPool(t *testing.T) {
	small := func(cfg *NodeConfig) { cfg.Actors.PrefillPages = 8 } // 128 tokens of 16
	p := startNodeTuned(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, nil, small)
	d := startClusterNode(t, actors.RoleDecode, p.GossipAddr()) // 96 pages: 1,536 tokens
	r := startClusterNode(t, actors.RoleRouter, p.GossipAddr())
	for _, n := range []*Node{p, d, r} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 && routable(n) })
	}
	g := r.cfg.Actors.Geometry()
	prefillTokens := int(p.cfg.Actors.PrefillPages) * g.PageTokens
	if decodeTokens := int(d.cfg.Actors.DecodePages) * g.PageTokens; decodeTokens <= 2*prefillTokens {
		t.Fatalf("decode pool of %d tokens, prefill pool of %d: the test needs decode's far larger", decodeTokens, prefillTokens)
	}
	c := tenantClient(t, r.Address(), "acme")

	long := strings.Repeat("x", prefillTokens) // BOS and prefillTokens bytes: one token over prefill's pool
	_, err := c.Generate(context.Background(), "acme", long, client.GenerateOptions{MaxTokens: 1}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodePromptTooLong || we.Where != "prefill pool" ||
		we.Have != uint64(prefillTokens+1) || we.Limit != uint64(prefillTokens) {
		t.Fatalf("a prompt of %d tokens, prefill pool of %d: %v; want prompt_too_long for the prefill pool", prefillTokens+1,
			prefillTokens, err)
	}
	rejected := r.rc.rejectedBy.Counts()
	if r.rc.rejectedTooLong.Load() != 1 || rejected[actors.RejectPrefillPool] != 1 || r.rc.routed.Load() != 0 {
		t.Fatalf("router: %d refused too long, %d by the prefill pool (by bound %v), %d routed; want 1, 1, 0",
			r.rc.rejectedTooLong.Load(), rejected[actors.RejectPrefillPool], rejected, r.rc.routed.Load())
	}
	for _, n := range []*Node{d, p} {
		s := n.status().Node
		if s.Admitted != 0 || s.RejectedTooLong != 0 || s.RejectedBusy != 0 || fmt.Sprint(s.RejectedBy) != fmt.Sprint(make([]uint64, len(s.RejectedBy))) {
			t.Fatalf("%s node heard of the refused request: %+v", n.cfg.Actors.Role, s)
		}
	}
	if m := p.Metrics(); m.Sent.Transfers != 0 || m.PrefillQueued != 0 {
		t.Fatalf("the prefill node computed for the refused request: %+v", m)
	}

	fits := long[:prefillTokens-1] // BOS and prefillTokens-1 bytes: the prefill pool exactly
	res, err := c.Generate(context.Background(), "acme", fits, client.GenerateOptions{MaxTokens: 2}, nil)
	if err != nil {
		t.Fatalf("a prompt of %d tokens, prefill pool of %d: %v", prefillTokens, prefillTokens, err)
	}
	want, _ := withModel(t, r.cfg).Model.Answer(fits, 2)
	if fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
		t.Fatalf("a prompt filling the prefill pool: %v, the reference %v", res.Tokens, want)
	}
	waitFor(t, "every page free after the answer", time.Minute, func() bool { return allFree(p, d) })
}
