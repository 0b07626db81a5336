package actors

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"

	"github.com/kvwarden/kvwarden/trust"
)

// Run with: go test ./actors -run '^$' -bench . -benchtime 3x

const (
	benchRequests  = 8
	benchPromptLen = 64
	benchMaxTokens = 32
)

func benchPrompts() []string {
	out := make([]string, benchRequests)
	for i := range out {
		out[i] = strings.Repeat(fmt.Sprintf("request %d of the benchmark; ", i), 8)[:benchPromptLen]
	}
	return out
}

// directLoop is the same work on one engine and one kv.Pool, with no actor,
// message, transfer or verification: prefill then greedy decode, request
// after request. It returns the tokens generated.
func directLoop(b *testing.B, cfg Config, e engine.Engine, prompts []string) int {
	pool, err := kv.NewPool(kv.DefaultConfig(cfg.Geometry(), cfg.DecodePages, 1))
	if err != nil {
		b.Fatal(err)
	}
	g := cfg.Geometry()
	tokens := 0
	for i, p := range prompts {
		owner := kv.Owner{Request: uint64(i + 1), Tenant: "bench"}
		prompt := engine.ByteTokenizer{}.Encode(p)
		tags, err := pool.Reserve(owner, 0, g.PagesFor(len(prompt)), time.Now())
		if err != nil {
			b.Fatal(err)
		}
		pre, err := e.Prefill(pool, owner, tags, prompt)
		if err != nil {
			b.Fatal(err)
		}
		seq, err := e.Decode(pool, pre.Manifest, pre.First)
		if err != nil {
			b.Fatal(err)
		}
		spare, err := pool.Reserve(owner, len(prompt), g.PagesFor(benchMaxTokens-1), time.Now())
		if err != nil {
			b.Fatal(err)
		}
		tokens++
		for n := 1; n < benchMaxTokens; n++ {
			if _, need := seq.NeedsPage(); need {
				if err := seq.GrantPage(spare[0]); err != nil {
					b.Fatal(err)
				}
				spare = spare[1:]
			}
			tok, err := seq.Step(pool)
			if err != nil {
				b.Fatal(err)
			}
			tokens++
			if tok == engine.EOS {
				break
			}
		}
		if err := seq.Close(pool); err != nil {
			b.Fatal(err)
		}
		for _, t := range append(tags, spare...) {
			if _, err := pool.Release(t, owner, time.Time{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	return tokens
}

// actorPath sends the same requests through a node, all at once, and
// returns the tokens generated.
func actorPath(b *testing.B, c *client.Client, prompts []string) int {
	var wg sync.WaitGroup
	counts := make([]int, len(prompts))
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Generate(context.Background(), "bench", p, client.GenerateOptions{MaxTokens: benchMaxTokens}, nil)
			if err != nil {
				b.Error(err)
				return
			}
			counts[i] = len(res.Tokens)
		}()
	}
	wg.Wait()
	total := 0
	for _, n := range counts {
		total += n
	}
	return total
}

// BenchmarkServe: tokens/s through the actor path (admission, request,
// page, pool and worker actors, frames, sealing and verification) against a
// direct engine loop on the same work, measured alternately in one run.
// The actor path runs prefill and decode on two workers; the direct loop
// on one goroutine, as a single engine would.
func BenchmarkServe(b *testing.B) {
	cfg := DefaultLocalConfig()
	n, err := Start(cfg, withModel(b, cfg, Options{}))
	if err != nil {
		b.Fatal(err)
	}
	defer n.Stop()
	c := client.New(n.Root().ActorSystem(), n.Admission(), client.Options{Auth: trust.Insecure(nil)})
	eng, err := engine.NewReferenceEngine(cfg.Model)
	if err != nil {
		b.Fatal(err)
	}
	prompts := benchPrompts()
	var direct, actors time.Duration
	var dTokens, aTokens int
	for b.Loop() {
		s := time.Now()
		dTokens += directLoop(b, cfg, eng, prompts)
		direct += time.Since(s)
		s = time.Now()
		aTokens += actorPath(b, c, prompts)
		actors += time.Since(s)
	}
	if dTokens != aTokens {
		b.Fatalf("direct loop generated %d tokens, actor path %d", dTokens, aTokens)
	}
	dRate := float64(dTokens) / direct.Seconds()
	aRate := float64(aTokens) / actors.Seconds()
	b.ReportMetric(dRate, "direct-tok/s")
	b.ReportMetric(aRate, "actor-tok/s")
	b.ReportMetric(aRate/dRate, "ratio")
}

// BenchmarkAdmissionReject: the latency of refusing an oversize prompt,
// from the client's call to its error.
func BenchmarkAdmissionReject(b *testing.B) {
	cfg := DefaultLocalConfig()
	n, err := Start(cfg, withModel(b, cfg, Options{}))
	if err != nil {
		b.Fatal(err)
	}
	defer n.Stop()
	c := client.New(n.Root().ActorSystem(), n.Admission(), client.Options{Auth: trust.Insecure(nil)})
	prompt := strings.Repeat("x", cfg.ContextTokens+1)
	for b.Loop() {
		if _, err := c.Generate(context.Background(), "bench", prompt, client.GenerateOptions{MaxTokens: 1}, nil); err == nil {
			b.Fatal("oversize prompt admitted")
		}
	}
}

// BenchmarkPageAsk: one page ask (a release of a page no one holds,
// refused by the page's actor) against the same call on a kv.Pool
// directly, alternately in one run: what each of the asks a request's
// prefill, transfer and verification make costs in handoffs between
// goroutines. It reports µs an ask and x-direct, the ask's time over the
// direct call's.
func BenchmarkPageAsk(b *testing.B) {
	cfg := testConfig()
	n, err := Start(cfg, withModel(b, cfg, Options{}))
	if err != nil {
		b.Fatal(err)
	}
	defer n.Stop()
	pool := nodePool(b, n, "bench/pool", 1, time.Minute)
	run := n.Config()
	direct, err := kv.NewPool(run.pool(1, run.Incarnation))
	if err != nil {
		b.Fatal(err)
	}
	tag := kv.Tag{Incarnation: run.Incarnation, Index: 0, Generation: 1}
	owner := kv.Owner{Request: 1, Tenant: "bench"}
	var asks, calls time.Duration
	for b.Loop() {
		start := time.Now()
		if rep := pool.Page(n.Root(), tag, PageRelease{Tag: tag, Owner: owner}); rep.Err == nil {
			b.Fatal("a release of a free page was taken")
		}
		mid := time.Now()
		if _, err := direct.Release(tag, owner, mid); err == nil {
			b.Fatal("a direct release of a free page was taken")
		}
		asks, calls = asks+mid.Sub(start), calls+time.Since(mid)
	}
	b.ReportMetric(float64(asks.Microseconds())/float64(b.N), "µs/ask")
	b.ReportMetric(float64(asks)/float64(max(calls, 1)), "x-direct")
}
