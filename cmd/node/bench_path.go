package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/bench"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// What --path sends, each round, to each of its three targets.
const (
	// pathSingleTokens is what the one request alone generates, and
	// pathSingleRepeats how many such requests a round sends one after
	// another, each a new prompt, for the median of their rates.
	pathSingleTokens  = 256
	pathSingleRepeats = 3
	// pathBatch requests of pathBatchTokens tokens each go at once.
	pathBatch       = 32
	pathBatchTokens = 64
	// pathPromptTokens is the prompt whose first token is timed,
	// pathTTFTProbes times a round, each prompt new.
	pathPromptTokens = 256
	pathTTFTProbes   = 5
	// pathRoundsMax bounds --path.
	pathRoundsMax = 100
)

// The targets --path compares, in the order each round visits them.
const (
	pathEngine  = "engine"
	pathNode    = "node"
	pathCluster = "cluster"
)

// pathRound is what one round measured of one target.
type pathRound struct {
	// SingleTokensPerS is one request's tokens over its time, send to
	// end: the median of pathSingleRepeats requests sent one at a time.
	SingleTokensPerS float64 `json:"single_tokens_per_s"`
	// BatchTokensPerS is pathBatch requests' tokens over the time from
	// the first send to the last end.
	BatchTokensPerS float64 `json:"batch_tokens_per_s"`
	// TTFTS is the median time to the first token of a new prompt of
	// pathPromptTokens tokens.
	TTFTS float64 `json:"ttft_s"`
	// CPUPerToken and BatchCPUPerToken are each process's CPU time over
	// the tokens of the single requests and of the batch, in seconds, by
	// process ("client" is bench itself).
	CPUPerToken      map[string]float64 `json:"cpu_per_token_s"`
	BatchCPUPerToken map[string]float64 `json:"batch_cpu_per_token_s"`
	// FirstTokenS splits the mean time to the first token of the round's
	// new prompts, in seconds, as the node that decoded them counted it
	// (messages.FirstTokenStatus): queue, prefill, transfer and verify;
	// outside is the rest of the mean the client saw, the hops to that
	// node and back. None for the engine.
	FirstTokenS map[string]float64 `json:"first_token_s,omitempty"`
}

// pathPhases are the keys of pathRound.FirstTokenS, in the order of a
// request's life.
var pathPhases = []string{"queue", "prefill", "transfer", "verify", "outside"}

// pathReport is what --path writes to --json.
type pathReport struct {
	Rounds       int                    `json:"rounds"`
	PromptTokens int                    `json:"prompt_tokens"`
	Targets      map[string][]pathRound `json:"targets"`
	Ratios       []pathRatio            `json:"ratios"`
}

// pathRatio is one ratio over the rounds, each round's taken from that
// round's two measurements.
type pathRatio struct {
	What   string    `json:"what"`
	Min    float64   `json:"min"`
	Median float64   `json:"median"`
	Max    float64   `json:"max"`
	Rounds []float64 `json:"rounds"`
}

// pathTarget is one thing --path measures: the processes it runs in and
// how a request reaches it (none for the engine, run in bench itself).
type pathTarget struct {
	name  string
	s     sender
	procs []*child
	// cc asks decoder, the process that decodes, for its status.
	cc      *controlClient
	decoder *child
}

// runPath brings up one node of role all and a router with a prefill and
// a decode node, and measures, rounds times, each of them and the engine
// alone, one after the other.
func runPath(ctx context.Context, stdout, stderr io.Writer, log *slog.Logger, o benchOptions, w *workload) error {
	single, prompts, err := pathShapes(w, o.Path)
	if err != nil {
		return err
	}
	targets := []*pathTarget{{name: pathEngine}}
	for _, l := range []bench.Layout{{All: 1}, {Prefill: 1, Decode: 1}} {
		fmt.Fprintf(stderr, "bringing up %s\n", l)
		c, stop, err := startLayout(o, l)
		if err != nil {
			return err
		}
		t := &pathTarget{name: pathCluster}
		endpoint := c.routerAddrs()
		for _, ch := range c.nodes {
			switch {
			case l.All > 0 && ch.role == roleAll:
				t.name, t.procs, endpoint = pathNode, []*child{ch}, []string{ch.addr}
			case l.All == 0:
				t.procs = append(t.procs, ch)
			}
			if ch.role == messages.RoleAll || ch.role == messages.RoleDecode {
				t.decoder = ch
			}
		}
		auth, err := c.creds.authority(log, trust.RoleOperator, "")
		if err == nil {
			t.cc, err = dialControl("127.0.0.1", auth)
		}
		if err != nil {
			return stop(fmt.Errorf("bench: --path: %w", err))
		}
		if t.s, err = o.dial(ctx, log, w, endpoint, c.creds); err != nil {
			t.cc.close()
			return stop(err)
		}
		defer func() {
			t.s.close()
			t.cc.close()
			if serr := stop(nil); serr != nil {
				log.Error("stopping a layout", "err", serr)
			}
		}()
		targets = append(targets, t)
	}
	rep := &pathReport{Rounds: o.Path, PromptTokens: prompts[0].ref.promptTokens, Targets: map[string][]pathRound{}}
	for r := range o.Path {
		batch, err := fullLength(w, pathBatchTokens, pathBatch, uint64(1+r*64*pathBatch))
		if err != nil {
			return err
		}
		for _, t := range targets {
			fmt.Fprintf(stderr, "round %d of %d: %s\n", r+1, o.Path, t.name)
			m, err := t.measure(ctx, stderr, w, single[r*pathSingleRepeats:(r+1)*pathSingleRepeats], batch,
				prompts[r*pathTTFTProbes:(r+1)*pathTTFTProbes])
			if err != nil {
				return fmt.Errorf("bench: --path, round %d, %s: %w", r+1, t.name, err)
			}
			rep.Targets[t.name] = append(rep.Targets[t.name], m)
		}
	}
	rep.Ratios = pathRatios(rep)
	printPath(stdout, rep, targets)
	if o.JSON == "" {
		return nil
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err == nil {
		err = os.WriteFile(o.JSON, append(data, '\n'), 0o644)
	}
	return err
}

// pathPrompt is a prompt of about pathPromptTokens tokens and its
// reference answer of one token.
type pathPrompt struct {
	shape bench.Shape
	ref   reference
}

// pathShapes are, for each of rounds, pathSingleRepeats single requests
// (short prompts whose answers run to pathSingleTokens tokens) and
// pathTTFTProbes new prompts of pathPromptTokens tokens, none a prefix of
// another.
func pathShapes(w *workload, rounds int) ([]bench.Shape, []pathPrompt, error) {
	single, err := fullLength(w, pathSingleTokens, rounds*pathSingleRepeats, 1<<20)
	if err != nil {
		return nil, nil, err
	}
	tok := w.model.Tokenizer()
	var prompts []pathPrompt
	for i := range rounds * pathTTFTProbes {
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		// Bytes per token differ by tokenizer: grow the text until it
		// holds the tokens, then take the longest cut that does not pass
		// them.
		text := fmt.Sprintf("%d ", i)
		for len(tok.Encode(text)) < pathPromptTokens {
			text += bench.Text(rng, 64)
		}
		for len(tok.Encode(text)) > pathPromptTokens {
			text = text[:len(text)-1]
		}
		shape := bench.Shape{Prompt: text, MaxTokens: 1}
		refs, err := references(w.model, []bench.Shape{shape})
		if err != nil {
			return nil, nil, err
		}
		prompts = append(prompts, pathPrompt{shape: shape, ref: refs[0]})
	}
	return single, prompts, nil
}

// measure is one round of t: the single requests, the batch and the
// first-token probes, with the CPU each process spent on the first two.
func (t *pathTarget) measure(ctx context.Context, stderr io.Writer, w *workload, singles, batch []bench.Shape, prompts []pathPrompt) (pathRound, error) {
	m := pathRound{CPUPerToken: map[string]float64{}}
	rates := make([]float64, len(singles))
	for i, single := range singles {
		tokens, elapsed, cpu, err := t.run(ctx, stderr, w, []bench.Shape{single}, "one request")
		if err != nil {
			return m, err
		}
		rates[i] = float64(tokens) / elapsed.Seconds()
		for p, c := range cpu { // every single request has pathSingleTokens tokens
			m.CPUPerToken[p] += c / float64(len(singles))
		}
	}
	slices.Sort(rates)
	m.SingleTokensPerS = bench.Percentile(rates, 50)
	tokens, elapsed, cpu, err := t.run(ctx, stderr, w, batch, fmt.Sprintf("%d at once", len(batch)))
	if err != nil {
		return m, err
	}
	m.BatchTokensPerS, m.BatchCPUPerToken = float64(tokens)/elapsed.Seconds(), cpu
	before, err := t.decoderStatus()
	if err != nil {
		return m, err
	}
	ttft := make([]float64, len(prompts))
	for i, p := range prompts {
		if ttft[i], err = t.first(ctx, stderr, w, p); err != nil {
			return m, err
		}
	}
	after, err := t.decoderStatus()
	if err != nil {
		return m, err
	}
	if after != nil {
		// Only the prompts' requests, of this run of the node, are between
		// the two readings: the means are theirs.
		if after.Incarnation != before.Incarnation || after.FirstToken.Requests-before.FirstToken.Requests != uint64(len(prompts)) {
			return m, fmt.Errorf("bench: --path: %s counted %d first tokens over %d prompts (incarnation %016x, then %016x)",
				t.decoder.name, after.FirstToken.Requests-before.FirstToken.Requests, len(prompts), before.Incarnation, after.Incarnation)
		}
		m.FirstTokenS = map[string]float64{}
		outside := 0.0
		for _, v := range ttft {
			outside += v / float64(len(ttft))
		}
		phases := meanPhases(after.FirstToken, before.FirstToken)
		for i, v := range phases[:len(pathPhases)-1] {
			m.FirstTokenS[pathPhases[i]] = v
			outside -= v
		}
		m.FirstTokenS[pathPhases[len(pathPhases)-1]] = outside
	}
	slices.Sort(ttft)
	m.TTFTS = bench.Percentile(ttft, 50)
	return m, nil
}

// decoderStatus is the status of t's decoding process, with the first
// tokens it counted so far; nil for the engine.
func (t *pathTarget) decoderStatus() (*messages.NodeStatus, error) {
	if t.decoder == nil {
		return nil, nil
	}
	s, err := t.cc.status(t.decoder.addr, statusPollTimeout)
	if err != nil {
		return nil, err
	}
	if s.Node.FirstToken == nil {
		return nil, fmt.Errorf("status of %s: no first tokens counted (a node of an older build, or its admission did not answer)",
			t.decoder.name)
	}
	return &s.Node, nil
}

// run sends shapes all at once and waits for every answer, each checked
// against the reference: the tokens they came back with, the time from
// the first send to the last answer, and each process's CPU time a token
// over that time.
func (t *pathTarget) run(ctx context.Context, stderr io.Writer, w *workload, shapes []bench.Shape, what string) (int, time.Duration, map[string]float64, error) {
	refs, err := references(w.model, shapes)
	if err != nil {
		return 0, 0, nil, err
	}
	before := t.cpu()
	var tokens int
	var elapsed time.Duration
	if t.s == nil {
		tokens, elapsed, err = engineRun(w.model, shapes, refs)
	} else {
		var samples []bench.Sample
		samples, err = probeRefs(ctx, stderr, t.s, what, shapes, refs, len(shapes), len(shapes))
		var end time.Duration
		for _, x := range samples {
			tokens += x.Tokens
			end = max(end, x.Start+x.E2E)
		}
		if len(samples) > 0 {
			elapsed = end - samples[0].Start
		}
	}
	if err != nil {
		return 0, 0, nil, err
	}
	return tokens, elapsed, before.since(t.cpu(), tokens), nil
}

// first is the time to the first token of p, in seconds.
func (t *pathTarget) first(ctx context.Context, stderr io.Writer, w *workload, p pathPrompt) (float64, error) {
	if t.s == nil {
		_, elapsed, err := engineRun(w.model, []bench.Shape{p.shape}, []reference{p.ref})
		return elapsed.Seconds(), err
	}
	samples, err := probeRefs(ctx, stderr, t.s, "first token", []bench.Shape{p.shape}, []reference{p.ref}, 1, 1)
	if err != nil {
		return 0, err
	}
	return samples[0].TTFT.Seconds(), nil
}

// engineRun generates shapes' answers with the engine alone, in bench's
// own process, the way a decode node's worker does: each prompt prefilled
// into pages of one pool, then every sequence stepped together
// (engine.StepBatch), a page reserved and granted whenever one asks. One shape runs
// through the engine's Reference instead, its single-stream path. Every
// answer must be the reference's.
func engineRun(m *engine.Model, shapes []bench.Shape, refs []reference) (int, time.Duration, error) {
	if len(shapes) == 1 {
		start := time.Now()
		tokens, err := m.Reference(shapes[0].Prompt, shapes[0].MaxTokens)
		elapsed := time.Since(start)
		if err == nil && !slices.Equal(tokens, refs[0].tokens) {
			err = errors.New("engine: the answer differs from the reference")
		}
		return len(tokens), elapsed, err
	}
	g := m.Config().Geometry(actors.DefaultConfig().PageTokens)
	prompts := make([][]int, len(shapes))
	pages := 0
	for i, s := range shapes {
		prompts[i] = m.Tokenizer().Encode(s.Prompt)
		pages += g.PagesFor(len(prompts[i]) + s.MaxTokens)
	}
	pool, err := kv.NewPool(kv.DefaultConfig(g, pages, 1))
	if err != nil {
		return 0, 0, err
	}
	e := m.Engine()
	start := time.Now()
	seqs := make([]engine.Sequence, len(shapes))
	owners := make([]kv.Owner, len(shapes))
	out := make([][]int, len(shapes))
	for i := range shapes {
		o := kv.Owner{Request: uint64(i + 1), Tenant: "bench"}
		owners[i] = o
		tags, err := pool.Reserve(o, 0, g.PagesFor(len(prompts[i])), start)
		if err != nil {
			return 0, 0, err
		}
		pf, err := e.Prefill(pool, o, tags, prompts[i])
		if err != nil {
			return 0, 0, err
		}
		if seqs[i], err = e.Decode(pool, pf.Manifest, pf.First); err != nil {
			return 0, 0, err
		}
		out[i] = []int{pf.First}
	}
	toks, errs := make([]int, len(seqs)), make([]error, len(seqs))
	for steps := 1; steps < shapes[0].MaxTokens; steps++ {
		for i, s := range seqs {
			if at, need := s.NeedsPage(); need {
				tags, err := pool.Reserve(owners[i], at, 1, start)
				if err == nil {
					err = s.GrantPage(tags[0])
				}
				if err != nil {
					return 0, 0, err
				}
			}
		}
		engine.StepBatch(pool, seqs, toks, errs)
		if err := errors.Join(errs...); err != nil {
			return 0, 0, err
		}
		for i, tok := range toks {
			out[i] = append(out[i], tok)
		}
	}
	elapsed := time.Since(start)
	tokens := 0
	for i := range out {
		if !slices.Equal(out[i], refs[i].tokens) {
			return 0, 0, fmt.Errorf("engine: batch answer %d differs from the reference", i)
		}
		tokens += len(out[i])
	}
	return tokens, elapsed, nil
}

// pathCPU is the CPU time of each of a target's processes, by name.
type pathCPU map[string]time.Duration

// cpu reads the CPU time of bench ("client") and of t's processes.
func (t *pathTarget) cpu() pathCPU {
	c := pathCPU{"client": processCPU(os.Getpid())}
	for _, ch := range t.procs {
		c[ch.name] = processCPU(ch.cmd.Process.Pid)
	}
	return c
}

// since is the CPU each process spent from c to later, over tokens, in
// seconds a token.
func (c pathCPU) since(later pathCPU, tokens int) map[string]float64 {
	out := map[string]float64{}
	for name, d := range later {
		out[name] = (d - c[name]).Seconds() / float64(tokens)
	}
	return out
}

// processCPU is the CPU time pid's threads have run, summed from each
// thread's schedstat (nanoseconds, where /proc/PID/stat counts 10 ms
// ticks); zero where /proc cannot say.
func processCPU(pid int) time.Duration {
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum time.Duration
	for _, d := range dirs {
		data, err := os.ReadFile(d)
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(data)); len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}

// pathRatios are the ratios the serving path is judged by, round by round.
func pathRatios(rep *pathReport) []pathRatio {
	e, n, c := rep.Targets[pathEngine], rep.Targets[pathNode], rep.Targets[pathCluster]
	ratio := func(what string, of func(i int) float64) pathRatio {
		r := pathRatio{What: what}
		for i := range e {
			r.Rounds = append(r.Rounds, of(i))
		}
		v := slices.Sorted(slices.Values(r.Rounds))
		r.Min, r.Median, r.Max = v[0], bench.Percentile(v, 50), v[len(v)-1]
		return r
	}
	cpu := func(m map[string]float64) float64 {
		var s float64
		for _, v := range m {
			s += v
		}
		return s
	}
	return []pathRatio{
		ratio("one request, cluster ÷ engine (tokens/s)", func(i int) float64 { return c[i].SingleTokensPerS / e[i].SingleTokensPerS }),
		ratio("one request, node ÷ engine (tokens/s)", func(i int) float64 { return n[i].SingleTokensPerS / e[i].SingleTokensPerS }),
		ratio("CPU per token, one request, cluster ÷ engine", func(i int) float64 { return cpu(c[i].CPUPerToken) / cpu(e[i].CPUPerToken) }),
		ratio(fmt.Sprintf("CPU per token, %d at once, cluster ÷ engine", pathBatch), func(i int) float64 { return cpu(c[i].BatchCPUPerToken) / cpu(e[i].BatchCPUPerToken) }),
		ratio(fmt.Sprintf("%d at once, cluster ÷ engine's batched steps (tokens/s)", pathBatch), func(i int) float64 { return c[i].BatchTokensPerS / e[i].BatchTokensPerS }),
		ratio(fmt.Sprintf("%d at once, node ÷ engine's batched steps (tokens/s)", pathBatch), func(i int) float64 { return n[i].BatchTokensPerS / e[i].BatchTokensPerS }),
		ratio("first token, cluster ÷ node", func(i int) float64 { return c[i].TTFTS / n[i].TTFTS }),
		ratio("first token, node ÷ engine", func(i int) float64 { return n[i].TTFTS / e[i].TTFTS }),
		ratio("engine: prefill ÷ single-stream decode (tokens/s)", func(i int) float64 {
			return float64(rep.PromptTokens) / e[i].TTFTS / e[i].SingleTokensPerS
		}),
	}
}

// printPath writes each target's medians over the rounds, the CPU per
// token of each process, and the ratios.
func printPath(w io.Writer, rep *pathReport, targets []*pathTarget) {
	med := func(name string, of func(pathRound) float64) float64 {
		var v []float64
		for _, r := range rep.Targets[name] {
			v = append(v, of(r))
		}
		slices.Sort(v)
		return bench.Percentile(v, 50)
	}
	fmt.Fprintf(w, "medians of %d rounds; one request of %d tokens, %d at once of %d tokens, first token of a %d-token prompt\n",
		rep.Rounds, pathSingleTokens, pathBatch, pathBatchTokens, rep.PromptTokens)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "TARGET\tONE TOK/S\t%d AT ONCE TOK/S\tTTFT\tCPU/TOKEN ONE\tCPU/TOKEN %d\tBY PROCESS (ONE; %d)\t\n", pathBatch, pathBatch, pathBatch)
	for _, t := range targets {
		var by []string
		total, batchTotal := 0.0, 0.0
		for _, p := range slices.Sorted(maps.Keys(rep.Targets[t.name][0].CPUPerToken)) {
			one := med(t.name, func(r pathRound) float64 { return r.CPUPerToken[p] })
			b := med(t.name, func(r pathRound) float64 { return r.BatchCPUPerToken[p] })
			total, batchTotal = total+one, batchTotal+b
			by = append(by, fmt.Sprintf("%s %.0f; %.0f µs", p, one*1e6, b*1e6))
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%s\t%.0f µs\t%.0f µs\t%s\t\n", t.name,
			med(t.name, func(r pathRound) float64 { return r.SingleTokensPerS }),
			med(t.name, func(r pathRound) float64 { return r.BatchTokensPerS }),
			msText(med(t.name, func(r pathRound) float64 { return r.TTFTS })*1000), total*1e6, batchTotal*1e6, strings.Join(by, ", "))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nfirst token of a new %d-token prompt as the decoding process split it (outside: the hops to it and back); "+
		"each the median over the rounds of a round's mean\n", rep.PromptTokens)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "TARGET\t%s\t\n", strings.ToUpper(strings.Join(pathPhases, "\t")))
	for _, t := range targets[1:] {
		fmt.Fprintf(tw, "%s", t.name)
		for _, ph := range pathPhases {
			fmt.Fprintf(tw, "\t%s", msText(med(t.name, func(r pathRound) float64 { return r.FirstTokenS[ph] })*1000))
		}
		fmt.Fprintln(tw, "\t")
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RATIO\tMIN\tMEDIAN\tMAX")
	for _, r := range rep.Ratios {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\n", r.What, r.Min, r.Median, r.Max)
	}
	tw.Flush()
}
