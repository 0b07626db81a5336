//go:build !race

// The node here serves protoactor remote, whose own goroutines race inside
// protoactor (see cluster/node_test.go); the probes' code has no shared
// state of its own.

package httpapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/cluster"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/trust"
)

// startNode is a real node of role all, alone, insecure, behind a test
// HTTP server of its handlers.
func startNode(t *testing.T, log *slog.Logger) (*cluster.Node, *httptest.Server) {
	t.Helper()
	cfg := cluster.DefaultLocalNodeConfig(actors.RoleAll)
	// The large model, whose decode steps take milliseconds: a request
	// cancelled after two tokens is still running when the cancel arrives.
	cfg.Actors.Model = engine.LargeModelConfig()
	cfg.Actors.PrefillPages, cfg.Actors.DecodePages = 64, 96
	cfg.Actors.ContextTokens, cfg.Actors.MaxTokensMax = 512, 64
	cfg.Auth = trust.Insecure(nil)
	m := modeltest.Builtin(t, cfg.Actors.Model)
	cfg.Model = m
	n, err := cluster.StartNode(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop() })
	return n, serve(t, n)
}

// serve is a test HTTP server of n's handlers.
func serve(t testing.TB, n Node) *httptest.Server {
	t.Helper()
	w, err := NewWeb(n, nil, DefaultLimits(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return startWeb(t, w)
}

// startWeb serves w on a test server as node run serves it: its server's
// bounds, on its listener.
func startWeb(t testing.TB, w *Web) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config, srv.Listener = w.Server(), w.Listener(srv.Listener)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// metric is the value of the series named (with its labels) in a scrape.
func metric(t *testing.T, scrape, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(scrape)
	if m == nil {
		t.Fatalf("no series %s in the scrape:\n%s", series, scrape)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestProbesAndMetrics: every series is there at zero before any request;
// three requests, one refused and one cancelled move the counters by
// exactly that; each
// pool's pages add up and its usage ratio is theirs; /readyz flips when
// the node drains.
func TestProbesAndMetrics(t *testing.T) {
	var logs testwait.Buffer
	n, srv := startNode(t, slog.New(slog.NewTextHandler(&logs, nil)))
	if code, body := get(t, srv.URL+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	testwait.For(t, "the node ready", time.Minute, func() bool { code, _ := get(t, srv.URL+"/readyz"); return code == 200 })

	_, before := get(t, srv.URL+"/metrics")
	for _, s := range []string{`kvwarden_requests_admitted_total`, `kvwarden_requests_finished_total{outcome="completed"}`,
		`kvwarden_requests_finished_total{outcome="failed"}`, `kvwarden_requests_rejected_total{reason="busy"}`,
		`kvwarden_requests_rejected_total{reason="prompt_too_long"}`, `kvwarden_requests_in_flight`,
		`kvwarden_members{role="prefill",state="dead"}`, `kvwarden_refusals_total{kind="tenant"}`, `kvwarden_draining`,
		`kvwarden_requests_failed_total{code="cancelled"}`, `kvwarden_requests_failed_total{code="model_mismatch"}`,
		`kvwarden_time_to_first_token_seconds_count`, `kvwarden_inter_token_latency_seconds_count`,
		`kvwarden_request_duration_seconds_bucket{le="+Inf"}`} {
		if v := metric(t, before, s); v != 0 {
			t.Errorf("%s is %g at start, want 0", s, v)
		}
	}
	everyNewSeriesAtZero(t, before)
	if v := metric(t, before, `kvwarden_members{role="all",state="alive"}`); v != 1 {
		t.Errorf("the node sees %g alive members of role all, want itself", v)
	}
	if !strings.Contains(before, `kvwarden_node_info{model="builtin",model_fingerprint="`+n.Status().Node.ModelFingerprint+`",role="all"} 1`) {
		t.Errorf("no node info in the scrape:\n%s", before)
	}

	c, err := client.Dial(n.Address(), client.Options{Auth: trust.Insecure(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		if _, err := c.Generate(context.Background(), "acme", "metrics", client.GenerateOptions{MaxTokens: 4}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Generate(context.Background(), "acme", strings.Repeat("x", 600), client.GenerateOptions{MaxTokens: 4}, nil); err == nil {
		t.Fatal("a 601-token prompt in a 512-token window was answered")
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := 0
	if _, err := c.Generate(ctx, "acme", "cut short", client.GenerateOptions{MaxTokens: 64}, func(int) {
		if got++; got == 1 {
			// Streaming: decoding, and waiting for nothing.
			_, during := get(t, srv.URL+"/metrics")
			wantSeries(t, "while a request streams", during, map[string]float64{`kvwarden_requests_running`: 1,
				`kvwarden_requests_in_flight`: 1, `kvwarden_requests_waiting{queue="decode_pages"}`: 0,
				`kvwarden_requests_waiting{queue="decode_transfer"}`: 0, `kvwarden_requests_waiting{queue="prefill"}`: 0})
		}
		if got == 2 {
			cancel()
		}
	}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a request cancelled after 2 tokens: %v", err)
	}
	testwait.For(t, "the cancelled request ended", time.Minute, func() bool { return n.Status().Node.InFlight == 0 })
	_, after := get(t, srv.URL+"/metrics")
	for s, want := range map[string]float64{`kvwarden_requests_admitted_total`: 4,
		`kvwarden_requests_finished_total{outcome="completed"}`: 3, `kvwarden_requests_finished_total{outcome="failed"}`: 1,
		`kvwarden_requests_failed_total{code="cancelled"}`: 1, `kvwarden_requests_failed_total{code="busy"}`: 0,
		`kvwarden_requests_rejected_total{reason="prompt_too_long"}`: 1, `kvwarden_requests_in_flight`: 0} {
		if v := metric(t, after, s); v != want {
			t.Errorf("after 3 requests, one too long and one cancelled: %s is %g, want %g", s, v, want)
		}
	}
	// The four that ran moved their KV from the node's prefill worker to
	// its decode side, as messages: four transfers on each side.
	tokens, pages, bytes := kvOf(t, n, "metrics", "metrics", "metrics", "cut short")
	wantSeries(t, "after the requests", after, map[string]float64{`kvwarden_prompt_tokens_total`: tokens,
		`kvwarden_admission_rejections_total{bound="context_window"}`: 1, `kvwarden_requests_running`: 0,
		`kvwarden_kv_transfer_duration_seconds_count{side="send"}`: 4, `kvwarden_kv_transfer_pages_total{side="send"}`: pages,
		`kvwarden_kv_transfer_bytes_total{side="send"}`: bytes, `kvwarden_kv_transfer_duration_seconds_count{side="receive"}`: 4,
		`kvwarden_kv_transfer_pages_total{side="receive"}`: pages, `kvwarden_kv_transfer_bytes_total{side="receive"}`: bytes})
	// Every request that streamed a token has a time to first token; the
	// three that completed a duration; their 3 × 3 gaps and the cancelled
	// one's (at least one) are inter-token latencies.
	if ttft, e2e, itl := metric(t, after, `kvwarden_time_to_first_token_seconds_count`),
		metric(t, after, `kvwarden_request_duration_seconds_bucket{le="+Inf"}`),
		metric(t, after, `kvwarden_inter_token_latency_seconds_count`); ttft != 4 || e2e != 3 || itl < 10 {
		t.Errorf("latencies: %g first tokens, %g durations, %g gaps", ttft, e2e, itl)
	} else if gen, out := metric(t, after, `kvwarden_generation_tokens_total`), n.Status().Node.TokensOut; gen != ttft+itl || gen != float64(out) {
		// Each token streamed is timed once, and counted once.
		t.Errorf("%g tokens generated, %g timed, %d in the status", gen, ttft+itl, out)
	}
	if le1, le60 := metric(t, after, `kvwarden_request_duration_seconds_bucket{le="0.001"}`),
		metric(t, after, `kvwarden_request_duration_seconds_bucket{le="60"}`); le1 > le60 || le60 != 3 {
		t.Errorf("duration buckets: %g within 1 ms, %g within a minute", le1, le60)
	}
	for _, p := range n.Status().Node.Pools {
		used, free := metric(t, after, `kvwarden_kv_pages{pool="`+p.Name+`",state="used"}`), metric(t, after, `kvwarden_kv_pages{pool="`+p.Name+`",state="free"}`)
		cached := metric(t, after, `kvwarden_kv_pages{pool="`+p.Name+`",state="cached"}`)
		ratio := metric(t, after, `kvwarden_kv_usage_ratio{pool="`+p.Name+`"}`)
		if used+cached+free != float64(p.Capacity) || ratio != used/float64(p.Capacity) || cached != float64(p.CachePages) {
			t.Errorf("pool %s of %d pages: %g used, %g cached, %g free, ratio %g", p.Name, p.Capacity, used, cached, free, ratio)
		}
	}

	// protoactor logged (its endpoint manager, its activator): counted, and
	// not in the node's log at info.
	runtime := 0.0
	for _, lv := range []string{"debug", "info", "warn", "error"} {
		runtime += metric(t, after, `kvwarden_runtime_log_records_total{level="`+lv+`"}`)
	}
	if runtime == 0 || strings.Contains(logs.String(), "runtime_level") {
		t.Errorf("%g runtime records counted; the node's log at info:\n%s", runtime, logs.String())
	}

	if _, err := n.Drain(); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not ready: cluster: the node is") {
		t.Fatalf("/readyz after the drain: %d %q", code, body)
	}
}

func TestLimitsValidate(t *testing.T) {
	if err := DefaultLimits().Validate(); err != nil {
		t.Fatal(err)
	}
	l := DefaultLimits()
	l.HeaderBytesMax = 10
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "HeaderBytesMax (10)") {
		t.Fatalf("a 10-byte header bound: %v", err)
	}
}
