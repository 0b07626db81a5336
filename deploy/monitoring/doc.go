// Package monitoring holds kvwarden's Grafana dashboard
// (kvwarden-dashboard.json) and Prometheus alerting rules
// (kvwarden-alerts.yaml), and checks them against what the nodes export, so
// that no panel stays empty and no alert stays silent for a name that does
// not exist.
//
// Read takes every PromQL expression from the files: the rules through
// Prometheus' own rule loader (rulefmt, as Prometheus and promtool check
// rules load them: fields, durations, templates), each dashboard target's
// with the dashboard's variables given a value, and each query variable's
// metric. Check parses each with Prometheus' own parser and holds it to an
// Exported, the series real nodes exported in their scrapes: every selector
// names a series some node exports (a histogram's _bucket, _sum and _count)
// or one Prometheus makes itself (up), with label names the series has and,
// where a matcher names values, values some node exported; counter
// functions (rate, increase) read counters and gauge ones (deriv, delta)
// gauges; and every label a grouping, a vector matching, a legend or an
// alert's annotations name is one the expression's result has.
//
// deploy/kubernetes's TestManifestsServe runs Check against the router,
// prefill and decode nodes its manifests start, after a request went
// through them, and plants typos to see them caught.
package monitoring
