package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
)

// Generator runs one generation in the cluster: a *client.Client aimed at
// the node's own admission actor (or router).
type Generator interface {
	Generate(ctx context.Context, tenant, prompt string, opt client.GenerateOptions, onToken func(int)) (client.Result, error)
}

// APIConfig is what the OpenAI-compatible API serves.
type APIConfig struct {
	// Model is the node's model: its name is the one model the API lists,
	// its tokenizer counts usage.
	Model *engine.Model
	// ChatTemplate is the model's own chat template (the GGUF file's, as
	// engine.DetectChatTemplate recognised it), for the model's tokenizer;
	// nil: chats take ChatPrompt's.
	ChatTemplate *engine.ChatTemplate
	// Generator runs the requests.
	Generator Generator
	// Keys are the API keys accepted, each with its tenant.
	Keys *Keys
	// Node are the node's own limits (context window, most tokens per
	// request), for max_tokens' default.
	Node handoff.Limits
	// Log receives a line for each request the API itself failed (5xx).
	Log *slog.Logger
}

// DefaultCompletionTokens is max_tokens of a completion that names none,
// as OpenAI's completions API documents it. A chat completion's default is
// what the context window leaves after the prompt.
const DefaultCompletionTokens = 16

// API serves POST /v1/completions, POST /v1/chat/completions and GET
// /v1/models in OpenAI's shapes (docs/api.md is the contract). Every
// request needs a key (Authorization: Bearer); it runs as the key's
// tenant. Every field OpenAI defines is honoured, accepted with no effect
// or refused unless neutral (request.go), and any other is refused. A
// request that fails is answered with an error object and the status of
// its stable code (messages.ErrorCode.HTTPStatus), never 200: a streamed
// request holds its headers until the first text, so that one refused at
// admission still gets its status, and one that fails after the stream
// began ends with an error event and no "data: [DONE]". A client that goes
// away cancels its request in the cluster, which frees its pages; a stop
// sequence stops it there, and it ends as completed.
type API struct {
	cfg     APIConfig
	limits  Limits
	metrics *apiMetrics
	// guard throttles clients that send bad keys; nil throttles none.
	guard *guard
}

// NewAPI checks cfg and makes the API, its metrics in reg.
func NewAPI(cfg APIConfig, l Limits, reg prometheus.Registerer) (*API, error) {
	switch {
	case cfg.Model == nil || cfg.Generator == nil || cfg.Keys == nil:
		return nil, errors.New("httpapi: an API needs a model, a generator and keys")
	case cfg.Node.ContextTokens < 1 || cfg.Node.MaxTokensMax < 1:
		return nil, fmt.Errorf("httpapi: the node's context (%d tokens) and most tokens per request (%d) must be positive",
			cfg.Node.ContextTokens, cfg.Node.MaxTokensMax)
	case cfg.ChatTemplate != nil && cfg.ChatTemplate.Tokenizer() != cfg.Model.Tokenizer():
		return nil, fmt.Errorf("httpapi: the chat template %s is for another tokenizer than the model %s's", cfg.ChatTemplate.Name(),
			cfg.Model.Name())
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m, err := newAPIMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &API{cfg: cfg, limits: l, metrics: m}, nil
}

// routes adds the API's routes to mux. A route asked with another method
// is answered 405 with Allow, in OpenAI's error shape; a path under /v1/
// that is no route, 404.
func (a *API) routes(mux *http.ServeMux) {
	a.route(mux, "/v1/completions", http.MethodPost, routeCompletions, a.completions)
	a.route(mux, "/v1/chat/completions", http.MethodPost, routeChat, a.chat)
	a.route(mux, "/v1/models", http.MethodGet, routeModels, a.models)
	a.route(mux, "/v1/models/{model}", http.MethodGet, routeModels, a.model)
	mux.HandleFunc("/v1/", a.counted(routeOther, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Code: "not_found",
			Message: fmt.Sprintf("no %s %s here; this node serves POST /v1/completions, POST /v1/chat/completions and GET /v1/models",
				r.Method, r.URL.Path)})
	}))
}

// route serves h at path for method (GET takes HEAD too, as net/http
// does) and answers any other method 405.
func (a *API) route(mux *http.ServeMux, path, method, name string, h http.HandlerFunc) {
	allow := method
	if method == http.MethodGet {
		allow = "GET, HEAD"
	}
	mux.HandleFunc(path, a.counted(name, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && (method != http.MethodGet || r.Method != http.MethodHead) {
			w.Header().Set("Allow", allow)
			writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed",
				Message: fmt.Sprintf("%s %s is not served; %s takes %s", r.Method, r.URL.Path, path, allow)})
			return
		}
		h(w, r)
	}))
}

// apiError is an error the API answers with: OpenAI's error object, our
// stable code (a messages.ErrorCode's name, or the API's own) in "code",
// and for a cluster's error its numbers under "kvwarden".
type apiError struct {
	Status  int
	Code    string
	Message string
	Param   string
	Wire    *messages.WireError
	// RetryAfter, if positive, is sent as the Retry-After header.
	RetryAfter time.Duration
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// errorType is OpenAI's "type" of an error of status.
func errorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status < 500:
		return "invalid_request_error"
	}
	return "server_error"
}

type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string       `json:"message"`
	Type    string       `json:"type"`
	Param   *string      `json:"param"`
	Code    string       `json:"code"`
	Detail  *errorDetail `json:"kvwarden,omitempty"`
}

// errorDetail is a cluster error's stable numeric code and numbers.
type errorDetail struct {
	Code  uint16 `json:"code"`
	Have  uint64 `json:"have,omitempty"`
	Limit uint64 `json:"limit,omitempty"`
	Where string `json:"where,omitempty"`
}

func (e *apiError) body() errorBody {
	o := errorObject{Message: e.Message, Type: errorType(e.Status), Code: e.Code}
	if e.Param != "" {
		o.Param = &e.Param
	}
	if w := e.Wire; w != nil {
		o.Detail = &errorDetail{Code: uint16(w.Code), Have: w.Have, Limit: w.Limit, Where: w.Where}
	}
	return errorBody{o}
}

// writeError answers with e, as JSON.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((e.RetryAfter+time.Second-1)/time.Second)))
	}
	writeJSON(w, e.Status, e.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// clusterError is the API's answer to an error g ended with, in the API's
// terms: a prompt too long for a bound of the cluster names the field of
// g's to change; any other error of the cluster's is its message without
// the names of the packages it passed through, its code and numbers in
// "kvwarden". The API checks a request as the cluster would before it
// sends it, so an error the cluster refuses a request's fields with (and
// one client.Generate refuses them with) is the API's bug: internal.
func (a *API) clusterError(err error, g *generation) *apiError {
	var w *messages.WireError
	switch {
	case errors.As(err, &w):
		e := &apiError{Status: w.Code.HTTPStatus(), Code: w.Code.String(), Message: plain(w.Message), Wire: w}
		if w.Code == messages.CodePromptTooLong {
			e.Param, e.Message = tooLongMessage(w, g.fields)
		}
		// The tenant's own bound (tenancy.LimitError), not the cluster's:
		// it passes as the tenant's requests end.
		if code, ok := tenantLimitCodes[w.Where]; ok && w.Code == messages.CodeBusy {
			e.Code = code
			a.metrics.tenantLimited.Inc()
		}
		return e
	case errors.Is(err, context.Canceled):
		return &apiError{Status: messages.CodeCancelled.HTTPStatus(), Code: messages.CodeCancelled.String(),
			Message: "the client went away; the request was cancelled"}
	}
	return &apiError{Status: http.StatusInternalServerError, Code: messages.CodeInternal.String(), Message: plain(err.Error())}
}

// tenantLimitCodes are the API's codes of a busy answer at a tenant's
// bound, by its where.
var tenantLimitCodes = map[string]string{
	"tenant concurrent_max": "tenant_concurrency_limit",
	"tenant pages_max":      "tenant_pages_limit",
}

// tooLongMessage names the field of a request (as f names them) that
// took it past the bound a prompt_too_long of the cluster's, w, names, with
// the figures.
func tooLongMessage(w *messages.WireError, f fields) (param, message string) {
	switch w.Where {
	case "prefill pool":
		return f.prompt, fmt.Sprintf("the prompt is %d tokens, over the %d the smallest prefill pool on its path holds", w.Have, w.Limit)
	case "decode pool":
		return f.maxTokens, fmt.Sprintf("the prompt and %s need %d tokens, over the %d the smallest decode pool on its path holds",
			f.maxTokens, w.Have, w.Limit)
	case "context window (prompt + max_tokens)":
		return f.maxTokens, fmt.Sprintf("the prompt and %s need %d tokens, over the context window of %d (max_model_len)",
			f.maxTokens, w.Have, w.Limit)
	}
	return f.prompt, fmt.Sprintf("the prompt needs %d tokens, over the %d the %s holds", w.Have, w.Limit, w.Where)
}

// packages are the project's packages, whose names lead the errors they
// make ("handoff: busy: …").
var packages = []string{"actors", "client", "cluster", "engine", "gpu", "handoff", "httpapi", "kv", "messages", "tenancy", "trust"}

// plain is message without the names of the packages it passed through:
// "handoff: busy: …" is "busy: …".
func plain(message string) string {
	for {
		pkg, rest, ok := strings.Cut(message, ": ")
		if !ok || !slices.Contains(packages, pkg) {
			return message
		}
		message = rest
	}
}

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Code: "invalid_request", Param: param, Message: fmt.Sprintf(format, args...)}
}

// authenticate is the key of r's Authorization header; a request without
// one is refused before its body is read: 401, or 429 while its client is
// throttled for too many such requests (Limits.AuthFailuresMax).
func (a *API) authenticate(r *http.Request) (Key, *apiError) {
	k, err := a.cfg.Keys.Authenticate(r.Header.Get("Authorization"))
	if err == nil {
		return k, nil
	}
	if a.guard != nil {
		if wait := a.guard.authFailed(r.RemoteAddr); wait > 0 {
			return Key{}, &apiError{Status: http.StatusTooManyRequests, Code: "auth_failures_limit", RetryAfter: wait,
				Message: fmt.Sprintf("%v; this address sent more than %d requests without an accepted key in %s, "+
					"so such requests are answered 429 for %s", err, a.limits.AuthFailuresMax, a.limits.AuthFailureWindow,
					a.limits.AuthPenalty)}
		}
	}
	code := "invalid_api_key"
	if errors.Is(err, errNoKey) {
		code = "missing_api_key"
	}
	return Key{}, &apiError{Status: http.StatusUnauthorized, Code: code, Message: err.Error()}
}

// permit says whether k may use model, one of the node's.
func (a *API) permit(k Key, model string) *apiError {
	m := a.cfg.Model
	if model != m.Name() && model != m.Fingerprint().String() {
		return &apiError{Status: http.StatusNotFound, Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("model %q is not served here; this node serves %q (fingerprint %s)", model, m.Name(), m.Fingerprint())}
	}
	if !k.MayUse(m.Name(), m.Fingerprint().String()) {
		return &apiError{Status: http.StatusForbidden, Code: "model_not_permitted", Param: "model",
			Message: fmt.Sprintf("key %q may not use model %q", k.Name, model)}
	}
	return nil
}

// begin is the start of every generation request: the key (before any
// of the body is read), then the body decoded into req and checked.
func (a *API) begin(w http.ResponseWriter, r *http.Request, req interface{ check() *apiError }) (Key, *apiError) {
	key, e := a.authenticate(r)
	if e == nil {
		e = a.readJSON(w, r, req)
	}
	if e == nil {
		e = req.check()
	}
	return key, e
}

// readJSON decodes r's body, at most BodyBytesMax bytes, into v; a
// field v does not name is refused.
func (a *API) readJSON(w http.ResponseWriter, r *http.Request, v any) *apiError {
	body := http.MaxBytesReader(w, r.Body, a.limits.BodyBytesMax)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
				Message: fmt.Sprintf("the request body is over %d bytes, the bound", tooBig.Limit)}
		}
		return jsonError("", err)
	}
	if dec.More() {
		return badRequest("", "the request body has more after its JSON object")
	}
	return nil
}

// generation is one request as the API runs it.
type generation struct {
	key          Key
	fields       fields
	prompt       string
	promptTokens int
	maxTokens    int
	stops        []string
	// turnEnd is the token that ends a chat's answer besides the model's
	// stop token (the chat template's end of turn); -1 for none.
	turnEnd int
	salt    string // narrows the prefix cache scope (common.cacheSalt)
}

// fields are the names a request gave its prompt and its max_tokens, for
// the errors that name them, and whether it is a chat.
type fields struct {
	prompt, maxTokens string
	chat              bool
}

// outcome is how a generation ended: the tokens generated and why it
// finished, or the error; its text went to run's emit.
type outcome struct {
	tokens int
	finish string
	err    error
	cached int // prompt tokens read from the prefix cache
}

// generation is what both handlers do once the body is read and its
// fields checked: the key must be allowed the model, then the prompt (from
// prompt, named as f says), the request's stop sequences (a chat's end of
// turn besides: the model's template's end token, or ChatTurnStop) and
// max_tokens settle into a generation.
func (a *API) generation(key Key, c *common, f fields, prompt func() (string, *apiError), maxTokens *int) (*generation, *apiError) {
	if e := a.permit(key, c.Model); e != nil {
		return nil, e
	}
	g := &generation{key: key, fields: f, salt: c.cacheSalt(), turnEnd: -1}
	var e *apiError
	if g.prompt, e = prompt(); e != nil {
		return nil, e
	}
	if len(g.prompt) > messages.PromptBytesMax {
		return nil, badRequest(f.prompt, "the prompt is %d bytes; the bound is %d", len(g.prompt), messages.PromptBytesMax)
	}
	if g.stops, e = a.parseStop(c.Stop); e != nil {
		return nil, e
	}
	switch ct := a.cfg.ChatTemplate; {
	case f.chat && ct != nil:
		g.turnEnd = ct.TurnEnd()
	case f.chat:
		g.stops = append(g.stops, ChatTurnStop)
	}
	if e := a.prepare(g, maxTokens); e != nil {
		return nil, e
	}
	return g, nil
}

// prepare counts the prompt's tokens (for usage, and so that a prompt that
// cannot fit is refused before it enters the cluster) and settles
// max_tokens: given, else a completion's default or, for a chat, what the
// context window leaves. The prompt and max_tokens must fit the window
// together.
func (a *API) prepare(g *generation, maxTokens *int) *apiError {
	l, f := a.cfg.Node, g.fields
	prompt, err := handoff.Encode(l, a.cfg.Model.Tokenizer(), g.prompt, true) // the API's own prompt: text it checked, or a chat it rendered
	var long *handoff.PromptTooLongError
	switch {
	case errors.As(err, &long):
		return windowTooLong(f.prompt, long.Tokens, long.Limit, long.AtLeast)
	case err != nil:
		return a.clusterError(err, g)
	}
	g.promptTokens = len(prompt)
	given := ""
	switch {
	case maxTokens != nil:
		if *maxTokens < 1 || *maxTokens > l.MaxTokensMax {
			return badRequest(f.maxTokens, "%s is %d; want 1 to %d, the most this node generates for a request", f.maxTokens,
				*maxTokens, l.MaxTokensMax)
		}
		g.maxTokens = *maxTokens
	case f.chat:
		g.maxTokens = min(l.MaxTokensMax, l.ContextTokens-g.promptTokens)
	default:
		g.maxTokens, given = min(DefaultCompletionTokens, l.MaxTokensMax), " (its default)"
	}
	switch need := g.promptTokens + max(g.maxTokens, 1); {
	case g.promptTokens > l.ContextTokens:
		return windowTooLong(f.prompt, g.promptTokens, l.ContextTokens, false)
	case g.maxTokens < 1:
		return tooLong(f.prompt, need, l.ContextTokens, "context window (prompt + max_tokens)",
			fmt.Sprintf("the prompt is %d tokens and leaves no room for an answer in the context window of %d (max_model_len)",
				g.promptTokens, l.ContextTokens))
	case need > l.ContextTokens:
		return tooLong(f.maxTokens, need, l.ContextTokens, "context window (prompt + max_tokens)",
			fmt.Sprintf("the prompt is %d tokens and %s %d%s: %d tokens, over the context window of %d (max_model_len)",
				g.promptTokens, f.maxTokens, g.maxTokens, given, need, l.ContextTokens))
	}
	return nil
}

// windowTooLong refuses, naming param, a prompt of need tokens (at least,
// when it was not encoded to tell), over the context window of limit.
func windowTooLong(param string, need, limit int, atLeast bool) *apiError {
	least := ""
	if atLeast {
		least = "at least "
	}
	return tooLong(param, need, limit, "context window",
		fmt.Sprintf("the prompt is %s%d tokens, over the context window of %d (max_model_len)", least, need, limit))
}

// tooLong is a prompt_too_long refusal naming param: need tokens, over
// limit, the bound named by where.
func tooLong(param string, need, limit int, where, message string) *apiError {
	w := &messages.WireError{Code: messages.CodePromptTooLong, Message: message, Have: uint64(need), Limit: uint64(limit),
		Where: where}
	return &apiError{Status: http.StatusBadRequest, Code: w.Code.String(), Param: param, Message: message, Wire: w}
}

// run generates g, passing each piece of text that may be sent (stop
// sequences held back and cut) to emit; an error from emit (the client
// went away) cancels the request. A stop sequence, or the chat's end of
// turn token (counted with the answer's tokens, as the model's stop token
// is), stops the request in the cluster at once, where it ends as
// completed (client.GenerateOptions.Stop) and is counted so: the answer is
// whole.
func (a *API) run(ctx context.Context, g *generation, emit func(string) error) outcome {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		stop             = newStopText(g.stops)
		stopCluster      = make(chan struct{})
		streamed         strings.Builder
		tokens           int
		stopped, emitErr bool
	)
	send := func(text string) {
		if text != "" && !emitErr {
			if err := emit(text); err != nil {
				emitErr = true
				cancel()
			}
		}
	}
	opt := client.GenerateOptions{MaxTokens: g.maxTokens, Stop: stopCluster, CacheSalt: g.salt, OnText: func(text string) {
		if stopped {
			return
		}
		streamed.WriteString(text)
		out, hit := stop.feed(text)
		send(out)
		if hit {
			stopped = true
			close(stopCluster)
		}
	}}
	res, err := a.cfg.Generator.Generate(ctx, g.key.Tenant, g.prompt, opt, func(id int) {
		if stopped {
			return
		}
		tokens++
		if id == g.turnEnd {
			stopped = true
			close(stopCluster)
		}
	})
	switch {
	case err != nil && !stopped:
		return outcome{tokens: tokens, err: err}
	case stopped:
		return outcome{tokens: tokens, finish: "stop", cached: res.CachedTokens}
	}
	// What the stream held back (an incomplete character) ends the text.
	if rest, ok := strings.CutPrefix(res.Text, streamed.String()); ok {
		out, hit := stop.feed(rest)
		send(out)
		if hit {
			return outcome{tokens: len(res.Tokens), finish: "stop", cached: res.CachedTokens}
		}
	}
	send(stop.flush())
	return outcome{tokens: len(res.Tokens), finish: res.Finish, cached: res.CachedTokens}
}

// parseStop reads "stop": absent, null, a string or an array of strings.
func (a *API) parseStop(raw json.RawMessage) ([]string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var stops []string
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		stops = []string{one}
	} else if stops, err = decodeList[string](raw, a.limits.StopSequencesMax); err != nil {
		var long *listTooLongError
		if errors.As(err, &long) {
			return nil, badRequest("stop", "stop has more than %d sequences, the bound", long.Max)
		}
		return nil, badRequest("stop", "stop must be a string or an array of strings, not %s", shown(raw))
	}
	for i, s := range stops {
		if s == "" || len(s) > a.limits.StopBytesMax {
			field := "stop"
			if raw[0] == '[' {
				field = fmt.Sprintf("stop[%d]", i)
			}
			return nil, badRequest(field, "%s is %d bytes; want 1 to %d", field, len(s), a.limits.StopBytesMax)
		}
	}
	return stops, nil
}

// listTooLongError is a JSON array of a request with more than Max
// elements.
type listTooLongError struct{ Max int }

func (e *listTooLongError) Error() string { return fmt.Sprintf("more than %d elements", e.Max) }

// decodeList decodes raw, a JSON array, and refuses it at element max+1,
// so that an array costs at most max elements however many would fit in
// the body (a 4 MiB body holds over a million empty ones).
func decodeList[T any](raw json.RawMessage, max int) ([]T, error) {
	var list []T
	err := decodeEach(raw, func(v T) error {
		if len(list) == max {
			return &listTooLongError{Max: max}
		}
		list = append(list, v)
		return nil
	})
	return list, err
}

// decodeEach decodes raw, a JSON array, one element at a time, each passed
// to take as it comes; take's error ends the decoding. An element with a
// field T does not name is refused; an error decoding one is an
// *elementError.
func decodeEach[T any](raw json.RawMessage, take func(v T) error) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return &notArrayError{raw: raw}
	}
	for i := 0; dec.More(); i++ {
		var v T
		if err := dec.Decode(&v); err != nil {
			return &elementError{Index: i, Err: err}
		}
		if err := take(v); err != nil {
			return err
		}
	}
	return nil
}

// notArrayError is a value that should have been a JSON array.
type notArrayError struct{ raw json.RawMessage }

func (e *notArrayError) Error() string { return "must be an array, not " + shown(e.raw) }

// usage is OpenAI's token counts, in the model's tokens (the prompt's
// BOS included).
type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails promptDetails `json:"prompt_tokens_details"`
}

// promptDetails is usage's account of the prompt: how many of its tokens
// were read from the prefix cache instead of computed.
type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func usageOf(g *generation, o outcome) *usage {
	return &usage{PromptTokens: g.promptTokens, CompletionTokens: o.tokens, TotalTokens: g.promptTokens + o.tokens,
		PromptTokensDetails: promptDetails{CachedTokens: o.cached}}
}

// newID is a response id: prefix and 12 random bytes in hex.
func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// serveGeneration runs g and answers: one JSON object from whole, or,
// when c asks for a stream, an SSE stream of the objects chunk makes, ending with the
// one final makes (and usage's, with include_usage) and "data: [DONE]".
func (a *API) serveGeneration(w http.ResponseWriter, r *http.Request, g *generation, c *common,
	chunk func(text string) any, final func(o outcome) any, usageChunk func(u *usage) any, whole func(text string, o outcome) any) {
	// A generation takes as long as it takes: no write deadline until
	// there is something to write.
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	if !c.Stream {
		var text strings.Builder
		o := a.run(r.Context(), g, func(s string) error { text.WriteString(s); return nil })
		if o.err != nil {
			a.fail(w, r, g, o.err)
			return
		}
		_ = rc.SetWriteDeadline(time.Now().Add(a.limits.WriteTimeout))
		writeJSON(w, http.StatusOK, whole(text.String(), o))
		return
	}
	s := &sse{w: w, rc: rc, timeout: a.limits.WriteTimeout}
	o := a.run(r.Context(), g, func(text string) error { return s.event(chunk(text)) })
	switch {
	case o.err != nil && !s.started:
		a.fail(w, r, g, o.err)
		return
	case o.err != nil:
		a.metrics.streamsAborted.Inc()
		e := a.apiErrorOf(o.err, g)
		a.logFailure(r, e)
		_ = s.event(e.body())
		return
	}
	if err := s.event(final(o)); err != nil {
		return
	}
	if c.StreamOptions != nil && c.StreamOptions.IncludeUsage {
		if err := s.event(usageChunk(usageOf(g, o))); err != nil {
			return
		}
	}
	_ = s.done()
}

// apiErrorOf is the answer to an error run returned for g.
func (a *API) apiErrorOf(err error, g *generation) *apiError {
	e := a.clusterError(err, g)
	if e.Status == http.StatusTooManyRequests {
		e.RetryAfter = a.limits.RetryAfter
	}
	return e
}

// fail answers g, a request that failed before anything was sent.
func (a *API) fail(w http.ResponseWriter, r *http.Request, g *generation, err error) {
	e := a.apiErrorOf(err, g)
	a.logFailure(r, e)
	writeError(w, e)
}

func (a *API) logFailure(r *http.Request, e *apiError) {
	if e.Status >= 500 {
		a.cfg.Log.Warn("http request failed", "path", r.URL.Path, "status", e.Status, "code", e.Code, "err", e.Message)
	}
}

// sse writes one Server-Sent Events stream; the headers (status 200) go
// with its first event.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	started bool
}

func (s *sse) event(v any) error {
	var b strings.Builder
	b.WriteString("data: ")
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	b.WriteString("\n") // Encode ended the line; an empty one ends the event
	return s.write(b.String())
}

func (s *sse) done() error { return s.write("data: [DONE]\n\n") }

func (s *sse) write(line string) error {
	if !s.started {
		h := s.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no") // proxies must not hold tokens back
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
	// A reader that stops reading does not hold the request for ever.
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := s.w.Write([]byte(line)); err != nil {
		return err
	}
	return s.rc.Flush()
}

// models answers GET /v1/models: the node's model, if the key may use it.
func (a *API) models(w http.ResponseWriter, r *http.Request) {
	k, e := a.authenticate(r)
	if e != nil {
		writeError(w, e)
		return
	}
	list := modelList{Object: "list", Data: []modelObject{}}
	m := a.cfg.Model
	if k.MayUse(m.Name(), m.Fingerprint().String()) {
		list.Data = append(list.Data, a.modelObject())
	}
	writeJSON(w, http.StatusOK, list)
}

// model answers GET /v1/models/{model}.
func (a *API) model(w http.ResponseWriter, r *http.Request) {
	k, e := a.authenticate(r)
	if e == nil {
		e = a.permit(k, r.PathValue("model"))
	}
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, a.modelObject())
}

type modelList struct {
	Object string        `json:"object"`
	Data   []modelObject `json:"data"`
}

// modelObject is OpenAI's model object with the bounds a request is held
// to: MaxModelLen is the context window, in tokens, that the prompt and
// the tokens generated share (vLLM's max_model_len);
// MaxCompletionTokens is the most tokens one request may generate, its
// max_tokens' bound (the node's --max-tokens-max).
type modelObject struct {
	ID                  string `json:"id"`
	Object              string `json:"object"`
	Created             int64  `json:"created"`
	OwnedBy             string `json:"owned_by"`
	Fingerprint         string `json:"fingerprint"`
	MaxModelLen         int    `json:"max_model_len"`
	MaxCompletionTokens int    `json:"max_completion_tokens"`
}

func (a *API) modelObject() modelObject {
	m := a.cfg.Model
	return modelObject{ID: m.Name(), Object: "model", OwnedBy: "kvwarden", Fingerprint: m.Fingerprint().String(),
		MaxModelLen: a.cfg.Node.ContextTokens, MaxCompletionTokens: a.cfg.Node.MaxTokensMax}
}
