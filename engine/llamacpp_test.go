package engine

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/llamacpp"
	"github.com/kvwarden/kvwarden/internal/stories"
)

// The engine is checked against llama.cpp itself (internal/llamacpp), on
// the three GGUF files of stories260K and the same weights written here as
// BF16 and Q4_0, with llama.cpp's KV cache in F32 as the engine's, one
// thread, flash attention off.
//
// F32 weights: llama.cpp and the engine sum in different orders, but in
// float32 throughout, and their greedy tokens must be the same, so the
// same text byte for byte. The other types: llama.cpp multiplies them by
// activations it rounds too (to Q8_0 blocks for Q8_0 and Q4_0, to F16 or
// BF16 for those on CPUs that multiply them natively), the engine by
// float32 activations, so their logits
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
// logits may differ from llama.cpp's (see above), with a margin over the
// largest difference measured here (logged by the test: 2e-5, 0.007, 0.26,
// 0.08, 0.38), as another CPU makes ggml pick other kernels.
var llamaNearTie = map[string]float64{"f32": 1e-3, "f16": 0.05, "q8_0": 0.5, "bf16": 0.2, "q4_0": 0.75}

// llamaTokens is how many tokens each prompt is continued by.
const llamaTokens = 200

func TestAgainstLlamaCpp(t *testing.T) {
	h := llamacpp.ForTest(t)
	for _, typ := range []string{"f32", "f16", "q8_0", "bf16", "q4_0"} {
		path := storiesGGUF(t, typ)
		m, err := LoadGGUF(path, GGUFOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var worst agreement
		var info llamacpp.Info // what llama.cpp said of itself
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
			info = g.Info
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
			typ, worst.positions, worst.apart, worst.gap, worst.delta, llamaNearTie[typ], info.LlamaCpp, info.CPUBackend)
	}
}

// storiesGGUF is the stories260K GGUF file of type typ: one of the three
// the model's folder holds, or, for bf16 and q4_0, one written here from
// the F32 file's weights (as quantize describes ggml's conversion; the
// ffn_down matrices, whose rows are no whole blocks, in F16 as the Q8_0
// file has them).
func storiesGGUF(t *testing.T, typ string) string {
	t.Helper()
	wt := map[string]WeightType{"bf16": WeightBF16, "q4_0": WeightQ4_0}[typ]
	if wt == WeightF32 {
		return stories.GGUF(t, typ)
	}
	m, _ := readStoriesGGUF(t, "f32")
	path := filepath.Join(t.TempDir(), "stories260K-"+typ+".gguf")
	if err := os.WriteFile(path, writeGGUF(m.cfg, m.w, wt, m.vocab), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

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

// BenchmarkDecodeVsLlamaCpp decodes one sequence from BOS, a token at a
// time, with the engine and with llama.cpp (internal/llamacpp) on the same
// GGUF file and the same number of threads, and reports each one's tokens
// per second and x-llamacpp, the engine's over llama.cpp's: the stories260K
// files on one thread (more only slows either down on a model this small),
// and memoryBoundConfig's generated files (BenchmarkDecodeWeights) on
// every processor. llama.cpp runs its runs in one process after loading
// the model once; the engine's are timed here the same way, after a first
// run that is not counted.
func BenchmarkDecodeVsLlamaCpp(b *testing.B) {
	h := llamacpp.ForTest(b)
	type file struct {
		name       string
		path       func() string
		threads, n int
	}
	var files []file
	for _, typ := range []string{"f32", "f16", "q8_0"} {
		files = append(files, file{"stories260K-" + typ, func() string { return stories.GGUF(b, typ) }, 1, 256})
	}
	for _, typ := range append([]WeightType{WeightF32}, benchWeightTypes...) {
		files = append(files, file{"random-" + typ.String(), func() string { return generatedGGUF(b)[typ] }, runtime.GOMAXPROCS(0), 32})
	}
	for _, f := range files {
		b.Run(f.name, func(b *testing.B) {
			path := f.path()
			m, err := LoadGGUF(path, GGUFOptions{})
			if err != nil {
				b.Fatal(err)
			}
			saved := runtime.GOMAXPROCS(f.threads)
			defer runtime.GOMAXPROCS(saved)
			bos := []int{m.Tokenizer().BOS()}
			if _, err := m.engine.Reference(bos, f.n); err != nil {
				b.Fatal(err)
			}
			var ours time.Duration
			for b.Loop() {
				start := time.Now()
				if _, err := m.engine.Reference(bos, f.n); err != nil {
					b.Fatal(err)
				}
				ours += time.Since(start)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			res, err := h.Bench(ctx, llamacpp.BenchRequest{Model: path, Prompt: bos, N: f.n - 1, Runs: 3,
				Setup: llamacpp.Setup{Threads: f.threads, KVType: "f32"}})
			if err != nil {
				b.Fatal(err)
			}
			rates := make([]float64, len(res.Runs))
			for i, r := range res.Runs {
				rates[i] = r.TokensPerSecond()
			}
			slices.Sort(rates)
			theirs := rates[len(rates)/2]
			perSecond := float64(b.N*f.n) / ours.Seconds()
			b.ReportMetric(perSecond, "tok/s")
			b.ReportMetric(theirs, "llamacpp-tok/s")
			b.ReportMetric(perSecond/theirs, "x-llamacpp")
		})
	}
}
