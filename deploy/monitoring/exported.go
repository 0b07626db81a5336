package monitoring

import (
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Exported is what nodes export, by the name of a series as a query
// selects it (a histogram's name_bucket, name_sum and name_count).
type Exported map[string]*Series

// Series is one name's series: whether they count (a counter, or a
// histogram's or summary's parts but its quantiles), and the values each
// label took in them.
type Series struct {
	Counter bool
	Labels  map[string]map[string]bool
}

// targetLabels are the labels Prometheus gives every series it scrapes:
// their values are the scrape configuration's, not the nodes'.
var targetLabels = map[string]bool{"job": true, "instance": true}

// prometheusSeries are the series Prometheus makes itself for every target,
// with the target's labels only.
var prometheusSeries = []string{"up"}

// Add adds one scrape, in Prometheus' text format, read by Prometheus' own
// parser.
func (e Exported) Add(scrape io.Reader) error {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(scrape)
	if err != nil {
		return err
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				e.add(name, true, m)
			case dto.MetricType_GAUGE, dto.MetricType_UNTYPED:
				e.add(name, false, m)
			case dto.MetricType_HISTOGRAM:
				e.add(name+"_sum", true, m)
				e.add(name+"_count", true, m)
				for _, b := range m.GetHistogram().GetBucket() {
					e.add(name+"_bucket", true, m, "le", model.FloatString(b.GetUpperBound()).String())
				}
			case dto.MetricType_SUMMARY:
				e.add(name+"_sum", true, m)
				e.add(name+"_count", true, m)
				for _, q := range m.GetSummary().GetQuantile() {
					e.add(name, false, m, "quantile", model.FloatString(q.GetQuantile()).String())
				}
			default:
				return fmt.Errorf("family %s: type %s, which Prometheus reads as no series a query selects", name, f.GetType())
			}
		}
	}
	return nil
}

// add records one sample of series name and its labels, with one more
// label and its value if extra has them (a bucket's le, a quantile).
func (e Exported) add(name string, counter bool, m *dto.Metric, extra ...string) {
	s := e[name]
	if s == nil {
		s = &Series{Counter: counter, Labels: map[string]map[string]bool{}}
		e[name] = s
	}
	set := func(l, v string) {
		if s.Labels[l] == nil {
			s.Labels[l] = map[string]bool{}
		}
		s.Labels[l][v] = true
	}
	for _, l := range m.GetLabel() {
		set(l.GetName(), l.GetValue())
	}
	if len(extra) == 2 {
		set(extra[0], extra[1])
	}
}

// series is name's series as a query sees them: exported by a node, or
// made by Prometheus.
func (e Exported) series(name string) (*Series, bool) {
	if s, ok := e[name]; ok {
		return s, true
	}
	for _, p := range prometheusSeries {
		if name == p {
			return &Series{Labels: map[string]map[string]bool{}}, true
		}
	}
	return nil, false
}
