package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/modeltest"
)

// failingGenerator streams text, then fails with err.
type failingGenerator struct {
	text []string
	err  error
}

func (g failingGenerator) Generate(_ context.Context, _, _ string, opt client.GenerateOptions, onToken func(int)) (client.Result, error) {
	for _, s := range g.text {
		onToken(1)
		opt.OnText(s)
	}
	return client.Result{}, g.err
}

// apiMux is the API of the built-in model over a node's default limits (a
// 2,048-token window, at most 1,024 tokens a request), its requests
// answered "ok" by a generator that stands in for the cluster.
func apiMux(t *testing.T) *http.ServeMux {
	t.Helper()
	m := modeltest.Builtin(t, engine.DefaultModelConfig())
	keys, err := LoadKeys(writeKeys(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	node := actors.DefaultConfig()
	api, err := NewAPI(APIConfig{Model: m, Generator: failingGenerator{text: []string{"ok"}}, Keys: keys, Node: node.Limits()},
		DefaultLimits(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	api.routes(mux)
	return mux
}

// ask sends method path with body and acme's key to mux.
func ask(mux *http.ServeMux, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	return w
}

// TestErrorMessages: each bad body is refused with 400 and a message that
// names the field as the API does (never a Go type or package), with the
// value and the bound; each field at its neutral value, and each accepted
// with no effect, is served.
func TestErrorMessages(t *testing.T) {
	mux := apiMux(t)
	const cmpl, chat = "/v1/completions", "/v1/chat/completions"
	c := func(fields string) string { return `{"model":"builtin","prompt":"hi"` + fields + `}` }
	m := func(fields string) string {
		return `{"model":"builtin","max_tokens":2,"messages":[{"role":"user","content":"hi"}]` + fields + `}`
	}
	msg := func(message string) string { return `{"model":"builtin","max_tokens":2,"messages":[` + message + `]}` }
	for _, tc := range []struct {
		path, body     string
		param, message string // "" for a request served
	}{
		{cmpl, c(`,"max_tokens":"x"`), "max_tokens", "max_tokens must be an integer, not a string"},
		{cmpl, c(`,"max_tokens":1.5`), "max_tokens", "max_tokens must be an integer, not 1.5"},
		{cmpl, c(`,"max_tokens":1e20`), "max_tokens", "max_tokens is 1e20, out of range"},
		{cmpl, c(`,"max_tokens":0`), "max_tokens", "max_tokens is 0; want 1 to 1024, the most this node generates for a request"},
		{cmpl, c(`,"max_tokens":2000`), "max_tokens", "max_tokens is 2000; want 1 to 1024, the most this node generates for a request"},
		{chat, `{"model":"builtin","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":5000}`, "max_completion_tokens",
			"max_completion_tokens is 5000; want 1 to 1024, the most this node generates for a request"},
		{chat, m(`,"max_completion_tokens":3`), "max_completion_tokens", "max_tokens (2) and max_completion_tokens (3) differ"},
		{cmpl, c(`,"model":7`), "model", "model must be a string, not a number"},
		{cmpl, `{"prompt":"hi"}`, "model", "model is required"},
		{cmpl, c(`,"stream":"yes"`), "stream", "stream must be a boolean, not a string"},
		{cmpl, c(`,"stream":true,"stream_options":{"include_usage":1}`), "stream_options.include_usage",
			"stream_options.include_usage must be a boolean, not a number"},
		{cmpl, c(`,"stream_options":{"include_usage":true}`), "stream_options", "stream_options is only for stream: true"},
		{cmpl, c(`,"top_k":40`), "top_k", `unknown field "top_k": not one of the fields OpenAI defines here`},
		{cmpl, `[1]`, "", "the request body must be a JSON object, not an array"},
		{cmpl, `{"model":`, "", "the request body ends inside its JSON value"},
		{cmpl, ``, "", "the request body is empty; want a JSON object"},
		{cmpl, `{"model" "builtin"}`, "", `the request body is not valid JSON: invalid character '"' after object key (at byte 10)`},
		{cmpl, c(``) + `x`, "", "the request body has more after its JSON object"},
		{cmpl, c(`,"temperature":3`), "temperature", "temperature is 3; want 0 to 2 (it has no effect: decoding here is greedy)"},
		{cmpl, c(`,"temperature":"hot"`), "temperature", "temperature must be a number, not a string"},
		{cmpl, c(`,"top_p":1.5`), "top_p", "top_p is 1.5; want 0 to 1 (it has no effect: decoding here is greedy)"},
		{cmpl, c(`,"seed":"x"`), "seed", "seed must be an integer, not a string"},
		{cmpl, c(`,"presence_penalty":0.5`), "presence_penalty",
			"presence_penalty is 0.5; decoding here is greedy, without penalties: only 0 is taken"},
		{cmpl, c(`,"frequency_penalty":-1`), "frequency_penalty",
			"frequency_penalty is -1; decoding here is greedy, without penalties: only 0 is taken"},
		{cmpl, c(`,"logit_bias":{"50256": -100}`), "logit_bias",
			`logit_bias is {"50256":-100}; decoding here is greedy, without biases: only {} is taken`},
		{cmpl, c(`,"n":2`), "n", "n is 2; only one choice is generated: only 1 is taken"},
		{cmpl, c(`,"best_of":3`), "best_of", "best_of is 3; only one choice is generated: only 1 is taken"},
		{cmpl, c(`,"echo":true`), "echo", "echo is true; the prompt is not echoed: only false is taken"},
		{cmpl, c(`,"suffix":"end"`), "suffix", `suffix is "end"; only text after the prompt is generated: only "" is taken`},
		{cmpl, c(`,"logprobs":2`), "logprobs", "logprobs is 2; log probabilities are not returned: only 0 is taken"},
		{cmpl, `{"model":"builtin"}`, "prompt", "prompt is required"},
		{cmpl, `{"model":"builtin","prompt":[1,2]}`, "prompt",
			"prompt must be a string or an array of one string (token ids are not taken)"},
		{cmpl, c(`,"stop":5`), "stop", "stop must be a string or an array of strings, not 5"},
		{cmpl, c(`,"stop":""`), "stop", "stop is 0 bytes; want 1 to 256"},
		{cmpl, c(`,"stop":["a",""]`), "stop[1]", "stop[1] is 0 bytes; want 1 to 256"},
		{cmpl, c(`,"stop":["a","b","c","d","e"]`), "stop", "stop has more than 4 sequences, the bound"},
		{cmpl, `{"model":"builtin","prompt":"` + strings.Repeat("x", 2100) + `"}`, "prompt",
			"the prompt is at least 2101 tokens, over the context window of 2048 (max_model_len)"},
		{cmpl, `{"model":"builtin","prompt":"` + strings.Repeat("x", 2040) + `"}`, "max_tokens",
			"the prompt is 2041 tokens and max_tokens 16 (its default): 2057 tokens, over the context window of 2048 (max_model_len)"},
		{cmpl, `{"model":"builtin","max_tokens":100,"prompt":"` + strings.Repeat("x", 2000) + `"}`, "max_tokens",
			"the prompt is 2001 tokens and max_tokens 100: 2101 tokens, over the context window of 2048 (max_model_len)"},
		{chat, `{"model":"builtin","max_completion_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`,
			"max_completion_tokens",
			"the prompt is 2018 tokens and max_completion_tokens 100: 2118 tokens, over the context window of 2048 (max_model_len)"},
		{chat, `{"model":"builtin","messages":[{"role":"user","content":"` + strings.Repeat("x", 2030) + `"}]}`, "messages",
			"the prompt is 2048 tokens and leaves no room for an answer in the context window of 2048 (max_model_len)"},
		{cmpl, `{"model":"builtin","prompt":"` + strings.Repeat("x", 600<<10) + `"}`, "prompt",
			"the prompt is 614400 bytes; the bound is 524288"},
		{chat, `{"model":"builtin"}`, "messages", "messages is required"},
		{chat, `{"model":"builtin","messages":"hi"}`, "messages", `messages must be an array, not "hi"`},
		{chat, `{"model":"builtin","messages":[]}`, "messages", "messages is empty; want at least one message"},
		{chat, msg(`{"role":"user","content":"hi"},{"role":"user","content":5}`), "messages[1].content",
			"messages[1].content must be a string or an array of text parts, not 5"},
		{chat, msg(`{"role":"tool","content":"hi"}`), "messages[0].role",
			`messages[0].role is "tool"; want system, developer, user or assistant`},
		{chat, msg(`{"role":5,"content":"hi"}`), "messages[0].role", "messages[0].role must be a string, not a number"},
		{chat, msg(`{"role":"user","content":"hi","mood":"calm"}`), "messages[0].mood",
			`unknown field "messages[0].mood": not one of the fields OpenAI defines here`},
		{chat, msg(`{"role":"user","name":"alice","content":"hi"}`), "messages[0].name",
			`messages[0].name is "alice"; names are not part of the prompt here: only "" is taken`},
		{chat, msg(`{"role":"assistant","content":"hi","tool_calls":[{"id":"x"}]}`), "messages[0].tool_calls",
			`messages[0].tool_calls is [{"id":"x"}]; tools are not supported: only [] is taken`},
		{chat, msg(`{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}`),
			"messages[0].content[1].type", `messages[0].content[1] is of type "image_url"; only text parts are taken`},
		{chat, msg(`{"role":"user","content":[{"type":"text","text":5}]}`), "messages[0].content[0].text",
			"messages[0].content[0].text must be a string, not a number"},
		{chat, msg(`{"role":"user","content":[{"type":"text","text":"hi","color":"red"}]}`), "messages[0].content[0].color",
			`unknown field "messages[0].content[0].color": not one of the fields OpenAI defines here`},
		{chat, m(`,"logprobs":true`), "logprobs", "logprobs is true; log probabilities are not returned: only false is taken"},
		{chat, m(`,"top_logprobs":3`), "top_logprobs", "top_logprobs is 3; log probabilities are not returned: only 0 is taken"},
		{chat, m(`,"tools":[{"type":"function"}]`), "tools", `tools is [{"type":"function"}]; tools are not supported: only [] is taken`},
		{chat, m(`,"tool_choice":"required"`), "tool_choice",
			`tool_choice is "required"; tools are not supported: only "none" or "auto" is taken`},
		{chat, m(`,"response_format":{"type":"json_object"}`), "response_format",
			`response_format is {"type":"json_object"}; only text is generated: only {"type":"text"} is taken`},
		{chat, m(`,"modalities":["text","audio"]`), "modalities",
			`modalities is ["text","audio"]; only text is generated: only ["text"] is taken`},
		{chat, m(`,"reasoning_effort":"high"`), "reasoning_effort",
			`reasoning_effort is "high"; this model does not reason: only "none" is taken`},
		{chat, m(`,"verbosity":"low"`), "verbosity", `verbosity is "low"; it would change the answer: only the default, "medium", is taken`},
		{chat, m(`,"store":true`), "store", "store is true; answers are not stored: only false is taken"},
		{chat, m(`,"audio":{"voice":"alloy","format":"wav"}`), "audio",
			`audio is {"voice":"alloy","format":"wav"}; no audio is generated: only null is taken`},
		{chat, m(`,"web_search_options":{}`), "web_search_options", "web_search_options is {}; the web is not searched: only null is taken"},
		{chat, m(`,"moderation":{"model":"omni"}`), "moderation", `moderation is {"model":"omni"}; no moderation is run: only null is taken`},
		{chat, m(`,"metadata":"x"`), "metadata", `metadata must be an object, not "x"`},
		{chat, m(`,"logit_bias":{"1":` + strings.Repeat("1", 100) + `}`), "logit_bias",
			"logit_bias is an object of 106 bytes; decoding here is greedy, without biases: only {} is taken"},

		// Neutral values, and fields accepted with no effect.
		{cmpl, c(`,"n":1,"best_of":1,"echo":false,"suffix":"","logprobs":0,"presence_penalty":0,"frequency_penalty":0,"logit_bias":{}`), "", ""},
		{cmpl, c(`,"temperature":0.7,"top_p":0.9,"seed":42,"user":"alice","stream":false,"stop":null`), "", ""},
		{chat, m(`,"n":null,"logprobs":false,"top_logprobs":0,"response_format":{"type":"text"},"tools":[],"tool_choice":"none"`), "", ""},
		{chat, m(`,"modalities":["text"],"reasoning_effort":"none","verbosity":"medium","store":false,"parallel_tool_calls":true`), "", ""},
		{chat, m(`,"metadata":{"a":"b"},"service_tier":"auto","safety_identifier":"u1","prompt_cache_key":"k","prompt_cache_retention":"24h"`), "", ""},
		{chat, m(`,"prompt_cache_options":{"mode":"explicit"},"prediction":{"type":"content","content":"x"},"temperature":2`), "", ""},
		{chat, m(`,"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}`), "", ""},
		{chat, msg(`{"role":"assistant","content":"hi","name":"","tool_calls":[],"refusal":null,"audio":null}`), "", ""},
		{chat, msg(`{"role":"user","content":[{"type":"text","text":"hi","prompt_cache_breakpoint":{}}]}`), "", ""},
	} {
		w := ask(mux, http.MethodPost, tc.path, tc.body)
		name := tc.body
		if len(name) > 120 {
			name = name[:120] + "…"
		}
		if tc.message == "" {
			if w.Code != http.StatusOK {
				t.Errorf("%s %s: %d %s, want 200", tc.path, name, w.Code, w.Body.String())
			}
			continue
		}
		var e errorBody
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
			t.Fatalf("%s %s: %d %q is not an error object", tc.path, name, w.Code, w.Body.String())
		}
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if w.Code != http.StatusBadRequest || param != tc.param || e.Error.Message != tc.message {
			t.Errorf("%s %s:\n  got  %d param %q %q\n  want 400 param %q %q", tc.path, name, w.Code, param, e.Error.Message,
				tc.param, tc.message)
		}
	}
}

// TestWrongMethod: every route asked with another method is 405 with
// Allow, in OpenAI's error shape; a path that is no route is 404.
func TestWrongMethod(t *testing.T) {
	mux := apiMux(t)
	for _, tc := range []struct {
		method, path   string
		status         int
		allow, message string
	}{
		{http.MethodGet, "/v1/completions", 405, "POST", "GET /v1/completions is not served; /v1/completions takes POST"},
		{http.MethodPut, "/v1/chat/completions", 405, "POST", "PUT /v1/chat/completions is not served; /v1/chat/completions takes POST"},
		{http.MethodPost, "/v1/models", 405, "GET, HEAD", "POST /v1/models is not served; /v1/models takes GET, HEAD"},
		{http.MethodDelete, "/v1/models/builtin", 405, "GET, HEAD",
			"DELETE /v1/models/builtin is not served; /v1/models/{model} takes GET, HEAD"},
		{http.MethodGet, "/v1/embeddings", 404, "",
			"no GET /v1/embeddings here; this node serves POST /v1/completions, POST /v1/chat/completions and GET /v1/models"},
	} {
		w := ask(mux, tc.method, tc.path, "")
		var e errorBody
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || w.Code != tc.status || w.Header().Get("Allow") != tc.allow ||
			e.Error.Message != tc.message || e.Error.Type != errorType(tc.status) {
			t.Errorf("%s %s: %d (Allow %q) %s, want %d (Allow %q) %q", tc.method, tc.path, w.Code, w.Header().Get("Allow"),
				w.Body.String(), tc.status, tc.allow, tc.message)
		}
	}
	if w := ask(mux, http.MethodHead, "/v1/models", ""); w.Code != http.StatusOK {
		t.Errorf("HEAD /v1/models: %d, want 200", w.Code)
	}
}

// TestEveryOpenAIFieldDecided: every field the official SDK can send in a
// completion or a chat (and in a chat's messages and stream options) is a
// field of the request the API decodes, so it is never refused as
// unknown, and has its row in docs/api.md, which says what the API does
// with it: none is silently ignored.
func TestEveryOpenAIFieldDecided(t *testing.T) {
	doc, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	both := section(t, string(doc), "### Both endpoints")
	for _, tc := range []struct {
		name    string
		sdk     []any
		ours    any
		prefix  string
		section string
	}{
		{"completions", []any{openai.CompletionNewParams{}}, completionRequest{}, "",
			both + section(t, string(doc), "### `POST /v1/completions`")},
		{"chat", []any{openai.ChatCompletionNewParams{}}, chatRequest{}, "",
			both + section(t, string(doc), "### `POST /v1/chat/completions`")},
		{"stream options", []any{openai.ChatCompletionStreamOptionsParam{}}, streamOptions{}, "stream_options.", both},
		{"chat messages", []any{openai.ChatCompletionSystemMessageParam{}, openai.ChatCompletionDeveloperMessageParam{},
			openai.ChatCompletionUserMessageParam{}, openai.ChatCompletionAssistantMessageParam{}}, chatMessage{}, "messages[i].",
			section(t, string(doc), "### `POST /v1/chat/completions`")},
	} {
		decoded := jsonFields(reflect.TypeOf(tc.ours))
		for _, s := range tc.sdk {
			for _, f := range append(jsonFields(reflect.TypeOf(s)), "stream") {
				if f == "stream" && tc.prefix != "" {
					continue // a field of the request itself only
				}
				if !slices.Contains(decoded, f) {
					t.Errorf("%s: the SDK's %T sends %q, which the API refuses as unknown", tc.name, s, f)
				}
				if !documented(tc.section, tc.prefix+f) {
					t.Errorf("%s: docs/api.md does not say what the API does with %q", tc.name, tc.prefix+f)
				}
			}
		}
	}
}

// jsonFields are the JSON names of t's fields, those of embedded structs
// included.
func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			out = append(out, jsonFields(f.Type)...)
		case name != "" && name != "-":
			out = append(out, name)
		}
	}
	return out
}

// section is the text of doc from heading to the next heading.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/api.md has no %q", heading)
	}
	text, _, _ := strings.Cut(rest, "\n#")
	return text
}

// documented says whether a table row of text names field in its first
// cell: as itself, or, for a field of a message, bare after a first name
// of the same prefix (`messages[i].tool_calls`, `tool_call_id`).
func documented(text, field string) bool {
	prefix, bare := "", field
	if i := strings.LastIndex(field, "."); i >= 0 {
		prefix, bare = field[:i+1], field[i+1:]
	}
	for _, line := range strings.Split(text, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		first := cells[1]
		if strings.Contains(first, "`"+field+"`") ||
			prefix != "" && strings.HasPrefix(strings.TrimSpace(first), "`"+prefix) && strings.Contains(first, "`"+bare+"`") {
			return true
		}
	}
	return false
}
