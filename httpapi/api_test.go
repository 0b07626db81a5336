//go:build !race

// The node here serves protoactor remote, whose own goroutines race inside
// protoactor (see cluster/node_test.go); the API's own state is tested
// under the race detector in keys_test.go and stop_test.go.

package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/cluster"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
	"github.com/kvwarden/kvwarden/trust"
)

// apiNode is a real node of role all serving stories260K, alone and
// insecure, and a test HTTP server of its handlers with the API.
type apiNode struct {
	node *cluster.Node
	// shares are the node's tenants' shares (limitedPolicy), read from a
	// file; nil for a node started otherwise.
	shares *tenancy.Shares
	model  *engine.Model
	keys   *Keys
	srv    *httptest.Server
}

func startAPI(t *testing.T) *apiNode { return startAPIServing(t, modeltest.Stories(t, kv.F32)) }

// startSlowAPI serves the large built-in model, whose decode steps take
// milliseconds: a request of a few hundred tokens is still streaming when
// its client goes away or sends another.
func startSlowAPI(t *testing.T) *apiNode {
	cfg := engine.LargeModelConfig()
	cfg.ContextTokens = 512
	return startAPIServing(t, modeltest.Builtin(t, cfg))
}

func startAPIServing(t testing.TB, m *engine.Model) *apiNode { return startAPIServingChat(t, m, nil) }

// startAPIServingChat is startAPIServing with ct as the API's chat
// template (nil: none).
func startAPIServingChat(t testing.TB, m *engine.Model, ct *engine.ChatTemplate) *apiNode {
	t.Helper()
	cfg := cluster.DefaultLocalNodeConfig(actors.RoleAll)
	cfg.Actors.Model, cfg.Model = m.Config(), m
	cfg.Actors.ContextTokens, cfg.Actors.MaxTokensMax = m.Config().ContextTokens, 448
	cfg.Auth = trust.Insecure(nil)
	shares := writeTenants(t, t.TempDir(), limitedPolicy)
	cfg.Actors.Tenants = shares
	n, err := cluster.StartNode(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop() })
	a := serveAPIChat(t, n, ct)
	a.shares = shares
	waitReady(t, n)
	return a
}

// waitReady waits for n to be ready.
func waitReady(t testing.TB, n *cluster.Node) {
	t.Helper()
	testwait.For(t, "the node ready", time.Minute, func() bool { return n.Ready() == nil })
}

// serveAPI is a test HTTP server of n's handlers with the API, its
// requests sent to n's own admission (a router's, on a router), as node
// run serves them.
func serveAPI(t testing.TB, n *cluster.Node) *apiNode { return serveAPIChat(t, n, nil) }

// serveAPIChat is serveAPI with ct as the API's chat template (nil: none).
func serveAPIChat(t testing.TB, n *cluster.Node, ct *engine.ChatTemplate) *apiNode {
	t.Helper()
	keys, err := LoadKeys(writeKeys(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	a := n.Actors()
	gen := client.New(a.Root().ActorSystem(), actor.NewPID(n.Address(), actors.AdmissionName), client.Options{})
	cfg := a.Config()
	w, err := NewWeb(n, &APIConfig{Model: a.Model(), ChatTemplate: ct, Generator: gen, Keys: keys, Node: cfg.Limits()},
		DefaultLimits(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := startWeb(t, w)
	return &apiNode{node: n, model: a.Model(), keys: keys, srv: srv}
}

func (a *apiNode) sdk(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(a.srv.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// reference is the model's answer to prompt with at most max tokens, cut
// before the first of stops: its text and its tokens up to the one that
// completed the stop sequence (all of them without one), and whether one
// came.
func (a *apiNode) reference(t *testing.T, prompt string, max int, stops ...string) (string, int, bool) {
	t.Helper()
	tokens, err := a.model.Answer(prompt, max)
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= len(tokens); n++ {
		text := a.model.Text(prompt, tokens[:n])
		at := -1
		for _, s := range stops {
			if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at) {
				at = i
			}
		}
		if at >= 0 {
			return text[:at], n, true
		}
	}
	return a.model.Text(prompt, tokens), len(tokens), false
}

func (a *apiNode) promptTokens(prompt string) int64 {
	return int64(len(a.model.Tokenizer().Encode(prompt)))
}

// TestSDKCompletions: the official OpenAI Go SDK gets the reference answer
// from /v1/completions, whole and streamed, with usage in the model's
// tokens, and the same text cut at a stop sequence.
func TestSDKCompletions(t *testing.T) {
	a := startAPI(t)
	c := a.sdk(keyAcme)
	ctx := context.Background()
	const prompt, max = "Once upon a time", 48
	want, n, _ := a.reference(t, prompt, max)
	params := openai.CompletionNewParams{Model: "stories260K", MaxTokens: openai.Int(max),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}}
	res, err := c.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 1 || res.Choices[0].Text != want || res.Choices[0].FinishReason != "length" {
		t.Fatalf("completion %+v, want the reference %q", res.Choices, want)
	}
	if u := res.Usage; u.PromptTokens != a.promptTokens(prompt) || u.CompletionTokens != int64(n) || u.TotalTokens != u.PromptTokens+int64(n) {
		t.Errorf("usage %+v, want %d prompt and %d completion tokens", u, a.promptTokens(prompt), n)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Completions.NewStreaming(ctx, params)
	var text strings.Builder
	var finish string
	var usage openai.CompletionUsage
	chunks := 0
	for stream.Next() {
		cur := stream.Current()
		for _, ch := range cur.Choices {
			text.WriteString(ch.Text)
			if ch.FinishReason != "" {
				finish = string(ch.FinishReason)
			}
		}
		if cur.Usage.TotalTokens > 0 {
			usage = cur.Usage
		}
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != want || finish != "length" || usage.CompletionTokens != int64(n) || chunks < 3 {
		t.Fatalf("streamed %q (finish %q, usage %+v, %d chunks), want the reference %q", text.String(), finish, usage, chunks, want)
	}

	// A stop sequence from the middle of the reference answer: the text
	// before it, finish "stop", and the tokens up to the one that
	// completed it.
	stop := want[len(want)/2 : len(want)/2+3]
	cut, cutTokens, _ := a.reference(t, prompt, max, stop)
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	params.Stop = openai.CompletionNewParamsStopUnion{OfString: openai.String(stop)}
	res, err = c.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Text != cut || res.Choices[0].FinishReason != "stop" || res.Usage.CompletionTokens != int64(cutTokens) {
		t.Fatalf("with stop %q: %q (finish %s, %d tokens), want %q (%d tokens)", stop, res.Choices[0].Text,
			res.Choices[0].FinishReason, res.Usage.CompletionTokens, cut, cutTokens)
	}
	stream = c.Completions.NewStreaming(ctx, params)
	text.Reset()
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := stream.Err(); err != nil || text.String() != cut {
		t.Fatalf("streamed with stop %q: %q (%v), want %q", stop, text.String(), err, cut)
	}
	testwait.For(t, "the stopped requests ended", time.Minute, func() bool { return a.node.Status().Node.InFlight == 0 })
}

// TestSDKChat: a chat completion is the reference answer to ChatPrompt's
// text, ending at the next user turn, whole and streamed.
func TestSDKChat(t *testing.T) {
	a := startAPI(t)
	c := a.sdk(keyAcme)
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Tell a story."), openai.UserMessage("Once upon a time")}
	prompt := "System: Tell a story.\nUser: Once upon a time\nAssistant:"
	const max = 64
	want, n, _ := a.reference(t, prompt, max, ChatTurnStop)
	params := openai.ChatCompletionNewParams{Model: "stories260K", Messages: msgs, MaxTokens: openai.Int(max)}
	res, err := c.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 1 || res.Choices[0].Message.Content != want || res.Choices[0].Message.Role != "assistant" {
		t.Fatalf("chat answered %+v, want %q", res.Choices, want)
	}
	if u := res.Usage; u.PromptTokens != a.promptTokens(prompt) || u.CompletionTokens != int64(n) {
		t.Errorf("usage %+v, want %d prompt and %d completion tokens", u, a.promptTokens(prompt), n)
	}
	if got := streamedChat(t, c, params); got != want {
		t.Fatalf("chat streamed %q, want %q", got, want)
	}
}

// streamedChat is the answer to params, streamed.
func streamedChat(t *testing.T, c openai.Client, params openai.ChatCompletionNewParams) string {
	t.Helper()
	stream := c.Chat.Completions.NewStreaming(context.Background(), params)
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	return acc.Choices[0].Message.Content
}

// TestSDKChatTemplate: a model with a chat template of its own answers a
// chat completion in it: the cluster takes the template's tokens as the
// prompt and the answer is the reference over them, whole and streamed,
// with usage in those tokens.
func TestSDKChatTemplate(t *testing.T) {
	m, ct := chatStories(t)
	a := startAPIServingChat(t, m, ct)
	c := a.sdk(keyAcme)
	const max = 40
	ids, _ := ct.EncodeWithin([]engine.ChatMessage{{Role: "system", Content: "Tell a story."}, {Role: "user", Content: "Once upon a time"}},
		1<<20)
	tokens, err := m.Engine().(*engine.ReferenceEngine).Reference(ids, max)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(tokens, func(id int) bool { return id == m.Tokenizer().Stop() || id == ct.TurnEnd() }); i >= 0 {
		tokens = tokens[:i+1]
	}
	want := engine.DecodeText(m.Tokenizer(), ids[len(ids)-1], tokens)
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Tell a story."), openai.UserMessage("Once upon a time")}
	params := openai.ChatCompletionNewParams{Model: "stories260K", Messages: msgs, MaxTokens: openai.Int(max)}
	res, err := c.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 1 || res.Choices[0].Message.Content != want || want == "" {
		t.Fatalf("chat answered %+v, want %q", res.Choices, want)
	}
	if u := res.Usage; u.PromptTokens != int64(len(ids)) || u.CompletionTokens != int64(len(tokens)) {
		t.Errorf("usage %+v, want %d prompt and %d completion tokens", u, len(ids), len(tokens))
	}
	if got := streamedChat(t, c, params); got != want {
		t.Fatalf("chat streamed %q, want %q", got, want)
	}
}

// post sends body to the API's path with key (none if empty) and returns
// the status, the Retry-After header and the decoded error object, if
// any.
func post(t *testing.T, url, key, body string) (int, string, errorObject) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var e errorBody
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		if err := json.Unmarshal(data, &e); err != nil {
			t.Fatalf("status %d with a body that is not an error object: %q", res.StatusCode, data)
		}
	}
	return res.StatusCode, res.Header.Get("Retry-After"), e.Error
}

// TestAPIRefusals: each refusal has its status, OpenAI's error shape and
// our code, from the real node: no key, a wrong key, a key for another
// model, an unknown model, unsupported parameters, a prompt the window
// cannot hold, max_tokens out of range and a body too large.
func TestAPIRefusals(t *testing.T) {
	a := startAPI(t)
	url := a.srv.URL + "/v1/completions"
	ok := `{"model":"stories260K","prompt":"hi","max_tokens":2}`
	for _, tc := range []struct {
		name, key, body string
		status          int
		code, param     string
	}{
		{"no key", "", ok, 401, "missing_api_key", ""},
		{"a wrong key", "kvw-nobody", ok, 401, "invalid_api_key", ""},
		{"a key for another model", keyRestricted, ok, 403, "model_not_permitted", "model"},
		{"an unknown model", keyAcme, `{"model":"gpt-4","prompt":"hi"}`, 404, "model_not_found", "model"},
		{"no model", keyAcme, `{"prompt":"hi"}`, 400, "invalid_request", "model"},
		{"n = 2", keyAcme, `{"model":"stories260K","prompt":"hi","n":2}`, 400, "invalid_request", "n"},
		{"echo", keyAcme, `{"model":"stories260K","prompt":"hi","echo":true}`, 400, "invalid_request", "echo"},
		{"token ids", keyAcme, `{"model":"stories260K","prompt":[1,2,3]}`, 400, "invalid_request", "prompt"},
		{"five stops", keyAcme, `{"model":"stories260K","prompt":"hi","stop":["a","b","c","d","e"]}`, 400, "invalid_request", "stop"},
		{"max_tokens 0", keyAcme, `{"model":"stories260K","prompt":"hi","max_tokens":0}`, 400, "invalid_request", "max_tokens"},
		{"a prompt over the window", keyAcme, `{"model":"stories260K","prompt":"` + strings.Repeat("word ", 600) + `"}`, 400,
			"prompt_too_long", ""},
		{"not JSON", keyAcme, `{"model":`, 400, "invalid_request", ""},
		{"a body over 4 MiB", keyAcme, `{"model":"stories260K","prompt":"` + strings.Repeat("x", 5<<20) + `"}`, 413, "body_too_large", ""},
		{"a cache salt with U+001F", keyAcme, `{"model":"stories260K","prompt":"hi","cache_salt":"a\u001fb"}`, 400, "invalid_request", "cache_salt"},
		{"a cache salt and key over 64 bytes", keyAcme, `{"model":"stories260K","prompt":"hi","cache_salt":"` + strings.Repeat("s", 40) +
			`","prompt_cache_key":"` + strings.Repeat("k", 30) + `"}`, 400, "invalid_request", "cache_salt"},
	} {
		status, _, e := post(t, url, tc.key, tc.body)
		if status != tc.status || e.Code != tc.code || (tc.param != "" && (e.Param == nil || *e.Param != tc.param)) ||
			e.Type != errorType(tc.status) || e.Message == "" {
			t.Errorf("%s: %d %+v, want %d code %q param %q", tc.name, status, e, tc.status, tc.code, tc.param)
		}
	}
	status, _, e := post(t, url, keyAcme, `{"model":"stories260K","prompt":"`+strings.Repeat("word ", 600)+`"}`)
	if status != 400 || e.Detail == nil || e.Detail.Code != 1 || e.Detail.Limit != 512 || e.Detail.Where != "context window" {
		t.Errorf("a prompt over the window: %d, detail %+v, want code 1 and the window's 512 tokens", status, e.Detail)
	}
}

// TestCacheSaltAndKeyNarrowApart: cache_salt alone is the salt as the Go
// client sends it; prompt_cache_key narrows apart from it, so that no two
// different pairs of the two fields name one scope.
func TestCacheSaltAndKeyNarrowApart(t *testing.T) {
	s := func(v string) *string { return &v }
	pairs := []common{{}, {CacheSalt: s("x")}, {PromptCacheKey: s("x")}, {CacheSalt: s("x"), PromptCacheKey: s("y")},
		{CacheSalt: s("x"), PromptCacheKey: s("")}, {CacheSalt: s("y"), PromptCacheKey: s("x")}, {CacheSalt: s("xy")}}
	seen := map[string]int{}
	for i, c := range pairs {
		salt := c.cacheSalt()
		if j, ok := seen[salt]; ok && !(i == 4 && j == 1) { // an empty key narrows nothing
			t.Errorf("pairs %d and %d narrow alike (%q)", j, i, salt)
		}
		seen[salt] = i
	}
	if got := (&common{CacheSalt: s("user-7")}).cacheSalt(); got != "user-7" {
		t.Errorf("cache_salt alone narrows by %q, want it as it is", got)
	}
}

// TestAPITenantLimit: the limited tenant's one request in flight holds
// its stream open; a second, by its other key, is refused by the node's
// tenants' shares with 429 and Retry-After, another tenant is served
// meanwhile, and the limited one again once its request ends.
func TestAPITenantLimit(t *testing.T) {
	a := startSlowAPI(t)
	url := a.srv.URL + "/v1/completions"
	ok := `{"model":"builtin","prompt":"hi","max_tokens":2}`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, _ := streamFirstEvent(t, ctx, url, keyLimited, `{"model":"builtin","prompt":"Once","max_tokens":400,"stream":true}`)
	status, retry, e := post(t, url, keyLimited2, ok)
	if status != 429 || retry != "1" || e.Code != "tenant_concurrency_limit" ||
		!strings.Contains(e.Message, `tenant "limited" has 1 requests in flight and asks 1 more, its concurrent_max is 1`) {
		t.Errorf("a limited tenant's second request: %d (Retry-After %q) %+v", status, retry, e)
	}
	if status, _, _ := post(t, url, keyAcme, ok); status != 200 {
		t.Errorf("another tenant's request while the limited one is at its limit: %d", status)
	}
	cancel()
	body.Close()
	testwait.For(t, "the limited tenant served again", time.Minute, func() bool {
		status, _, _ := post(t, url, keyLimited, ok)
		return status == 200
	})
}

// streamFirstEvent starts a streamed request and reads its first event;
// the caller closes the body (or cancels ctx) to go away.
func streamFirstEvent(t *testing.T, ctx context.Context, url, key, body string) (io.ReadCloser, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		data, _ := io.ReadAll(res.Body)
		t.Fatalf("stream: %d %s: %s", res.StatusCode, res.Header.Get("Content-Type"), data)
	}
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first event %q: %v", line, err)
	}
	return res.Body, line
}

// TestAPIDisconnect: a client that goes away mid-stream cancels its
// request on the node, whose pages are all free again.
func TestAPIDisconnect(t *testing.T) {
	a := startSlowAPI(t)
	// Pages the prefix cache keeps count as free: held by no request.
	capacity := func() (free, all uint32) {
		for _, p := range a.node.Status().Node.Pools {
			free, all = free+p.Free+p.CachePages, all+p.Capacity
		}
		return free, all
	}
	ctx, cancel := context.WithCancel(context.Background())
	body, _ := streamFirstEvent(t, ctx, a.srv.URL+"/v1/completions", keyAcme,
		`{"model":"builtin","prompt":"Once upon a time","max_tokens":400,"stream":true}`)
	if free, all := capacity(); free == all {
		t.Fatalf("no page in use while a request streams (%d of %d free)", free, all)
	}
	cancel()
	body.Close()
	testwait.Report(t, "the request cancelled and its pages freed", time.Minute, func() (bool, string) {
		s := a.node.Status().Node
		free, all := capacity()
		return s.InFlight == 0 && free == all, strconv.Itoa(int(free)) + " of " + strconv.Itoa(int(all)) + " pages free"
	})
	if s := a.node.Status().Node; s.Completed != 0 || s.Failed != 1 {
		t.Errorf("after a client went away: %d completed, %d failed, want the one cancelled", s.Completed, s.Failed)
	}
}

// TestAPIMetricsCount: the API's and the node's counters move by exactly
// the requests sent through the API.
func TestAPIMetricsCount(t *testing.T) {
	a := startAPI(t)
	_, before := get(t, a.srv.URL+"/metrics")
	for _, s := range []string{`kvwarden_http_requests_total{route="completions",status="200"}`,
		`kvwarden_http_requests_total{route="chat_completions",status="429"}`, `kvwarden_http_streams_aborted_total`,
		`kvwarden_http_tenant_limited_total`} {
		if v := metric(t, before, s); v != 0 {
			t.Errorf("%s is %g at start, want 0", s, v)
		}
	}
	ok := `{"model":"stories260K","prompt":"hi","max_tokens":3}`
	for range 3 {
		if status, _, _ := post(t, a.srv.URL+"/v1/completions", keyAcme, ok); status != 200 {
			t.Fatalf("status %d", status)
		}
	}
	for range 2 {
		post(t, a.srv.URL+"/v1/completions", "", ok)
	}
	post(t, a.srv.URL+"/v1/chat/completions", keyAcme, `{"model":"stories260K","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)
	_, after := get(t, a.srv.URL+"/metrics")
	for s, want := range map[string]float64{`kvwarden_http_requests_total{route="completions",status="200"}`: 3,
		`kvwarden_http_requests_total{route="completions",status="401"}`:      2,
		`kvwarden_http_requests_total{route="chat_completions",status="200"}`: 1,
		`kvwarden_requests_admitted_total`:                                    4, `kvwarden_requests_finished_total{outcome="completed"}`: 4} {
		if v := metric(t, after, s); v != want {
			t.Errorf("%s is %g, want %g", s, v, want)
		}
	}
}

// TestModels: /v1/models lists the node's model for a key that may use
// it, with its context window and the most tokens a request may ask for,
// and nothing for one that may not.
func TestModels(t *testing.T) {
	a := startAPI(t)
	c := a.sdk(keyAcme)
	page, err := c.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "stories260K" || page.Data[0].OwnedBy != "kvwarden" {
		t.Fatalf("models %+v", page.Data)
	}
	// The bounds a request is held to: the window, and max_tokens' own.
	var bounds struct {
		MaxModelLen         int `json:"max_model_len"`
		MaxCompletionTokens int `json:"max_completion_tokens"`
	}
	if err := json.Unmarshal([]byte(page.Data[0].RawJSON()), &bounds); err != nil || bounds.MaxModelLen != 512 ||
		bounds.MaxCompletionTokens != 448 {
		t.Fatalf("the model's bounds %+v (%v), want the window's 512 tokens and max_tokens' 448", bounds, err)
	}
	m, err := c.Models.Get(context.Background(), a.model.Fingerprint().String())
	if err != nil || m.ID != "stories260K" {
		t.Fatalf("the model by fingerprint: %+v, %v", m, err)
	}
	restricted := a.sdk(keyRestricted)
	if page, err := restricted.Models.List(context.Background()); err != nil || len(page.Data) != 0 {
		t.Fatalf("a key for another model lists %+v (%v)", page, err)
	}
	var apiErr *openai.Error
	if _, err := restricted.Models.Get(context.Background(), "stories260K"); !errors.As(err, &apiErr) || apiErr.StatusCode != 403 {
		t.Fatalf("a key for another model gets the model: %v", err)
	}
}

// TestKeysReload: a key added to the file is accepted after Reload; a
// broken file leaves the keys in use as they were.
func TestKeysReload(t *testing.T) {
	a := startAPI(t)
	url := a.srv.URL + "/v1/models"
	getWith := func(key string) int {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := getWith("kvw-new"); got != 401 {
		t.Fatalf("a key not in the file: %d", got)
	}
	if err := AddKey(a.keys.Path(), KeyEntry{Name: "new", Tenant: "newco", SHA256: HashKey("kvw-new")}); err != nil {
		t.Fatal(err)
	}
	if err := a.keys.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := getWith("kvw-new"); got != 200 {
		t.Fatalf("a key added and reloaded: %d", got)
	}
	if err := os.WriteFile(a.keys.Path(), []byte(`{"keys": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	var fe *KeysFileError
	if err := a.keys.Reload(); !errors.As(err, &fe) {
		t.Fatalf("a broken keys file reloaded: %v", err)
	}
	if getWith("kvw-new") != 200 || getWith(keyAcme) != 200 {
		t.Fatal("a broken keys file took keys away")
	}
}

// TestErrorCodes: every stable code reaches the client with its status,
// before a stream began (a plain error answer) and after (an error event
// and no [DONE], which the SDK reports as an error). The generator stands
// in for the cluster: the real failures behind most codes (a lost node, a
// checksum) cannot be made to order here; the binary's tests make a real
// one.
func TestErrorCodes(t *testing.T) {
	m := modeltest.Builtin(t, engine.DefaultModelConfig())
	keys, err := LoadKeys(writeKeys(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	node := actors.DefaultConfig()
	for _, code := range append(slices.Clone(messages.KnownCodes()), 42) {
		wire := &messages.WireError{Code: code, Message: "made to order"}
		for _, text := range [][]string{nil, {"partial ", "answer"}} {
			api, err := NewAPI(APIConfig{Model: m, Generator: failingGenerator{text, wire}, Keys: keys, Node: node.Limits()},
				DefaultLimits(), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			api.routes(mux)
			srv := httptest.NewServer(mux)
			c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(keyAcme), option.WithMaxRetries(0))
			params := openai.CompletionNewParams{Model: "builtin", MaxTokens: openai.Int(8),
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}}
			_, err = c.Completions.New(context.Background(), params)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != code.HTTPStatus() || apiErr.Code != code.String() {
				t.Errorf("code %d, %d chunks, whole: %v, want status %d code %q", code, len(text), err, code.HTTPStatus(), code)
			}
			stream := c.Completions.NewStreaming(context.Background(), params)
			var got strings.Builder
			for stream.Next() {
				for _, ch := range stream.Current().Choices {
					got.WriteString(ch.Text)
				}
			}
			err = stream.Err()
			switch {
			case len(text) == 0 && (!errors.As(err, &apiErr) || apiErr.StatusCode != code.HTTPStatus()):
				t.Errorf("code %d before any text, streamed: %v, want status %d", code, err, code.HTTPStatus())
			case len(text) > 0 && (err == nil || !strings.Contains(err.Error(), `"code":"`+code.String()+`"`) ||
				got.String() != "partial answer"):
				t.Errorf("code %d after text, streamed %q then %v, want the text and an error event", code, got.String(), err)
			}
			srv.Close()
		}
	}
}

// TestAPITenantLimitReload: a limit a reload of the tenants' shares gives
// a tenant counts the requests it already has in flight: with one
// streaming, a second is refused.
func TestAPITenantLimitReload(t *testing.T) {
	a := startSlowAPI(t)
	url := a.srv.URL + "/v1/completions"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, _ := streamFirstEvent(t, ctx, url, keyAcme, `{"model":"builtin","prompt":"Once","max_tokens":400,"stream":true}`)
	defer body.Close()
	if err := os.WriteFile(a.shares.Path(), []byte(`{"tenants": {"acme": {"concurrent_max": 1}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.shares.Reload(); err != nil {
		t.Fatal(err)
	}
	if status, _, e := post(t, url, keyAcme, `{"model":"builtin","prompt":"hi","max_tokens":2}`); status != 429 {
		t.Errorf("acme's second request once a reload limits it to one: %d %+v, want 429", status, e)
	}
}

// TestAPIKeyBeforeBody: a request without a valid key is refused before
// its body is read, whatever the body is.
func TestAPIKeyBeforeBody(t *testing.T) {
	a := startAPI(t)
	for _, body := range []string{`{"model":`, `{"model":"stories260K","prompt":"` + strings.Repeat("x", 5<<20) + `"}`} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			if status, _, e := post(t, a.srv.URL+path, "kvw-nobody", body); status != 401 || e.Code != "invalid_api_key" {
				t.Errorf("%s with a wrong key and a body of %d bytes: %d %+v, want 401", path, len(body), status, e)
			}
		}
	}
}

// TestAPIArraysBounded: a body of a million empty messages, stop
// sequences or content parts is refused at the first past its limit, its
// cost a few times the body's bytes, not per element; content in parts
// is still taken.
func TestAPIArraysBounded(t *testing.T) {
	mux := apiMux(t)
	empties := strings.Repeat(`{},`, (4<<20-100)/3) + `{}`
	for _, tc := range []struct {
		path, body string
		status     int
		message    string
	}{
		{"/v1/chat/completions", `{"model":"builtin","messages":[` + empties + `]}`, 400, "more than 1024 messages"},
		{"/v1/completions", `{"model":"builtin","prompt":"x","stop":[` + strings.Repeat(`"",`, (4<<20-100)/3) + `""]}`, 400,
			"stop has more than 4 sequences"},
		{"/v1/chat/completions", `{"model":"builtin","messages":[{"role":"user","content":[` + empties + `]}]}`, 400,
			"messages[0].content[0] is of type"},
		{"/v1/chat/completions", `{"model":"builtin","max_tokens":2,"messages":[{"role":"user","content":[{"type":"text","text":"Once"},{"type":"text","text":" upon"}]}]}`,
			200, `"content":"ok"`},
	} {
		req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+keyAcme)
		w := httptest.NewRecorder()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		mux.ServeHTTP(w, req)
		runtime.ReadMemStats(&after)
		if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.message) {
			t.Errorf("%s: %d %s, want %d %q", tc.path, w.Code, w.Body.String(), tc.status, tc.message)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16*uint64(len(tc.body))+1<<20 {
			t.Errorf("%s of %d bytes (%s) allocated %d MiB", tc.path, len(tc.body), tc.message, alloc>>20)
		}
	}
}
