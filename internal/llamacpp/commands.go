package llamacpp

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
)

// Info is what every reply says about the llama.cpp that answered.
type Info struct {
	NodeLlamaCpp string `json:"node_llama_cpp"` // node-llama-cpp's version
	LlamaCpp     string `json:"llama_cpp"`      // "repo@release" of the llama.cpp it bundles
	Build        string `json:"build"`          // "prebuilt" (or "localBuild")
	GPU          string `json:"gpu"`            // always "none": run.mjs refuses anything else
	// CPUBackend is the ggml CPU library ggml chose for this processor,
	// such as libggml-cpu-haswell.so (AVX2) or -zen4 / -sapphirerapids
	// (AVX-512); "" if ggml did not say. Quantized results can differ
	// between them (sums in another order).
	CPUBackend  string  `json:"cpu_backend"`
	SystemInfo  string  `json:"system_info"`  // llama.cpp's llama_print_system_info
	LoadSeconds float64 `json:"load_seconds"` // starting llama.cpp, loading the model (and context)

	// Set by the commands that evaluate (greedy, forced, bench).
	Threads        int    `json:"threads,omitempty"`
	ContextSize    int    `json:"context_size,omitempty"` // tokens, as llama.cpp made it
	BatchSize      int    `json:"batch_size,omitempty"`
	FlashAttention bool   `json:"flash_attention,omitempty"`
	KVType         string `json:"kv_type,omitempty"`
}

// Setup is how llama.cpp evaluates: the fields of every command that does.
type Setup struct {
	// Threads is how many CPU threads evaluate; at least 1.
	Threads int `json:"threads"`
	// ContextSize is the context in tokens; zero means the model's
	// training context. llama.cpp rounds it up to a multiple of 256.
	ContextSize int `json:"context_size,omitempty"`
	// KVType is the KV cache's type: "f16" (llama.cpp's default; "" means
	// it) or "f32".
	KVType string `json:"kv_type,omitempty"`
	// FlashAttention turns on llama.cpp's flash-attention path; off, it
	// computes attention as softmax(QKᵀ)V.
	FlashAttention bool `json:"flash_attention,omitempty"`
}

// Candidate is one of a position's most likely next tokens.
type Candidate struct {
	ID int `json:"id"`
	// Value is the token's log-probability (see Kind): softmax in float32
	// over the whole vocabulary, as llama.cpp's sampler computed it.
	Value float64 `json:"value"`
}

// KindLogProbs is the Kind of every greedy and forced reply: Candidate
// values are log-probabilities, since node-llama-cpp 3.21.1 exposes
// probabilities but not logits. A reply of another kind is a *ReplyError.
const KindLogProbs = "logprobs"

// TokenizeRequest asks for the token ids of Text.
type TokenizeRequest struct {
	Model string `json:"model"` // a GGUF file
	Text  string `json:"text"`
	// Special makes control-token text such as "<s>" in Text that token
	// (llama.cpp's parse_special); without it such text is plain text.
	Special bool `json:"special,omitempty"`
}

// TokenizeResult is llama_tokenize(add_special = true): BOS when the model
// adds one, then the tokenizer's ids for the text (with the space prefix
// of a SentencePiece vocabulary that asks for it), then EOS when the model
// adds one.
type TokenizeResult struct {
	Info    Info  `json:"info"`
	Tokens  []int `json:"tokens"`
	Options struct {
		AddSpecial   bool `json:"add_special"`
		ParseSpecial bool `json:"parse_special"`
	} `json:"options"`
}

// Tokenize returns llama.cpp's token ids for a text.
func (h *Harness) Tokenize(ctx context.Context, req TokenizeRequest) (*TokenizeResult, error) {
	var res TokenizeResult
	what := fmt.Sprintf("%d bytes of text, %s", len(req.Text), filepath.Base(req.Model))
	if err := h.call(ctx, "tokenize", what, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// VocabResult is a model's vocabulary as its GGUF file stores it
// (tokenizer.ggml.tokens, .scores and .token_type): pieces with a space
// written as U+2581, byte tokens as "<0xHH>". Types are SentencePiece's: 1
// normal, 2 unknown, 3 control, 6 byte.
type VocabResult struct {
	Info   Info      `json:"info"`
	Pieces []string  `json:"pieces"`
	Scores []float32 `json:"scores"`
	Types  []int     `json:"types"`
}

// Vocab returns the model's vocabulary, for decoding token ids to text.
func (h *Harness) Vocab(ctx context.Context, model string) (*VocabResult, error) {
	var res VocabResult
	if err := h.call(ctx, "vocab", filepath.Base(model), map[string]string{"model": model}, &res); err != nil {
		return nil, err
	}
	if len(res.Scores) != len(res.Pieces) || len(res.Types) != len(res.Pieces) {
		return nil, &ReplyError{Command: "vocab", What: filepath.Base(model), Err: fmt.Errorf(
			"%d pieces, %d scores, %d types", len(res.Pieces), len(res.Scores), len(res.Types))}
	}
	return &res, nil
}

// GreedyRequest asks for N tokens after Prompt, each the most likely one.
type GreedyRequest struct {
	Model  string `json:"model"`
	Prompt []int  `json:"prompt"` // token ids, BOS included if wanted
	N      int    `json:"n"`
	TopK   int    `json:"top_k,omitempty"` // candidates per step; zero means 8
	Setup
}

// GreedyResult is llama.cpp's greedy decoding: temperature 0 (its greedy
// sampler, ties to the lower id), no penalties, bias or grammar, not
// stopping at EOS or BOS.
type GreedyResult struct {
	Info   Info          `json:"info"`
	Kind   string        `json:"kind"`
	Tokens []int         `json:"tokens"`
	Top    [][]Candidate `json:"top"` // Top[i]: step i's candidates, most likely first; Top[i][0].ID is Tokens[i]
	// ContextFull is set when the context ran out before N tokens (len(Tokens)
	// is then context size − prompt length); llama.cpp never shifts it.
	ContextFull bool    `json:"context_full"`
	Seconds     float64 `json:"seconds"` // prompt and generation
}

// Greedy decodes greedily from a prompt.
func (h *Harness) Greedy(ctx context.Context, req GreedyRequest) (*GreedyResult, error) {
	var res GreedyResult
	what := fmt.Sprintf("%d tokens after %d, %s", req.N, len(req.Prompt), filepath.Base(req.Model))
	if err := h.call(ctx, "greedy", what, req, &res); err != nil {
		return nil, err
	}
	if res.Kind != KindLogProbs || len(res.Top) != len(res.Tokens) || len(res.Tokens) > req.N {
		return nil, &ReplyError{Command: "greedy", What: what, Err: fmt.Errorf(
			"%q: %d tokens and %d candidate lists for %d asked", res.Kind, len(res.Tokens), len(res.Top), req.N)}
	}
	return &res, nil
}

// ForcedRequest asks for the next-token distribution after every prefix of
// Tokens.
type ForcedRequest struct {
	Model  string `json:"model"`
	Tokens []int  `json:"tokens"`          // at most context size − 1
	TopK   int    `json:"top_k,omitempty"` // candidates per position; zero means 8
	Setup
}

// ForcedResult is teacher forcing: Top[i] are the most likely tokens to
// follow Tokens[0..i], all from one evaluation of the whole sequence (one
// llama_decode with an output at every position).
type ForcedResult struct {
	Info    Info          `json:"info"`
	Kind    string        `json:"kind"`
	Top     [][]Candidate `json:"top"`
	Seconds float64       `json:"seconds"`
}

// Forced evaluates a sequence once and returns every position's
// candidates for the next token.
func (h *Harness) Forced(ctx context.Context, req ForcedRequest) (*ForcedResult, error) {
	var res ForcedResult
	what := fmt.Sprintf("%d tokens, %s", len(req.Tokens), filepath.Base(req.Model))
	if err := h.call(ctx, "forced", what, req, &res); err != nil {
		return nil, err
	}
	if res.Kind != KindLogProbs || len(res.Top) != len(req.Tokens) {
		return nil, &ReplyError{Command: "forced", What: what, Err: fmt.Errorf(
			"%q: %d candidate lists for %d tokens", res.Kind, len(res.Top), len(req.Tokens))}
	}
	return &res, nil
}

// BenchRequest asks for Runs timings of N tokens decoded one at a time
// after Prompt.
type BenchRequest struct {
	Model  string `json:"model"`
	Prompt []int  `json:"prompt"`
	N      int    `json:"n"`
	Runs   int    `json:"runs,omitempty"` // zero means DefaultBenchRuns
	Setup
}

// DefaultBenchRuns is how many runs a BenchRequest with zero Runs gets.
const DefaultBenchRuns = 3

// BenchRun is one run from an empty context: the prompt and the first
// token, then N one-token decodes (greedy sampling included), timed.
type BenchRun struct {
	PromptSeconds float64 `json:"prompt_seconds"` // evaluating the prompt, sampling the first token
	Seconds       float64 `json:"seconds"`        // the N decodes after it
	Tokens        int     `json:"tokens"`         // N
}

// TokensPerSecond is the run's single-stream decode rate.
func (r BenchRun) TokensPerSecond() float64 { return float64(r.Tokens) / r.Seconds }

// BenchResult is the runs in order; Info.LoadSeconds is the load, once.
type BenchResult struct {
	Info Info       `json:"info"`
	Runs []BenchRun `json:"runs"`
}

// Bench measures single-stream decode speed.
func (h *Harness) Bench(ctx context.Context, req BenchRequest) (*BenchResult, error) {
	var res BenchResult
	req.Runs = cmp.Or(req.Runs, DefaultBenchRuns)
	what := fmt.Sprintf("%d tokens after %d, %s", req.N, len(req.Prompt), filepath.Base(req.Model))
	if err := h.call(ctx, "bench", what, req, &res); err != nil {
		return nil, err
	}
	if len(res.Runs) != req.Runs {
		return nil, &ReplyError{Command: "bench", What: what, Err: fmt.Errorf("%d runs for %d asked", len(res.Runs), req.Runs)}
	}
	for i, r := range res.Runs {
		if r.Tokens != req.N || r.Seconds <= 0 {
			return nil, &ReplyError{Command: "bench", What: what, Err: fmt.Errorf(
				"run %d: %d tokens in %g s for %d asked", i, r.Tokens, r.Seconds, req.N)}
		}
	}
	return &res, nil
}
