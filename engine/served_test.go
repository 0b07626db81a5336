package engine

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvwarden/kvwarden/internal/stories"
	"github.com/kvwarden/kvwarden/kv"
)

// loadStories loads stories260K with K and V of dt, failing the test on
// any error.
func loadStories(t *testing.T, dt kv.DType) *Model {
	t.Helper()
	model, tok := stories.Files(t)
	m, err := LoadModel(model, tok, dt)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFingerprintCoversWhatChangesAnswers: the fingerprint is the same for
// the same files loaded twice and changes with every weight, every
// tokenizer score or piece, the KV type and each setting of the config
// that changes what the model computes.
func TestFingerprintCoversWhatChangesAnswers(t *testing.T) {
	m := loadStories(t, kv.F32)
	if again := loadStories(t, kv.F32); again.Fingerprint() != m.Fingerprint() {
		t.Fatalf("the same files, two fingerprints: %s, %s", m.Fingerprint(), again.Fingerprint())
	}
	model, tokPath := stories.Files(t)
	cfg, w, err := ReadCheckpoint(model, CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tokData, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ParseTokenizer(tokData, cfg.Vocab)
	if err != nil {
		t.Fatal(err)
	}
	if m.Fingerprint() != fingerprint(cfg, &w, tok) || cfg.KVDType != 0 {
		t.Fatal("KV type zero is f32: the fingerprints must agree")
	}
	seen := map[Fingerprint]string{m.Fingerprint(): "stories260K"}
	differs := func(what string, fp Fingerprint) {
		t.Helper()
		if other, ok := seen[fp]; ok {
			t.Errorf("%s has the fingerprint of %s", what, other)
		}
		seen[fp] = what
	}
	for _, dt := range []kv.DType{kv.F16, kv.BF16} {
		differs(dt.String()+" KV", loadStories(t, dt).Fingerprint())
	}
	for _, c := range []struct {
		what string
		edit func(*ModelConfig)
	}{
		{"another RoPE base", func(c *ModelConfig) { c.RoPETheta = 500000 }},
		{"another norm epsilon", func(c *ModelConfig) { c.NormEps = 1e-6 }},
		{"another context window", func(c *ModelConfig) { c.ContextTokens = 256 }},
	} {
		other := cfg
		c.edit(&other)
		differs(c.what, fingerprint(other, &w, tok))
	}
	for _, a := range []struct {
		what string
		v    []float32
	}{{"an embedding weight", w.Embed.F32}, {"a wq weight", w.Layers[2].WQ.F32}, {"a w2 weight", w.Layers[4].W2.F32}, {"the final norm", w.Norm}} {
		old := a.v[7]
		a.v[7] = old * 1.0001
		differs(a.what, fingerprint(cfg, &w, tok))
		a.v[7] = old
	}
	old := tok.scores[300]
	tok.scores[300] = old + 1
	differs("a merge score", fingerprint(cfg, &w, tok))
	tok.scores[300] = old
	piece := tok.pieces[300]
	tok.pieces[300] = []byte("zz")
	differs("a piece", fingerprint(cfg, &w, tok))
	tok.pieces[300] = piece
	if fingerprint(cfg, &w, tok) != m.Fingerprint() {
		t.Fatal("the edits were not undone")
	}
}

func TestNewModelRefuses(t *testing.T) {
	cfg := DefaultModelConfig()
	w := seededWeights(cfg)
	var ve *TokenizerVocabError
	if _, err := NewModel("m", cfg, w, loadStories(t, kv.F32).Tokenizer()); !errors.As(err, &ve) || ve.Want != 258 || ve.Have != 512 {
		t.Fatalf("a 512-token tokenizer for a 258-token model: %v", err)
	}
	for _, name := range []string{"", strings.Repeat("n", ModelNameBytesMax+1), "\xff"} {
		if _, err := NewModel(name, cfg, w, ByteTokenizer{}); err == nil || !strings.Contains(err.Error(), "model name") {
			t.Errorf("name %q: %v", name, err)
		}
	}
	w.Layers[1].W3.F32[5] = float32(math.NaN())
	var we *WeightError
	if _, err := NewModel("m", cfg, w, ByteTokenizer{}); !errors.As(err, &we) || we.Array != "layer 1 w3" || we.Index != 5 {
		t.Fatalf("a NaN weight: %v", err)
	}
}

func TestModelName(t *testing.T) {
	long := strings.Repeat("é", ModelNameBytesMax) // two bytes each
	for _, tc := range []struct{ path, want string }{
		{"/models/stories260K.bin", "stories260K"},
		{"/models/st\xffries.bin", "st\uFFFDries"},
		{"/models/.bin", ".bin"},
		{"/models/model", "model"},
		{"/m/" + long, long[:ModelNameBytesMax]},
		{"/m/x" + long, "x" + long[:ModelNameBytesMax-2]},
	} {
		if got := modelName(tc.path); got != tc.want || !utf8.ValidString(got) || len(got) > ModelNameBytesMax {
			t.Errorf("modelName(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

func TestParseFingerprint(t *testing.T) {
	fp := Fingerprint{1, 2, 3, 0xfe}
	if got, err := ParseFingerprint(fp.String()); err != nil || got != fp || len(fp.String()) != 2*len(fp) || fp.Short() != fp.String()[:12] {
		t.Fatalf("round trip of %s: %s, %v", fp, got, err)
	}
	for _, bad := range []string{"", "xyz", fp.String()[2:], fp.String() + "00"} {
		if _, err := ParseFingerprint(bad); err == nil {
			t.Errorf("ParseFingerprint(%q) accepted", bad)
		}
	}
}

// TestEncodeWithin: a text is refused unencoded only when its encoding
// would exceed the limit, and then with a count no larger than the
// encoding's.
func TestEncodeWithin(t *testing.T) {
	bpe := loadStories(t, kv.F32).Tokenizer()
	rnd := rand.New(rand.NewPCG(1, 2))
	words := []string{"Once", " upon", " a", " time", "é", "🙂", "\xff", " ", "Lily", "."}
	for _, tok := range []Tokenizer{ByteTokenizer{}, bpe} {
		for range 500 {
			var b strings.Builder
			for range rnd.IntN(80) {
				b.WriteString(words[rnd.IntN(len(words))])
			}
			text, limit := b.String(), 1+rnd.IntN(40)
			full := tok.Encode(text)
			ids, n := EncodeWithin(tok, text, limit)
			switch {
			case ids == nil && (n > len(full) || n <= limit):
				t.Fatalf("%q refused at %d tokens (limit %d); it encodes to %d", text, n, limit, len(full))
			case ids != nil && (n != len(full) || len(ids) != len(full)):
				t.Fatalf("%q: %d tokens, want %d", text, n, len(full))
			}
		}
	}
}

// TestBuiltinTextIsPrintable: whatever bytes a prompt holds (control
// characters, invalid UTF-8), the built-in model's greedy answer is
// printable ASCII and newlines, at both sizes: its noise never garbles a
// terminal, a log or a pipe.
func TestBuiltinTextIsPrintable(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 12))
	for _, c := range []struct {
		cfg     ModelConfig
		prompts int
	}{{DefaultModelConfig(), 24}, {LargeModelConfig(), 4}} {
		m, err := BuiltinModel(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		for range c.prompts {
			prompt := make([]byte, rng.IntN(48))
			for i := range prompt {
				prompt[i] = byte(rng.Uint32())
			}
			tokens, err := m.Answer(string(prompt), 64)
			if err != nil {
				t.Fatal(err)
			}
			for i, b := range []byte(m.Text(string(prompt), tokens)) {
				if b != '\n' && (b < 0x20 || b > 0x7e) {
					t.Fatalf("dim %d: byte %d of the answer to %q is %#x", c.cfg.Dim, i, prompt, b)
				}
			}
		}
	}
}
