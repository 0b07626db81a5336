package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/bench"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/trust"
)

// benchRatesMax bounds a --rates sweep.
const benchRatesMax = 64

// benchOptions are the flags of "node bench".
type benchOptions struct {
	workloadFlags
	Endpoint string
	// HTTP is the base URL of the OpenAI-compatible API; with it the
	// requests go over HTTP with APIKeys (comma-separated, one a tenant).
	HTTP, APIKeys string
	Rates         string
	Concurrency   int
	JSON, Plot    string
	// Compare is the nodes of each layout --compare brings up; zero
	// benchmarks Endpoint instead.
	Compare   int
	NodeProcs int
	// Profile is where --profile writes the measured per-node figures.
	Profile string
	// Path is the rounds of the serving path's comparison.
	Path int
	// SideChannel is the trials of the side-channel harness.
	SideChannel int
	// Stub benchmarks an in-process stub that answers at once.
	Stub          bool
	NoAnswerAfter time.Duration
	NodeArgs      []string
	creds         credFlags
}

func newBenchCmd() *cobra.Command {
	o := benchOptions{workloadFlags: defaultWorkloadFlags(), Endpoint: defaultEndpoint, NodeProcs: 1,
		NoAnswerAfter: client.DefaultNoAnswerAfter}
	cmd := &cobra.Command{
		Use:   "bench [flags] [-- node run flags]",
		Short: "Measure a cluster: TTFT, inter-token latency, throughput and goodput under SLOs",
		Long: `bench sends a workload to --endpoint (routers, comma-separated, through the Go
client; or, with --http URL and --api-key, through the OpenAI-compatible API)
and measures each request: time to first token (TTFT), mean inter-token
latency (ITL), end-to-end latency (E2E), each at p50/p90/p99, output tokens/s,
requests/s, errors by code, and goodput: the requests a second that were
answered within --slo-ttft and --slo-itl. Every answer is compared with the
reference engine's (the model --model names, or the built-in one): a wrong
answer is counted and makes bench exit 1, so that no speed is reported for
wrong output.

The workload: --distinct requests drawn from --seed, prompts of --prompt-len
bytes (or from --prompts, a JSONL file), each asking for --output-len tokens,
spread over --tenants tenants; sent at --rate a second (Poisson arrivals), at
each rate of --rates in turn, or --concurrency at a time; for --duration or
--requests after a --warmup whose requests are not counted.

The traffic a prefix cache serves: --shared-prefix-len BYTES starts every
prompt with one of --shared-prefixes common prefixes, each tenant its own
(every tenant the same with --prefix-across-tenants); --turns T makes each
request a chat of T turns, each turn sent once the one before it is answered,
with the whole conversation so far and a new message. The table and the
report show the prompt tokens the cluster read from its cache (CACHED) and
their share of all prompt tokens (HIT). A progress line
goes to stderr, a table to stdout, the whole report to --json and PNG plots to
--plot (latency CDFs; goodput and p99 against the rate for a sweep).

--compare N brings up, one after the other on this machine, a router with N
nodes of role all and a router with P prefill and D decode nodes for every
P + D = N, each node limited to --node-procs processors (GOMAXPROCS), runs the
same workload against each and prints their goodput ratios. Arguments after
"--" go to every node run.

--side-channel N plays, for N trials, an attacker (tenant-1, or the second
--api-key) timing guesses of a victim's (tenant-0's) prompt prefixes: the
victim sends a secret prefix of --shared-prefix-len bytes; the attacker sends
the secret, and a random prefix of the same length, each followed by a suffix
of its own, and times each first token. It reports the ROC AUC of telling the
two apart by time (0.5: chance), its 95% interval and chance's, and how many
prompt tokens the attacker was told it read from the cache. Across scopes
both must show nothing; within a shared scope (a cache_scope group of the
cluster's --tenants file) they will, which shows the harness works.

--path N compares the serving path with the engine under it: it brings up
one node of role all and a router with one prefill and one decode node, and
for N rounds sends each of them, and the engine alone in bench's process,
three requests of 256 tokens one at a time (the median rate counts), 32 at
once of 64 tokens and five new prompts of 256 tokens for their first token,
one target after the other. It prints
tokens/s, TTFT and the CPU time each process spends a token, and the ratios
of the cluster and the node to the engine (--json: every round).

--profile FILE measures the per-node figures node plan needs (prefill
tokens/s, decode tokens/s by batch size, KV bytes per token, transfer
bandwidth, per-request overhead) against --endpoint, best a router with one
prefill and one decode node, and writes them as JSON. --stub benchmarks an
in-process stub that answers every request at once with its reference
answer, to show what the generator itself sustains.

Exit codes: 0 measured, 1 a wrong answer or a failure, 2 usage error, 130
interrupted.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.NodeArgs, err = nodeArgs(cmd, args); err != nil {
				return err
			}
			if err := o.check(cmd); err != nil {
				return usageError{err}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			return runBench(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	fs := cmd.Flags()
	o.workloadFlags.bind(fs)
	o.workloadFlags.bindCache(fs)
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "host:port of the routers (or a node of role all or decode), comma-separated")
	fs.StringVar(&o.HTTP, "http", o.HTTP, "base URL of the OpenAI-compatible API (http://host:port): send through it instead")
	fs.StringVar(&o.APIKeys, "api-key", o.APIKeys, "API keys for --http, comma-separated: tenant i uses the i-th (round)")
	fs.StringVar(&o.Rates, "rates", o.Rates, "a sweep: request rates a second, comma-separated, each run in turn")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "keep this many requests in flight instead of sending at --rate")
	fs.StringVar(&o.JSON, "json", o.JSON, "write the report as JSON to this file")
	fs.StringVar(&o.Plot, "plot", o.Plot, "write PNG plots into this directory")
	fs.IntVar(&o.Compare, "compare", o.Compare, "bring up N nodes of role all, then every P prefill + D decode with P + D = N, and compare")
	fs.IntVar(&o.NodeProcs, "node-procs", o.NodeProcs, "processors (GOMAXPROCS) of each node --compare starts")
	fs.StringVar(&o.Profile, "profile", o.Profile, "measure the per-node figures node plan needs and write them to this file")
	fs.IntVar(&o.Path, "path", o.Path, "compare the engine alone, one node of role all and a router with a prefill and a decode node, for this many rounds")
	fs.IntVar(&o.SideChannel, "side-channel", o.SideChannel, "play an attacker timing guesses of a victim's prompt prefixes for this many trials and report the ROC AUC")
	fs.BoolVar(&o.Stub, "stub", o.Stub, "benchmark an in-process stub that answers at once: the generator's own limit")
	fs.DurationVar(&o.NoAnswerAfter, "no-answer-after", o.NoAnswerAfter, "give a request up as lost after this long without a message")
	o.creds.bind(fs, "tenant-<i>")
	return cmd
}

// check validates the flags before anything is loaded or started.
func (o *benchOptions) check(cmd *cobra.Command) error {
	if _, err := o.workloadFlags.check(); err != nil {
		return err
	}
	modes := 0
	for _, on := range []bool{o.Compare > 0, o.Profile != "", o.Stub, o.SideChannel > 0, o.Path > 0} {
		if on {
			modes++
		}
	}
	switch {
	case modes > 1:
		return errors.New("--compare, --profile, --stub, --side-channel and --path are ways to run bench: give one")
	case o.Path < 0 || o.Path > pathRoundsMax:
		return fmt.Errorf("--path (%d) must be 1 to %d rounds", o.Path, pathRoundsMax)
	case o.Path > 0 && o.HTTP != "":
		return errors.New("--path brings up its own nodes and sends through the Go client: no --http")
	case o.Compare < 0 || o.Compare > upNodesMax:
		return fmt.Errorf("--compare (%d) must be 1 to %d nodes", o.Compare, upNodesMax)
	case o.NodeProcs < 1 || o.NodeProcs > 1024:
		return fmt.Errorf("--node-procs (%d) must be 1 to 1024", o.NodeProcs)
	case o.Concurrency < 0 || o.Concurrency > benchInflightMax:
		return fmt.Errorf("--concurrency (%d) must be 0 to %d", o.Concurrency, benchInflightMax)
	case o.Concurrency > 0 && (cmd.Flags().Changed("rate") || o.Rates != ""):
		return errors.New("--concurrency and --rate or --rates: give one")
	case o.SideChannel < 0 || o.SideChannel > sideChannelTrialsMax:
		return fmt.Errorf("--side-channel (%d) must be 0 to %d trials", o.SideChannel, sideChannelTrialsMax)
	case o.SideChannel > 0 && o.PrefixLen == 0:
		return errors.New("--side-channel needs --shared-prefix-len: the length of the victim's secret prefix")
	case o.SideChannel > 0 && o.Turns > 1:
		return errors.New("--side-channel sends single prompts: no --turns")
	case o.SideChannel > 0 && o.HTTP != "" && len(strings.Split(o.APIKeys, ",")) < 2:
		return errors.New("--side-channel over --http needs two --api-key, the victim's then the attacker's")
	case o.NoAnswerAfter <= 0:
		return fmt.Errorf("--no-answer-after (%s) must be positive", o.NoAnswerAfter)
	case o.HTTP != "" && (o.Compare > 0 || o.Stub):
		return errors.New("--http benchmarks an API that is running; --compare and --stub start their own")
	case o.HTTP != "" && o.APIKeys == "":
		return errors.New("--http needs --api-key")
	case len(o.NodeArgs) > 0 && o.Compare == 0 && o.Path == 0:
		return errors.New("arguments after -- are for the nodes --compare and --path start")
	}
	if _, err := o.rates(); err != nil {
		return err
	}
	if o.Compare == 0 && o.Path == 0 && !o.Stub && o.HTTP == "" {
		_, err := generateOptions{Endpoint: o.Endpoint}.endpoints()
		return err
	}
	return nil
}

// rates are the request rates of the runs; none with --concurrency.
func (o *benchOptions) rates() ([]float64, error) {
	if o.Concurrency > 0 {
		return nil, nil
	}
	if o.Rates == "" {
		return []float64{o.Rate}, bench.CheckSchedule(o.Rate, o.Warmup, o.bound())
	}
	parts := strings.Split(o.Rates, ",")
	if len(parts) > benchRatesMax {
		return nil, fmt.Errorf("--rates holds %d rates; at most %d", len(parts), benchRatesMax)
	}
	out := make([]float64, len(parts))
	for i, p := range parts {
		r, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil {
			return nil, fmt.Errorf("--rates: %q is not a number", p)
		}
		if err := bench.CheckSchedule(r, o.Warmup, o.bound()); err != nil {
			return nil, fmt.Errorf("--rates: %w", err)
		}
		out[i] = r
	}
	return out, nil
}

// benchRun is one run of a report: a layout (or the endpoint) at a rate
// or a concurrency.
type benchRun struct {
	Layout      string        `json:"layout,omitempty"`
	RatePerS    float64       `json:"rate_per_s,omitempty"`
	Concurrency int           `json:"concurrency,omitempty"`
	Summary     bench.Summary `json:"summary"`
	samples     []bench.Sample
}

// label names the run in the table and the plots.
func (r benchRun) label() string {
	what := fmt.Sprintf("%g/s", r.RatePerS)
	if r.Concurrency > 0 {
		what = fmt.Sprintf("concurrency %d", r.Concurrency)
	}
	if r.Layout != "" {
		return r.Layout + " " + what
	}
	return what
}

// benchReport is what --json writes.
type benchReport struct {
	Target   string     `json:"target"`
	Workload any        `json:"workload"`
	Runs     []benchRun `json:"runs"`
	// Ratios are, with --compare, each split's goodput over the
	// colocated layout's, by rate.
	Ratios []benchRatio `json:"ratios,omitempty"`
	// SideChannel is what --side-channel measured.
	SideChannel *sideChannelReport `json:"side_channel,omitempty"`
}

type benchRatio struct {
	Layout   string  `json:"layout"`
	Over     string  `json:"over"`
	RatePerS float64 `json:"rate_per_s,omitempty"`
	Goodput  float64 `json:"goodput_ratio"`
}

// runBench runs the mode the options ask for, prints the table and writes
// the report and plots.
func runBench(ctx context.Context, stdout, stderr io.Writer, o benchOptions) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rep := &benchReport{Target: o.target(), Workload: o.workloadFlags}
	if o.SideChannel > 0 {
		return finishBench(ctx, stdout, o, rep, sideChannel(ctx, stderr, log, o, rep))
	}
	w, err := o.build()
	if err != nil {
		return err
	}
	switch {
	case o.Profile != "":
		return runProfile(ctx, stdout, stderr, log, o, w)
	case o.Path > 0:
		return runPath(ctx, stdout, stderr, log, o, w)
	}
	switch {
	case o.Compare > 0:
		err = compareLayouts(ctx, stderr, o, w, rep)
	case o.Stub:
		err = benchStub(ctx, stderr, o, w, rep)
	default:
		var s sender
		if s, err = o.dial(ctx, log, w, strings.Split(o.Endpoint, ","), o.creds); err == nil {
			err = runAll(ctx, stderr, o, w, s, "", rep)
			s.close()
		}
	}
	return finishBench(ctx, stdout, o, rep, err)
}

// finishBench prints the table of what rep holds and writes the report
// and plots: the run's error, else the wrong answers it got.
func finishBench(ctx context.Context, stdout io.Writer, o benchOptions, rep *benchReport, err error) error {
	if ctx.Err() != nil {
		err = interruptedError{}
	}
	printRuns(stdout, rep)
	printSideChannel(stdout, rep.SideChannel)
	if werr := writeReport(o, rep); werr != nil {
		err = errors.Join(err, werr)
	}
	if err == nil {
		err = wrongAnswers(rep)
	}
	return err
}

// target says what the report measured.
func (o benchOptions) target() string {
	switch {
	case o.Compare > 0:
		return fmt.Sprintf("layouts of %d nodes on this machine", o.Compare)
	case o.Stub:
		return "an in-process stub that answers at once"
	case o.SideChannel > 0 && o.HTTP == "":
		return o.Endpoint + ": an attacker timing guesses of a victim's prefixes"
	case o.SideChannel > 0:
		return o.HTTP + ": an attacker timing guesses of a victim's prefixes"
	case o.HTTP != "":
		return o.HTTP
	}
	return o.Endpoint
}

// dial is the sender of the options: HTTP, or the Go client with one
// client (and credential) per tenant.
func (o benchOptions) dial(ctx context.Context, log *slog.Logger, w *workload, endpoints []string, creds credFlags) (sender, error) {
	if o.HTTP != "" {
		return newHTTPSender(o.HTTP, strings.Split(o.APIKeys, ","), w.model.Name(), max(o.Concurrency, 64), o.NoAnswerAfter), nil
	}
	if err := reachAny(endpoints); err != nil {
		return nil, err
	}
	creds.Endpoint = endpoints[0]
	s := &clientSender{}
	for i := range o.Tenants {
		id := trust.Identity{Role: trust.RoleTenant, Name: bench.TenantName(i)}
		auth, err := creds.authority(log, trust.RoleTenant, trust.FileName(id))
		if err != nil {
			s.close()
			return nil, err
		}
		c, err := client.DialEndpoints(ctx, endpoints, client.Options{NoAnswerAfter: o.NoAnswerAfter, Auth: auth})
		if err != nil {
			s.close()
			return nil, fmt.Errorf("bench: %w", err)
		}
		s.clients = append(s.clients, c)
	}
	return s, nil
}

// runAll runs the workload at every rate (or the concurrency) against s,
// adding each run to rep under layout.
func runAll(ctx context.Context, stderr io.Writer, o benchOptions, w *workload, s sender, layout string, rep *benchReport) error {
	rates, _ := o.rates() // checked with the options
	if o.Concurrency > 0 {
		rates = []float64{0}
	}
	for _, rate := range rates {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		run := benchRun{Layout: layout, RatePerS: rate, Concurrency: o.Concurrency}
		l := &benchLoad{send: s, shapes: w.shapes, refs: w.refs, order: w.order, progress: &progress{label: run.label()}}
		done := l.progress.show(stderr)
		if rate > 0 {
			at, warm := bench.Poisson(o.Seed, rate, o.Warmup, w.bound)
			l.progress.total = len(at) * max(o.Turns, 1)
			run.samples = l.open(ctx, at, warm)
		} else {
			run.samples = l.closed(ctx, o.Concurrency, o.Warmup, w.bound)
		}
		done()
		run.Summary = w.slo.Summarize(run.samples, o.Warmup)
		rep.Runs = append(rep.Runs, run)
	}
	return nil
}

// printRuns writes the table of the runs, their errors and, with
// --compare, the goodput ratios.
func printRuns(w io.Writer, rep *benchReport) {
	if len(rep.Runs) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "RUN\tREQS\tOK\tERR\tWRONG\tREQ/S\tTOK/S\tGOODPUT/S\tGOOD\tCACHED\tHIT\tTTFT p50\tp90\tp99\tITL p50\tp90\tp99\tE2E p50\tp90\tp99\t")
	for _, r := range rep.Runs {
		s := r.Summary
		errs := 0
		for _, n := range s.Errors {
			errs += n
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.2f\t%.1f\t%.2f\t%.0f%%\t%d\t%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.label(), s.Requests, s.OK,
			errs, s.Wrong, s.RequestsPerS, s.OutputTokensPerS, s.GoodputPerS, 100*s.GoodShare, s.CachedTokens, 100*s.HitRate,
			msText(s.TTFT.P50), msText(s.TTFT.P90), msText(s.TTFT.P99), msText(s.ITL.P50), msText(s.ITL.P90), msText(s.ITL.P99),
			msText(s.E2E.P50), msText(s.E2E.P90), msText(s.E2E.P99))
	}
	tw.Flush()
	for _, r := range rep.Runs {
		if len(r.Summary.Errors) > 0 {
			fmt.Fprintf(w, "errors of %s: %s\n", r.label(), codeList(r.Summary.Errors))
		}
	}
	for _, q := range rep.Ratios {
		at := ""
		if q.RatePerS > 0 {
			at = fmt.Sprintf(" at %g/s", q.RatePerS)
		}
		fmt.Fprintf(w, "goodput %s / %s%s: %.2f\n", q.Layout, q.Over, at, q.Goodput)
	}
}

// msText is a latency in milliseconds for the table.
func msText(ms float64) string {
	switch {
	case ms == 0:
		return "-"
	case ms < 1:
		return fmt.Sprintf("%.0fµs", ms*1000)
	case ms < 10:
		return fmt.Sprintf("%.2fms", ms)
	case ms < 10000:
		return fmt.Sprintf("%.0fms", ms)
	}
	return fmt.Sprintf("%.1fs", ms/1000)
}

// codeList is counts by code, as "busy 3, node_lost 1", by name.
func codeList(counts map[string]int) string {
	var parts []string
	for code, n := range counts {
		parts = append(parts, fmt.Sprintf("%s %d", code, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// writeReport writes --json and --plot.
func writeReport(o benchOptions, rep *benchReport) error {
	if o.JSON != "" {
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.JSON, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("bench: --json: %w", err)
		}
	}
	if o.Plot != "" && len(rep.Runs) > 0 {
		return writePlots(o.Plot, rep)
	}
	return nil
}

// wrongAnswersError is a run that got answers other than the reference
// engine's.
type wrongAnswersError struct{ Wrong, Requests int }

func (e *wrongAnswersError) Error() string {
	return fmt.Sprintf("bench: %d of %d answers differed from the reference engine's; no speed is worth wrong output", e.Wrong, e.Requests)
}

func wrongAnswers(rep *benchReport) error {
	e := &wrongAnswersError{}
	for _, r := range rep.Runs {
		for _, s := range r.samples {
			e.Requests++
			if s.Wrong {
				e.Wrong++
			}
		}
	}
	if e.Wrong > 0 {
		return e
	}
	return nil
}
