package bench

import (
	"math"
	"testing"
	"time"
)

// TestPercentile: linear interpolation between the closest ranks, as
// numpy's default computes, on sets worked out by hand.
func TestPercentile(t *testing.T) {
	for _, tc := range []struct {
		values []float64
		p      float64
		want   float64
	}{
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{[]float64{1, 2, 3, 4}, 90, 3.7},        // rank 2.7: 3 + 0.7 × 1
		{[]float64{1, 2, 3, 4}, 99, 3.97},       // rank 2.97
		{[]float64{15, 20, 35, 40, 50}, 40, 29}, // rank 1.6: 20 + 0.6 × 15
		{[]float64{15, 20, 35, 40, 50}, 0, 15},
		{[]float64{15, 20, 35, 40, 50}, 100, 50},
		{[]float64{7}, 99, 7},
	} {
		if got := Percentile(tc.values, tc.p); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Percentile(%v, %g) = %g, want %g", tc.values, tc.p, got, tc.want)
		}
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("Percentile of nothing = %g, want NaN", got)
	}
}

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// TestSummarize: the rates are over the span from the warm-up's end (or
// the first counted send, if earlier) to the last end; a warm-up request, an error and a wrong answer are not
// answers; goodput counts the answers within both objectives.
func TestSummarize(t *testing.T) {
	samples := []Sample{
		{Start: 0, TTFT: ms(500), E2E: ms(900), Tokens: 3, PromptTokens: 64, CachedTokens: 48, Warmup: true},
		{Start: ms(1000), TTFT: ms(100), E2E: ms(300), Tokens: 5, PromptTokens: 40, CachedTokens: 32, Gaps: []time.Duration{ms(50), ms(50), ms(50), ms(50)}}, // ITL 50 ms
		{Start: ms(1500), TTFT: ms(300), E2E: ms(700), Tokens: 5, PromptTokens: 24, Gaps: []time.Duration{ms(100), 0, ms(200), ms(100)}},                     // TTFT over
		{Start: ms(2000), TTFT: ms(150), E2E: ms(1150), Tokens: 11},                                                                                          // ITL 100 ms: over
		{Start: ms(2500), TTFT: ms(50), E2E: ms(50), Tokens: 1},                                                                                              // no ITL
		{Start: ms(2600), Code: "busy", E2E: ms(10)},
		{Start: ms(2700), TTFT: ms(20), E2E: ms(3300), Tokens: 2, PromptTokens: 16, CachedTokens: 16, Wrong: true}, // ends at 6000 ms
	}
	slo := SLO{TTFT: ms(200), ITL: ms(60)}
	s := slo.Summarize(samples, ms(1200))
	if s.Requests != 6 || s.OK != 4 || s.Wrong != 1 || s.Errors["busy"] != 1 || len(s.Errors) != 1 {
		t.Fatalf("counts: %+v", s)
	}
	if s.WindowS != 5 {
		t.Fatalf("window %g s, want 5 (1000 ms to 6000 ms)", s.WindowS)
	}
	// Good: the first (TTFT 100, ITL 50) and the one-token answer.
	if s.GoodputPerS != 2.0/5 || s.GoodShare != 2.0/6 || s.RequestsPerS != 4.0/5 || s.OutputTokensPerS != 22.0/5 {
		t.Errorf("rates: goodput %g, share %g, requests %g, tokens %g", s.GoodputPerS, s.GoodShare, s.RequestsPerS, s.OutputTokensPerS)
	}
	// TTFT of the answers: 50, 100, 150, 300.
	if s.TTFT.Count != 4 || s.TTFT.P50 != 125 || s.TTFT.Mean != 150 || s.TTFT.Max != 300 || math.Abs(s.TTFT.P90-255) > 1e-9 {
		t.Errorf("TTFT %+v, want p50 125, mean 150, p90 255, max 300", s.TTFT)
	}
	// ITL of the answers with two tokens or more: 50, 100, 100.
	if s.ITL.Count != 3 || s.ITL.P50 != 100 || s.ITL.Max != 100 {
		t.Errorf("ITL %+v, want three, p50 100", s.ITL)
	}
	// Prompt tokens of the answers: 40 (32 of them cached) and 24.
	if s.PromptTokens != 64 || s.CachedTokens != 32 || s.HitRate != 0.5 {
		t.Errorf("prompt tokens %d, %d cached, hit rate %g; want 64, 32 and 0.5", s.PromptTokens, s.CachedTokens, s.HitRate)
	}
	if s.Gaps.Count != 8 || s.Gaps.P50 != 50 {
		t.Errorf("gaps %+v, want 8, p50 50", s.Gaps)
	}
	if none := (SLO{}).Summarize(samples[:1], ms(1000)); none.Requests != 0 || none.GoodputPerS != 0 {
		t.Errorf("only warm-up: %+v, want nothing counted", none)
	}
}

// TestSummarizeWindow: the window starts at the warm-up's end, not at the
// first counted send, so that a run's rates never exceed what it offered:
// two answers sent 1.5 s and 1.9 s into a run at 1 a second after a 1 s
// warm-up, each ending 100 ms later, are 2 over 1 s, not 2 over 0.5 s.
func TestSummarizeWindow(t *testing.T) {
	samples := []Sample{
		{Start: ms(500), TTFT: ms(50), E2E: ms(100), Tokens: 1, Warmup: true},
		{Start: ms(1500), TTFT: ms(50), E2E: ms(100), Tokens: 1},
		{Start: ms(1900), TTFT: ms(50), E2E: ms(100), Tokens: 1},
	}
	s := (SLO{}).Summarize(samples, ms(1000))
	if s.WindowS != 1 || s.RequestsPerS != 2 || s.GoodputPerS != 2 {
		t.Errorf("window %g s, %g requests/s, goodput %g/s; want 1 s (1000 ms to 2000 ms), 2 and 2", s.WindowS, s.RequestsPerS, s.GoodputPerS)
	}
}
