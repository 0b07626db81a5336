//go:build !race

package cluster

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/bench"
	"github.com/kvwarden/kvwarden/client"
)

// BenchmarkPrefixCacheTTFT measures the time to first token of a prompt
// of a 512-token prefix and a 32-token suffix (the built-in model's
// tokenizer: a token a byte, after the BOS), side by side in one run, on
// a node of role all and on a router, prefill and decode node: each
// iteration draws a new prefix and sends it, with one suffix, to a
// cluster whose prefix caches are off (--prefix-cache-percent 0 and
// --decode-cache-percent 0) and, in turn, to one whose caches are on,
// where it misses (the prefix is new); then, once its pages are kept by
// prefill and decode, with another suffix to the caches that now hold
// the prefix. It reports each TTFT's median and the ratios
// cached ÷ uncached (the miss) and miss ÷ cache off (what looking in the
// cache costs a request that finds nothing). Run with:
//
//	go test ./cluster -run '^$' -bench PrefixCacheTTFT -benchtime 30x
func BenchmarkPrefixCacheTTFT(b *testing.B) {
	const prefixBytes, suffixBytes = 512, 32
	tune := func(percent int) func(*NodeConfig) {
		return func(cfg *NodeConfig) {
			cfg.Actors.PrefixCachePercent, cfg.Actors.DecodeCachePercent = percent, percent
			cfg.Actors.ContextTokens, cfg.Actors.PrefillPages, cfg.Actors.DecodePages = 1024, 256, 128
		}
	}
	// start brings a layout up with the caches at percent and returns a
	// client of its entry node and the nodes whose pools cache.
	type layout struct {
		c     *client.Client
		nodes []*Node
	}
	for _, topo := range []struct {
		name  string
		start func(b *testing.B, percent int) layout
	}{
		{"role-all", func(b *testing.B, percent int) layout {
			n := startNodeTuned(b, testAuth(b, actors.RoleAll), actors.RoleAll, nil, tune(percent))
			return layout{tenantClient(b, n.Address(), "bench"), []*Node{n}}
		}},
		{"router-prefill-decode", func(b *testing.B, percent int) layout {
			p := startNodeTuned(b, testAuth(b, actors.RolePrefill), actors.RolePrefill, nil, tune(percent))
			d := startNodeTuned(b, testAuth(b, actors.RoleDecode), actors.RoleDecode, nil, tune(percent), p.GossipAddr())
			r := startNodeTuned(b, testAuth(b, actors.RoleRouter), actors.RoleRouter, nil, tune(percent), p.GossipAddr())
			for _, n := range []*Node{p, d, r} {
				waitFor(b, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 && routable(n) })
			}
			return layout{tenantClient(b, r.Address(), "bench"), []*Node{p, d}}
		}},
	} {
		b.Run(topo.name, func(b *testing.B) {
			on, off := topo.start(b, 50), topo.start(b, 0)
			published := func() uint64 { return cachePublished(on.nodes...) }
			ttft := func(l layout, prompt string) (time.Duration, int) {
				start := time.Now()
				var first time.Duration
				res, err := l.c.Generate(context.Background(), "bench", prompt, client.GenerateOptions{MaxTokens: 2}, func(int) {
					if first == 0 {
						first = time.Since(start)
					}
				})
				if err != nil {
					b.Fatal(err)
				}
				return first, res.CachedTokens
			}
			r := rand.New(rand.NewPCG(1, 2))
			// A first request each outside the measurement: connections.
			ttft(on, bench.Text(r, 8))
			ttft(off, bench.Text(r, 8))
			var hit, miss, none []time.Duration
			for i := 0; b.Loop(); i++ {
				prefix := bench.Text(r, prefixBytes)
				first, second := prefix+bench.Text(r, suffixBytes), prefix+bench.Text(r, suffixBytes)
				before := published()
				// Which cluster goes first alternates: neither always
				// finds the machine just idle.
				for k := range 2 {
					if (i+k)%2 == 0 {
						d, _ := ttft(off, first)
						none = append(none, d)
						continue
					}
					d, cached := ttft(on, first)
					if cached != 0 {
						b.Fatalf("a new prefix read %d tokens from the cache", cached)
					}
					miss = append(miss, d)
				}
				// By prefill, once decode has them, and by decode, once
				// the request is answered.
				waitFor(b, "the prefix's pages kept", time.Minute, func() bool { return published() >= before+2*prefixBytes/16 })
				d, cached := ttft(on, second)
				if cached != prefixBytes {
					b.Fatalf("the cached prefix: %d tokens read from the cache, want %d", cached, prefixBytes)
				}
				hit = append(hit, d)
			}
			median := func(ds []time.Duration) float64 {
				s := slices.Clone(ds)
				slices.Sort(s)
				return bench.Percentile(msOf(s), 50)
			}
			h, m, n := median(hit), median(miss), median(none)
			b.ReportMetric(h, "cached-ttft-ms")
			b.ReportMetric(m, "miss-ttft-ms")
			b.ReportMetric(n, "off-ttft-ms")
			b.ReportMetric(h/m, "cached/uncached")
			b.ReportMetric(m/n, "miss/off")
		})
	}
}

// msOf is durations in milliseconds.
func msOf(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}
