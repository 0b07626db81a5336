package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/kvwarden/kvwarden/bench"
)

// The plots' size: 800 × 500 pixels at 100 dpi, small enough to commit.
const (
	benchPlotWidth  = 8 * vg.Inch
	benchPlotHeight = 5 * vg.Inch
)

// writePlots writes into dir the latency CDFs of every run and, for a
// sweep, goodput and p99 latency against the rate, a line per layout.
func writePlots(dir string, rep *benchReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: --plot: %w", err)
	}
	for _, c := range []struct {
		file, what string
		of         func(bench.Sample) (time.Duration, bool)
	}{
		{"ttft_cdf.png", "time to first token", func(s bench.Sample) (time.Duration, bool) { return s.TTFT, true }},
		{"itl_cdf.png", "mean inter-token latency", func(s bench.Sample) (time.Duration, bool) { return s.ITL(), s.Tokens > 1 }},
		{"e2e_cdf.png", "end-to-end latency", func(s bench.Sample) (time.Duration, bool) { return s.E2E, true }},
	} {
		p, err := cdfPlot(rep, c.what, c.of)
		if err != nil {
			return err
		}
		if err := savePlot(p, dir, c.file); err != nil {
			return err
		}
	}
	layouts, sweep := sweepLines(rep)
	if !sweep {
		return nil
	}
	for _, c := range []struct {
		file, title, y string
		of             func(bench.Summary) float64
	}{
		{"goodput.png", "goodput against request rate", "goodput (requests/s within the SLO)", func(s bench.Summary) float64 { return s.GoodputPerS }},
		{"ttft_p99.png", "p99 time to first token against request rate", "TTFT p99 (ms)", func(s bench.Summary) float64 { return s.TTFT.P99 }},
		{"itl_p99.png", "p99 inter-token latency against request rate", "ITL p99 (ms)", func(s bench.Summary) float64 { return s.ITL.P99 }},
	} {
		p := plot.New()
		p.Title.Text, p.X.Label.Text, p.Y.Label.Text = c.title, "request rate (requests/s)", c.y
		var lines []any
		for _, l := range layouts {
			var xy plotter.XYs
			for _, r := range rep.Runs {
				if r.Layout == l {
					xy = append(xy, plotter.XY{X: r.RatePerS, Y: c.of(r.Summary)})
				}
			}
			lines = append(lines, nameOr(l, "endpoint"), xy)
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return err
		}
		p.Legend.Top, p.Legend.Left = true, true
		if err := savePlot(p, dir, c.file); err != nil {
			return err
		}
	}
	return nil
}

// sweepLines are the layouts of the report in order, and whether any ran
// at more than one rate.
func sweepLines(rep *benchReport) ([]string, bool) {
	var layouts []string
	counts := map[string]int{}
	sweep := false
	for _, r := range rep.Runs {
		if !slices.Contains(layouts, r.Layout) {
			layouts = append(layouts, r.Layout)
		}
		counts[r.Layout]++
		sweep = sweep || (r.RatePerS > 0 && counts[r.Layout] > 1)
	}
	return layouts, sweep
}

func nameOr(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// cdfPlot is the CDF of what of picks from each run's answered requests,
// one line per run, on a log time axis.
func cdfPlot(rep *benchReport, what string, of func(bench.Sample) (time.Duration, bool)) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "CDF of " + what
	p.X.Label.Text, p.Y.Label.Text = what+" (ms, log scale)", "share of answered requests"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	var lines []any
	for _, r := range rep.Runs {
		var ms []float64
		for _, s := range r.samples {
			if d, ok := of(s); ok && !s.Warmup && s.OK() {
				ms = append(ms, max(float64(d)/float64(time.Millisecond), 1e-3))
			}
		}
		if len(ms) == 0 {
			continue
		}
		slices.Sort(ms)
		xy := make(plotter.XYs, len(ms))
		for i, v := range ms {
			xy[i] = plotter.XY{X: v, Y: float64(i+1) / float64(len(ms))}
		}
		lines = append(lines, r.label(), xy)
	}
	p.Legend.Top, p.Legend.Left = true, true
	if err := plotutil.AddLines(p, lines...); err != nil {
		return nil, err
	}
	logRange(&p.X)
	return p, nil
}

// logRange gives a log axis whose data span no range (every value the
// same, as when every token of a run arrived in one read, or no value at
// all) the decades around it: gonum widens a point to ±1, which reaches
// below zero, where a log scale cannot draw.
func logRange(a *plot.Axis) {
	switch {
	case math.IsInf(a.Min, 0) || math.IsInf(a.Max, 0):
		a.Min, a.Max = 1e-3, 1
	case a.Min == a.Max:
		a.Min, a.Max = a.Min/10, a.Max*10
	}
}

func savePlot(p *plot.Plot, dir, file string) error {
	if err := p.Save(benchPlotWidth, benchPlotHeight, filepath.Join(dir, file)); err != nil {
		return fmt.Errorf("bench: --plot: %w", err)
	}
	return nil
}
