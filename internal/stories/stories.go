// Package stories finds, for tests and benchmarks, the stories260K model
// that lives outside the repository at ../shared/models/stories260K/
// (relative to the repository root), and the text its README publishes for
// greedy decoding. The model files are never part of the repository.
//
// Without the files a test is skipped, and fails when the environment
// variable CI is "true": CI must run the tests that need the real model.
package stories

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Dir is the model's directory: ../shared/models/stories260K/ from the
// repository root, found from this file's place in the repository.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	return filepath.Join(root, "..", "shared", "models", "stories260K")
}

// Files returns the paths of the checkpoint and its tokenizer.
func Files(tb testing.TB) (model, tokenizer string) {
	tb.Helper()
	model = filepath.Join(Dir(), "stories260K.bin")
	tokenizer = filepath.Join(Dir(), "tok512.bin")
	for _, p := range []string{model, tokenizer} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CI") == "true" {
				tb.Fatalf("the stories260K model is required in CI: %v", err)
			}
			tb.Skipf("the stories260K model is not at %s: %v", Dir(), err)
		}
	}
	return model, tokenizer
}

// Published is the text the model card says greedy decoding writes from
// an empty prompt in 256 positions: the fenced block under the README's
// "What it must say", without the newline that closes its last line.
func Published(tb testing.TB) string {
	tb.Helper()
	Files(tb)
	readme, err := os.ReadFile(filepath.Join(Dir(), "README.md"))
	if err != nil {
		tb.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "## What it must say")
	if ok {
		_, section, ok = strings.Cut(section, "```\n")
	}
	text, _, closed := strings.Cut(section, "\n```")
	if !ok || !closed {
		tb.Fatal("the README has no fenced block under \"What it must say\"")
	}
	return text
}

// PublishedTokens is how many tokens the published text is: llama2.c's
// runner, given 256 positions and the one-token empty prompt, generates
// one token at each.
const PublishedTokens = 256

// GGUF returns the path of the model as GGUF of the given type: "f32",
// "f16" or "q8_0".
func GGUF(tb testing.TB, typ string) string {
	tb.Helper()
	Files(tb)
	p := filepath.Join(Dir(), "stories260K-"+typ+".gguf")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("the stories260K GGUF files are required in CI: %v", err)
		}
		tb.Skipf("the stories260K GGUF file is not at %s: %v", p, err)
	}
	return p
}
