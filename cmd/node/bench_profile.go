package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/bench"
)

// What --profile sends.
const (
	// profileShortBytes and profileLongBytesMax are the two prompt lengths
	// whose TTFTs give the prefill rate (the slope) and the overhead (what
	// is left at no prompt); the long one is at most half the context.
	profileShortBytes   = 16
	profileLongBytesMax = 1024
	// profilePrefillRounds is how many of each length are timed, one at a
	// time.
	profilePrefillRounds = 12
	// profileDecodeTokens is what each decode probe generates, and
	// profileDecodeLanes how many requests each of its lanes sends.
	profileDecodeTokens = 96
	profileDecodeLanes  = 4
	// profileTransferBytes is what the loopback transfer probe moves.
	profileTransferBytes = 64 << 20
)

// profileBatches are the batch sizes decode is measured at, up to the
// nodes' batch limit.
var profileBatches = []int{1, 2, 4, 8, 16, 32}

// runProfile measures the per-node figures of the cluster at --endpoint
// and writes them to --profile.
func runProfile(ctx context.Context, stdout, stderr io.Writer, log *slog.Logger, o benchOptions, w *workload) error {
	s, err := o.dial(ctx, log, w, strings.Split(o.Endpoint, ","), o.creds)
	if err != nil {
		return err
	}
	defer s.close()
	p, err := measureProfile(ctx, stderr, s, w)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.Profile, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: --profile: %w", err)
	}
	printProfile(stdout, p)
	fmt.Fprintf(stdout, "profile written to %s\n", o.Profile)
	return nil
}

func printProfile(w io.Writer, p bench.Profile) {
	fmt.Fprintf(w, "prefill %.0f tokens/s, overhead %.2f ms a request, KV %.0f bytes/token, transfer %.2f GB/s, batch max %d\n",
		p.PrefillTokensPerS, p.OverheadS*1000, p.KVBytesPerToken, p.TransferBytesPerS/1e9, p.BatchMax)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "BATCH\tDECODE TOK/S\tSTEP\t")
	for _, d := range p.Decode {
		fmt.Fprintf(tw, "%d\t%.0f\t%s\t\n", d.Batch, d.TokensPerS, msText(float64(d.Batch)/d.TokensPerS*1000))
	}
	tw.Flush()
}

// measureProfile times a loopback transfer, one-token answers to short
// and long prompts one at a time (prefill rate and overhead), then long
// answers at each batch size, that many at a time (decode rate).
func measureProfile(ctx context.Context, stderr io.Writer, s sender, w *workload) (bench.Profile, error) {
	p := bench.Profile{BatchMax: actors.DefaultConfig().BatchMax}
	p.KVBytesPerToken = float64(w.model.Config().Geometry(actors.DefaultConfig().PageTokens).BytesPerToken())
	var err error
	if p.TransferBytesPerS, err = loopbackBytesPerS(); err != nil {
		return p, err
	}
	long := min(profileLongBytesMax, w.model.Config().ContextTokens/2)
	var ttft [2]float64
	var tokens [2]int
	for i, n := range []int{profileShortBytes, long} {
		shape := bench.Shape{Prompt: bench.Text(rand.New(rand.NewPCG(uint64(n), 0)), n), MaxTokens: 1}
		samples, refs, err := probe(ctx, stderr, s, w, fmt.Sprintf("prefill, %d-byte prompts", n), []bench.Shape{shape}, 1, profilePrefillRounds)
		if err != nil {
			return p, err
		}
		ttft[i], tokens[i] = median(samples, func(x bench.Sample) time.Duration { return x.TTFT }), refs[0].promptTokens
	}
	slope := (ttft[1] - ttft[0]) / float64(tokens[1]-tokens[0])
	// The slope holds the transfer of each token's KV too.
	prefill := slope - p.KVBytesPerToken/p.TransferBytesPerS
	if prefill <= 0 {
		return p, fmt.Errorf("bench: the TTFT of %d-token prompts (%.2f ms) is not above that of %d-token ones (%.2f ms): no prefill rate to measure",
			tokens[1], ttft[1]*1000, tokens[0], ttft[0]*1000)
	}
	p.PrefillTokensPerS, p.OverheadS = 1/prefill, max(ttft[0]-float64(tokens[0])*slope, 0)
	shapes, err := fullLength(w, profileDecodeTokens, profileBatches[len(profileBatches)-1], 1)
	if err != nil {
		return p, err
	}
	for _, b := range profileBatches {
		if b > p.BatchMax {
			break
		}
		samples, refs, err := probe(ctx, stderr, s, w, fmt.Sprintf("decode, batch %d", b), shapes, b, b*profileDecodeLanes)
		if err != nil {
			return p, err
		}
		// Tokens reach the client in bursts when a hop queues them, so the
		// gaps between them say little; a lane's mean time per request does
		// not lie. What of it is not the first token's (overhead, prefill
		// and transfer, as measured alone) is the decode steps'.
		var e2e float64
		for _, x := range samples {
			e2e += x.E2E.Seconds() / float64(len(samples))
		}
		prompt := float64(refs[0].promptTokens)
		first := p.OverheadS + prompt/p.PrefillTokensPerS + prompt*p.KVBytesPerToken/p.TransferBytesPerS
		step := (e2e - first) / float64(profileDecodeTokens-1)
		if step <= 0 {
			return p, fmt.Errorf("bench: profile, decode at batch %d: requests took %.2f ms, no more than their first token's %.2f ms",
				b, e2e*1000, first*1000)
		}
		p.Decode = append(p.Decode, bench.DecodeRate{Batch: b, TokensPerS: float64(b) / step})
	}
	return p, p.Validate()
}

// fullLength are n short prompts, drawn from seeds from on, whose
// reference answers run to all tokens tokens (none stops early), so that
// a decode probe keeps its batch full.
func fullLength(w *workload, tokens, n int, from uint64) ([]bench.Shape, error) {
	var out []bench.Shape
	for seed := from; len(out) < n && seed < from+uint64(64*n); seed++ {
		cand := bench.Shape{Prompt: fmt.Sprintf("%d %s", seed, bench.Text(rand.New(rand.NewPCG(seed, 0)), profileShortBytes)), MaxTokens: tokens}
		refs, err := references(w.model, []bench.Shape{cand})
		if err != nil {
			return nil, err
		}
		if len(refs[0].tokens) == tokens {
			out = append(out, cand)
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("bench: found %d of %d prompts whose answers run to %d tokens", len(out), n, tokens)
	}
	return out, nil
}

// probe sends n requests of shapes in turn, concurrency at a time, and
// returns their samples; any error or wrong answer fails it.
func probe(ctx context.Context, stderr io.Writer, s sender, w *workload, what string, shapes []bench.Shape, concurrency, n int) ([]bench.Sample, []reference, error) {
	refs, err := references(w.model, shapes)
	if err != nil {
		return nil, nil, err
	}
	samples, err := probeRefs(ctx, stderr, s, what, shapes, refs, concurrency, n)
	return samples, refs, err
}

// probeRefs is probe with the shapes' reference answers given.
func probeRefs(ctx context.Context, stderr io.Writer, s sender, what string, shapes []bench.Shape, refs []reference, concurrency, n int) ([]bench.Sample, error) {
	order := make([]bench.Request, len(shapes))
	for i := range order {
		order[i] = bench.Request{Shape: i}
	}
	l := &benchLoad{send: s, shapes: shapes, refs: refs, order: order, progress: &progress{label: "profile: " + what, total: n}}
	done := l.progress.show(stderr)
	samples := l.closed(ctx, concurrency, 0, bench.Bound{Requests: n})
	done()
	for _, x := range samples {
		if !x.OK() {
			return nil, fmt.Errorf("bench: profile, %s: a request failed (%s) or answered wrong (%t)", what, x.Code, x.Wrong)
		}
	}
	if len(samples) < n {
		return nil, ctx.Err()
	}
	return samples, nil
}

// median is the median of what of picks from samples, in seconds.
func median(samples []bench.Sample, of func(bench.Sample) time.Duration) float64 {
	v := make([]float64, len(samples))
	for i, x := range samples {
		v[i] = of(x).Seconds()
	}
	slices.Sort(v)
	return bench.Percentile(v, 50)
}

// loopbackBytesPerS times profileTransferBytes through one TCP connection
// on loopback, in 1 MiB writes: the path the data plane moves KV on
// between nodes of one machine.
func loopbackBytesPerS() (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("bench: the transfer probe: %w", err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err == nil {
			_, err = io.Copy(io.Discard, conn)
			conn.Close()
		}
		got <- err
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("bench: the transfer probe: %w", err)
	}
	buf := make([]byte, 1<<20)
	start := time.Now()
	for sent := 0; sent < profileTransferBytes && err == nil; sent += len(buf) {
		_, err = conn.Write(buf)
	}
	conn.Close()
	if rerr := <-got; err == nil {
		err = rerr
	}
	if err != nil {
		return 0, fmt.Errorf("bench: the transfer probe: %w", err)
	}
	return profileTransferBytes / time.Since(start).Seconds(), nil
}
