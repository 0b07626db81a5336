package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/stories"
)

// callTimeout bounds each call: one takes about a second here.
const callTimeout = 2 * time.Minute

// The stories260K vocabulary's fixed ids and SentencePiece token types.
const (
	bos         = 1
	typeControl = 3
	typeByte    = 6
)

// harness is ForTest's.
func harness(t *testing.T) *Harness { return ForTest(t) }

// model is stories260K-f32.gguf; without the model directory the test is
// skipped (failed in CI), as internal/stories decides.
func model(t *testing.T) string {
	t.Helper()
	stories.Files(t)
	path := filepath.Join(stories.Dir(), "stories260K-f32.gguf")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the stories260K directory has no GGUF file: %v", err)
	}
	return path
}

func callContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// encode is the model README's encoding, naively: BOS; then, for a
// non-empty text, " " + text with spaces as U+2581, each code point its
// piece or else its UTF-8 bytes' <0xHH> pieces, and the adjacent pair
// whose concatenation is the highest-scoring piece merged (the leftmost
// of equals) until no pair is a piece.
func encode(v *VocabResult, text string) []int {
	if text == "" {
		return []int{bos}
	}
	index := make(map[string]int, len(v.Pieces))
	for id, p := range v.Pieces {
		if _, dup := index[p]; !dup {
			index[p] = id
		}
	}
	var ids []int
	for _, r := range "▁" + strings.ReplaceAll(text, " ", "▁") {
		if id, ok := index[string(r)]; ok {
			ids = append(ids, id)
			continue
		}
		for _, b := range []byte(string(r)) {
			ids = append(ids, index[fmt.Sprintf("<0x%02X>", b)])
		}
	}
	for {
		at, merged := -1, 0
		for i := 0; i+1 < len(ids); i++ {
			id, ok := index[v.Pieces[ids[i]]+v.Pieces[ids[i+1]]]
			if ok && (at < 0 || v.Scores[id] > v.Scores[merged]) {
				at, merged = i, id
			}
		}
		if at < 0 {
			return append([]int{bos}, ids...)
		}
		ids = append(ids[:at+1], ids[at+2:]...)
		ids[at] = merged
	}
}

// decode is the model README's decoding of ids that follow prev: control
// tokens write nothing, <0xHH> the byte HH, other pieces their text with
// U+2581 as a space, less a leading space right after BOS.
func decode(t *testing.T, v *VocabResult, prev int, ids []int) string {
	t.Helper()
	var b strings.Builder
	for _, id := range ids {
		switch piece := v.Pieces[id]; v.Types[id] {
		case typeControl:
		case typeByte:
			var x byte
			if _, err := fmt.Sscanf(piece, "<0x%02X>", &x); err != nil {
				t.Fatalf("byte token %d is %q: %v", id, piece, err)
			}
			b.WriteByte(x)
		default:
			piece = strings.ReplaceAll(piece, "▁", " ")
			if prev == bos {
				piece = strings.TrimPrefix(piece, " ")
			}
			b.WriteString(piece)
		}
		prev = id
	}
	return b.String()
}

func TestTokenizeIsBOSThenSpacePrefixedSentencePiece(t *testing.T) {
	h, m := harness(t), model(t)
	v, err := h.Vocab(callContext(t), m)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Pieces) != 512 || v.Pieces[bos] != "<s>" || v.Types[bos] != typeControl {
		t.Fatalf("vocabulary: %d pieces, BOS %q of type %d; the README says 512, \"<s>\", %d",
			len(v.Pieces), v.Pieces[bos], v.Types[bos], typeControl)
	}
	for _, text := range []string{
		"", "Once upon a time", "Lily's mom said, \"Lily, let's go to the park.\"",
		"two\nlines  and   spaces", "café ☃ 🦙", "<s> is text here",
	} {
		got, err := h.Tokenize(callContext(t), TokenizeRequest{Model: m, Text: text})
		if err != nil {
			t.Fatal(err)
		}
		if want := encode(v, text); fmt.Sprint(got.Tokens) != fmt.Sprint(want) {
			t.Errorf("Tokenize(%q) = %v; the README's encoding gives %v", text, got.Tokens, want)
		}
		if back := decode(t, v, bos, got.Tokens[1:]); back != text {
			t.Errorf("Tokenize(%q) decodes to %q", text, back)
		}
	}
	special, err := h.Tokenize(callContext(t), TokenizeRequest{Model: m, Text: "<s>", Special: true})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(special.Tokens) != fmt.Sprint([]int{bos, bos}) || !special.Options.ParseSpecial {
		t.Errorf("Tokenize(\"<s>\", special) = %v, options %+v; want [1 1] with parse_special", special.Tokens, special.Options)
	}
}

// checkTop checks that every list has k candidates, most likely first, with
// log-probabilities (at most 0, and exp summing to at most 1).
func checkTop(t *testing.T, top [][]Candidate, k int) {
	t.Helper()
	for i, cands := range top {
		if len(cands) != k {
			t.Fatalf("position %d: %d candidates, want %d", i, len(cands), k)
		}
		sum := 0.0
		for j, c := range cands {
			sum += math.Exp(c.Value)
			if c.Value > 0 || (j > 0 && c.Value > cands[j-1].Value) {
				t.Fatalf("position %d: candidates %+v are not log-probabilities in falling order", i, cands)
			}
		}
		if sum > 1+1e-5 {
			t.Fatalf("position %d: the candidates' probabilities sum to %g", i, sum)
		}
	}
}

func greedyFromBOS(t *testing.T, h *Harness, m, kvType string) *GreedyResult {
	t.Helper()
	res, err := h.Greedy(callContext(t), GreedyRequest{
		Model: m, Prompt: []int{bos}, N: stories.PublishedTokens, Setup: Setup{Threads: 1, KVType: kvType}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// With either KV cache type (F16 is llama.cpp's default), as the model
// README says of its F32 file.
func TestGreedyWritesThePublishedStory(t *testing.T) {
	h, m := harness(t), model(t)
	v, err := h.Vocab(callContext(t), m)
	if err != nil {
		t.Fatal(err)
	}
	for _, kvType := range []string{"f16", "f32"} {
		res := greedyFromBOS(t, h, m, kvType)
		if len(res.Tokens) != stories.PublishedTokens || res.ContextFull {
			t.Fatalf("KV %s: %d tokens (context full: %v), want %d", kvType, len(res.Tokens), res.ContextFull, stories.PublishedTokens)
		}
		if res.Info.GPU != "none" || res.Info.Threads != 1 || res.Info.CPUBackend == "" || res.Info.KVType != kvType {
			t.Errorf("info %+v: want no GPU, 1 thread, a named CPU backend, a KV cache of %s", res.Info, kvType)
		}
		checkTop(t, res.Top, 8)
		for i, tok := range res.Tokens {
			if res.Top[i][0].ID != tok {
				t.Fatalf("KV %s, step %d: token %d is not the most likely, %+v: the sampling is not greedy", kvType, i, tok, res.Top[i])
			}
		}
		if got := decode(t, v, bos, res.Tokens); got != stories.Published(t) {
			t.Fatalf("KV %s: llama.cpp's greedy text is not the model card's:\n got %q\nwant %q", kvType, got, stories.Published(t))
		}
		t.Logf("KV %s: %d tokens in %.3f s (load %.3f s), CPU backend %s, %s",
			kvType, len(res.Tokens), res.Seconds, res.Info.LoadSeconds, res.Info.CPUBackend, res.Info.LlamaCpp)
	}
}

// Teacher forcing on the greedy text gives back, at each position, the
// greedy token and its log-probability: the same model evaluated as one
// batch instead of token by token. With an F32 KV cache the two agree to
// about 1e-5 here; with F16 (llama.cpp's default) or flash attention they
// differ by up to about 0.01, so the check uses F32.
func TestForcedAgreesWithGreedy(t *testing.T) {
	h, m := harness(t), model(t)
	g := greedyFromBOS(t, h, m, "f32")
	seq := append([]int{bos}, g.Tokens[:len(g.Tokens)-1]...)
	f, err := h.Forced(callContext(t), ForcedRequest{Model: m, Tokens: seq, TopK: 4, Setup: Setup{Threads: 1, KVType: "f32"}})
	if err != nil {
		t.Fatal(err)
	}
	checkTop(t, f.Top, 4)
	const tolerance = 1e-4
	worst := 0.0
	for i, cands := range f.Top {
		if cands[0].ID != g.Tokens[i] {
			t.Fatalf("position %d: forced's most likely is %+v, greedy chose %d (%+v)", i, cands, g.Tokens[i], g.Top[i][:2])
		}
		for j, c := range cands {
			if g.Top[i][j].ID == c.ID {
				worst = max(worst, math.Abs(c.Value-g.Top[i][j].Value))
			}
		}
	}
	if worst > tolerance {
		t.Errorf("forced and greedy log-probabilities differ by up to %g (tolerance %g)", worst, tolerance)
	}
	t.Logf("%d positions in one evaluation, %.4f s; greatest difference from greedy %.3g", len(seq), f.Seconds, worst)
}

func TestGreedyStopsWhereTheContextEnds(t *testing.T) {
	h, m := harness(t), model(t)
	res, err := h.Greedy(callContext(t), GreedyRequest{
		Model: m, Prompt: []int{bos}, N: 300, TopK: 1, Setup: Setup{Threads: 1, ContextSize: 256}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.ContextFull || len(res.Tokens) != res.Info.ContextSize-1 || res.Info.ContextSize != 256 {
		t.Fatalf("context %d: %d tokens, context full %v; want 255 and true", res.Info.ContextSize, len(res.Tokens), res.ContextFull)
	}
	// Without a shift, the first 255 tokens are those of the full context.
	g := greedyFromBOS(t, h, m, "")
	if fmt.Sprint(res.Tokens) != fmt.Sprint(g.Tokens[:len(res.Tokens)]) {
		t.Fatal("the tokens in a 256-token context differ from those in the model's 512")
	}
}

func TestBench(t *testing.T) {
	h, m := harness(t), model(t)
	res, err := h.Bench(callContext(t), BenchRequest{Model: m, Prompt: []int{bos}, N: 128, Runs: 2, Setup: Setup{Threads: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 || res.Info.LoadSeconds <= 0 {
		t.Fatalf("%+v: want 2 runs and a load time", res)
	}
	for i, r := range res.Runs {
		if r.Tokens != 128 || r.Seconds <= 0 || r.PromptSeconds <= 0 {
			t.Errorf("run %d: %+v", i, r)
		}
		t.Logf("run %d: %d tokens in %.4f s, %.0f tokens/s (prompt %.4f s)", i, r.Tokens, r.Seconds, r.TokensPerSecond(), r.PromptSeconds)
	}
}

func TestRefusedRequestIsARunError(t *testing.T) {
	h, m := harness(t), model(t)
	_, err := h.Greedy(callContext(t), GreedyRequest{Model: m, Prompt: []int{bos, 512}, N: 1, Setup: Setup{Threads: 1}})
	var run *RunError
	if !errors.As(err, &run) || run.ExitCode != 2 || !strings.Contains(run.Stderr, "prompt[1] = 512") {
		t.Fatalf("a token id past the vocabulary: %v; want a *RunError, status 2, naming prompt[1] = 512", err)
	}
}

func TestFindWithoutInstallSaysHowToInstall(t *testing.T) {
	for name, c := range map[string]struct {
		setup func(dir string)
		says  string
	}{
		"empty folder": {func(string) {}, "has no run.mjs"},
		"another version": {func(dir string) {
			write(t, filepath.Join(dir, "run.mjs"), "")
			write(t, filepath.Join(dir, "package.json"), `{"dependencies": {"node-llama-cpp": "3.21.1"}}`)
			write(t, filepath.Join(dir, moduleDir, "package.json"), `{"version": "3.0.0"}`)
		}, `node-llama-cpp "3.0.0" where package.json pins "3.21.1"`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			c.setup(dir)
			t.Setenv(EnvDir, dir)
			_, err := Find()
			var missing *NotInstalledError
			if !errors.As(err, &missing) || !strings.Contains(err.Error(), InstallCommand) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Find() = %v; want a *NotInstalledError saying %q and %q", err, c.says, InstallCommand)
			}
		})
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fake is a Harness whose run.mjs is script: the process handling, with
// node but without llama.cpp.
func fake(t *testing.T, script string) *Harness {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatal(err)
		}
		t.Skipf("node is not on PATH: %v", err)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "run.mjs"), script)
	return &Harness{Node: node, Dir: dir, OutputMax: 1 << 20}
}

func TestStuckNodeIsKilledAtTheDeadline(t *testing.T) {
	h := fake(t, `process.stderr.write("loading\n"); setInterval(() => {}, 1000);`)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err := h.Tokenize(ctx, TokenizeRequest{Model: "m.gguf", Text: "hi"})
	var timeout *TimeoutError
	if !errors.As(err, &timeout) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "tokenize (2 bytes of text, m.gguf): waited") || timeout.Stderr != "loading" {
		t.Fatalf("got %v; want a *TimeoutError saying what it waited for, with stderr %q", err, "loading")
	}
	if took := time.Since(started); took > 500*time.Millisecond+waitDelay+5*time.Second {
		t.Fatalf("the call returned %s after it began, long past its 500ms deadline", took)
	}
}

func TestHarnessErrors(t *testing.T) {
	for _, c := range []struct {
		name, script string
		check        func(error) bool
	}{
		{"exit status", `process.stderr.write("it broke\n"); process.exitCode = 3;`, func(err error) bool {
			var run *RunError
			return errors.As(err, &run) && run.ExitCode == 3 && run.Stderr == "it broke"
		}},
		{"reply over the bound", `process.stdout.write("x".repeat(4 << 20)); setInterval(() => {}, 1000);`, func(err error) bool {
			var big *OutputTooLargeError
			return errors.As(err, &big) && big.Limit == 1<<20
		}},
		{"unknown field", `console.log(JSON.stringify({info: {}, tokens: [1], surprise: 1}));`, func(err error) bool {
			var reply *ReplyError
			return errors.As(err, &reply) && strings.Contains(err.Error(), "surprise")
		}},
		{"not JSON", `console.log("hello");`, func(err error) bool {
			var reply *ReplyError
			return errors.As(err, &reply)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := fake(t, c.script).Tokenize(callContext(t), TokenizeRequest{Model: "m.gguf", Text: "hi"})
			if !c.check(err) {
				t.Fatalf("got %v (%T)", err, err)
			}
		})
	}
}
