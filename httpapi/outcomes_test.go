//go:build !race

// Real nodes serving protoactor remote: see api_test.go.

package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/cluster"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// slowModel is the large built-in model in a 512-token window, whose
// decode steps take milliseconds: a request of a few hundred tokens is
// still generating when a stop sequence early in its text is found.
func slowModel(cfg *cluster.NodeConfig) {
	cfg.Actors.Model = engine.LargeModelConfig()
	cfg.Actors.Model.ContextTokens = 512
	cfg.Actors.ContextTokens, cfg.Actors.MaxTokensMax = 512, 448
}

// stopSequence is a stop sequence that first ends the reference answer to
// prompt (with stops besides) within its first dozen tokens: the text of
// two of its tokens from the third on, whole characters (a stream holds
// back an incomplete one, which the reference's text would end with), and
// the reference cut there (the text before it and the tokens up to the one
// that completed it).
func (a *apiNode) stopSequence(t *testing.T, prompt string, max int, stops ...string) (stop, cut string, tokens int) {
	t.Helper()
	answer, err := a.model.Answer(prompt, 12)
	if err != nil {
		t.Fatal(err)
	}
	for k := 2; k+2 <= len(answer); k++ {
		before, after := a.model.Text(prompt, answer[:k]), a.model.Text(prompt, answer[:k+2])
		stop, ok := strings.CutPrefix(after, before)
		if !ok || stop == "" || !utf8.ValidString(stop) || strings.ContainsRune(stop, utf8.RuneError) {
			continue
		}
		if cut, tokens, ok := a.reference(t, prompt, max, append(stops, stop)...); ok && tokens <= k+2 {
			return stop, cut, tokens
		}
	}
	t.Fatalf("no stop sequence of whole characters in the reference's first tokens %v", answer)
	return "", "", 0
}

// TestStopCountedAsCompleted: a request that ends at a stop sequence,
// whole or streamed, a completion or a chat, is answered with the text
// before it, finish_reason "stop" and the tokens up to the one that
// completed it, and every node on its path counts it as completed, none as
// failed or cancelled, in its status, its metrics and the line it logs: a
// node of role all, and a router with a prefill and a decode node. Every
// page is free after.
func TestStopCountedAsCompleted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T, log *slog.Logger) (*apiNode, []*cluster.Node)
	}{
		{"role all", func(t *testing.T, log *slog.Logger) (*apiNode, []*cluster.Node) {
			n, _ := startLogged(t, actors.RoleAll, slowModel, log)
			waitReady(t, n)
			return serveAPI(t, n), []*cluster.Node{n}
		}},
		{"router, prefill and decode", func(t *testing.T, log *slog.Logger) (*apiNode, []*cluster.Node) {
			p, _ := startAs(t, actors.RolePrefill, slowModel)
			d, _ := startLogged(t, actors.RoleDecode, slowModel, log, p.GossipAddr())
			r, _ := startAs(t, actors.RoleRouter, slowModel, p.GossipAddr())
			waitReady(t, r)
			return serveAPI(t, r), []*cluster.Node{r, p, d}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testwait.Buffer // the decoding node's
			a, nodes := tc.start(t, slog.New(slog.NewTextHandler(&logs, nil)))
			model := a.model.Name()
			c := a.sdk(keyAcme)
			ctx := context.Background()
			const prompt, max = "Once upon a time", 400
			stop, cut, n := a.stopSequence(t, prompt, max)
			params := openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(model), MaxTokens: openai.Int(max),
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
				Stop:   openai.CompletionNewParamsStopUnion{OfString: openai.String(stop)}}
			res, err := c.Completions.New(ctx, params)
			if err != nil || res.Choices[0].Text != cut || res.Choices[0].FinishReason != "stop" || res.Usage.CompletionTokens != int64(n) {
				t.Fatalf("a completion with stop %q: %+v, %v; want %q, finish stop, %d tokens", stop, res, err, cut, n)
			}
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			stream := c.Completions.NewStreaming(ctx, params)
			var text strings.Builder
			var finish string
			var usage int64
			for stream.Next() {
				for _, ch := range stream.Current().Choices {
					text.WriteString(ch.Text)
					finish += string(ch.FinishReason)
				}
				usage += stream.Current().Usage.CompletionTokens
			}
			if err := stream.Err(); err != nil || text.String() != cut || finish != "stop" || usage != int64(n) {
				t.Fatalf("a streamed completion with stop %q: %q (finish %q, %d tokens), %v; want %q, stop, %d", stop,
					text.String(), finish, usage, err, cut, n)
			}

			chatPrompt := "User: " + prompt + "\nAssistant:"
			stop, cut, n = a.stopSequence(t, chatPrompt, max, ChatTurnStop)
			chat := openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(max),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
				Stop:     openai.ChatCompletionNewParamsStopUnion{OfString: openai.String(stop)}}
			reply, err := c.Chat.Completions.New(ctx, chat)
			if err != nil || reply.Choices[0].Message.Content != cut || reply.Choices[0].FinishReason != "stop" ||
				reply.Usage.CompletionTokens != int64(n) {
				t.Fatalf("a chat with stop %q: %+v, %v; want %q, finish stop, %d tokens", stop, reply, err, cut, n)
			}
			chunks := c.Chat.Completions.NewStreaming(ctx, chat)
			acc := openai.ChatCompletionAccumulator{}
			for chunks.Next() {
				acc.AddChunk(chunks.Current())
			}
			if err := chunks.Err(); err != nil || acc.Choices[0].Message.Content != cut || acc.Choices[0].FinishReason != "stop" {
				t.Fatalf("a streamed chat with stop %q: %+v, %v; want %q, finish stop", stop, acc.Choices, err, cut)
			}

			for _, node := range nodes {
				testwait.Report(t, "the stopped requests ended and every page is free", time.Minute, func() (bool, string) {
					s := node.Status().Node
					free := true
					for _, p := range s.Pools {
						free = free && p.Idle()
					}
					return s.InFlight == 0 && free, s.Name + ": " + s.Role
				})
				s := node.Status().Node
				if s.Role == messages.RolePrefill {
					continue
				}
				if s.Completed != 4 || s.Failed != 0 || countAt(s.FailedByCode, messages.CodeCancelled) != 0 {
					t.Errorf("%s (%s) counted %d completed, %d failed (%v by code), want the 4 completed", s.Name, s.Role,
						s.Completed, s.Failed, s.FailedByCode)
				}
				wantSeries(t, s.Role+" after 4 stopped requests", scrape(t, serve(t, node)), map[string]float64{
					`kvwarden_requests_finished_total{outcome="completed"}`: 4,
					`kvwarden_requests_finished_total{outcome="failed"}`:    0,
					`kvwarden_requests_failed_total{code="cancelled"}`:      0,
				})
			}
			ended := strings.Count(logs.String(), `msg="request ended"`)
			if completed := strings.Count(logs.String(), "outcome=completed"); ended != 4 || completed != 4 {
				t.Errorf("the decoding node logged %d requests ended, %d completed; want the 4 completed:\n%s", ended, completed,
					logs.String())
			}
		})
	}
}

// countAt is counts' entry for code, 0 past its end.
func countAt(counts []uint64, code messages.ErrorCode) uint64 {
	if int(code) < len(counts) {
		return counts[code]
	}
	return 0
}

// TestNoNodeInSightIs503: with no decode node in a router's sight (the
// only one stopped), or no prefill node in a decode node's, a request is
// answered 503, code unavailable, naming the role missing, without
// Retry-After (nothing says when a node will join), as /readyz says 503
// naming it; the router's refusal is counted as unavailable, not busy.
func TestNoNodeInSightIs503(t *testing.T) {
	p, _ := startAs(t, actors.RolePrefill, nil)
	d, _ := startAs(t, actors.RoleDecode, nil, p.GossipAddr())
	r, rs := startAs(t, actors.RoleRouter, nil, p.GossipAddr())
	waitReady(t, r)
	router := serveAPI(t, r)
	d.Stop()
	testwait.For(t, "the router sees no decode node", time.Minute, func() bool {
		code, body := get(t, rs.URL+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "no decode node")
	})
	body := `{"model":"builtin","prompt":"hi","max_tokens":2}`
	status, retry, e := post(t, router.srv.URL+"/v1/completions", keyAcme, body)
	if status != http.StatusServiceUnavailable || retry != "" || e.Code != "unavailable" || e.Type != "server_error" ||
		!strings.HasPrefix(e.Message, "no decode node is in sight (0 decode and 1 prefill nodes of model ") || e.Detail == nil || e.Detail.Code != uint16(messages.CodeUnavailable) ||
		e.Detail.Where != "decode nodes" {
		t.Errorf("a request with no decode node in sight: %d (Retry-After %q) %+v %+v, want 503 unavailable naming decode",
			status, retry, e, e.Detail)
	}
	wantSeries(t, "after the refusal", scrape(t, rs), map[string]float64{
		`kvwarden_requests_rejected_total{reason="unavailable"}`: 1,
		`kvwarden_requests_rejected_total{reason="busy"}`:        0,
	})

	alone, as := startAs(t, actors.RoleDecode, nil)
	status, retry, e = post(t, serveAPI(t, alone).srv.URL+"/v1/completions", keyAcme, body)
	if code, ready := get(t, as.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(ready, "no prefill node") {
		t.Errorf("/readyz of a decode node alone: %d %q", code, ready)
	}
	if status != http.StatusServiceUnavailable || retry != "" || e.Code != "unavailable" || e.Message != "no prefill node is in sight" {
		t.Errorf("a decode node alone: %d (Retry-After %q) %+v, want 503 unavailable naming prefill", status, retry, e)
	}
}

// TestClusterRefusalsNamed: a refusal that comes from the cluster names
// the API's field and the figures, never a package of the cluster's: a
// prompt over the node's prefill pool names prompt, a prompt and
// max_tokens over its decode pool name max_tokens, and a draining node's
// busy is the cluster's message without the package it came from.
func TestClusterRefusalsNamed(t *testing.T) {
	n, _ := startAs(t, actors.RoleAll, func(cfg *cluster.NodeConfig) {
		cfg.Actors.PrefillPages, cfg.Actors.DecodePages = 24, 8 // 384 and 128 tokens
	})
	waitReady(t, n)
	url := serveAPI(t, n).srv.URL + "/v1/completions"
	for _, tc := range []struct {
		body, param, message, where string
	}{
		{`{"model":"builtin","max_tokens":1,"prompt":"` + strings.Repeat("x", 400) + `"}`, "prompt",
			"the prompt is 401 tokens, over the 384 the smallest prefill pool on its path holds", "prefill pool"},
		{`{"model":"builtin","max_tokens":64,"prompt":"` + strings.Repeat("x", 100) + `"}`, "max_tokens",
			"the prompt and max_tokens need 165 tokens, over the 128 the smallest decode pool on its path holds", "decode pool"},
	} {
		status, _, e := post(t, url, keyAcme, tc.body)
		if status != http.StatusBadRequest || e.Code != "prompt_too_long" || e.Param == nil || *e.Param != tc.param ||
			e.Message != tc.message || e.Detail == nil || e.Detail.Where != tc.where {
			t.Errorf("%s: %d %+v %+v, want 400 prompt_too_long param %q %q", tc.where, status, e, e.Detail, tc.param, tc.message)
		}
	}
	if _, err := n.Actors().Drain(); err != nil {
		t.Fatal(err)
	}
	status, retry, e := post(t, url, keyAcme, `{"model":"builtin","max_tokens":1,"prompt":"x"}`)
	if status != http.StatusTooManyRequests || retry != "1" || e.Code != "busy" || e.Message != "busy: draining node is full (0 of 0)" {
		t.Errorf("a draining node: %d (Retry-After %q) %+v, want 429 busy with the cluster's message", status, retry, e)
	}
}
