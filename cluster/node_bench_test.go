//go:build !race

package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"

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
	waitFor(b, "membership converges", 10*time.Second, func() bool { return aliveCount(r) == 3 })
	prompt := strings.Repeat("a prompt of two hundred and fifty-six bytes. ", 6)[:256]
	for _, tc := range []struct {
		name    string
		entry   *Node
		decoder *Node
	}{{"cluster", r, d}, {"one-node", all, all}} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := client.Dial(tc.entry.Address(), client.Options{Auth: trust.Insecure(nil)})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			before, _ := tc.decoder.Actors().Status()
			start := time.Now()
			for i := 0; b.Loop(); i++ {
				if _, err := c.Generate(context.Background(), fmt.Sprintf("t%d", i%4), prompt, client.GenerateOptions{MaxTokens: 2}, nil); err != nil {
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
