package main

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/gpu"
)

func newPreflightCmd() *cobra.Command {
	cfg := defaultNodeConfig()
	var configPath *string
	cmd := &cobra.Command{
		Use:   "preflight",
		Short: "Check that every device's KV pool holds the advertised context window",
		Long: `preflight finds the node's devices, sizes each device's KV pool (from memory, or
from --kv-pool-tokens) and refuses the node when any pool is smaller than the
context window it would advertise. It prints one row per device and exits 0
when every device passes, 1 when any fails and 2 on a usage error.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.load(cmd.Flags(), *configPath); err != nil {
				return usageError{err}
			}
			var model *engine.Model
			if cfg.Model != "" || cfg.Tokenizer != "" {
				for _, f := range []string{"layers", "kv-heads", "head-dim", "weight-bytes"} {
					if cmd.Flags().Changed(f) {
						return usageError{fmt.Errorf("--%s: the geometry and weights are --model's; give one or the other", f)}
					}
				}
				// What "node run --model" would serve: its KV type unless
				// told, and the model's context window unless told.
				if !cmd.Flags().Changed("dtype") {
					cfg.DType = actors.DefaultConfig().Model.KVDType.String()
				}
				var err error
				if model, err = cfg.model(); err != nil {
					return err
				}
				if err := fitContext(cmd.Flags(), &cfg, model); err != nil {
					return usageError{err}
				}
			}
			discovery, preflight, err := cfg.build(model)
			if err != nil {
				return usageError{err}
			}
			return runPreflight(cmd.OutOrStdout(), discovery, preflight)
		},
	}
	configPath = configFlag(cmd)
	cfg.bindFlags(cmd.Flags())
	return cmd
}

// runPreflight discovers the devices, checks each and prints the table. It
// returns an error when discovery fails or any device fails.
func runPreflight(w io.Writer, dc gpu.DiscoveryConfig, pc gpu.PreflightConfig) error {
	found, err := gpu.Discover(dc)
	if err != nil {
		return fmt.Errorf("preflight: device discovery (%s): %w", dc.Source, err)
	}
	reports, err := gpu.PreflightAll(found.Devices, pc)
	if reports == nil {
		return usageError{err}
	}
	printPreflight(w, found, pc, reports)
	failed := 0
	for _, r := range reports {
		if !r.OK() {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("preflight failed on %d of %d devices (see the FAIL lines above); the node must not start",
			failed, len(reports))
	}
	fmt.Fprintf(w, "preflight ok: %d of %d devices hold the %d-token context window\n",
		len(reports), len(reports), pc.ContextTokens)
	return nil
}

func printPreflight(w io.Writer, found gpu.Discovery, pc gpu.PreflightConfig, reports []gpu.PreflightReport) {
	fmt.Fprintf(w, "devices: %s", found.Source)
	if found.DriverVersion != "" {
		fmt.Fprintf(w, " (driver %s)", found.DriverVersion)
	}
	if found.Fallback != nil {
		fmt.Fprintf(w, " → cpu, because %v", found.Fallback)
	}
	fmt.Fprintf(w, "\nkv geometry: %s\n", pc.Sizing.Geometry)
	if pc.Sizing.KVPoolTokens > 0 {
		fmt.Fprintf(w, "pool: configured, %d tokens per device\n", pc.Sizing.KVPoolTokens)
	} else {
		fmt.Fprintf(w, "pool: from memory × %g − %d weight bytes − %d reserve bytes\n",
			pc.Sizing.MemoryFraction, pc.Sizing.WeightBytes, pc.Sizing.ReserveBytes)
	}
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "DEVICE\tNAME\tMEMORY\tPOOL PAGES\tPOOL TOKENS\tPOOL BYTES\tCONTEXT TOKENS\tFULL-CONTEXT REQUESTS\tVERDICT\t")
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%d\t%d\t%s\t\n", r.Device, r.Device.Name,
			gibibytes(r.Device.MemoryTotalBytes), r.Pool.Pages, r.Pool.Tokens, gibibytes(r.Pool.Bytes),
			r.ContextTokens, r.FullContextRequests, verdict(r))
	}
	tw.Flush()

	for _, r := range reports {
		if r.Err != nil {
			fmt.Fprintf(w, "\nFAIL %s: %v\n", r.Device, r.Err)
			if hint := fixHint(r.Err); hint != "" {
				fmt.Fprintf(w, "  fix with flags: %s\n", hint)
			}
		}
		if r.Warning != nil {
			fmt.Fprintf(w, "\nwarning %s: %v\n", r.Device, r.Warning)
		}
	}
	fmt.Fprintln(w)
}

// verdict is the table's one-word summary; the full error follows the
// table.
func verdict(r gpu.PreflightReport) string {
	switch {
	case r.Err == nil && r.Warning != nil:
		return "ok (warning)"
	case r.Err == nil:
		return "ok"
	case errors.As(r.Err, new(*gpu.PoolTooSmallError)):
		return "FAIL: pool < context"
	case errors.As(r.Err, new(*gpu.EmptyPoolError)):
		return "FAIL: empty pool"
	case errors.As(r.Err, new(*gpu.UnknownMemoryError)):
		return "FAIL: memory unknown"
	case errors.As(r.Err, new(*gpu.MemoryBudgetError)):
		return "FAIL: over budget"
	}
	return "FAIL"
}

// fixHint restates a failure's fixes as the flags that apply them; the gpu
// package's errors name configuration fields, not flags.
func fixHint(err error) string {
	var small *gpu.PoolTooSmallError
	var unknown *gpu.UnknownMemoryError
	var budget *gpu.MemoryBudgetError
	var empty *gpu.EmptyPoolError
	switch {
	case errors.As(err, &small) && small.Source == gpu.PoolConfigured:
		return fmt.Sprintf("--context-tokens %d, or --kv-pool-tokens %d on a device with at least %d bytes "+
			"(--memory-fraction %g, --weight-bytes %d, --reserve-bytes %d)", small.PoolTokens, small.NeedTokens,
			small.NeedMemoryBytes, small.MemoryFraction, small.WeightBytes, small.ReserveBytes)
	case errors.As(err, &small):
		return fmt.Sprintf("--context-tokens %d, or a device with at least %d bytes at --memory-fraction %g "+
			"--weight-bytes %d --reserve-bytes %d", small.PoolTokens, small.NeedMemoryBytes, small.MemoryFraction,
			small.WeightBytes, small.ReserveBytes)
	case errors.As(err, &unknown):
		return "--cpu-memory-bytes (the CPU device's budget) or --kv-pool-tokens (an explicit pool)"
	case errors.As(err, &budget):
		return "lower --weight-bytes or --reserve-bytes, or raise --memory-fraction"
	case errors.As(err, &empty) && empty.KVPoolTokens > 0:
		return fmt.Sprintf("--kv-pool-tokens of at least --page-tokens (%d)", empty.Pool.PageTokens)
	case errors.As(err, &empty):
		return "lower --weight-bytes or --reserve-bytes, raise --memory-fraction, or use a larger device"
	}
	return ""
}

func gibibytes(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
}
