package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kvwarden/kvwarden/bench"
)

// Bounds of reading the HTTP API's answers.
const (
	// sseLineBytesMax bounds one line of an event stream: one chunk of
	// text, well under this.
	sseLineBytesMax = 1 << 20
	// errorBodyBytesMax bounds the body of a refusal read for its code.
	errorBodyBytesMax = 64 << 10
)

// httpSender sends through the OpenAI-compatible API: POST
// /v1/completions with stream and include_usage, tenant i with keys[i %
// len(keys)] (the tenant of a request is its key's). A request that goes
// noAnswerAfter without a line of its answer (or its headers) is given up
// as codeNoAnswer, as the Go client gives one up: an API that accepts and
// never answers would otherwise hold the run until it is interrupted.
type httpSender struct {
	url           string
	keys          []string
	model         string
	noAnswerAfter time.Duration
	client        *http.Client
}

// codeNoAnswer is a request over HTTP given up after noAnswerAfter
// without a line.
const codeNoAnswer = "http_no_answer"

func newHTTPSender(url string, keys []string, model string, concurrency int, noAnswerAfter time.Duration) *httpSender {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = concurrency
	return &httpSender{url: strings.TrimRight(url, "/") + "/v1/completions", keys: keys, model: model, noAnswerAfter: noAnswerAfter,
		client: &http.Client{Transport: tr}}
}

func (h *httpSender) close() { h.client.CloseIdleConnections() }

// sseChunk is what one event of the stream holds: text, a usage, or an
// error.
type sseChunk struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Code string `json:"code"`
	} `json:"error"`
}

func (h *httpSender) send(ctx context.Context, tenant int, s bench.Shape) answer {
	body, _ := json.Marshal(map[string]any{"model": h.model, "prompt": s.Prompt, "max_tokens": s.MaxTokens, "stream": true,
		"stream_options": map[string]bool{"include_usage": true}})
	t := newTimer()
	// quiet ends the request once noAnswerAfter passes with no line read.
	quietCtx, quit := context.WithCancel(ctx)
	defer quit()
	quiet := time.AfterFunc(h.noAnswerAfter, quit)
	defer quiet.Stop()
	req, err := http.NewRequestWithContext(quietCtx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		a := t.end()
		a.code = "http_request"
		return a
	}
	req.Header.Set("Authorization", "Bearer "+h.keys[tenant%len(h.keys)])
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		a := t.end()
		a.code = "http_unreachable"
		switch {
		case ctx.Err() != nil:
			a.code = "cancelled"
		case quietCtx.Err() != nil:
			a.code = codeNoAnswer
		}
		return a
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e sseChunk
		data, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytesMax))
		_ = json.Unmarshal(data, &e)
		a := t.end()
		a.code = fmt.Sprintf("http_%d", resp.StatusCode)
		if e.Error != nil && e.Error.Code != "" {
			a.code += "_" + e.Error.Code
		}
		return a
	}
	a := h.read(resp.Body, t, quiet)
	if a.code == "http_stream_ended" && ctx.Err() == nil && quietCtx.Err() != nil {
		a.code = codeNoAnswer
	}
	return a
}

// read takes the event stream: a chunk of text per token (or per few),
// the usage, then [DONE], resetting quiet at each line. A stream that ends
// without [DONE] failed.
func (h *httpSender) read(r io.Reader, t *timer, quiet *time.Timer) answer {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), sseLineBytesMax)
	var text strings.Builder
	count, cached, done, code := 0, 0, false, ""
	for sc.Scan() && !done && code == "" {
		quiet.Reset(h.noAnswerAfter)
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c sseChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			code = "http_bad_event"
			continue
		}
		switch {
		case c.Error != nil:
			code = "http_stream_" + c.Error.Code
		case c.Usage != nil:
			count = c.Usage.CompletionTokens
			if d := c.Usage.PromptTokensDetails; d != nil {
				cached = d.CachedTokens
			}
		case len(c.Choices) == 1 && c.Choices[0].Text != "":
			t.tokens(1)
			text.WriteString(c.Choices[0].Text)
		}
	}
	a := t.end()
	switch {
	case code != "":
		a.code = code
	case !done:
		a.code = "http_stream_ended"
	}
	a.text, a.count, a.cached = text.String(), count, cached
	return a
}
