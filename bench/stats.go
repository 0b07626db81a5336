package bench

import (
	"math"
	"slices"
	"time"
)

// Sample is what one request of a run did, its times as offsets from the
// run's start or durations.
type Sample struct {
	// Start is when it was sent.
	Start time.Duration
	// TTFT is from the send to the first token; E2E to the answer's end.
	TTFT, E2E time.Duration
	// Tokens is how many tokens came back; PromptTokens how many the
	// prompt is; CachedTokens how many of those the cluster read from its
	// prefix cache instead of computing them.
	Tokens, PromptTokens, CachedTokens int
	// Gaps are the times between consecutive tokens, as they arrived
	// (tokens that arrive together have gaps of zero).
	Gaps []time.Duration
	// Code is empty for an answer, else the error's code name ("busy",
	// "http_503", …).
	Code string
	// Wrong says the answer differed from the reference engine's.
	Wrong bool
	// Warmup says it was sent during the warm-up: it is not counted.
	Warmup bool
}

// OK says the request was answered with the reference answer.
func (s Sample) OK() bool { return s.Code == "" && !s.Wrong }

// ITL is the request's mean inter-token latency: the time after the
// first token over the tokens after it (DistServe's TPOT); zero with
// fewer than two tokens.
func (s Sample) ITL() time.Duration {
	if s.Tokens < 2 {
		return 0
	}
	return (s.E2E - s.TTFT) / time.Duration(s.Tokens-1)
}

// SLO is a service-level objective: a request meets it when it was
// answered correctly within TTFT of being sent and with a mean
// inter-token latency within ITL. Zero means no bound.
type SLO struct {
	TTFT time.Duration `json:"ttft_ns"`
	ITL  time.Duration `json:"itl_ns"`
}

// Met says whether s meets the objective.
func (o SLO) Met(s Sample) bool {
	return s.OK() && (o.TTFT == 0 || s.TTFT <= o.TTFT) && (o.ITL == 0 || s.ITL() <= o.ITL)
}

// Percentiles summarize a set of durations, in milliseconds.
type Percentiles struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Percentile is the p-th percentile (0 ≤ p ≤ 100) of sorted values,
// interpolated linearly between the closest ranks (numpy's default); NaN
// for no values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	if lo >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	return sorted[lo] + (rank-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// Summarize is the percentiles of ds; zero for none.
func Summarize(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	ms := make([]float64, len(ds))
	sum := 0.0
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
		sum += ms[i]
	}
	slices.Sort(ms)
	return Percentiles{Count: len(ms), Mean: sum / float64(len(ms)), P50: Percentile(ms, 50), P90: Percentile(ms, 90),
		P99: Percentile(ms, 99), Max: ms[len(ms)-1]}
}

// Summary is what a run measured, over the requests sent after the
// warm-up.
type Summary struct {
	// Requests were sent; OK were answered with the reference answer;
	// Wrong were answered otherwise; Errors counts the others by code.
	Requests int            `json:"requests"`
	OK       int            `json:"ok"`
	Wrong    int            `json:"wrong"`
	Errors   map[string]int `json:"errors"`
	// WindowS is the span the rates are over, in seconds: from the
	// measured window's start (the warm-up's end) to the last counted
	// request's end. It starts there rather than at the first counted send,
	// which comes a Poisson gap later, so that a run's rates do not exceed
	// what it offered: four requests at 2 a second over 2 s would otherwise
	// read as more than 4 a second answered.
	WindowS float64 `json:"window_s"`
	// RequestsPerS counts answered requests, OutputTokensPerS their
	// tokens, GoodputPerS those that met the SLO; GoodShare is the share of
	// the requests sent that met it.
	RequestsPerS     float64 `json:"requests_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	GoodputPerS      float64 `json:"goodput_per_s"`
	GoodShare        float64 `json:"good_share"`
	SLO              SLO     `json:"slo"`
	// PromptTokens are the prompts' tokens of the answered requests;
	// CachedTokens those of them read from the prefix cache; HitRate the
	// share of the one that is the other.
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	HitRate      float64 `json:"cache_hit_rate"`
	// TTFT, ITL (each request's mean) and E2E are over answered requests;
	// Gaps over every gap between two tokens of them.
	TTFT Percentiles `json:"ttft"`
	ITL  Percentiles `json:"itl"`
	E2E  Percentiles `json:"e2e"`
	Gaps Percentiles `json:"token_gaps"`
}

// Summarize is the summary of the samples of a run that are not warm-up,
// its rates over the window from the offset from (the warm-up's end; the
// first counted send, if earlier) to the last counted request's end.
func (o SLO) Summarize(samples []Sample, from time.Duration) Summary {
	s := Summary{Errors: map[string]int{}, SLO: o}
	var ttft, itl, e2e, gaps []time.Duration
	first, last := from, time.Duration(0)
	good, tokens := 0, 0
	for _, x := range samples {
		if x.Warmup {
			continue
		}
		s.Requests++
		first, last = min(first, x.Start), max(last, x.Start+x.E2E)
		switch {
		case x.Code != "":
			s.Errors[x.Code]++
			continue
		case x.Wrong:
			s.Wrong++
			continue
		}
		s.OK++
		tokens += x.Tokens
		s.PromptTokens, s.CachedTokens = s.PromptTokens+x.PromptTokens, s.CachedTokens+x.CachedTokens
		if o.Met(x) {
			good++
		}
		ttft, e2e, gaps = append(ttft, x.TTFT), append(e2e, x.E2E), append(gaps, x.Gaps...)
		if x.Tokens > 1 {
			itl = append(itl, x.ITL())
		}
	}
	if s.Requests == 0 {
		return s
	}
	s.WindowS = max(last-first, time.Microsecond).Seconds()
	s.RequestsPerS, s.OutputTokensPerS = float64(s.OK)/s.WindowS, float64(tokens)/s.WindowS
	s.GoodputPerS, s.GoodShare = float64(good)/s.WindowS, float64(good)/float64(s.Requests)
	if s.PromptTokens > 0 {
		s.HitRate = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	s.TTFT, s.ITL, s.E2E, s.Gaps = Summarize(ttft), Summarize(itl), Summarize(e2e), Summarize(gaps)
	return s
}
