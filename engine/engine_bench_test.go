package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/kv"
)

var benchModels = []struct {
	name string
	cfg  ModelConfig
}{{"default", DefaultModelConfig()}, {"large", LargeModelConfig()}}

const benchPageTokens = 16

// BenchmarkPrefill reports prompt tokens per second of Prefill, writing
// and sealing the pages included.
func BenchmarkPrefill(b *testing.B) {
	for _, bm := range benchModels {
		for _, n := range []int{64, 256} {
			b.Run(fmt.Sprintf("%s/prompt=%d", bm.name, n), func(b *testing.B) {
				e := engineFor(b, bm.cfg)
				g := bm.cfg.Geometry(benchPageTokens)
				p := fragmentedPool(b, g, 2*g.PagesFor(n)+4, 1, 1)
				prompt := testPrompt(n, "bench")
				for b.Loop() {
					prefill(b, e, p, ownerA, prompt)
					b.StopTimer()
					releaseAll(b, p, ownerA)
					b.StartTimer()
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}

// BenchmarkDecode reports one Step at a context of about ctx tokens, and
// sets it against a roofline measured in the same run: the time copy takes
// to move the bytes one step must read (every weight once, and the KV of
// every position). Copy also writes those bytes, so the roofline is
// generous: a ratio of 1 would mean the step runs at memcpy speed.
//
// The sequence restarts from the prompt's manifest every restartSteps steps,
// so that the context stays near ctx however long the benchmark runs.
func BenchmarkDecode(b *testing.B) {
	const restartSteps = 64
	for _, bm := range benchModels {
		for _, ctx := range []int{256, 1024} {
			b.Run(fmt.Sprintf("%s/ctx=%d", bm.name, ctx), func(b *testing.B) {
				e := engineFor(b, bm.cfg)
				g := bm.cfg.Geometry(benchPageTokens)
				p := fragmentedPool(b, g, 2*g.PagesFor(ctx+restartSteps)+4, 1, 1)
				pf := prefill(b, e, p, ownerA, testPrompt(ctx, "bench"))
				kvTokens := 0 // summed over steps: positions each step read
				var s Sequence
				for b.Loop() {
					if s == nil || s.Tokens() == ctx+restartSteps {
						b.StopTimer()
						s = restartDecode(b, e, p, s, pf)
						b.StartTimer()
					}
					if at, need := s.NeedsPage(); need {
						if err := s.GrantPage(reserve(b, p, ownerA, at, 1)[0]); err != nil {
							b.Fatal(err)
						}
					}
					kvTokens += s.Tokens() + 1
					if _, err := s.Step(p); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				stepNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
				bytes := bm.cfg.WeightBytes() + int64(kvTokens/b.N)*int64(g.BytesPerToken())
				copyNs := copyTime(bytes)
				b.ReportMetric(1e9/stepNs, "tok/s")
				b.ReportMetric(float64(bytes)/stepNs, "GB/s")
				b.ReportMetric(float64(bytes)/copyNs, "memcpy-GB/s")
				b.ReportMetric(stepNs/copyNs, "x-roofline")
			})
		}
	}
}

// restartDecode closes s, gives back the pages it sealed, and starts again
// from the prompt's manifest.
func restartDecode(b *testing.B, e Engine, p *kv.Pool, s Sequence, pf Prefilled) Sequence {
	if s != nil {
		if err := s.Close(p); err != nil {
			b.Fatal(err)
		}
		for _, mp := range s.Manifest().Pages[len(pf.Manifest.Pages):] {
			if _, err := p.Release(mp.Tag, ownerA, epoch); err != nil {
				b.Fatal(err)
			}
		}
	}
	s, err := e.Decode(p, pf.Manifest, pf.First)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// copyTime is the nanoseconds copy takes to move n bytes between two
// buffers, the best of several rounds of at least 20 ms each so that one
// interruption does not count.
func copyTime(n int64) float64 {
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	best := 0.0
	for range 5 {
		start, reps := time.Now(), 0
		for time.Since(start) < 20*time.Millisecond {
			copy(dst, src)
			reps++
		}
		if ns := float64(time.Since(start).Nanoseconds()) / float64(reps); best == 0 || ns < best {
			best = ns
		}
	}
	return best
}
