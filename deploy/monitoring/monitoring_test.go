package monitoring

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/deploy/internal/mistake"
)

// TestFilesRead: the dashboard and the rules load as Grafana and
// Prometheus read them, every alert with a severity, a for, a summary and a
// description; and between them they watch what an operator needs watched.
// Whether the series they name exist is checked against real nodes
// (deploy/kubernetes, TestManifestsServe).
func TestFilesRead(t *testing.T) {
	f, err := ReadFiles(".")
	if err != nil {
		t.Fatal(err)
	}
	exprs, problems := Read(f)
	if len(problems) > 0 {
		t.Fatalf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
	}
	watched := func(file, name string) bool {
		return slices.ContainsFunc(exprs, func(e Expression) bool {
			return strings.HasPrefix(e.Where, file) && strings.Contains(e.Query, name)
		})
	}
	for _, name := range []string{"kvwarden_requests_finished_total", "kvwarden_prompt_tokens_total",
		"kvwarden_generation_tokens_total", "histogram_quantile(0.99, sum by (le, role) (rate(kvwarden_time_to_first_token_seconds_bucket",
		"histogram_quantile(0.99, sum by (le, role) (rate(kvwarden_inter_token_latency_seconds_bucket", "kvwarden_kv_usage_ratio",
		"sum by (queue) (kvwarden_requests_waiting", "kvwarden_integrity_refusals_total", "max by (role, state) (kvwarden_members",
		"kvwarden_requests_failed_total", "kvwarden_kv_transfer_duration_seconds_bucket", "kvwarden_kv_transfer_failures_total"} {
		if !watched(DashboardFile, name) {
			t.Errorf("no panel of %s reads %s", DashboardFile, name)
		}
	}
	for _, name := range []string{"kvwarden_integrity_refusals_total", "kvwarden_requests_failed_total", "kvwarden_kv_usage_ratio",
		`kvwarden_members{role=~"decode|all"`, `kvwarden_members{role=~"prefill|all"`, "kvwarden_requests_waiting", "up{"} {
		if !watched(AlertsFile, name) {
			t.Errorf("no alert of %s reads %s", AlertsFile, name)
		}
	}
}

// readMistakes are planted one at a time into the real files: Read must
// report each, in words containing want.
var readMistakes = []struct {
	name, file, old, new, want string
}{
	{"rule field misspelt", AlertsFile, "        for: 2m\n", "        fro: 2m\n", "field fro not found"},
	{"alert without a for", AlertsFile, "        for: 2m\n", "", "alert KvwardenNodeDown: no for"},
	{"alert without a severity", AlertsFile, "  for: 2m\n        labels:\n          severity: critical",
		"  for: 2m\n        labels:\n          urgency: critical", `alert KvwardenNodeDown: severity ""`},
	{"alert without a description", AlertsFile, "          description: >-\n            Prometheus has not read",
		"          details: >-\n            Prometheus has not read", "alert KvwardenNodeDown: wants a summary and a description"},
	{"annotation template that does not parse", AlertsFile, "node {{ $labels.instance }} does not answer",
		"node {{ $labels.instance } does not answer", "KvwardenNodeDown"},
	{"expression that does not parse", AlertsFile, "expr: up{job=\"kvwarden\"} == 0", "expr: up{job=\"kvwarden\"} == == 0", "parse error"},
	{"dashboard that does not decode", DashboardFile, `"schemaVersion": 39,`, `"schemaVersion": 39,,`, "invalid character"},
	{"variable the dashboard does not define", DashboardFile, `sum(up{job=~\"$job\"})`, `sum(up{job=~\"$cluster\"})`,
		`panel "Scrape targets up", query A: uses $cluster`},
	{"variable without a value to try", DashboardFile, `"allValue": ".+",`, "", "variable job: no allValue"},
	{"panel without a query", DashboardFile, `"expr": "sum(up{job=~\"$job\"})"`, `"expr": ""`,
		`panel "Scrape targets up", query A: no expression`},
}

func TestReadCatchesMistakes(t *testing.T) {
	files, err := ReadFiles(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range readMistakes {
		t.Run(m.name, func(t *testing.T) {
			_, problems := Read(files.With(m.file, mistake.Plant(t, files.Text(m.file), m.old, m.new)))
			mistake.Caught(t, m.new, m.want, problems)
		})
	}
}

// scrape is a node's exposition with a family of each type.
const scrape = `# TYPE t_total counter
t_total{kind="a"} 1
t_total{kind="b"} 0
# TYPE g gauge
g{queue="x"} 1
# TYPE h_seconds histogram
h_seconds_bucket{side="send",le="1"} 0
h_seconds_bucket{side="send",le="+Inf"} 0
h_seconds_sum{side="send"} 0
h_seconds_count{side="send"} 0
# TYPE s summary
s{quantile="0.5"} 0
s_sum 0
s_count 0
`

// TestCheck holds expressions to a scrape: each is accepted, or refused
// with a problem containing want.
func TestCheck(t *testing.T) {
	e := Exported{}
	if err := e.Add(strings.NewReader(scrape)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		query string
		uses  []string
		want  string // "" when accepted
	}{
		{`sum by (kind) (rate(t_total{job=~".+"}[5m]))`, []string{"kind"}, ""},
		{`histogram_quantile(0.9, sum by (le, side) (rate(h_seconds_bucket[5m])))`, []string{"side"}, ""},
		{`rate(h_seconds_count[5m]) / rate(h_seconds_sum[5m])`, []string{"side", "instance"}, ""},
		{`s{quantile="0.5"} + on () group_left rate(s_count[1m])`, []string{"quantile"}, ""},
		{`g{queue=~"x.*"} and on (job, instance) t_total{kind=~"a|b"}`, []string{"queue"}, ""},
		{`t_total * on (job, instance) group_left (queue) g`, []string{"kind", "queue"}, ""},
		{`count_values("v", g)`, []string{"v"}, ""},
		{`label_replace(g, "dst", "$1", "queue", "(.*)")`, []string{"dst", "queue"}, ""},
		{`absent(up{job="kvwarden"})`, []string{"job"}, ""},
		{`sum without (queue) (g)`, []string{"job"}, ""},
		{`deriv(g[5m]) > 0`, nil, ""},
		{`tt_total`, nil, "no node exports tt_total"},
		{`h_seconds`, nil, "no node exports h_seconds"},
		{`{kind="a"}`, nil, "selects by no metric name"},
		{`g{queu="x"}`, nil, "g has no label queu (it has queue)"},
		{`g{queue="y"}`, nil, `no node exports queue="y" (queue has x)`},
		{`g{queue!="y"}`, nil, `no node exports queue="y"`},
		{`t_total{kind=~"a|c"}`, nil, `no node exports kind="c"`},
		{`g{queue=~"z.*"}`, nil, `matches no value of queue`},
		{`rate(g[5m])`, nil, "rate of g, a gauge: rate reads a counter"},
		{`deriv(t_total[5m])`, nil, "deriv of t_total, a counter: deriv reads a gauge"},
		{`sum by (side) (t_total)`, nil, "sum by (side): t_total has no label side"},
		{`histogram_quantile(0.9, sum by (side) (rate(h_seconds_bucket[5m])))`, nil, "histogram_quantile: sum by (side)"},
		{`t_total * on (queue) g`, nil, "on (queue): t_total has no label queue"},
		{`t_total * on (job) group_left (side) g`, nil, "group_left (side): g has no label side"},
		{`sum(g)`, []string{"queue"}, "read by its legend or annotations: sum(g) has no label queue (it has none)"},
		{`sum without (queue) (g)`, []string{"queue"}, "has no label queue"},
		{`g and on (job) t_total`, []string{"kind"}, "has no label kind"},
		{`sum(rate(t_total[5m])`, nil, "parse error"},
	} {
		problems := Check([]Expression{{Where: "here", Query: tc.query, Uses: tc.uses}}, e)
		switch {
		case tc.want == "" && len(problems) > 0:
			t.Errorf("%s, reading %v: %s", tc.query, tc.uses, strings.Join(problems, "; "))
		case tc.want != "" && !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }):
			t.Errorf("%s, reading %v: %q, want a problem containing %q", tc.query, tc.uses, problems, tc.want)
		}
	}
}
