// Package httpapi is a node's HTTP surface for operators: liveness and
// readiness probes a load balancer or Kubernetes can use, and Prometheus
// metrics.
//
//	GET /healthz  200 "ok" while the process serves HTTP at all
//	GET /readyz   200 "ready", or 503 and why the node should get no work
//	GET /metrics  the Prometheus text format
//
// Every series exists from the start, at zero; labels are the node's pools,
// roles, member states, refusal kinds, queues, transfer sides, failure codes,
// integrity reasons and admission bounds, never a request or a tenant, so
// that their number is bounded by the configuration. Names follow
// Prometheus' conventions (a _total suffix for counters, base units);
// kvwarden_kv_usage_ratio means what vLLM's kv_cache_usage_perc and
// SGLang's token_usage mean, as a 0–1 ratio.
package httpapi

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// Node is what the handlers read: a *cluster.Node.
type Node interface {
	// Status is the node's counters, pools and members.
	Status() *messages.StatusReply
	// Ready is nil when the node should get work, else why not.
	Ready() error
	// Latencies are the node's request latency histograms.
	Latencies() actors.LatenciesSnapshot
	// RuntimeLog counts protoactor's own log records, by level.
	RuntimeLog() *messages.RuntimeLogCounts
	// Metrics are the node's queues, transfers, integrity refusals and
	// refusals by bound; the collector reads its transfers here, their
	// counts and durations from one snapshot.
	Metrics() actors.Metrics
}

// Limits bound what one HTTP request may cost the node.
type Limits struct {
	// HeaderBytesMax bounds a request's header, in bytes.
	HeaderBytesMax int
	// BodyBytesMax bounds an API request's body, in bytes.
	BodyBytesMax int64
	// ReadTimeout bounds reading a request; WriteTimeout writing an answer
	// (for a stream, each event: a client that stops reading for longer
	// loses its request); IdleTimeout how long a kept-alive connection
	// may wait.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// StopSequencesMax bounds a request's stop sequences, StopBytesMax
	// each one's bytes.
	StopSequencesMax, StopBytesMax int
	// ChatMessagesMax bounds a chat completion's messages.
	ChatMessagesMax int
	// RetryAfter is what a 429 tells the client to wait.
	RetryAfter time.Duration
}

// DefaultLimits suit probes, scrapes and API requests of prompts up to
// messages.PromptBytesMax (JSON escaping included).
func DefaultLimits() Limits {
	return Limits{HeaderBytesMax: 16 << 10, BodyBytesMax: 4 << 20, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: time.Minute, StopSequencesMax: 4, StopBytesMax: 256, ChatMessagesMax: 1024, RetryAfter: time.Second}
}

// Validate reports the first limit out of range, with its value.
func (l Limits) Validate() error {
	switch {
	case l.HeaderBytesMax < 1<<10 || l.HeaderBytesMax > 1<<20:
		return fmt.Errorf("httpapi: HeaderBytesMax (%d) must be 1 KiB to 1 MiB", l.HeaderBytesMax)
	case l.BodyBytesMax < 4<<10 || l.BodyBytesMax > 64<<20:
		return fmt.Errorf("httpapi: BodyBytesMax (%d) must be 4 KiB to 64 MiB", l.BodyBytesMax)
	case l.ReadTimeout <= 0 || l.WriteTimeout <= 0 || l.IdleTimeout <= 0:
		return fmt.Errorf("httpapi: ReadTimeout (%s), WriteTimeout (%s) and IdleTimeout (%s) must be positive",
			l.ReadTimeout, l.WriteTimeout, l.IdleTimeout)
	case l.StopSequencesMax < 1 || l.StopSequencesMax > 64 || l.StopBytesMax < 1 || l.StopBytesMax > 4<<10:
		return fmt.Errorf("httpapi: StopSequencesMax (%d) must be 1 to 64 and StopBytesMax (%d) 1 to 4096",
			l.StopSequencesMax, l.StopBytesMax)
	case l.ChatMessagesMax < 1 || l.ChatMessagesMax > 1<<16:
		return fmt.Errorf("httpapi: ChatMessagesMax (%d) must be 1 to 65536", l.ChatMessagesMax)
	case l.RetryAfter < time.Second || l.RetryAfter > time.Hour:
		return fmt.Errorf("httpapi: RetryAfter (%s) must be 1s to 1h", l.RetryAfter)
	}
	return nil
}

// Server is the HTTP server of h with limits l.
func Server(h http.Handler, l Limits) *http.Server {
	return &http.Server{Handler: h, MaxHeaderBytes: l.HeaderBytesMax, ReadTimeout: l.ReadTimeout,
		ReadHeaderTimeout: l.ReadTimeout, WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout}
}

// Handler serves n's probes and metrics, and, when api is given (cfg
// .Model not nil), the OpenAI-compatible API of APIConfig.
func Handler(n Node, api *APIConfig, l Limits) (http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(&collector{n: n})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := n.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	if api != nil {
		a, err := NewAPI(*api, l, reg)
		if err != nil {
			return nil, err
		}
		a.routes(mux)
	}
	return mux, nil
}

var (
	descInFlight = prometheus.NewDesc("kvwarden_requests_in_flight", "Requests admitted and not finished.", nil, nil)
	descAdmitted = prometheus.NewDesc("kvwarden_requests_admitted_total", "Requests admitted (or routed, on a router).", nil, nil)
	descFinished = prometheus.NewDesc("kvwarden_requests_finished_total", "Admitted requests that ended, by outcome.",
		[]string{"outcome"}, nil)
	descRejected = prometheus.NewDesc("kvwarden_requests_rejected_total", "Requests refused at admission, by bound.",
		[]string{"reason"}, nil)
	descFailed = prometheus.NewDesc("kvwarden_requests_failed_total", "Admitted requests that failed, by the stable code the client was told.",
		[]string{"code"}, nil)
	descPages = prometheus.NewDesc("kvwarden_kv_pages", "KV pages of each pool, by state.", []string{"pool", "state"}, nil)
	descUsage = prometheus.NewDesc("kvwarden_kv_usage_ratio", "Share of each pool's KV pages in use, 0 to 1.",
		[]string{"pool"}, nil)
	descMembers = prometheus.NewDesc("kvwarden_members", "Cluster members this node sees, by role and state.",
		[]string{"role", "state"}, nil)
	descRefused = prometheus.NewDesc("kvwarden_refusals_total", "What the node refused from outside, by kind.",
		[]string{"kind"}, nil)
	descDraining = prometheus.NewDesc("kvwarden_draining", "1 while the node drains, else 0.", nil, nil)
	descInfo     = prometheus.NewDesc("kvwarden_node_info", "The node's role and model; always 1.",
		[]string{"role", "model", "model_fingerprint"}, nil)
	descTTFT = prometheus.NewDesc("kvwarden_time_to_first_token_seconds",
		"From admission (or, on a router, arrival) to the first token sent.", nil, nil)
	descITL = prometheus.NewDesc("kvwarden_inter_token_latency_seconds",
		"Between two consecutive tokens of one request's stream.", nil, nil)
	descE2E = prometheus.NewDesc("kvwarden_request_duration_seconds",
		"From admission (or arrival) to the answer of a request that completed.", nil, nil)
	descRuntimeLog = prometheus.NewDesc("kvwarden_runtime_log_records_total",
		"protoactor's own log records (endpoint chatter, dead letters), by level; logged at debug only.", []string{"level"}, nil)
	descWaiting = prometheus.NewDesc("kvwarden_requests_waiting",
		"Requests waiting, by queue: decode_pages (admitted here, for decode KV pages), decode_transfer (admitted here, for their "+
			"prompt's KV from prefill), prefill (transfer plans this node's prefill workers have not started), prefill_transfer "+
			"(computed here, their KV on its way or awaiting decode's acknowledgement).", []string{"queue"}, nil)
	descRunning   = prometheus.NewDesc("kvwarden_requests_running", "Requests admitted here and decoding.", nil, nil)
	descAdmission = prometheus.NewDesc("kvwarden_admission_rejections_total",
		"Requests refused before they ran, by the bound that refused them.", []string{"bound"}, nil)
	descIntegrity = prometheus.NewDesc("kvwarden_integrity_refusals_total",
		"What the node's integrity checks refused (frames, pages, manifests, models), by reason.", []string{"reason"}, nil)
	descTransferTime = prometheus.NewDesc("kvwarden_kv_transfer_duration_seconds",
		"KV transfers (one per request attempt) that completed, by side: send (prefill, from the frames leaving to their "+
			"acknowledgement, a dial included) and receive (decode, from the first frame written to prefill's report).",
		[]string{"side"}, nil)
	descTransferBytes = prometheus.NewDesc("kvwarden_kv_transfer_bytes_total",
		"KV bytes (frame payloads) of the transfers that completed, by side.", []string{"side"}, nil)
	descTransferPages = prometheus.NewDesc("kvwarden_kv_transfer_pages_total",
		"KV pages of the transfers that completed, by side.", []string{"side"}, nil)
	descTransferFailed = prometheus.NewDesc("kvwarden_kv_transfer_failures_total",
		"KV transfers that failed, by side and the stable code of the failure.", []string{"side", "code"}, nil)
)

// memberRoles and memberStates are every label value kvwarden_members
// takes, each present at zero when no member has it.
var (
	memberRoles  = []string{messages.RoleAll, messages.RolePrefill, messages.RoleDecode, messages.RoleRouter}
	memberStates = []string{messages.MemberAlive, messages.MemberSuspect, messages.MemberDead, messages.MemberLeft}
)

// collector reads the node's status at each scrape, so that every series
// of one scrape is from one moment.
type collector struct{ n Node }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInFlight, descAdmitted, descFinished, descRejected, descFailed, descPages, descUsage,
		descMembers, descRefused, descDraining, descInfo, descTTFT, descITL, descE2E, descRuntimeLog, descWaiting, descRunning,
		descAdmission, descIntegrity, descTransferTime, descTransferBytes, descTransferPages, descTransferFailed} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.n.Status()
	n := &s.Node
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descInFlight, float64(n.InFlight))
	counter(descAdmitted, n.Admitted)
	counter(descFinished, n.Completed, "completed")
	counter(descFinished, n.Failed, "failed")
	counter(descRejected, n.RejectedTooLong, "prompt_too_long")
	counter(descRejected, n.RejectedBusy, "busy")
	for _, code := range messages.KnownCodes() {
		counter(descFailed, at(n.FailedByCode, int(code)), code.String())
	}
	for _, p := range n.Pools {
		gauge(descPages, float64(p.Capacity-p.Free), p.Name, "used")
		gauge(descPages, float64(p.Free), p.Name, "free")
		usage := 0.0
		if p.Capacity > 0 {
			usage = float64(p.Capacity-p.Free) / float64(p.Capacity)
		}
		gauge(descUsage, usage, p.Name)
	}
	members := map[[2]string]int{}
	for _, m := range s.Members {
		members[[2]string{m.Role, m.State}]++
	}
	for _, r := range memberRoles {
		for _, st := range memberStates {
			gauge(descMembers, float64(members[[2]string{r, st}]), r, st)
		}
	}
	for i, kind := range trust.RefusalNames() {
		counter(descRefused, at(n.Refused, i), kind)
	}
	for _, q := range []struct {
		name string
		v    uint32
	}{{"decode_pages", n.WaitingPages}, {"decode_transfer", n.WaitingKV}, {"prefill", n.PrefillQueued},
		{"prefill_transfer", n.PrefillInFlight}} {
		gauge(descWaiting, float64(q.v), q.name)
	}
	gauge(descRunning, float64(n.Running))
	for i, bound := range actors.RejectBoundNames() {
		counter(descAdmission, at(n.RejectedBy, i), bound)
	}
	for i, reason := range actors.IntegrityReasonNames() {
		counter(descIntegrity, at(n.Integrity, i), reason)
	}
	m := c.n.Metrics()
	for _, side := range []struct {
		name string
		s    actors.TransferStats
	}{{"send", m.Sent}, {"receive", m.Received}} {
		ch <- histogram(descTransferTime, side.s.Duration, side.name)
		counter(descTransferBytes, side.s.Bytes, side.name)
		counter(descTransferPages, side.s.Pages, side.name)
		for _, code := range messages.KnownCodes() {
			counter(descTransferFailed, at(side.s.FailedByCode, int(code)), side.name, code.String())
		}
	}
	draining := 0.0
	if n.Draining {
		draining = 1
	}
	gauge(descDraining, draining)
	gauge(descInfo, 1, n.Role, n.Model, n.ModelFingerprint)
	rl := c.n.RuntimeLog()
	for _, lv := range []struct {
		name string
		v    *atomic.Uint64
	}{{"debug", &rl.Debug}, {"info", &rl.Info}, {"warn", &rl.Warn}, {"error", &rl.Error}} {
		counter(descRuntimeLog, lv.v.Load(), lv.name)
	}
	l := c.n.Latencies()
	for _, h := range []struct {
		d *prometheus.Desc
		s actors.LatencySnapshot
	}{{descTTFT, l.TTFT}, {descITL, l.InterToken}, {descE2E, l.EndToEnd}} {
		ch <- histogram(h.d, h.s)
	}
}

// at is counts[i], or 0 past their end: a status sends counts up to the
// last non-zero one, or of fewer kinds than this build names.
func at(counts []uint64, i int) uint64 {
	if i < len(counts) {
		return counts[i]
	}
	return 0
}

// histogram is s in Prometheus' form: cumulative counts by upper bound in
// seconds, the sum in seconds, with labels.
func histogram(d *prometheus.Desc, s actors.LatencySnapshot, labels ...string) prometheus.Metric {
	bounds := actors.LatencyBounds()
	buckets := make(map[float64]uint64, len(bounds))
	var cum uint64
	for i, b := range bounds {
		if i < len(s.Counts) {
			cum += s.Counts[i]
		}
		buckets[b.Seconds()] = cum
	}
	total := cum
	if len(s.Counts) > len(bounds) {
		total += s.Counts[len(bounds)]
	}
	return prometheus.MustNewConstHistogram(d, total, s.Sum.Seconds(), buckets, labels...)
}
