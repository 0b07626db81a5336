package httpapi

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// The API's routes, as the kvwarden_http_requests_total label names them.
const (
	routeCompletions = "completions"
	routeChat        = "chat_completions"
	routeModels      = "models"
	routeOther       = "other"
)

// apiStatuses are every status the API answers with, each present at zero
// from the start; another (the mux's 405) is counted under its own value
// when it happens, which keeps the labels bounded all the same.
var apiStatuses = []int{http.StatusOK, http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden,
	http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusTooManyRequests, 499,
	http.StatusInternalServerError, http.StatusServiceUnavailable}

// apiMetrics are the API's own series.
type apiMetrics struct {
	requests       *prometheus.CounterVec
	streamsAborted prometheus.Counter
	tenantLimited  prometheus.Counter
}

func newAPIMetrics(reg prometheus.Registerer) (*apiMetrics, error) {
	m := &apiMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvwarden_http_requests_total",
			Help: "HTTP API requests answered, by route and status."}, []string{"route", "status"}),
		streamsAborted: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvwarden_http_streams_aborted_total",
			Help: "Streamed answers that failed after they began, ended with an error event and no [DONE]."}),
		tenantLimited: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvwarden_http_tenant_limited_total",
			Help: "Requests refused with 429 because their tenant was at a bound of its share (concurrent_max or pages_max)."}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.streamsAborted, m.tenantLimited} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, route := range []string{routeCompletions, routeChat, routeModels, routeOther} {
		for _, s := range apiStatuses {
			m.requests.WithLabelValues(route, strconv.Itoa(s))
		}
	}
	return m, nil
}

// counted counts h's answers under route, by status.
func (a *API) counted(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		h(sw, r)
		status := sw.status
		if status == 0 {
			// Nothing written: the client went away before an answer.
			status = 499
		}
		a.metrics.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	}
}

// statusWriter remembers the status written; Unwrap lets
// http.ResponseController reach the connection (flush, deadlines).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
