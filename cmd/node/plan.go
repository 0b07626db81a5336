package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/bench"
	"github.com/kvwarden/kvwarden/internal/boundedread"
)

// profileFileBytesMax bounds the profile read: a few dozen numbers.
const profileFileBytesMax = 1 << 20

// planOptions are the flags of "node plan".
type planOptions struct {
	workloadFlags
	Profile string
	Nodes   int
	JSON    string
}

func newPlanCmd() *cobra.Command {
	o := planOptions{workloadFlags: defaultWorkloadFlags(), Nodes: 2}
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Predict goodput for each prefill:decode split of N nodes and recommend one",
		Long: `plan predicts, from a profile of one node (prefill tokens/s, decode tokens/s by
batch size, KV bytes per token, transfer bandwidth, per-request overhead: the
JSON file node bench --profile writes, or one written by hand), how a target
workload would fare on --nodes nodes: all of role all, and every split into P
prefill and D decode nodes with P + D = --nodes, each behind a router. The
workload flags are node bench's: the same flags and --seed give the same
requests at the same times, so that a prediction can be checked against node
bench --compare. The model is a discrete-event simulation (package bench):
prompts prefilled one at a time on the prefill node with the shortest queue,
their KV moved to the decode node with the fewest sequences, decoded there in
batches of at most the profile's batch_max at the measured step times; a node
of role all shares its processor between its prefill and its decode. The
reference engine gives each request's prompt tokens and answer length.

It prints each layout's predicted goodput (requests/s within --slo-ttft and
--slo-itl), share within the SLO and latency percentiles, best first, and
recommends the best; --json writes them.

Exit codes: 0 planned, 1 failure, 2 usage error.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := o.workloadFlags.check(); err != nil {
				return usageError{err}
			}
			if err := bench.CheckSchedule(o.Rate, o.Warmup, o.bound()); err != nil {
				return usageError{err}
			}
			if o.Profile == "" {
				return usageError{fmt.Errorf("--profile is required: node bench --profile FILE writes one")}
			}
			return plan(cmd.OutOrStdout(), o)
		},
	}
	fs := cmd.Flags()
	o.workloadFlags.bind(fs)
	fs.StringVar(&o.Profile, "profile", o.Profile, "the node's profile: JSON as node bench --profile writes it (required)")
	fs.IntVar(&o.Nodes, "nodes", o.Nodes, "nodes to plan for")
	fs.StringVar(&o.JSON, "json", o.JSON, "write the predictions as JSON to this file")
	return cmd
}

// readProfile reads and validates a profile file.
func readProfile(path string) (bench.Profile, error) {
	var p bench.Profile
	data, err := boundedread.File(path, profileFileBytesMax)
	if err != nil {
		return p, usageError{fmt.Errorf("--profile: %w", err)}
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return p, usageError{fmt.Errorf("--profile %s: %w", path, err)}
	}
	if err := p.Validate(); err != nil {
		return p, usageError{fmt.Errorf("--profile %s: %w", path, err)}
	}
	return p, nil
}

// planRun is the open-loop run the workload flags describe, each request's
// tokens those of its reference answer.
func planRun(o workloadFlags, w *workload) bench.Run {
	at, warm := bench.Poisson(o.Seed, o.Rate, o.Warmup, w.bound)
	loads := make([]bench.Load, len(at))
	for i := range loads {
		ref := w.refs[w.order[i%len(w.order)].Shape]
		loads[i] = bench.Load{PromptTokens: ref.promptTokens, OutputTokens: len(ref.tokens)}
	}
	return bench.Run{At: at, Loads: loads, Warm: warm, Warmup: o.Warmup}
}

func plan(stdout io.Writer, o planOptions) error {
	p, err := readProfile(o.Profile)
	if err != nil {
		return err
	}
	w, err := o.build()
	if err != nil {
		return err
	}
	preds, err := bench.Plan(p, o.Nodes, planRun(o.workloadFlags, w), w.slo)
	if err != nil {
		return usageError{err}
	}
	printPlan(stdout, o, preds)
	if o.JSON == "" {
		return nil
	}
	data, err := json.MarshalIndent(preds, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.JSON, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("plan: --json: %w", err)
	}
	return nil
}

func printPlan(w io.Writer, o planOptions, preds []bench.Prediction) {
	fmt.Fprintf(w, "predicted for %d nodes at %g requests/s (prompts %s bytes, outputs %s tokens):\n", o.Nodes, o.Rate,
		nameOr(o.PromptLen, "from "+o.Prompts), o.OutputLen)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "LAYOUT\tGOODPUT/S\tGOOD\tREQ/S\tTOK/S\tTTFT p50\tp99\tITL p50\tp99\t")
	var colocated float64
	for _, pr := range preds {
		s := pr.Summary
		if pr.Layout.All > 0 {
			colocated = s.GoodputPerS
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.0f%%\t%.2f\t%.1f\t%s\t%s\t%s\t%s\t\n", pr.Layout, s.GoodputPerS, 100*s.GoodShare, s.RequestsPerS,
			s.OutputTokensPerS, msText(s.TTFT.P50), msText(s.TTFT.P99), msText(s.ITL.P50), msText(s.ITL.P99))
	}
	tw.Flush()
	best := preds[0]
	ratio := ""
	if colocated > 0 && best.Layout.All == 0 {
		ratio = fmt.Sprintf(", %.2f× the colocated layout's", best.Summary.GoodputPerS/colocated)
	}
	fmt.Fprintf(w, "recommended: %s (goodput %.2f requests/s%s)\n", best.Layout, best.Summary.GoodputPerS, ratio)
}
