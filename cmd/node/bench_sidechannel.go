package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvwarden/kvwarden/bench"
	"github.com/kvwarden/kvwarden/engine"
)

// Bounds of the side-channel harness.
const (
	// sideChannelTrialsMax bounds --side-channel: each trial is at least
	// four requests.
	sideChannelTrialsMax = 10000
	// victimSendsMax bounds the sends of a victim's prompt until one reads
	// its prefix from the cache: its pages are kept once decode
	// acknowledges them, which may come after the answer.
	victimSendsMax = 20
	// victimPause is the wait between two such sends.
	victimPause = 20 * time.Millisecond
)

// The tenants of the harness: the victim is tenant-0, the attacker
// tenant-1 (their credentials, or the first and second --api-key).
const (
	victimTenant   = 0
	attackerTenant = 1
)

// sideChannelReport is what the harness measured: whether the attacker can
// tell by time to first token that a prefix it guessed is one the victim
// sent.
type sideChannelReport struct {
	Trials      int              `json:"trials"`
	PrefixBytes int              `json:"prefix_bytes"`
	Separation  bench.Separation `json:"separation"`
	// GuessCachedTokens and MissCachedTokens are the prompt tokens the
	// attacker was told were read from the cache, over its guesses of the
	// victim's prefix and over its random prefixes; GuessesCached and
	// MissesCached how many of each were told any.
	GuessCachedTokens int `json:"guess_cached_tokens"`
	MissCachedTokens  int `json:"miss_cached_tokens"`
	GuessesCached     int `json:"guesses_cached"`
	MissesCached      int `json:"misses_cached"`
	// VictimSends is how many times the victim sent its prompts, at least
	// twice a trial: until a send read its prefix from the cache.
	VictimSends int `json:"victim_sends"`
}

// sidePrompt is one request of the harness and what came back.
type sidePrompt struct {
	tenant int
	shape  bench.Shape
	a      answer
	start  time.Duration
}

// sideChannel plays the harness --side-channel asks for: in each trial the
// victim sends a prompt that starts with a secret prefix of
// --shared-prefix-len bytes, again until a send reads the prefix from the
// cache (so that it is there to find), then the attacker sends, in an
// order drawn at random, the secret followed by a suffix of its own (a
// would-be hit) and a random prefix of the same length followed by the
// same suffix (a miss), timing each. The report is the AUC of telling the
// two apart by time to first token, and what the attacker was told it
// read from the cache. Every answer is checked against the reference
// engine's once the trials are over, so that computing them does not
// slow the requests being timed.
func sideChannel(ctx context.Context, stderr io.Writer, log *slog.Logger, o benchOptions, rep *benchReport) error {
	wl, err := o.workloadFlags.check()
	if err != nil {
		return usageError{err}
	}
	m, err := nodeConfig{Model: o.Model, Tokenizer: o.Tokenizer, DType: o.DType}.model()
	if err != nil {
		return err
	}
	o.Tenants = 2
	w := &workload{model: m}
	s, err := o.dial(ctx, log, w, strings.Split(o.Endpoint, ","), o.creds)
	if err != nil {
		return err
	}
	defer s.close()
	r := rand.New(rand.NewPCG(o.Seed, 0))
	sr := &sideChannelReport{Trials: o.SideChannel, PrefixBytes: o.PrefixLen}
	var victim, attacker []sidePrompt
	var hits, misses []time.Duration
	p := &progress{label: "side channel", total: o.SideChannel}
	done := p.show(stderr)
	defer done()
	began := time.Now()
	send := func(tenant int, prompt string, maxTokens int) sidePrompt {
		sp := sidePrompt{tenant: tenant, shape: bench.Shape{Prompt: prompt, MaxTokens: maxTokens}, start: time.Since(began)}
		sp.a = s.send(ctx, tenant, sp.shape)
		return sp
	}
	for range o.SideChannel {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.sent.Add(1)
		secret := letters(r, o.PrefixLen)
		mine := secret + bench.Text(r, wl.PromptBytes.Draw(r))
		out := wl.OutputTokens.Draw(r)
		for i := range victimSendsMax {
			v := send(victimTenant, mine, out)
			victim = append(victim, v)
			sr.VictimSends++
			if v.a.code != "" {
				return fmt.Errorf("side channel: the victim's request failed: %s", v.a.code)
			}
			if v.a.cached > 0 {
				break
			}
			if i == victimSendsMax-1 {
				return fmt.Errorf("side channel: the victim sent its prompt %d times and none read its prefix from the cache: is the cache on (--prefix-cache-percent) and --shared-prefix-len (%d) a page or longer?",
					victimSendsMax, o.PrefixLen)
			}
			time.Sleep(victimPause)
		}
		suffix := bench.Text(r, wl.PromptBytes.Draw(r))
		guess, other := secret+suffix, letters(r, o.PrefixLen)+suffix
		guessFirst := r.IntN(2) == 0
		for _, isGuess := range []bool{guessFirst, !guessFirst} {
			prompt := other
			if isGuess {
				prompt = guess
			}
			a := send(attackerTenant, prompt, out)
			attacker = append(attacker, a)
			if a.a.code != "" {
				return fmt.Errorf("side channel: the attacker's request failed: %s", a.a.code)
			}
			if isGuess {
				hits = append(hits, a.a.first)
				sr.GuessCachedTokens += a.a.cached
				sr.GuessesCached += min(a.a.cached, 1)
			} else {
				misses = append(misses, a.a.first)
				sr.MissCachedTokens += a.a.cached
				sr.MissesCached += min(a.a.cached, 1)
			}
		}
		p.done.Add(1)
	}
	sr.Separation = bench.Separate(hits, misses)
	rep.SideChannel = sr
	for _, run := range []struct {
		name string
		reqs []sidePrompt
	}{{"victim", victim}, {"attacker", attacker}} {
		samples, err := checkSidePrompts(m, run.reqs)
		if err != nil {
			return err
		}
		rep.Runs = append(rep.Runs, benchRun{Layout: run.name, Concurrency: 1, Summary: bench.SLO{}.Summarize(samples, 0), samples: samples})
	}
	return nil
}

// letters is n random lowercase letters: a prefix that no other draw
// shares a page of, as a secret and a random guess must not. bench.Text's
// words would: two of its prefixes often start with the same three words,
// a page of a byte tokenizer, and the attacker would read that page of its
// own earlier prompt from its own cache.
func letters(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	return string(b)
}

// checkSidePrompts are the samples of reqs, each answer checked against
// the reference engine's.
func checkSidePrompts(m *engine.Model, reqs []sidePrompt) ([]bench.Sample, error) {
	shapes := make([]bench.Shape, len(reqs))
	for i, r := range reqs {
		shapes[i] = r.shape
	}
	refs, err := references(m, shapes)
	if err != nil {
		return nil, err
	}
	out := make([]bench.Sample, len(reqs))
	for i, r := range reqs {
		out[i] = bench.Sample{Start: r.start, TTFT: r.a.first, E2E: r.a.e2e, Tokens: r.a.count, PromptTokens: refs[i].promptTokens,
			CachedTokens: r.a.cached, Gaps: r.a.gaps, Wrong: !refs[i].matches(r.a)}
	}
	return out, nil
}

// printSideChannel writes what the harness measured under the table.
func printSideChannel(w io.Writer, sr *sideChannelReport) {
	if sr == nil {
		return
	}
	s := sr.Separation
	fmt.Fprintf(w, "side channel: %d trials (%d guesses of the victim's %d-byte prefix, %d random prefixes): ROC AUC of telling them apart by TTFT %.3f (95%% CI %.3f to %.3f; chance gives %.3f to %.3f)\n",
		sr.Trials, s.Hits, sr.PrefixBytes, s.Misses, s.AUC, s.Low, s.High, s.ChanceLow, s.ChanceHigh)
	fmt.Fprintf(w, "the attacker was told it read %d prompt tokens from the cache on %d of its guesses and %d on %d of its random prefixes\n",
		sr.GuessCachedTokens, sr.GuessesCached, sr.MissCachedTokens, sr.MissesCached)
}
