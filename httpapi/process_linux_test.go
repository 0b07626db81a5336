package httpapi

import (
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestProcessSeriesAsClientGolang: the process's series are those
// client_golang's process collector exports, but for the network
// namespace's two, with its types and help, and the same values where they
// cannot move between two reads: the limits and the start time. The CPU
// time read first is at most the one read after it.
func TestProcessSeriesAsClientGolang(t *testing.T) {
	var h metricsHandler
	if err := h.addProcess(nil); err != nil {
		t.Fatal(err)
	}
	var e exposition
	h.process(&e)
	p := expfmt.NewTextParser(model.UTF8Validation)
	ours, err := p.TextToMetricFamilies(strings.NewReader(string(e.b)))
	if err != nil {
		t.Fatalf("%v in:\n%s", err, e.b)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{ReportErrors: true}))
	theirs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range theirs {
		name := f.GetName()
		o := ours[name]
		if strings.HasPrefix(name, "process_network_") {
			if o != nil {
				t.Errorf("%s is written: the network namespace's, not the process's", name)
			}
			continue
		}
		if o == nil || o.GetType() != f.GetType() || o.GetHelp() != f.GetHelp() {
			t.Errorf("client_golang's %s (%s, %q) is written as %v", name, f.GetType(), f.GetHelp(), o)
			continue
		}
		delete(ours, name)
		v, w := value(o), value(f)
		switch name {
		case "process_max_fds", "process_virtual_memory_max_bytes", "process_start_time_seconds":
			if v != w {
				t.Errorf("%s is %g, client_golang says %g", name, v, w)
			}
		case "process_cpu_seconds_total":
			if v <= 0 || v > w {
				t.Errorf("%s is %g, client_golang says %g after it", name, v, w)
			}
		default:
			if v <= 0 {
				t.Errorf("%s is %g", name, v)
			}
		}
	}
	for name := range ours {
		t.Errorf("%s is written; client_golang has no such series", name)
	}
}

// value is a family's only sample, a gauge or a counter.
func value(f *dto.MetricFamily) float64 {
	m := f.GetMetric()[0]
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

// BenchmarkProcessSeries is what writing the process's series costs a
// scrape, beside client_golang's collector gathered and written. Run with:
//
//	go test ./httpapi -run '^$' -bench ProcessSeries
func BenchmarkProcessSeries(b *testing.B) {
	b.Run("written", func(b *testing.B) {
		var h metricsHandler
		if err := h.addProcess(nil); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		var e exposition
		for b.Loop() {
			e.b = e.b[:0]
			h.process(&e)
		}
	})
	b.Run("client_golang", func(b *testing.B) {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		b.ReportAllocs()
		for b.Loop() {
			mfs, err := reg.Gather()
			if err != nil {
				b.Fatal(err)
			}
			for _, mf := range mfs {
				expfmt.MetricFamilyToText(io.Discard, mf)
			}
		}
	})
}
