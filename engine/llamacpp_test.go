package engine

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/llamacpp"
	"github.com/kvwarden/kvwarden/internal/stories"
)

// The engine is checked against llama.cpp itself (internal/llamacpp), on
// the three GGUF files of stories260K, with llama.cpp's KV cache in F32 as
// the engine's, one thread, flash attention off.
//
// F32 weights: llama.cpp and the engine sum in different orders, but in
// float32 throughout, and their greedy tokens must be the same, so the
// same text byte for byte. F16 and Q8_0: llama.cpp multiplies quantized
// weights by activations it quantizes too (to Q8_0 for Q8_0 and, on this
// CPU, F16 for F16), the engine by float32 activations, so their logits
// differ by more, and their greedy paths may part at a near-tie and never
// meet again. So they are compared by teacher forcing: llama.cpp's greedy
// tokens are fed through the engine, and at every position the engine's
// argmax must be llama.cpp's token unless the two are a near-tie (the
// engine's logits of the two within nearTie of each other). Every position
// also bounds how far the engine's logits are from llama.cpp's: for each
// of llama.cpp's top candidates c after a prefix, the difference
// logit(c) − logit(llama.cpp's token) in the engine and in llama.cpp
// (llama.cpp gives log-probabilities, whose differences are the logits')
// may differ by at most nearTie. That is what justifies the bound: where
// the two implementations' relative logits differ by at most δ, their
// argmaxes can part only where the engine's two best are within δ.

// llamaPrompts are the prompts the engine and llama.cpp both continue.
var llamaPrompts = []string{"", "Once upon a time", "Tom had a red ball.\nHe", `Mom said, "Let's go to the park!"`, "A big fish"}

// llamaNearTie is, for each weight type, the most the engine's relative
// logits may differ from llama.cpp's (see above). The measured largest
// differences are well inside them (the test logs them).
var llamaNearTie = map[string]float64{"f32": 1e-3, "f16": 0.05, "q8_0": 0.5}

// llamaTokens is how many tokens each prompt is continued by.
const llamaTokens = 200

func TestAgainstLlamaCpp(t *testing.T) {
	h := llamacpp.ForTest(t)
	for _, typ := range []string{"f32", "f16", "q8_0"} {
		path := stories.GGUF(t, typ)
		m, err := LoadGGUF(path, GGUFOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var worst agreement
		for _, prompt := range llamaPrompts {
			ids := m.Tokenizer().Encode(prompt)
			if typ == "f32" {
				tok, err := h.Tokenize(llamaContext(t), llamacpp.TokenizeRequest{Model: path, Text: prompt})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(tok.Tokens, ids) {
					t.Fatalf("%q: llama.cpp's tokens %v, the engine's %v", prompt, tok.Tokens, ids)
				}
			}
			g, err := h.Greedy(llamaContext(t), llamacpp.GreedyRequest{Model: path, Prompt: ids, N: llamaTokens,
				Setup: llamacpp.Setup{Threads: 1, KVType: "f32"}})
			if err != nil {
				t.Fatal(err)
			}
			if len(g.Tokens) != llamaTokens {
				t.Fatalf("%s %q: llama.cpp gave %d tokens of %d", typ, prompt, len(g.Tokens), llamaTokens)
			}
			if typ == "f32" {
				ours, err := m.Reference(prompt, llamaTokens)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := m.Text(prompt, ours), m.Text(prompt, g.Tokens); got != want {
					t.Fatalf("F32 %q: the engine writes\n%q\nllama.cpp\n%q", prompt, got, want)
				}
			}
			a := forcedAgreement(t, m, ids, g, llamaNearTie[typ])
			t.Logf("%s %q: %d positions, %d argmaxes apart (near-ties of up to %.3g), largest relative logit difference %.3g",
				typ, prompt, a.positions, a.apart, a.gap, a.delta)
			worst = worst.join(a)
		}
		t.Logf("%s: %d positions, %d near-ties taken apart (up to %.3g), largest relative logit difference %.3g (bound %g), llama.cpp %s on %s",
			typ, worst.positions, worst.apart, worst.gap, worst.delta, llamaNearTie[typ], llamaInfo.LlamaCpp, llamaInfo.CPUBackend)
	}
}

// llamaInfo is what the last llama.cpp reply said about itself.
var llamaInfo llamacpp.Info

func llamaContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// agreement is how the engine's logits compare with llama.cpp's over a
// run of positions.
type agreement struct {
	positions, apart int
	delta            float64 // the largest relative logit difference
	gap              float64 // the largest gap of two argmaxes apart
}

func (a agreement) join(b agreement) agreement {
	return agreement{a.positions + b.positions, a.apart + b.apart, max(a.delta, b.delta), max(a.gap, b.gap)}
}

// forcedAgreement feeds the prompt and llama.cpp's greedy tokens through
// the engine in one pass and compares every generated position with
// llama.cpp's (see the comment at the top): the argmax is llama.cpp's
// token, or the two are within bound; every relative logit differs from
// llama.cpp's by at most bound.
func forcedAgreement(t *testing.T, m *Model, prompt []int, g *llamacpp.GreedyResult, bound float64) agreement {
	t.Helper()
	llamaInfo = g.Info
	seq := append(slices.Clone(prompt), g.Tokens[:len(g.Tokens)-1]...)
	logits, err := m.Logits(seq)
	if err != nil {
		t.Fatal(err)
	}
	v := m.Config().Vocab
	a := agreement{positions: len(g.Tokens)}
	for i, want := range g.Tokens {
		row := logits[(len(prompt)-1+i)*v : (len(prompt)+i)*v]
		for _, c := range g.Top[i] {
			// llama.cpp's log-probabilities differ by what its logits do.
			d := math.Abs(float64(row[c.ID]-row[want]) - (c.Value - g.Top[i][0].Value))
			a.delta = max(a.delta, d)
			if d > bound {
				t.Fatalf("position %d after %d prompt tokens: the engine's logit of %d relative to %d is %g, llama.cpp's %g: %g apart, more than %g",
					i, len(prompt), c.ID, want, row[c.ID]-row[want], c.Value-g.Top[i][0].Value, d, bound)
			}
		}
		if got := argmax(row); got != want {
			gap := float64(row[got] - row[want])
			if gap > bound {
				t.Fatalf("position %d after %d prompt tokens: the engine picks %d, llama.cpp %d, whose logits in the engine are %g apart: more than the near-tie bound %g",
					i, len(prompt), got, want, gap, bound)
			}
			a.apart++
			a.gap = max(a.gap, gap)
		}
	}
	return a
}
