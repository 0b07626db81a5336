//go:build !race

package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/stories"

	"github.com/kvwarden/kvwarden/trust"
)

// BenchmarkTTFT splits the time to first token of 256-token prompts into
// its phases, across a router, a prefill and a decode node on loopback
// (KV over the TCP data plane) and, side by side, inside one node of role
// all (KV as actor messages). Requests run one at a time, so the figures
// are unloaded latencies. Run with:
//
//	go test ./cluster -run '^$' -bench TTFT -benchtime 20x
func BenchmarkTTFT(b *testing.B) {
	p := startClusterNode(b, actors.RolePrefill)
	d := startClusterNode(b, actors.RoleDecode, p.GossipAddr())
	r := startClusterNode(b, actors.RoleRouter, p.GossipAddr())
	all := startClusterNode(b, actors.RoleAll)
	waitFor(b, "membership converges", 10*time.Second, func() bool { return aliveCount(r) == 3 && routable(r) })
	prompt := strings.Repeat("a prompt of two hundred and fifty-six bytes. ", 6)[:256]
	for _, tc := range []struct {
		name    string
		entry   *Node
		decoder *Node
	}{{"cluster", r, d}, {"one-node", all, all}} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := client.Dial(tc.entry.Address(), client.Options{Auth: tenantAuth(b, "bench")})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			before, _ := tc.decoder.Actors().Status()
			start := time.Now()
			for i := 0; b.Loop(); i++ {
				if _, err := c.Generate(context.Background(), "bench", prompt, client.GenerateOptions{MaxTokens: 2}, nil); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			after, _ := tc.decoder.Actors().Status()
			ph, n := after.Phases, float64(after.Phases.Count-before.Phases.Count)
			ms := func(total, base time.Duration) float64 { return float64(total-base) / n / 1e6 }
			b.ReportMetric(ms(ph.Queue, before.Phases.Queue), "queue-ms")
			b.ReportMetric(ms(ph.Prefill, before.Phases.Prefill), "prefill-ms")
			b.ReportMetric(ms(ph.Transfer, before.Phases.Transfer), "transfer-ms")
			b.ReportMetric(ms(ph.Verify, before.Phases.Verify), "verify-ms")
			b.ReportMetric(ms(ph.FirstDecode, before.Phases.FirstDecode), "first-decode-ms")
			b.ReportMetric(float64(elapsed)/n/1e6, "request-ms")
		})
	}
}

// BenchmarkTTFTSecured measures the time to first token of a 256-token
// prompt through a router, a prefill and a decode node, in a cluster
// secured with mutual TLS (remote, data plane, gossip) and in one started
// --insecure, alternating requests between the two in one run, and reports
// the ratio. Run with:
//
//	go test ./cluster -run '^$' -bench TTFTSecured -benchtime 20x -count 3
func BenchmarkTTFTSecured(b *testing.B) {
	type cluster struct {
		c    *client.Client
		took time.Duration
	}
	start := func(auth func(actors.Role) *trust.Authority, tenant *trust.Authority) *cluster {
		p := startNodeAs(b, auth(actors.RolePrefill), actors.RolePrefill)
		startNodeAs(b, auth(actors.RoleDecode), actors.RoleDecode, p.GossipAddr())
		r := startNodeAs(b, auth(actors.RoleRouter), actors.RoleRouter, p.GossipAddr())
		waitFor(b, "membership converges", 10*time.Second, func() bool { return aliveCount(r) == 3 && routable(r) })
		c, err := client.Dial(r.Address(), client.Options{Auth: tenant})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		return &cluster{c: c}
	}
	secure := start(func(r actors.Role) *trust.Authority { return testAuth(b, r) }, tenantAuth(b, "bench"))
	insecure := start(func(actors.Role) *trust.Authority { return trust.Insecure(nil) }, trust.Insecure(nil))
	prompt := strings.Repeat("a prompt of two hundred and fifty-six bytes. ", 6)[:256]
	first := func(cl *cluster) {
		t0 := time.Now()
		var ttft time.Duration
		if _, err := cl.c.Generate(context.Background(), "bench", prompt, client.GenerateOptions{MaxTokens: 2}, func(int) {
			if ttft == 0 {
				ttft = time.Since(t0)
			}
		}); err != nil {
			b.Fatal(err)
		}
		cl.took += ttft
	}
	first(secure) // connections and verification outside the measurement
	first(insecure)
	secure.took, insecure.took = 0, 0
	n := 0
	for b.Loop() {
		first(secure)
		first(insecure)
		n++
	}
	b.ReportMetric(float64(secure.took)/float64(n)/1e6, "secure-ttft-ms")
	b.ReportMetric(float64(insecure.took)/float64(n)/1e6, "insecure-ttft-ms")
	b.ReportMetric(float64(secure.took)/float64(insecure.took), "secure/insecure")
}

// BenchmarkStories is stories260K's single-stream generation of the
// published story (256 tokens from an empty prompt), tokens per second:
// the engine alone (one contiguous cache, no pages), one node of role all,
// and a router, prefill and decode node on loopback, side by side in one
// run. Run with:
//
//	go test ./cluster -run '^$' -bench Stories -benchtime 20x
func BenchmarkStories(b *testing.B) {
	m, _, c := storiesTrio(b)
	all := startNodeServing(b, testAuth(b, actors.RoleAll), actors.RoleAll, m)
	one := tenantClient(b, all.Address(), "acme")
	generate := func(b *testing.B, c *client.Client) int {
		res, err := c.Generate(context.Background(), "acme", "", client.GenerateOptions{MaxTokens: stories.PublishedTokens}, nil)
		if err != nil {
			b.Fatal(err)
		}
		return len(res.Tokens)
	}
	for _, tc := range []struct {
		name string
		run  func(b *testing.B) int
	}{
		{"engine", func(b *testing.B) int {
			out, err := m.Answer("", stories.PublishedTokens)
			if err != nil {
				b.Fatal(err)
			}
			return len(out)
		}},
		{"one-node", func(b *testing.B) int { return generate(b, one) }},
		{"cluster", func(b *testing.B) int { return generate(b, c) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tokens := 0
			for b.Loop() {
				tokens += tc.run(b)
			}
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
