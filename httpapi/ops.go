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
// SGLang's token_usage mean, as a 0–1 ratio, and the token counters are
// their prompt_tokens_total and generation_tokens_total. The Go runtime's
// and the process's series carry the names client_golang gives them
// (go_*, process_*), and kvwarden_build_info the binary's version.
package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

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
	// refusals by bound; /metrics reads its transfers here, their counts
	// and durations from one snapshot.
	Metrics() actors.Metrics
}

// Limits bound what one HTTP request, and what a stranger, may cost the
// node.
type Limits struct {
	// HeaderBytesMax bounds a request's header, in bytes.
	HeaderBytesMax int
	// BodyBytesMax bounds an API request's body, in bytes.
	BodyBytesMax int64
	// ReadTimeout bounds reading a request, its header and its body: a
	// client that sends them slower loses its connection. WriteTimeout
	// bounds writing an answer (for a stream, each event: a client that
	// stops reading for longer loses its request, while a generation that
	// takes long is never cut); IdleTimeout how long a kept-alive
	// connection may wait for its next request.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// StopSequencesMax bounds a request's stop sequences, StopBytesMax
	// each one's bytes.
	StopSequencesMax, StopBytesMax int
	// ChatMessagesMax bounds a chat completion's messages.
	ChatMessagesMax int
	// RetryAfter is what a 429 tells the client to wait.
	RetryAfter time.Duration
	// ConnsMax bounds the connections the server holds at once, in all;
	// ConnsPerAddrMax those of one client address (an IPv4 address, or an
	// IPv6 /64). A connection past either is closed as it is accepted,
	// before a byte of it is read, and counted by bound. Behind a proxy
	// every client has the proxy's address: give ConnsPerAddrMax
	// ConnsMax's value there.
	ConnsMax, ConnsPerAddrMax int
	// DescriptorsReserved is the number of file descriptors the HTTP
	// server leaves to the rest of the process (protoactor remote, data
	// plane, gossip and operators' connections, files): ConnsMax and it
	// must fit the process's limit (FitOpenFiles), so that the cluster's
	// own traffic goes on while HTTP is at its bound.
	DescriptorsReserved int
	// AuthFailuresMax is how many failed authentications (no key, or a key
	// not accepted) one client address may make in AuthFailureWindow; its
	// failures past it are answered 429 with Retry-After, rather than 401,
	// for AuthPenalty. A key that is accepted is served all the same, so
	// that clients sharing an address with a prober are not shut out (a
	// key is 32 random bytes: there is nothing to gain by guessing).
	// AuthAddrsMax bounds the client addresses remembered.
	AuthFailuresMax                int
	AuthFailureWindow, AuthPenalty time.Duration
	AuthAddrsMax                   int
}

// DefaultLimits suit probes, scrapes and API requests of prompts up to
// messages.PromptBytesMax (JSON escaping included). ConnsPerAddrMax is
// the router's default queue (actors.Config.QueueMax): one client with
// more connections than the requests a router runs at once only waits;
// with DescriptorsReserved the connections fit a limit of 4096 open files,
// the lowest hard limit in common use, so that any number of strangers
// holding connections leaves the process descriptors for its own traffic.
func DefaultLimits() Limits {
	return Limits{HeaderBytesMax: 16 << 10, BodyBytesMax: 4 << 20, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: time.Minute, StopSequencesMax: 4, StopBytesMax: 256, ChatMessagesMax: 1024, RetryAfter: time.Second,
		ConnsMax: 2048, ConnsPerAddrMax: 256, DescriptorsReserved: 1024,
		AuthFailuresMax: 10, AuthFailureWindow: time.Minute, AuthPenalty: time.Minute, AuthAddrsMax: 4096}
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
	return l.validateStrangers()
}

// validateStrangers reports the first bound on strangers out of range.
func (l Limits) validateStrangers() error {
	switch {
	case l.ConnsMax < 1 || l.ConnsMax > 1<<20:
		return fmt.Errorf("httpapi: ConnsMax (%d) must be 1 to %d", l.ConnsMax, 1<<20)
	case l.ConnsPerAddrMax < 1 || l.ConnsPerAddrMax > l.ConnsMax:
		return fmt.Errorf("httpapi: ConnsPerAddrMax (%d) must be 1 to ConnsMax (%d)", l.ConnsPerAddrMax, l.ConnsMax)
	case l.DescriptorsReserved < 64 || l.DescriptorsReserved > 1<<20:
		return fmt.Errorf("httpapi: DescriptorsReserved (%d) must be 64 to %d", l.DescriptorsReserved, 1<<20)
	case l.AuthFailuresMax < 1 || l.AuthFailuresMax > 1<<16:
		return fmt.Errorf("httpapi: AuthFailuresMax (%d) must be 1 to 65536", l.AuthFailuresMax)
	case l.AuthFailureWindow < time.Second || l.AuthFailureWindow > time.Hour:
		return fmt.Errorf("httpapi: AuthFailureWindow (%s) must be 1s to 1h", l.AuthFailureWindow)
	case l.AuthPenalty < time.Second || l.AuthPenalty > 24*time.Hour:
		return fmt.Errorf("httpapi: AuthPenalty (%s) must be 1s to 24h", l.AuthPenalty)
	case l.AuthAddrsMax < 1 || l.AuthAddrsMax > 1<<20:
		return fmt.Errorf("httpapi: AuthAddrsMax (%d) must be 1 to %d", l.AuthAddrsMax, 1<<20)
	}
	return nil
}

// OpenFilesError is bounds on connections that do not fit the process's
// limit of open files (RLIMIT_NOFILE): the server at ConnsMax would leave
// the rest of the process fewer than DescriptorsReserved.
type OpenFilesError struct {
	ConnsMax, DescriptorsReserved int
	// Need is what the server may hold and the reserve together; Limit
	// the process's limit.
	Need, Limit uint64
}

func (e *OpenFilesError) Error() string {
	return fmt.Sprintf("httpapi: ConnsMax (%d) HTTP connections, the listener and one connection being refused, and "+
		"DescriptorsReserved (%d) for the node's own traffic need %d file descriptors, over the process's limit of %d "+
		"(RLIMIT_NOFILE): lower ConnsMax or DescriptorsReserved, or raise the limit (ulimit -n, LimitNOFILE)",
		e.ConnsMax, e.DescriptorsReserved, e.Need, e.Limit)
}

// FitOpenFiles checks l's bounds on connections against limit, the
// process's limit of open files; 0 means unknown, which fits.
func (l Limits) FitOpenFiles(limit uint64) error {
	need := uint64(l.ConnsMax) + 2 + uint64(l.DescriptorsReserved)
	if limit != 0 && need > limit {
		return &OpenFilesError{ConnsMax: l.ConnsMax, DescriptorsReserved: l.DescriptorsReserved, Need: need, Limit: limit}
	}
	return nil
}

// Web is a node's HTTP server: its probes and metrics and, with an API
// config, the OpenAI-compatible API, behind the bounds Limits put on
// strangers.
type Web struct {
	handler http.Handler
	guard   *guard
	limits  Limits
}

// NewWeb checks l and makes n's HTTP server: probes and metrics, and,
// when api is given, the OpenAI-compatible API of APIConfig. /metrics has
// the Go runtime's series (client_golang's collector, go_*) and the
// process's (process_*) too. What its bounds on strangers refuse is
// passed to refuser as well, unless it is nil.
func NewWeb(n Node, api *APIConfig, l Limits, refuser Refuser) (*Web, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, err
	}
	g, err := newGuard(l, reg, refuser)
	if err != nil {
		return nil, err
	}
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
	metrics := &metricsHandler{n: n, reg: reg}
	if err := metrics.addProcess(reg); err != nil {
		return nil, fmt.Errorf("httpapi: the process's series: %w", err)
	}
	mux.Handle("GET /metrics", metrics)
	if api != nil {
		a, err := NewAPI(*api, l, reg)
		if err != nil {
			return nil, err
		}
		a.guard = g
		a.routes(mux)
	}
	return &Web{handler: mux, guard: g, limits: l}, nil
}

// Handler serves w's routes. The bounds on connections are Listener's.
func (w *Web) Handler() http.Handler { return w.handler }

// Server is an HTTP server of w's routes with its limits' bounds on
// headers and times; serve it on Listener's listener.
func (w *Web) Server() *http.Server {
	l := w.limits
	return &http.Server{Handler: w.handler, MaxHeaderBytes: l.HeaderBytesMax, ReadTimeout: l.ReadTimeout,
		ReadHeaderTimeout: l.ReadTimeout, WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout}
}

// Listener is ln with w's bounds on connections: one past ConnsMax, or
// past ConnsPerAddrMax of its client address, is closed as it is
// accepted.
func (w *Web) Listener(ln net.Listener) net.Listener { return w.guard.listener(ln) }

// family is one metric family: its name, type and help.
type family struct{ name, typ, help string }

var (
	famInFlight     = family{"kvwarden_requests_in_flight", "gauge", "Requests admitted and not finished."}
	famAdmitted     = family{"kvwarden_requests_admitted_total", "counter", "Requests admitted (or routed, on a router)."}
	famFinished     = family{"kvwarden_requests_finished_total", "counter", "Admitted requests that ended, by outcome."}
	famRejected     = family{"kvwarden_requests_rejected_total", "counter", "Requests refused at admission, by the code they were told (prompt_too_long, busy, unavailable)."}
	famFailed       = family{"kvwarden_requests_failed_total", "counter", "Admitted requests that failed, by the stable code the client was told."}
	famPages        = family{"kvwarden_kv_pages", "gauge", "KV pages of each pool, by state: used (held for requests), cached (kept by the prefix cache, given up when the pool is full) and free."}
	famUsage        = family{"kvwarden_kv_usage_ratio", "gauge", "Share of each pool's KV pages held for requests, 0 to 1 (cached pages are not)."}
	famCacheLookups = family{"kvwarden_prefix_cache_lookups_total", "counter", "Requests that looked their prompt up in the pool's prefix cache: prefills in a prefill pool, reservations in a decode pool."}
	famCacheQueries = family{"kvwarden_prefix_cache_queries_total", "counter",
		"Prompt tokens the requests looked up could have found in the prefix cache: those of their full pages before the last."}
	famCacheHits      = family{"kvwarden_prefix_cache_hits_total", "counter", "Prompt tokens read from the prefix cache: instead of computed (a prefill pool) or sent by prefill (a decode pool)."}
	famCachePages     = family{"kvwarden_prefix_cache_pages", "gauge", "Pages the pool's prefix cache keeps, by kind: held now, and at most (max)."}
	famCacheEvictions = family{"kvwarden_prefix_cache_evictions_total", "counter",
		"Cached pages given up, by why: room (the cache or the pool was full) and gone (found evicted or reclaimed when leased)."}
	famCachePublished = family{"kvwarden_prefix_cache_published_total", "counter", "Prompt pages the prefix cache kept: once decode had them (a prefill pool), once the request was answered (a decode pool)."}
	famMembers        = family{"kvwarden_members", "gauge", "Cluster members this node sees, by role and state."}
	famRefused        = family{"kvwarden_refusals_total", "counter", "What the node refused from outside, by kind."}
	famDraining       = family{"kvwarden_draining", "gauge", "1 while the node drains, else 0."}
	famInfo           = family{"kvwarden_node_info", "gauge", "The node's role and model; always 1."}
	famTTFT           = family{"kvwarden_time_to_first_token_seconds", "histogram",
		"From admission (or, on a router, arrival) to the first token sent."}
	famITL = family{"kvwarden_inter_token_latency_seconds", "histogram",
		"Between two consecutive tokens of one request's stream."}
	famE2E = family{"kvwarden_request_duration_seconds", "histogram",
		"From admission (or arrival) to the answer of a request that completed."}
	famRuntimeLog = family{"kvwarden_runtime_log_records_total", "counter",
		"protoactor's own log records (endpoint chatter, dead letters), by level; logged at debug only."}
	famWaiting = family{"kvwarden_requests_waiting", "gauge",
		"Requests waiting at this node, by queue: routed (a router's, routed and no token back yet), decode_pages (admitted " +
			"here, for decode KV pages), decode_transfer (admitted here, for their prompt's KV from prefill), prefill (transfer " +
			"plans this node's prefill workers have not started), prefill_transfer (computed here, their KV on its way or " +
			"awaiting decode's acknowledgement). A routed request waits in a decode node's queue too, and one in decode_transfer " +
			"in a prefill node's: sum by queue."}
	famRunning   = family{"kvwarden_requests_running", "gauge", "Requests admitted here and decoding."}
	famAdmission = family{"kvwarden_admission_rejections_total", "counter",
		"Requests refused before they ran, by the bound that refused them; tenant_concurrent_max and tenant_pages_max are tenants held to their shares."}
	famTenants = family{"kvwarden_tenants_active", "gauge",
		"Tenants with requests in flight held to their shares at this node (a router, or a node clients send to); no tenant is named."}
	famIntegrity = family{"kvwarden_integrity_refusals_total", "counter",
		"What the node's integrity checks refused (frames, pages, manifests, models), by reason."}
	famTransferTime = family{"kvwarden_kv_transfer_duration_seconds", "histogram",
		"KV transfers (one per request attempt) that completed, by side: send (prefill, from the frames leaving to their " +
			"acknowledgement, a dial included) and receive (decode, from the first frame written to prefill's report)."}
	famTransferBytes  = family{"kvwarden_kv_transfer_bytes_total", "counter", "KV bytes (frame payloads) of the transfers that completed, by side."}
	famTransferPages  = family{"kvwarden_kv_transfer_pages_total", "counter", "KV pages of the transfers that completed, by side."}
	famTransferFailed = family{"kvwarden_kv_transfer_failures_total", "counter",
		"KV transfers that failed, by side and the stable code of the failure."}
	famPromptTokens = family{"kvwarden_prompt_tokens_total", "counter",
		"Prompt tokens whose KV this node's prefill workers computed; a prompt computed again (its transfer failed) counts again."}
	famGenerationTokens = family{"kvwarden_generation_tokens_total", "counter",
		"Tokens this node generated for the requests it admitted and streamed, an end-of-sequence token included."}
	famRelayedTokens = family{"kvwarden_relayed_tokens_total", "counter",
		"Tokens a router passed on to its clients, counted as generated on their decode nodes: sum one or the other, not both."}
	famStreamBatches = family{"kvwarden_stream_batches_total", "counter",
		"TokenBatch messages this node sent: the token chunks and results of many streams bound for one process, in one message."}
	famStreamItems = family{"kvwarden_stream_items_total", "counter",
		"Token chunks and results this node sent in TokenBatch messages; over kvwarden_stream_batches_total, the items a batch carried."}
	famStreamUnknown = family{"kvwarden_stream_unknown_total", "counter",
		"Items of TokenBatch messages this node received for no stream here: late ones, after their stream ended, or guesses."}
	famStreamUndecodable = family{"kvwarden_stream_undecodable_total", "counter",
		"TokenBatch messages this node received that did not decode (a peer of another build, or a broken one): their streams wait for their timeouts."}
	famMoved = family{"kvwarden_requests_moved_total", "counter",
		"Running requests moved between decode nodes, KV and all, by direction: out (moved to another node) and in " +
			"(taken over from one, once the stream's receiver took it)."}
	famStreamsMoved = family{"kvwarden_streams_moved_total", "counter",
		"Streams a router's relays followed from one decode node to another, after the hand-over of the node they left."}
	famFirstToken = family{"kvwarden_first_token_phase_seconds", "summary",
		"The time to first token of the requests this node decoded to the end, by phase: queue (arrival to the plan leaving, " +
			"decode pages reserved), prefill (the plan to the first KV frame, the prefill node's compute included), transfer " +
			"(the first frame to prefill's report), verify (seals, manifest, acknowledgement and the first token recomputed), " +
			"first_decode (the first decode step, of the requests that had a second token). What clients see beyond the first " +
			"four is the hops to this node and back. Every node has it, at zero where nothing decodes."}
	famBuildInfo = family{"kvwarden_build_info", "gauge",
		"The binary's module version, VCS revision (unknown when the build recorded none) and Go version; always 1."}
	famRetried = family{"kvwarden_requests_retried_total", "counter",
		"Requests sent on before any token reached the client, by who: router (a decode node answered busy or was lost; " +
			"sent to another decode node) and decode (a transfer failed or its prefill node was busy; planned with another)."}
)

// memberRoles and memberStates are every label value kvwarden_members
// takes, each present at zero when no member has it.
var (
	memberRoles  = []string{messages.RoleAll, messages.RolePrefill, messages.RoleDecode, messages.RoleRouter}
	memberStates = []string{messages.MemberAlive, messages.MemberSuspect, messages.MemberDead, messages.MemberLeft}
)

// latencyLe are the histograms' bucket bounds as their le labels, in
// seconds.
var latencyLe = func() []string {
	var out []string
	for _, b := range actors.LatencyBounds() {
		out = append(out, strconv.FormatFloat(b.Seconds(), 'g', -1, 64))
	}
	return out
}()

// metricsHandler serves /metrics: the node's series in Prometheus' text
// format, written straight from one read of its status, latencies and
// transfers, so that every series of one scrape is from one moment; then the
// process's (addProcess) and the registry's (the Go runtime's and the
// API's). Writing them directly rather than through a client_golang
// collector, whose objects are built and encoded again at each scrape, cut a
// scrape's cost to a quarter and its allocations to a tenth
// (BenchmarkScrape): at a 100 ms scrape interval, the collector's objects
// cost the node's requests 2 to 5 percent of their throughput, and the
// writer none that BenchmarkScrapeCost can tell from noise. The Go
// runtime's series are client_golang's collector's, whose 29 families mean
// exactly what every Go dashboard expects; its objects make a scrape cost
// 1.6 times the CPU and 5.7 times the bytes it would without them.
type metricsHandler struct {
	n       Node
	reg     prometheus.Gatherer
	process func(*exposition) // writes the process's series, where the registry has none (process_linux.go)
	bufs    sync.Pool         // of *[]byte: a scrape's text, kept for the next
}

func (h *metricsHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	mfs, err := h.reg.Gather()
	if err != nil {
		http.Error(w, "httpapi: gathering the API's series: "+err.Error(), http.StatusInternalServerError)
		return
	}
	bp, _ := h.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	t := exposition{b: (*bp)[:0]}
	t.node(h.n)
	if h.process != nil {
		h.process(&t)
	}
	w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	if _, err := w.Write(t.b); err == nil {
		for _, mf := range mfs {
			if _, err := expfmt.MetricFamilyToText(w, mf); err != nil {
				break
			}
		}
	}
	*bp = t.b
	h.bufs.Put(bp)
}

// exposition is Prometheus' text format being written. Labels are name,
// value pairs, given in their names' order (as client_golang writes them).
// Every label value comes from a fixed list or the configuration, never a
// request or a tenant.
type exposition struct{ b []byte }

// node writes every series of n: each one present, at zero where nothing
// happened, from the start.
func (t *exposition) node(n Node) {
	s, m := n.Status(), n.Metrics()
	t.requests(&s.Node)
	t.pools(s.Node.Pools)
	t.members(s.Members)
	t.self(&s.Node)
	t.queues(m)
	t.tokens(m)
	t.runtimeLog(n.RuntimeLog())
	l := n.Latencies()
	for _, h := range []struct {
		f family
		s actors.LatencySnapshot
	}{{famTTFT, l.TTFT}, {famITL, l.InterToken}, {famE2E, l.EndToEnd}} {
		t.family(h.f)
		t.histogram(h.f.name, h.s)
	}
	t.transfers(m)
}

// requests writes the node's request counts.
func (t *exposition) requests(ns *messages.NodeStatus) {
	t.one(famInFlight, float64(ns.InFlight))
	t.one(famAdmitted, float64(ns.Admitted))
	t.family(famFinished)
	t.sample(famFinished.name, "", float64(ns.Completed), "outcome", "completed")
	t.sample(famFinished.name, "", float64(ns.Failed), "outcome", "failed")
	t.family(famRejected)
	t.sample(famRejected.name, "", float64(ns.RejectedTooLong), "reason", "prompt_too_long")
	t.sample(famRejected.name, "", float64(ns.RejectedBusy), "reason", "busy")
	t.sample(famRejected.name, "", float64(at(ns.RejectedBy, int(actors.RejectNoPeer))), "reason", "unavailable")
	t.family(famFailed)
	for _, code := range messages.KnownCodes() {
		t.sample(famFailed.name, "", float64(at(ns.FailedByCode, int(code))), "code", code.String())
	}
	if ns.Tenants != nil {
		t.one(famTenants, float64(ns.Tenants.Active))
	}
}

// pools writes the pages of each pool, by state, and its usage.
func (t *exposition) pools(pools []messages.PoolStatus) {
	t.family(famPages)
	for _, p := range pools {
		t.sample(famPages.name, "", float64(p.Capacity-p.Free-p.CachePages), "pool", p.Name, "state", "used")
		t.sample(famPages.name, "", float64(p.CachePages), "pool", p.Name, "state", "cached")
		t.sample(famPages.name, "", float64(p.Free), "pool", p.Name, "state", "free")
	}
	t.family(famUsage)
	for _, p := range pools {
		usage := 0.0
		if p.Capacity > 0 {
			usage = float64(p.Capacity-p.Free-p.CachePages) / float64(p.Capacity)
		}
		t.sample(famUsage.name, "", usage, "pool", p.Name)
	}
	t.prefixCaches(pools)
}

// prefixCaches writes the prefix cache of each pool that has one; no
// tenant or scope is named.
func (t *exposition) prefixCaches(pools []messages.PoolStatus) {
	var cached []messages.PoolStatus
	for _, p := range pools {
		if p.CachePagesMax > 0 {
			cached = append(cached, p)
		}
	}
	if len(cached) == 0 {
		return
	}
	for _, c := range []struct {
		fam family
		of  func(p messages.PoolStatus) uint64
	}{
		{famCacheLookups, func(p messages.PoolStatus) uint64 { return p.CacheQueries }},
		{famCacheQueries, func(p messages.PoolStatus) uint64 { return p.CacheQueryTokens }},
		{famCacheHits, func(p messages.PoolStatus) uint64 { return p.CacheHitTokens }},
		{famCachePublished, func(p messages.PoolStatus) uint64 { return p.CachePublished }},
	} {
		t.family(c.fam)
		for _, p := range cached {
			t.sample(c.fam.name, "", float64(c.of(p)), "pool", p.Name)
		}
	}
	t.family(famCachePages)
	for _, p := range cached {
		t.sample(famCachePages.name, "", float64(p.CachePages), "pool", p.Name, "kind", "held")
		t.sample(famCachePages.name, "", float64(p.CachePagesMax), "pool", p.Name, "kind", "max")
	}
	t.family(famCacheEvictions)
	for _, p := range cached {
		t.sample(famCacheEvictions.name, "", float64(p.CacheEvicted), "pool", p.Name, "why", "room")
		t.sample(famCacheEvictions.name, "", float64(p.CacheGone), "pool", p.Name, "why", "gone")
	}
}

// members writes the members the node sees, by role and state.
func (t *exposition) members(ms []messages.MemberStatus) {
	t.family(famMembers)
	for _, r := range memberRoles {
		for _, st := range memberStates {
			count := 0
			for _, m := range ms {
				if m.Role == r && m.State == st {
					count++
				}
			}
			t.sample(famMembers.name, "", float64(count), "role", r, "state", st)
		}
	}
}

// self writes what the node refused, whether it drains, and what it is
// and runs.
func (t *exposition) self(ns *messages.NodeStatus) {
	t.family(famRefused)
	for i, kind := range trust.RefusalNames() {
		t.sample(famRefused.name, "", float64(at(ns.Refused, i)), "kind", kind)
	}
	draining := 0.0
	if ns.Draining {
		draining = 1
	}
	t.one(famDraining, draining)
	t.family(famInfo)
	t.sample(famInfo.name, "", 1, "model", ns.Model, "model_fingerprint", ns.ModelFingerprint, "role", ns.Role)
	t.family(famBuildInfo)
	t.sample(famBuildInfo.name, "", 1, "goversion", build.goversion, "revision", build.revision, "version", build.version)
	ft := ns.FirstToken
	if ft == nil {
		ft = &messages.FirstTokenStatus{}
	}
	t.family(famFirstToken)
	for _, ph := range []struct {
		name      string
		ns, count uint64
	}{{"queue", ft.QueueNs, ft.Requests}, {"prefill", ft.PrefillNs, ft.Requests}, {"transfer", ft.TransferNs, ft.Requests},
		{"verify", ft.VerifyNs, ft.Requests}, {"first_decode", ft.FirstDecodeNs, ft.Decoded}} {
		t.sample(famFirstToken.name, "_sum", float64(ph.ns)/1e9, "phase", ph.name)
		t.sample(famFirstToken.name, "_count", float64(ph.count), "phase", ph.name)
	}
}

// queues writes where the node's requests wait and run, and what
// admission and the integrity checks refused.
func (t *exposition) queues(m actors.Metrics) {
	t.family(famWaiting)
	for _, q := range []struct {
		name string
		v    uint32
	}{{"routed", m.RoutedWaiting}, {"decode_pages", m.WaitingPages}, {"decode_transfer", m.WaitingKV},
		{"prefill", m.PrefillQueued}, {"prefill_transfer", m.PrefillInFlight}} {
		t.sample(famWaiting.name, "", float64(q.v), "queue", q.name)
	}
	t.one(famRunning, float64(m.Running))
	t.family(famAdmission)
	for i, bound := range actors.RejectBoundNames() {
		t.sample(famAdmission.name, "", float64(at(m.RejectedBy, i)), "bound", bound)
	}
	t.family(famIntegrity)
	for i, reason := range actors.IntegrityReasonNames() {
		t.sample(famIntegrity.name, "", float64(at(m.Integrity, i)), "reason", reason)
	}
}

// tokens writes the prompt tokens computed, the tokens generated and, on
// a router, relayed.
func (t *exposition) tokens(m actors.Metrics) {
	t.one(famPromptTokens, float64(m.PromptTokens))
	t.one(famGenerationTokens, float64(m.GenerationTokens))
	t.one(famRelayedTokens, float64(m.RelayedTokens))
	t.one(famStreamBatches, float64(m.StreamBatches))
	t.one(famStreamItems, float64(m.StreamItems))
	t.one(famStreamUnknown, float64(m.StreamUnknown))
	t.one(famStreamUndecodable, float64(m.StreamUndecodable))
	t.family(famMoved)
	t.sample(famMoved.name, "", float64(m.MovedOut), "direction", "out")
	t.sample(famMoved.name, "", float64(m.MovedIn), "direction", "in")
	t.one(famStreamsMoved, float64(m.StreamsMoved))
}

// runtimeLog writes protoactor's own log records, by level.
func (t *exposition) runtimeLog(rl *messages.RuntimeLogCounts) {
	t.family(famRuntimeLog)
	for _, lv := range []struct {
		name string
		v    *atomic.Uint64
	}{{"debug", &rl.Debug}, {"info", &rl.Info}, {"warn", &rl.Warn}, {"error", &rl.Error}} {
		t.sample(famRuntimeLog.name, "", float64(lv.v.Load()), "level", lv.name)
	}
}

// transfers writes the node's KV transfers on each side and its retries.
func (t *exposition) transfers(m actors.Metrics) {
	sides := []struct {
		name string
		s    actors.TransferStats
	}{{"send", m.Sent}, {"receive", m.Received}}
	t.family(famTransferTime)
	for _, side := range sides {
		t.histogram(famTransferTime.name, side.s.Duration, "side", side.name)
	}
	t.family(famTransferBytes)
	for _, side := range sides {
		t.sample(famTransferBytes.name, "", float64(side.s.Bytes), "side", side.name)
	}
	t.family(famTransferPages)
	for _, side := range sides {
		t.sample(famTransferPages.name, "", float64(side.s.Pages), "side", side.name)
	}
	t.family(famTransferFailed)
	for _, side := range sides {
		for _, code := range messages.KnownCodes() {
			t.sample(famTransferFailed.name, "", float64(at(side.s.FailedByCode, int(code))), "code", code.String(), "side", side.name)
		}
	}
	t.family(famRetried)
	t.sample(famRetried.name, "", float64(m.RetriedRoutes), "by", "router")
	t.sample(famRetried.name, "", float64(m.RetriedTransfers), "by", "decode")
}

// build is what kvwarden_build_info says of this binary.
var build = readBuild()

// buildLabels are kvwarden_build_info's labels: the main module's version
// (a tag, a pseudo-version with +dirty for a modified tree, or "(devel)"),
// the VCS revision it was built from and the Go version that built it;
// "unknown" where the binary recorded none (go build -buildvcs=false, a
// tree without its .git, a test binary).
type buildLabels struct{ goversion, revision, version string }

func readBuild() buildLabels {
	b := buildLabels{goversion: runtime.Version(), revision: "unknown", version: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if bi.Main.Version != "" {
		b.version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			b.revision = s.Value
		}
	}
	return b
}

// at is counts[i], or 0 past their end: a status sends counts up to the
// last non-zero one, or of fewer kinds than this build names.
func at(counts []uint64, i int) uint64 {
	if i < len(counts) {
		return counts[i]
	}
	return 0
}

// family writes f's HELP and TYPE lines.
func (t *exposition) family(f family) {
	t.b = append(t.b, "# HELP "...)
	t.b = append(t.b, f.name...)
	t.b = append(t.b, ' ')
	t.b = appendEscaped(t.b, f.help, false)
	t.b = append(t.b, "\n# TYPE "...)
	t.b = append(t.b, f.name...)
	t.b = append(t.b, ' ')
	t.b = append(t.b, f.typ...)
	t.b = append(t.b, '\n')
}

// one writes f, a family of one unlabelled series of value v.
func (t *exposition) one(f family, v float64) {
	t.family(f)
	t.sample(f.name, "", v)
}

// sample writes one series, name and suffix, of value v.
func (t *exposition) sample(name, suffix string, v float64, labels ...string) {
	t.b = append(t.b, name...)
	t.b = append(t.b, suffix...)
	if len(labels) > 0 {
		t.b = append(t.b, '{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				t.b = append(t.b, ',')
			}
			t.b = append(t.b, labels[i]...)
			t.b = append(t.b, `="`...)
			t.b = appendEscaped(t.b, labels[i+1], true)
			t.b = append(t.b, '"')
		}
		t.b = append(t.b, '}')
	}
	t.b = append(t.b, ' ')
	t.b = strconv.AppendFloat(t.b, v, 'g', -1, 64)
	t.b = append(t.b, '\n')
}

// histogram writes s as a Prometheus histogram: cumulative counts by upper
// bound in seconds (le, after labels), then every count past them as +Inf,
// the sum in seconds and the count.
func (t *exposition) histogram(name string, s actors.LatencySnapshot, labels ...string) {
	// One slice for every bucket's labels, le last: no allocation per bucket.
	withLe := append(labels[:len(labels):len(labels)], "le", "")
	var cum uint64
	for i, le := range latencyLe {
		cum += at(s.Counts, i)
		withLe[len(withLe)-1] = le
		t.sample(name, "_bucket", float64(cum), withLe...)
	}
	total := cum + at(s.Counts, len(latencyLe))
	withLe[len(withLe)-1] = "+Inf"
	t.sample(name, "_bucket", float64(total), withLe...)
	t.sample(name, "_sum", s.Sum.Seconds(), labels...)
	t.sample(name, "_count", float64(total), labels...)
}

// appendEscaped appends s escaped as the text format wants: backslashes
// and line feeds in help, and double quotes too in label values.
func appendEscaped(b []byte, s string, quoted bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quoted:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}
