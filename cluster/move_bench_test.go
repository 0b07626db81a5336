//go:build !race

package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/messages/messagestest"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// Drain figures: a decode node holding drainRequests generations of up to
// drainTokens tokens of the large model, and another decode node with room.
const (
	drainRequests = 16
	drainTokens   = 1000
)

// BenchmarkDrain drains a decode node holding 16 long generations (up to
// 1,000 tokens each, of the large model) while another decode node has
// room: once moving them there (node drain), once waiting for them to end
// (node drain --stay), each on a cluster of its own with the same
// requests, and reports the time from the drain to the node's stop of
// each and their ratio, with the tokens the requests had streamed when the
// drain began. Every answer is checked against the model's. Run with:
//
//	go test ./cluster -run '^$' -bench Drain -benchtime 2x
func BenchmarkDrain(b *testing.B) {
	prompts := make([]string, drainRequests)
	for i := range prompts {
		prompts[i] = fmt.Sprintf("request %d of a drain", i)
	}
	var moveSum, staySum time.Duration
	var streamed, tokens int
	for b.Loop() {
		for _, stay := range []bool{false, true} {
			took, s, t := drainOnce(b, prompts, stay)
			streamed += s
			tokens += t
			if stay {
				staySum += took
			} else {
				moveSum += took
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(moveSum.Seconds()/n, "move-s")
	b.ReportMetric(staySum.Seconds()/n, "stay-s")
	b.ReportMetric(moveSum.Seconds()/staySum.Seconds(), "move/stay")
	b.ReportMetric(float64(streamed)/(2*n*drainRequests), "tokens-at-drain")
	b.ReportMetric(float64(tokens)/(2*n*drainRequests), "tokens-per-answer")
}

// drainOnce starts a prefill node, a router and a decode node, sends it
// prompts, starts a second decode node once every request streams, and
// drains the first: it returns the time from the drain to its stop, and
// the tokens the requests had streamed when the drain began and in all.
func drainOnce(b *testing.B, prompts []string, stay bool) (took time.Duration, streamed, tokens int) {
	long := func(cfg *NodeConfig) {
		cfg.Actors.Model = engine.LargeModelConfig()
		cfg.Actors.ContextTokens, cfg.Actors.MaxTokensMax = 1024+64, drainTokens
		cfg.Actors.QueueMax = 2 * drainRequests
		// 16 long generations on shared cores take minutes.
		cfg.Actors.RequestTimeout, cfg.Actors.OwnedPageTimeout = 5*time.Minute, 6*time.Minute
		cfg.DrainTimeout = 5 * time.Minute
	}
	decode := func(cfg *NodeConfig) {
		long(cfg)
		cfg.Actors.DecodePages = 2 * drainRequests * (1024 + 64) / cfg.Actors.PageTokens
	}
	p := startNodeTuned(b, testAuth(b, actors.RolePrefill), actors.RolePrefill, nil, long)
	victim := startNodeTuned(b, testAuth(b, actors.RoleDecode), actors.RoleDecode, nil, decode, p.GossipAddr())
	r := startNodeTuned(b, testAuth(b, actors.RoleRouter), actors.RoleRouter, nil, long, p.GossipAddr())
	waitFor(b, "membership converges", time.Minute, func() bool { return aliveCount(r) == 3 && routable(r) })
	c, err := client.Dial(r.Address(), client.Options{Auth: tenantAuth(b, "acme")})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()

	var mu sync.Mutex
	counts := make([]int, len(prompts))
	results := make(chan error, len(prompts))
	for i, prompt := range prompts {
		go func() {
			res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: drainTokens},
				func(int) { mu.Lock(); counts[i]++; mu.Unlock() })
			if err == nil {
				err = checkAnswer(p, prompt, drainTokens, res.Tokens)
			}
			results <- err
		}()
	}
	waitFor(b, "every request streaming", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range counts {
			if n == 0 {
				return false
			}
		}
		return true
	})
	other := startNodeTuned(b, testAuth(b, actors.RoleDecode), actors.RoleDecode, nil, decode, p.GossipAddr())
	waitFor(b, "the second decode node in sight", time.Minute, func() bool {
		return aliveCount(victim) == 4 && aliveCount(r) == 4 && aliveCount(other) == 4
	})
	op := messagestest.StartAwaiting(b, trusttest.Shared(b).Authority(b, trust.RoleOperator, "op", nil))
	mu.Lock()
	for _, n := range counts {
		streamed += n
	}
	mu.Unlock()
	start := time.Now()
	if _, err := messages.Request(op.Sys.Root, actor.NewPID(victim.Address(), ControlName), &messages.DrainRequest{Stay: stay},
		10*time.Second); err != nil {
		b.Fatal(err)
	}
	testwait.Recv(b, "the drained node's stop", 5*time.Minute, victim.Stopped())
	took = time.Since(start)
	b.Logf("drain (stay %t) of %d requests, %d tokens streamed: %s", stay, len(prompts), streamed, took)
	for range prompts {
		if err := testwait.Recv(b, "an answer", 5*time.Minute, results); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range counts {
		tokens += n
	}
	if moved := victim.Status().Node.MovedOut; stay != (moved == 0) {
		b.Fatalf("drain (stay %t) moved %d requests", stay, moved)
	}
	return took, streamed, tokens
}
