package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/kvwarden/kvwarden/kv"
)

// The bodies of POST /v1/completions and POST /v1/chat/completions name
// every field OpenAI defines for them (the official SDK's
// CompletionNewParams and ChatCompletionNewParams): each is honoured,
// accepted with no effect, or refused with 400 unless it holds its
// neutral value (docs/api.md has the table and the reasons). A field
// OpenAI does not define is refused too, so nothing a caller sends is
// ever silently ignored. Every refusal names the field as the API does
// (max_tokens, messages[2].content), with the value and the bound.

// common are the fields completions and chat share.
type common struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	Stop          json.RawMessage `json:"stop"`
	N             json.RawMessage `json:"n"`
	Logprobs      json.RawMessage `json:"logprobs"`
	// Decoding is greedy. These are taken within OpenAI's ranges and change
	// nothing, since common SDK callers send them: the most likely token
	// is the same at any temperature and within any top_p, and greedy
	// decoding needs no seed to repeat itself.
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	Seed        *int64   `json:"seed"`
	// Each would change the answer: refused unless 0 or empty.
	PresencePenalty  *float64        `json:"presence_penalty"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`
	LogitBias        json.RawMessage `json:"logit_bias"`
	// User names the end user to OpenAI; here a request runs as its key's
	// tenant. Accepted, no effect.
	User *string `json:"user"`
	// PromptCacheKey (OpenAI's) and CacheSalt (vLLM's) narrow the prefix
	// cache the request shares with its key's tenant (or the group the
	// operator put it in) to the requests that give the same values;
	// neither can widen it.
	PromptCacheKey *string `json:"prompt_cache_key"`
	CacheSalt      *string `json:"cache_salt"`
}

// cacheSaltSeparator joins cache_salt and prompt_cache_key into one salt;
// neither may hold it, so that no two requests' pairs join alike.
const cacheSaltSeparator = "\x1f"

// cacheSalt is what narrows the request's prefix cache scope: its
// cache_salt (the Go client's CacheSalt, as it is) and, after a separator,
// its prompt_cache_key, so that a key never names the scope a salt of the
// same text does.
func (c *common) cacheSalt() string {
	var salt string
	if c.CacheSalt != nil {
		salt = *c.CacheSalt
	}
	if c.PromptCacheKey != nil && *c.PromptCacheKey != "" {
		salt += cacheSaltSeparator + *c.PromptCacheKey
	}
	return salt
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
	// IncludeObfuscation asks OpenAI to pad stream events against
	// length side channels. Accepted, no effect.
	IncludeObfuscation *bool `json:"include_obfuscation"`
}

// greedy is why a field that would change the answer is refused.
const greedy = "decoding here is greedy"

// check refuses what the API cannot honour, naming the field.
func (c *common) check() *apiError {
	if c.Model == "" {
		return badRequest("model", "model is required")
	}
	if c.StreamOptions != nil && !c.Stream {
		return badRequest("stream_options", "stream_options is only for stream: true")
	}
	for _, f := range []struct {
		name  string
		value *string
	}{{"cache_salt", c.CacheSalt}, {"prompt_cache_key", c.PromptCacheKey}} {
		if f.value != nil && strings.Contains(*f.value, cacheSaltSeparator) {
			return badRequest(f.name, "%s holds the control character U+001F", f.name)
		}
	}
	if n := len(c.cacheSalt()); n > kv.CacheSaltBytesMax {
		return badRequest("cache_salt", "cache_salt and prompt_cache_key are %d bytes together; the bound is %d", n, kv.CacheSaltBytesMax)
	}
	return firstError(
		neutral("n", c.N, "only one choice is generated: only 1 is taken", "1"),
		inRange("temperature", c.Temperature, 2),
		inRange("top_p", c.TopP, 1),
		onlyZero("presence_penalty", c.PresencePenalty),
		onlyZero("frequency_penalty", c.FrequencyPenalty),
		neutral("logit_bias", c.LogitBias, greedy+", without biases: only {} is taken", "{}"),
	)
}

// completionRequest is POST /v1/completions' body.
type completionRequest struct {
	common
	Prompt json.RawMessage `json:"prompt"`
	Echo   json.RawMessage `json:"echo"`
	BestOf json.RawMessage `json:"best_of"`
	Suffix json.RawMessage `json:"suffix"`
}

func (r *completionRequest) check() *apiError {
	if len(r.Prompt) == 0 || string(r.Prompt) == "null" {
		return firstError(r.common.check(), badRequest("prompt", "prompt is required"))
	}
	return firstError(r.common.check(),
		neutral("logprobs", r.Logprobs, "log probabilities are not returned: only 0 is taken", "0"),
		neutral("echo", r.Echo, "the prompt is not echoed: only false is taken", "false"),
		neutral("best_of", r.BestOf, "only one choice is generated: only 1 is taken", "1"),
		neutral("suffix", r.Suffix, "only text after the prompt is generated: only \"\" is taken", `""`),
	)
}

// chatRequest is POST /v1/chat/completions' body.
type chatRequest struct {
	common
	Messages            json.RawMessage `json:"messages"` // decoded by decodeList, at most ChatMessagesMax
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	TopLogprobs         json.RawMessage `json:"top_logprobs"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	Functions           json.RawMessage `json:"functions"`
	FunctionCall        json.RawMessage `json:"function_call"`
	Modalities          json.RawMessage `json:"modalities"`
	Audio               json.RawMessage `json:"audio"`
	ReasoningEffort     json.RawMessage `json:"reasoning_effort"`
	Verbosity           json.RawMessage `json:"verbosity"`
	WebSearchOptions    json.RawMessage `json:"web_search_options"`
	Moderation          json.RawMessage `json:"moderation"`
	Store               json.RawMessage `json:"store"`
	// Accepted, no effect: what OpenAI keeps or bills by, and hints about
	// caching or the answer that do not change it.
	Metadata             json.RawMessage `json:"metadata"`
	ServiceTier          *string         `json:"service_tier"`
	SafetyIdentifier     *string         `json:"safety_identifier"`
	PromptCacheRetention *string         `json:"prompt_cache_retention"`
	PromptCacheOptions   json.RawMessage `json:"prompt_cache_options"`
	Prediction           json.RawMessage `json:"prediction"`
}

func (r *chatRequest) check() *apiError {
	const noTools = "tools are not supported"
	return firstError(r.common.check(),
		neutral("logprobs", r.Logprobs, "log probabilities are not returned: only false is taken", "false"),
		neutral("top_logprobs", r.TopLogprobs, "log probabilities are not returned: only 0 is taken", "0"),
		neutral("response_format", r.ResponseFormat, `only text is generated: only {"type":"text"} is taken`, `{"type":"text"}`),
		neutral("tools", r.Tools, noTools+": only [] is taken", "[]"),
		neutral("tool_choice", r.ToolChoice, noTools+`: only "none" or "auto" is taken`, `"none"`, `"auto"`),
		neutral("functions", r.Functions, noTools+": only [] is taken", "[]"),
		neutral("function_call", r.FunctionCall, noTools+`: only "none" or "auto" is taken`, `"none"`, `"auto"`),
		neutral("modalities", r.Modalities, `only text is generated: only ["text"] is taken`, `["text"]`),
		neutral("audio", r.Audio, "no audio is generated: only null is taken"),
		neutral("reasoning_effort", r.ReasoningEffort, `this model does not reason: only "none" is taken`, `"none"`),
		neutral("verbosity", r.Verbosity, `it would change the answer: only the default, "medium", is taken`, `"medium"`),
		neutral("web_search_options", r.WebSearchOptions, "the web is not searched: only null is taken"),
		neutral("moderation", r.Moderation, "no moderation is run: only null is taken"),
		neutral("store", r.Store, "answers are not stored: only false is taken", "false"),
		object("metadata", r.Metadata), object("prompt_cache_options", r.PromptCacheOptions),
		object("prediction", r.Prediction),
	)
}

// chatMessage is one of a chat's messages: its role and content are
// honoured; the other fields OpenAI defines for messages are refused
// unless empty.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	Name       json.RawMessage `json:"name"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID json.RawMessage `json:"tool_call_id"`
	// FunctionCall, Audio and Refusal are an assistant message's parts
	// other than its text.
	FunctionCall json.RawMessage `json:"function_call"`
	Audio        json.RawMessage `json:"audio"`
	Refusal      json.RawMessage `json:"refusal"`
}

// check refuses what ChatPrompt's template cannot carry, the message's
// path (messages[i]) naming it.
func (m chatMessage) check(path string) *apiError {
	return firstError(
		neutral(path+".name", m.Name, `names are not part of the prompt here: only "" is taken`, `""`),
		neutral(path+".tool_calls", m.ToolCalls, "tools are not supported: only [] is taken", "[]"),
		neutral(path+".tool_call_id", m.ToolCallID, `tools are not supported: only "" is taken`, `""`),
		neutral(path+".function_call", m.FunctionCall, "tools are not supported: only null is taken"),
		neutral(path+".audio", m.Audio, "audio is not part of the prompt here: only null is taken"),
		neutral(path+".refusal", m.Refusal, `refusals are not part of the prompt here: only "" is taken`, `""`),
	)
}

// textPart is a chat message's content part; only text is taken.
type textPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
	// PromptCacheBreakpoint is a caching hint to OpenAI. Accepted, no
	// effect.
	PromptCacheBreakpoint json.RawMessage `json:"prompt_cache_breakpoint"`
}

// text is a message's content: a string, or an array of text parts, each
// checked and taken as it is decoded (none kept, however many the body
// holds). path names the content (messages[i].content).
func (m chatMessage) text(path string) (string, *apiError) {
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	if len(m.Content) == 0 || m.Content[0] != '[' {
		return "", badRequest(path, "%s must be a string or an array of text parts, not %s", path, shown(m.Content))
	}
	var b strings.Builder
	i := 0
	err := decodeEach(m.Content, func(raw json.RawMessage) error {
		// The type first: another kind of part has fields of its own.
		var p textPart
		if err := json.Unmarshal(raw, &struct {
			Type *string `json:"type"`
		}{&p.Type}); err != nil || p.Type != "text" {
			return &partTypeError{Part: i, Type: p.Type}
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return &elementError{Index: i, Err: err}
		}
		b.WriteString(p.Text)
		i++
		return nil
	})
	var typed *partTypeError
	switch {
	case errors.As(err, &typed):
		return "", badRequest(fmt.Sprintf("%s[%d].type", path, typed.Part), "%s[%d] is of type %q; only text parts are taken",
			path, typed.Part, typed.Type)
	case err != nil:
		return "", jsonError(path, err)
	}
	return b.String(), nil
}

// partTypeError is a chat message's content part of a type not taken.
type partTypeError struct {
	Part int
	Type string
}

func (e *partTypeError) Error() string {
	return fmt.Sprintf("content part %d is of type %q; only text is taken", e.Part, e.Type)
}

// firstError is the first of es that is not nil. Each check is cheap and
// none has effects, so a request's checks are listed in one call.
func firstError(es ...*apiError) *apiError {
	for _, e := range es {
		if e != nil {
			return e
		}
	}
	return nil
}

// neutral refuses field's value, raw, unless it is absent, null or one of
// values (compact JSON): why says what the API does instead.
func neutral(field string, raw json.RawMessage, why string, values ...string) *apiError {
	if len(raw) == 0 {
		return nil
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) == nil && (b.String() == "null" || slices.Contains(values, b.String())) {
		return nil
	}
	return badRequest(field, "%s is %s; %s", field, shown(raw), why)
}

// inRange refuses a sampling field outside OpenAI's range of 0 to hi:
// within it, it is taken and has no effect.
func inRange(field string, v *float64, hi float64) *apiError {
	if v != nil && (*v < 0 || *v > hi) {
		return badRequest(field, "%s is %g; want 0 to %g (it has no effect: %s)", field, *v, hi, greedy)
	}
	return nil
}

// onlyZero refuses a penalty other than 0.
func onlyZero(field string, v *float64) *apiError {
	if v != nil && *v != 0 {
		return badRequest(field, "%s is %g; %s, without penalties: only 0 is taken", field, *v, greedy)
	}
	return nil
}

// object refuses a field accepted with no effect unless it is absent, null
// or a JSON object, as OpenAI defines it.
func object(field string, raw json.RawMessage) *apiError {
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] == '{' || string(t) == "null" {
		return nil
	}
	return badRequest(field, "%s must be an object, not %s", field, shown(raw))
}

// shownMax bounds how much of a value an error message repeats.
const shownMax = 64

// shown is raw, a JSON value, as an error message repeats it: compact, or
// its kind and size when longer than shownMax bytes.
func shown(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return "not JSON"
	}
	if b.Len() <= shownMax {
		return b.String()
	}
	kind := map[byte]string{'{': "an object", '[': "an array", '"': "a string"}[b.Bytes()[0]]
	if kind == "" {
		kind = "a value"
	}
	return fmt.Sprintf("%s of %d bytes", kind, b.Len())
}

// elementError is an error decoding element Index of a JSON array.
type elementError struct {
	Index int
	Err   error
}

func (e *elementError) Error() string { return fmt.Sprintf("element %d: %v", e.Index, e.Err) }

func (e *elementError) Unwrap() error { return e.Err }

// jsonError is the API's answer to an error decoding the JSON value at
// path ("" for the body itself), naming the field as the API does.
func jsonError(path string, err error) *apiError {
	var (
		elem     *elementError
		notArray *notArrayError
		typ      *json.UnmarshalTypeError
		syntax   *json.SyntaxError
	)
	switch {
	case errors.As(err, &elem):
		return jsonError(fmt.Sprintf("%s[%d]", path, elem.Index), elem.Err)
	case errors.As(err, &notArray):
		return badRequest(path, "%s must be an array, not %s", bodyName(path), shown(notArray.raw))
	case errors.As(err, &typ):
		// The Go name of the embedded struct is no field of the API's.
		field := join(path, strings.TrimPrefix(typ.Field, "common."))
		if field == "" {
			return badRequest("", "the request body must be a JSON object, not %s", jsonValue(typ.Value))
		}
		if n, e := strconv.ParseFloat(strings.TrimPrefix(typ.Value, "number "), 64); e == nil && n == math.Trunc(n) &&
			isInteger(typ.Type) {
			return badRequest(field, "%s is %s, out of range", field, strings.TrimPrefix(typ.Value, "number "))
		}
		return badRequest(field, "%s must be %s, not %s", field, jsonType(typ.Type), jsonValue(typ.Value))
	case errors.As(err, &syntax):
		return badRequest(path, "%s is not valid JSON: %v (at byte %d)", bodyName(path), syntax, syntax.Offset)
	case errors.Is(err, io.EOF):
		return badRequest(path, "%s is empty; want a JSON object", bodyName(path))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest(path, "%s ends inside its JSON value", bodyName(path))
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ = strconv.Unquote(name)
		return badRequest(join(path, name), "unknown field %q: not one of the fields OpenAI defines here", join(path, name))
	}
	return badRequest(path, "%s is not the JSON expected: %v", bodyName(path), err)
}

// bodyName is how an error names the value at path.
func bodyName(path string) string {
	if path == "" {
		return "the request body"
	}
	return path
}

// join is field under path.
func join(path, field string) string {
	switch {
	case path == "":
		return field
	case field == "":
		return path
	}
	return path + "." + field
}

// jsonType is the JSON kind a Go type decodes from, as an error names it.
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case isInteger(t):
		return "an integer"
	case t.Kind() == reflect.Float64 || t.Kind() == reflect.Float32:
		return "a number"
	case t.Kind() == reflect.Bool:
		return "a boolean"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Slice:
		return "an array"
	}
	return "an object"
}

func isInteger(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// jsonValue is encoding/json's description of a value ("string", "number
// 1.5") as an error names it.
func jsonValue(v string) string {
	if n, ok := strings.CutPrefix(v, "number "); ok {
		return n
	}
	switch v {
	case "array", "object":
		return "an " + v
	case "bool":
		return "a boolean"
	}
	return "a " + v
}
