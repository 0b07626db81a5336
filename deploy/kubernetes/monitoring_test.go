package kubernetes

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/deploy/internal/mistake"
	"github.com/kvwarden/kvwarden/deploy/monitoring"
)

// monitoringDir holds the dashboard and the alerting rules.
const monitoringDir = "../monitoring"

// monitoringMistakes are planted one at a time into the dashboard
// (monitoring.DashboardFile) or the alerting rules (monitoring.AlertsFile),
// each where its old text is, once: the check must report each, in words
// containing want.
var monitoringMistakes = []struct {
	name, file, old, new, want string
}{
	{"metric name misspelt", monitoring.AlertsFile, "increase(kvwarden_integrity_refusals_total[5m])",
		"increase(kvwarden_integrity_refusal_total[5m])", "no node exports kvwarden_integrity_refusal_total"},
	{"histogram read without its _bucket", monitoring.DashboardFile, "histogram_quantile(0.99, sum by (le, role) (rate(kvwarden_time_to_first_token_seconds_bucket",
		"histogram_quantile(0.99, sum by (le, role) (rate(kvwarden_time_to_first_token_seconds", "no node exports kvwarden_time_to_first_token_seconds"},
	{"label name misspelt", monitoring.AlertsFile, `kvwarden_members{role=~"decode|all", state="alive"}`,
		`kvwarden_members{role=~"decode|all", stat="alive"}`, "kvwarden_members has no label stat"},
	{"label value misspelt", monitoring.AlertsFile, "kvwarden_node_info{role=\"router\"}\n        for: 1m",
		"kvwarden_node_info{role=\"routr\"}\n        for: 1m", `no node exports role="routr"`},
	{"negated label value misspelt", monitoring.AlertsFile, `code!~"bad_request|prompt_too_long|forbidden|cancelled"`,
		`code!~"bad_request|prompt_too_long|forbidden|canceled"`, `no node exports code="canceled"`},
	{"grouping by a label the series lack", monitoring.DashboardFile, `sum by (queue) (kvwarden_requests_waiting`,
		`sum by (queues) (kvwarden_requests_waiting`,
		`sum by (queues): kvwarden_requests_waiting{job=~".+"} has no label queues`},
	{"group_left of a label the other side lacks", monitoring.DashboardFile,
		`sum by (role) (kvwarden_draining{job=~\"$job\"} * on (job, instance) group_left (role)`,
		`sum by (role) (kvwarden_draining{job=~\"$job\"} * on (job, instance) group_left (rol)`,
		`group_left (rol): kvwarden_node_info{job=~".+"} has no label rol`},
	{"legend of a label the result lacks", monitoring.DashboardFile, `"legendFormat": "{{reason}}"`, `"legendFormat": "{{reasons}}"`,
		"read by its legend or annotations: sum by (reason) (rate(kvwarden_integrity_refusals_total"},
	{"annotation of a label the result lacks", monitoring.AlertsFile, "pool {{ $labels.pool }} is", "pool {{ $labels.pools }} is",
		"read by its legend or annotations: max by (job, instance, pool) (kvwarden_kv_usage_ratio) > 0.95 has no label pools"},
	{"rate of a gauge", monitoring.DashboardFile, `sum by (queue) (kvwarden_requests_waiting{job=~\"$job\"})`,
		`sum by (queue) (rate(kvwarden_requests_waiting{job=~\"$job\"}[$__rate_interval]))`, "kvwarden_requests_waiting, a gauge"},
	{"quantile of a histogram summed without le", monitoring.DashboardFile, `histogram_quantile(0.5, sum by (le, side)`,
		`histogram_quantile(0.5, sum by (side)`, "histogram_quantile: sum by (side) (rate(kvwarden_kv_transfer_duration_seconds_bucket"},
	{"syntax error", monitoring.DashboardFile, `histogram_quantile(0.99, sum by (le, side)`, `histogram_quantile(0.99 sum by (le, side)`,
		"parse error"},
}

// checkMonitoring holds the dashboard and the alerting rules to what the
// pods' nodes export, read from each one's /metrics (after a request went
// through them, so that their histograms have samples), then plants each
// of monitoringMistakes and requires it reported.
func checkMonitoring(t *testing.T, procs map[string]*proc) {
	exported := monitoring.Exported{}
	for _, role := range roles {
		url := "http://" + net.JoinHostPort(podAddr[role], httpPort(procs[role].node)) + "/metrics"
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		err = exported.Add(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
	}
	files, err := monitoring.ReadFiles(monitoringDir)
	if err != nil {
		t.Fatal(err)
	}
	check := func(f monitoring.Files) []string {
		exprs, problems := monitoring.Read(f)
		return append(problems, monitoring.Check(exprs, exported)...)
	}
	if problems := check(files); len(problems) > 0 {
		t.Fatalf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
	}
	for _, m := range monitoringMistakes {
		t.Run(m.name, func(t *testing.T) {
			planted := files.With(m.file, mistake.Plant(t, files.Text(m.file), m.old, m.new))
			mistake.Caught(t, m.new, m.want, check(planted))
		})
	}
}
