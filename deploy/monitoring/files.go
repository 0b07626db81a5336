package monitoring

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// The files of this package's directory.
const (
	DashboardFile = "kvwarden-dashboard.json"
	AlertsFile    = "kvwarden-alerts.yaml"
)

// Files are the dashboard's and the alerting rules' contents.
type Files struct{ Dashboard, Alerts []byte }

// Text is the contents of file, DashboardFile or AlertsFile.
func (f Files) Text(file string) string {
	if file == DashboardFile {
		return string(f.Dashboard)
	}
	return string(f.Alerts)
}

// With is f with the contents of file, DashboardFile or AlertsFile,
// replaced by text: how tests plant mistakes in them.
func (f Files) With(file, text string) Files {
	if file == DashboardFile {
		f.Dashboard = []byte(text)
	} else {
		f.Alerts = []byte(text)
	}
	return f
}

// ReadFiles reads the files in dir.
func ReadFiles(dir string) (Files, error) {
	d, err := os.ReadFile(filepath.Join(dir, DashboardFile))
	if err != nil {
		return Files{}, err
	}
	a, err := os.ReadFile(filepath.Join(dir, AlertsFile))
	return Files{Dashboard: d, Alerts: a}, err
}

// Expression is one PromQL expression of the files: where it is, its text
// as Prometheus is sent it, and the labels its result is read by (a
// legend's {{label}}, an alert's $labels.label).
type Expression struct {
	Where string
	Query string
	Uses  []string
}

// severities are the values an alert's severity label may take.
var severities = map[string]bool{"critical": true, "warning": true, "info": true}

// Read takes every expression of f, and says what keeps a file from
// loading: a rule Prometheus' loader refuses, an alert without a severity,
// a summary or a description, a dashboard that does not decode, a target
// without an expression or a variable it cannot give a value.
func Read(f Files) ([]Expression, []string) {
	rules, p := readRules(f.Alerts)
	panels, q := readDashboard(f.Dashboard)
	return append(rules, panels...), append(p, q...)
}

// labelRef finds the labels an alert's template reads ($labels.x).
var labelRef = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

func readRules(b []byte) ([]Expression, []string) {
	groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	var p []string
	for _, err := range errs {
		p = append(p, fmt.Sprintf("%s: %v", AlertsFile, err))
	}
	if groups == nil {
		return nil, p
	}
	p = append(p, unsaidFor(b)...)
	var out []Expression
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			where := fmt.Sprintf("%s: group %s, record %s", AlertsFile, g.Name, r.Record)
			if r.Alert != "" {
				where = fmt.Sprintf("%s: group %s, alert %s", AlertsFile, g.Name, r.Alert)
				switch {
				case !severities[r.Labels["severity"]]:
					p = append(p, fmt.Sprintf("%s: severity %q, want critical, warning or info", where, r.Labels["severity"]))
				case strings.TrimSpace(r.Annotations["summary"]) == "" || strings.TrimSpace(r.Annotations["description"]) == "":
					p = append(p, where+": wants a summary and a description annotation")
				}
			}
			e := Expression{Where: where, Query: r.Expr}
			for _, text := range []map[string]string{r.Annotations, r.Labels} {
				for _, v := range text {
					for _, m := range labelRef.FindAllStringSubmatch(v, -1) {
						e.Uses = append(e.Uses, m[1])
					}
				}
			}
			out = append(out, e)
		}
	}
	return out, p
}

// unsaidFor names the alerts that do not say how long their condition
// must hold before they fire: rulefmt reads a missing for as 0m, which
// may be meant or forgotten.
func unsaidFor(b []byte) []string {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string  `json:"alert"`
				For   *string `json:"for"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		return []string{fmt.Sprintf("%s: %v", AlertsFile, err)}
	}
	var p []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && r.For == nil {
				p = append(p, fmt.Sprintf("%s: alert %s: no for: say how long it must hold before it fires (0m: at once)", AlertsFile, r.Alert))
			}
		}
	}
	return p
}

// dashboard is what Read takes of Grafana's dashboard model.
type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string   `json:"title"`
	Type    string   `json:"type"`
	Panels  []panel  `json:"panels"` // a collapsed row's
	Targets []target `json:"targets"`
}

type target struct {
	RefID        string `json:"refId"`
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
}

type variable struct {
	Name     string          `json:"name"`
	Type     string          `json:"type"`
	Query    json.RawMessage `json:"query"` // a string, or {"query": string}
	AllValue string          `json:"allValue"`
}

// grafanaBuiltins are Grafana's own variables, with values to try.
var grafanaBuiltins = map[string]string{"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}

var (
	// variableRef finds $name, ${name}, ${name:format} and [[name]].
	variableRef = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)
	// legendRef finds a legend's {{label}}.
	legendRef = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	// labelValues is a query variable's label_values(selector, label).
	labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)
)

func readDashboard(b []byte) ([]Expression, []string) {
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, []string{fmt.Sprintf("%s: %v", DashboardFile, err)}
	}
	values, out, p := variables(d.Templating.List)
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, pn := range ps {
			walk(pn.Panels)
			if pn.Type != "row" && len(pn.Targets) == 0 {
				p = append(p, fmt.Sprintf("%s: panel %q has no query", DashboardFile, pn.Title))
			}
			for _, t := range pn.Targets {
				where := fmt.Sprintf("%s: panel %q, query %s", DashboardFile, pn.Title, t.RefID)
				query, err := substitute(t.Expr, values)
				if err == nil && strings.TrimSpace(query) == "" {
					err = errors.New("no expression")
				}
				if err != nil {
					p = append(p, fmt.Sprintf("%s: %v", where, err))
					continue
				}
				e := Expression{Where: where, Query: query}
				for _, m := range legendRef.FindAllStringSubmatch(t.LegendFormat, -1) {
					e.Uses = append(e.Uses, m[1])
				}
				out = append(out, e)
			}
		}
	}
	walk(d.Panels)
	return out, p
}

// variables are the values the dashboard's variables are tried with
// (Grafana's own, and each query or custom variable's "all" value), and
// each query variable's label_values as an expression of its metric that
// uses its label.
func variables(vs []variable) (map[string]string, []Expression, []string) {
	values := map[string]string{}
	for k, v := range grafanaBuiltins {
		values[k] = v
	}
	var out []Expression
	var p []string
	for _, v := range vs {
		where := fmt.Sprintf("%s: variable %s", DashboardFile, v.Name)
		if v.Type != "query" && v.Type != "custom" {
			continue
		}
		if v.AllValue == "" {
			p = append(p, where+": no allValue to try the queries with")
			continue
		}
		values[v.Name] = v.AllValue
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q.Query); err != nil {
			if err := json.Unmarshal(v.Query, &q); err != nil {
				p = append(p, fmt.Sprintf("%s: query %s: %v", where, v.Query, err))
				continue
			}
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			p = append(p, fmt.Sprintf("%s: query %q is not label_values(selector, label)", where, q.Query))
			continue
		}
		out = append(out, Expression{Where: where, Query: m[1], Uses: []string{m[2]}})
	}
	return values, out, p
}

// substitute gives each variable in q its value.
func substitute(q string, values map[string]string) (string, error) {
	var missing []string
	out := variableRef.ReplaceAllStringFunc(q, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		v, ok := values[name]
		if !ok {
			missing = append(missing, "$"+name)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("uses %s, which the dashboard does not define (or gives no value to try)", strings.Join(missing, ", "))
	}
	return out, nil
}
