package actors

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/stories"
	"github.com/kvwarden/kvwarden/kv"
)

// storiesConfig is testConfig serving stories260K with K and V of dt: its
// 512-token context, room for the published 256-token answer.
func storiesConfig(t *testing.T, dt kv.DType) (Config, Options) {
	m := modeltest.Stories(t, dt)
	cfg := testConfig()
	cfg.Model = m.Config()
	cfg.ContextTokens = m.Config().ContextTokens
	cfg.MaxTokensMax = stories.PublishedTokens
	return cfg, Options{Model: m}
}

// TestStoriesPublishedText: one node, prefill and decode each in its own
// pool with the KV moved between them, writes the model card's story from
// an empty prompt, word for word, streamed and in the result.
func TestStoriesPublishedText(t *testing.T) {
	cfg, opt := storiesConfig(t, kv.F32)
	n := startNodeWith(t, cfg, opt)
	var streamed strings.Builder
	res, err := localClient(n).Generate(context.Background(), "acme", "",
		client.GenerateOptions{MaxTokens: stories.PublishedTokens, OnText: func(s string) { streamed.WriteString(s) }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := stories.Published(t)
	if res.Text != want {
		t.Fatalf("the node wrote\n%s\nthe model card publishes\n%s", res.Text, want)
	}
	if streamed.String() != want {
		t.Fatalf("the stream wrote\n%s", streamed.String())
	}
	if len(res.Tokens) != stories.PublishedTokens || res.Finish != "length" {
		t.Fatalf("%d tokens, finish %s: want %d, length", len(res.Tokens), res.Finish, stories.PublishedTokens)
	}
	stopsAtBOS(t, opt.Model, localClient(n))
}

// stopsAtBOS: generation stops where the model emits its stop token (BOS
// for stories260K): after "The little dog" the reference emits it as its
// 218th token, so a node that stopped at another token, or at none,
// answers otherwise.
func stopsAtBOS(t *testing.T, m *engine.Model, c *client.Client) {
	t.Helper()
	const prompt = "The little dog"
	res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: stories.PublishedTokens}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := m.Answer(prompt, stories.PublishedTokens)
	if err != nil {
		t.Fatal(err)
	}
	if stop := m.Tokenizer().Stop(); len(want) != 218 || want[217] != stop || res.Finish != "stop" ||
		!slices.Equal(res.Tokens, want) {
		t.Fatalf("%q: the node answered %d tokens (finish %s), the reference %d ending %d; the stop token is %d",
			prompt, len(res.Tokens), res.Finish, len(want), want[len(want)-1], stop)
	}
}

// TestStoriesPathsAgree: prompts of text, answered by a node over pages
// moved between pools, equal the in-process reference over one contiguous
// cache, token for token, in every KV type; the half-precision types write
// text, and where they part from the f32 story is logged.
func TestStoriesPathsAgree(t *testing.T) {
	prompts := []string{"Once upon a time", "Lily and Ben went to the park.", "The little dog", "é 🙂"}
	f32 := modeltest.Stories(t, kv.F32)
	for _, dt := range []kv.DType{kv.F32, kv.F16, kv.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			cfg, opt := storiesConfig(t, dt)
			n := startNodeWith(t, cfg, opt)
			c := localClient(n)
			for _, p := range append(prompts, "") {
				res, err := c.Generate(context.Background(), "acme", p, client.GenerateOptions{MaxTokens: 96}, nil)
				if err != nil {
					t.Fatal(err)
				}
				want, err := opt.Model.Answer(p, 96)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(res.Tokens, want) || res.Text != opt.Model.Text(p, want) {
					t.Fatalf("prompt %q: the node answered %v, the reference %v", p, res.Tokens, want)
				}
				if strings.TrimSpace(res.Text) == "" {
					t.Fatalf("prompt %q: no text", p)
				}
				if dt != kv.F32 {
					ref, _ := f32.Answer(p, 96)
					at := 0
					for at < min(len(ref), len(want)) && ref[at] == want[at] {
						at++
					}
					t.Logf("prompt %q: %s KV follows the f32 answer for %d of %d tokens", p, dt, at, len(want))
				}
			}
			if dt != kv.F32 {
				story, err := opt.Model.Answer("", stories.PublishedTokens)
				if err != nil {
					t.Fatal(err)
				}
				text := opt.Model.Text("", story)
				at := 0
				for at < min(len(text), len(stories.Published(t))) && text[at] == stories.Published(t)[at] {
					at++
				}
				t.Logf("the published story in %s KV: the first %d of %d bytes as published", dt, at, len(text))
			}
		})
	}
}
