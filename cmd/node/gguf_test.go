package main

import (
	"context"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/httpapi"
	"github.com/kvwarden/kvwarden/internal/stories"
)

// TestBinaryUpGGUF: node up serving stories260K-q8_0.gguf (Q8_0 weights,
// the tokenizer from the file), router, prefill and decode each a process
// with the KV moved over the data plane: the OpenAI API answers a
// completion and a chat with exactly the engine's answer for the file
// (which agrees with llama.cpp's: engine's TestAgainstLlamaCpp), counting
// the file's tokens, and a chat takes the plain template, the file having
// none. A --tokenizer beside a GGUF file is refused before any node
// starts.
func TestBinaryUpGGUF(t *testing.T) {
	path := stories.GGUF(t, "q8_0")
	code, out := runNode("up", "--model", path, "--tokenizer", path, "--prompt", "")
	if code != exitUsage || !strings.Contains(out, "is a GGUF file, which carries its tokenizer") {
		t.Fatalf("a GGUF file with --tokenizer: exit %d, want %d:\n%s", code, exitUsage, out)
	}
	m, err := engine.LoadGGUF(path, engine.GGUFOptions{})
	if err != nil {
		t.Fatal(err)
	}
	up := startUp(t, "--http", "127.0.0.1:0", "--model", path)
	c := openai.NewClient(option.WithBaseURL(up.baseURL+"/"), option.WithAPIKey(up.key), option.WithMaxRetries(0))
	ctx := context.Background()
	const prompt, max = "Once upon a time", 120
	tokens, err := m.Answer(prompt, max)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "stories260K-q8_0", MaxTokens: openai.Int(max),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}})
	if err != nil {
		t.Fatal(err)
	}
	if want := m.Text(prompt, tokens); res.Choices[0].Text != want || res.Usage.CompletionTokens != int64(len(tokens)) ||
		res.Usage.PromptTokens != int64(len(m.Tokenizer().Encode(prompt))) {
		t.Fatalf("the router answered %q (%d tokens after %d), the engine %q (%d after %d)", res.Choices[0].Text,
			res.Usage.CompletionTokens, res.Usage.PromptTokens, want, len(tokens), len(m.Tokenizer().Encode(prompt)))
	}
	chat, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "stories260K-q8_0", MaxTokens: openai.Int(16),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story")}})
	if err != nil {
		t.Fatal(err)
	}
	plain := "User: Tell me a story\nAssistant:"
	tokens, err = m.Answer(plain, 16)
	if err != nil {
		t.Fatal(err)
	}
	if want, _, _ := strings.Cut(m.Text(plain, tokens), httpapi.ChatTurnStop); chat.Choices[0].Message.Content != want {
		t.Fatalf("the chat answered %q; the engine, with the plain template, %q", chat.Choices[0].Message.Content, want)
	}
	up.stop(t)
}
