package bench

import (
	"math"
	"testing"
	"time"
)

// fastDecode is a profile whose decode and transfer take no time that
// matters, with prefill at tokensPerS.
func fastDecode(tokensPerS float64) Profile {
	return Profile{PrefillTokensPerS: tokensPerS, Decode: []DecodeRate{{1, 1e9}}, KVBytesPerToken: 1,
		TransferBytesPerS: 1e15, BatchMax: 8}
}

// TestPredictMD1: with one prefill node, one-token answers and Poisson
// arrivals, the prefill node is an M/D/1 queue: the mean wait is
// ρS / (2(1 − ρ)) (Pollaczek–Khinchine with deterministic service S);
// the simulation's mean TTFT is overhead + wait + S within 2 %.
func TestPredictMD1(t *testing.T) {
	p := fastDecode(1000)
	p.OverheadS = 0.01
	const rate, prompt, n = 7.0, 100, 100000
	at, _ := Poisson(11, rate, 0, Bound{Requests: n})
	loads := make([]Load, n)
	for i := range loads {
		loads[i] = Load{PromptTokens: prompt, OutputTokens: 1}
	}
	s, err := Predict(p, Layout{Prefill: 1, Decode: 1}, Run{At: at, Loads: loads}, SLO{})
	if err != nil {
		t.Fatal(err)
	}
	service := float64(prompt) / p.PrefillTokensPerS
	rho := rate * service
	want := p.OverheadS + rho*service/(2*(1-rho)) + service
	got := s.TTFT.Mean / 1000
	if math.Abs(got-want)/want > 0.02 {
		t.Errorf("mean TTFT %.4f s, M/D/1 says %.4f s (ρ = %.2f)", got, want, rho)
	}
	if s.OK != n || s.E2E.Mean != s.TTFT.Mean {
		t.Errorf("%d of %d answered; E2E %g ms, TTFT %g ms: one-token answers end at their first token", s.OK, n, s.E2E.Mean, s.TTFT.Mean)
	}
}

// TestPredictOneRequest: alone, a request's TTFT is overhead, prefill and
// transfer, and each later token one decode step of batch 1; on a node of
// role all, the same without the transfer.
func TestPredictOneRequest(t *testing.T) {
	p := Profile{PrefillTokensPerS: 1000, Decode: []DecodeRate{{1, 100}, {4, 200}}, KVBytesPerToken: 1000,
		TransferBytesPerS: 1e6, OverheadS: 0.005, BatchMax: 4}
	run := Run{At: []time.Duration{0}, Loads: []Load{{PromptTokens: 200, OutputTokens: 11}}}
	for _, tc := range []struct {
		layout Layout
		ttft   float64
	}{
		{Layout{Prefill: 1, Decode: 1}, 5 + 200 + 200}, // ms: overhead, prefill, 200 kB at 1 MB/s
		{Layout{All: 1}, 5 + 200},
	} {
		s, err := Predict(p, tc.layout, run, SLO{})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(s.TTFT.Mean-tc.ttft) > 1e-6 || math.Abs(s.ITL.Mean-10) > 1e-6 || math.Abs(s.E2E.Mean-(tc.ttft+100)) > 1e-6 {
			t.Errorf("%s: TTFT %g ms, ITL %g ms, E2E %g ms; want %g, 10, %g", tc.layout, s.TTFT.Mean, s.ITL.Mean, s.E2E.Mean, tc.ttft, tc.ttft+100)
		}
	}
}

// TestPredictShared: on a node of role all, a prefill that runs while
// another request decodes gets half the processor, and so do the decode
// steps beside it.
func TestPredictShared(t *testing.T) {
	p := Profile{PrefillTokensPerS: 1000, Decode: []DecodeRate{{1, 100}}, KVBytesPerToken: 1, TransferBytesPerS: 1e15, BatchMax: 4}
	// A: prefill 0–10 ms, then steps of 10 ms. B arrives at 10 ms: its 100
	// ms prefill shares the node with A's steps, so takes 200 ms.
	run := Run{At: []time.Duration{0, 10 * time.Millisecond}, Loads: []Load{{10, 1000}, {100, 1}}}
	s, err := Predict(p, Layout{All: 1}, run, SLO{})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(s.TTFT.Max-200) > 1e-6 || math.Abs(s.TTFT.P50-105) > 1e-6 {
		t.Errorf("TTFTs p50 %g ms, max %g ms; want 10 and 200 (p50 105)", s.TTFT.P50, s.TTFT.Max)
	}
	// A's steps at half speed for 200 ms: 10 of its gaps are 20 ms.
	if s.Gaps.Max != 20 {
		t.Errorf("longest gap %g ms, want 20", s.Gaps.Max)
	}
	// Apart, on 1P:1D, B waits for nothing.
	split, err := Predict(p, Layout{Prefill: 1, Decode: 1}, run, SLO{})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(split.TTFT.Max-100) > 1e-6 || split.Gaps.Max != 10 {
		t.Errorf("1P:1D: TTFT max %g ms, gap max %g ms; want 100 and 10", split.TTFT.Max, split.Gaps.Max)
	}
}

func TestStepS(t *testing.T) {
	p := Profile{Decode: []DecodeRate{{1, 100}, {4, 200}, {8, 200}}}
	for _, tc := range []struct {
		batch int
		want  float64
	}{{1, 0.01}, {4, 0.02}, {2, 0.01 + 0.01/3}, {8, 0.04}, {12, 0.06}, {0, 0.01}} {
		if got := p.StepS(tc.batch); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("StepS(%d) = %g, want %g", tc.batch, got, tc.want)
		}
	}
}

// TestPlan: a workload of long prompts and one-token answers is all
// prefill, so the layout with the most prefill nodes wins among the
// splits, and every node of role all prefills too.
func TestPlan(t *testing.T) {
	p := fastDecode(1000)
	const n = 400
	at, warm := Poisson(5, 20, time.Second, Bound{Requests: n})
	loads := make([]Load, len(at))
	for i := range loads {
		loads[i] = Load{PromptTokens: 100, OutputTokens: 1}
	}
	preds, err := Plan(p, 4, Run{At: at, Loads: loads, Warm: warm, Warmup: time.Second}, SLO{TTFT: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(preds) != 4 {
		t.Fatalf("%d layouts of 4 nodes, want 4", len(preds))
	}
	for i := 1; i < len(preds); i++ {
		if preds[i].Summary.GoodputPerS > preds[i-1].Summary.GoodputPerS {
			t.Errorf("not best first: %s %g before %s %g", preds[i-1].Layout, preds[i-1].Summary.GoodputPerS,
				preds[i].Layout, preds[i].Summary.GoodputPerS)
		}
	}
	if best := preds[0].Layout; best != (Layout{All: 4}) {
		t.Errorf("best layout %s, want 4 all (four nodes that prefill)", best)
	}
	if worst := preds[len(preds)-1].Layout; worst != (Layout{Prefill: 1, Decode: 3}) {
		t.Errorf("worst layout %s, want 1P:3D", worst)
	}
	if _, err := Plan(p, 0, Run{}, SLO{}); err == nil {
		t.Error("a plan for 0 nodes was made")
	}
}

// TestPredictWarmup: a run whose warm-up does not divide its warm requests
// from the others is refused, as its window would start in the wrong place.
func TestPredictWarmup(t *testing.T) {
	at := []time.Duration{0, time.Second}
	loads := []Load{{PromptTokens: 10, OutputTokens: 1}, {PromptTokens: 10, OutputTokens: 1}}
	for _, run := range []Run{{At: at, Loads: loads, Warm: 1}, {At: at, Loads: loads, Warm: 1, Warmup: 2 * time.Second}} {
		if _, err := Predict(fastDecode(1000), Layout{All: 1}, run, SLO{}); err == nil {
			t.Errorf("warm %d, warm-up %s: predicted, want refused", run.Warm, run.Warmup)
		}
	}
	if _, err := Predict(fastDecode(1000), Layout{All: 1}, Run{At: at, Loads: loads, Warm: 1, Warmup: time.Second}, SLO{}); err != nil {
		t.Errorf("warm-up of 1s: %v", err)
	}
}
