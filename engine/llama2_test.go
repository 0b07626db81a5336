package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/internal/stories"
	"github.com/kvwarden/kvwarden/kv"
)

// stories260KHeader is the header the README publishes.
var stories260KHeader = ModelConfig{Dim: 64, HiddenDim: 172, Layers: 5, Heads: 8, KVHeads: 4, HeadDim: 8,
	Vocab: 512, ContextTokens: 512, RoPETheta: 10000, NormEps: 1e-5, TiedEmbeddings: true}

func readStories260K(t testing.TB) (ModelConfig, Weights, []byte) {
	t.Helper()
	modelPath, _ := stories.Files(t)
	cfg, w, err := ReadCheckpoint(modelPath, CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, w, data
}

func TestStories260KCheckpoint(t *testing.T) {
	cfg, w, data := readStories260K(t)
	if cfg != stories260KHeader {
		t.Fatalf("config %+v, the README's header %+v", cfg, stories260KHeader)
	}
	if !w.tied() {
		t.Fatal("a shared classifier must be the embedding's slice")
	}
	// Spot checks against the README's layout, computed here rather than by
	// the reader: the first embedding weight follows the 28-byte header,
	// the final norm ends where the RoPE tables start, and the first row
	// of the tables (position 0) is cos 0 = 1 then sin 0 = 0.
	at := func(i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(data[28+4*i:])) }
	if w.Embed.F32[0] != at(0) {
		t.Fatalf("embedding[0] = %g, the file's first weight %g", w.Embed.F32[0], at(0))
	}
	const vocab, dim, hidden, layers, kvDim, seq, half = 512, 64, 172, 5, 32, 512, 4
	ropeAt := vocab*dim + layers*(2*dim+2*dim*dim+2*kvDim*dim+3*dim*hidden) + dim
	if w.Norm[dim-1] != at(ropeAt-1) || w.Layers[4].W3.F32[hidden*dim-1] != at(ropeAt-dim-1) {
		t.Fatal("the final norm or the last w3 is not where the README's layout puts it")
	}
	for i := range half {
		if at(ropeAt+i) != 1 || at(ropeAt+seq*half+i) != 0 {
			t.Fatalf("the skipped RoPE tables are not at float %d: cos %g, sin %g", ropeAt, at(ropeAt+i), at(ropeAt+seq*half+i))
		}
	}
	cfg16, _, err := ParseCheckpoint(data, CheckpointOptions{KVDType: kv.F16})
	if err != nil || cfg16.KVDType != kv.F16 {
		t.Fatalf("KVDType option: config %+v, %v", cfg16, err)
	}
}

// TestStories260KGreedy is the end-to-end check of the loader, tokenizer,
// forward pass and decoder: greedy decoding of the real model from an empty
// prompt gives the model card's text, byte for byte.
func TestStories260KGreedy(t *testing.T) {
	modelPath, tokPath := stories.Files(t)
	want := stories.Published(t)
	cfg, w, err := ReadCheckpoint(modelPath, CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bpe, err := ReadTokenizer(tokPath, cfg.Vocab)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	prompt := bpe.Encode("")
	if !slices.Equal(prompt, []int{bpe.BOS()}) {
		t.Fatalf("Encode(\"\") = %v, want [BOS]", prompt)
	}
	gen, err := e.Reference(prompt, llama2cNewTokens(256, len(prompt)))
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(gen, bpe.Stop()); i >= 0 {
		gen = gen[:i]
	}
	if got := DecodeText(bpe, prompt[len(prompt)-1], gen); got != want {
		t.Fatalf("greedy text of %d tokens differs from the model card's at byte %d:\n got %q\nwant %q",
			len(gen), sharedPrefixLen(got, want), got, want)
	}
}

// llama2cNewTokens is how many tokens llama2.c's run.c generates with -n
// steps after a prompt of promptLen tokens: it runs the model at positions
// 0 to steps-1, forcing the prompt's tokens while pos+1 < promptLen and
// printing every later token, so that the last steps-promptLen+1 positions
// each generate one (before a BOS stops it early).
func llama2cNewTokens(steps, promptLen int) int { return steps - promptLen + 1 }

func sharedPrefixLen(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

func TestCheckpointSizeRefused(t *testing.T) {
	modelPath, _ := stories.Files(t)
	data, err := os.ReadFile(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(len(data))
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"truncated", data[:n-4]},
		{"padded", append(slices.Clone(data), 0, 0, 0, 0)},
		{"one byte short", data[:n-1]},
	} {
		path := filepath.Join(t.TempDir(), c.name+".bin")
		if err := os.WriteFile(path, c.data, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := ReadCheckpoint(path, CheckpointOptions{})
		var se *CheckpointSizeError
		if !errors.As(err, &se) || se.Path != path || se.Have != int64(len(c.data)) || se.Want != n {
			t.Errorf("%s: %v, want a CheckpointSizeError of %s with %d and %d bytes", c.name, err, path, len(c.data), n)
		}
		if _, _, err := ParseCheckpoint(c.data, CheckpointOptions{}); !errors.As(err, &se) || se.Have != int64(len(c.data)) || se.Want != n {
			t.Errorf("%s: ParseCheckpoint: %v", c.name, err)
		}
	}
}

func TestCheckpointNaNRefused(t *testing.T) {
	_, _, data := readStories260K(t)
	// Weight 17 of layer 2's wq, by the README's layout: the embedding,
	// every layer's attention norm, then the layers' wq in turn.
	const vocab, dim, layers = 512, 64, 5
	off := 28 + 4*(vocab*dim+layers*dim+2*dim*dim+17)
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		c := slices.Clone(data)
		binary.LittleEndian.PutUint32(c[off:], math.Float32bits(bad))
		_, _, err := ParseCheckpoint(c, CheckpointOptions{})
		var we *WeightError
		if !errors.As(err, &we) || we.Array != "layer 2 wq" || we.Index != 17 {
			t.Fatalf("%g weight: %v, want a WeightError for layer 2 wq weight 17", bad, err)
		}
	}
}

// legacyHeader is a legacy header of the seven values.
func legacyHeader(p ...int32) []byte {
	b := make([]byte, 0, 4*len(p))
	for _, v := range p {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	return b
}

func TestCheckpointHeaderRefused(t *testing.T) {
	for _, c := range []struct {
		name  string
		p     []int32
		field string
	}{
		{"zero dim", []int32{0, 4, 1, 2, 1, 300, 8}, "dim"},
		{"negative hidden", []int32{8, -4, 1, 2, 1, 300, 8}, "hidden_dim"},
		{"huge layers", []int32{8, 4, 1 << 20, 2, 1, 300, 8}, "n_layers"},
		{"huge vocab", []int32{8, 4, 1, 2, 1, math.MinInt32, 8}, "vocab_size"},
		{"dim not a multiple of heads", []int32{9, 4, 1, 2, 1, 300, 8}, "dim"},
		{"heads not a multiple of kv heads", []int32{12, 4, 1, 3, 2, 300, 8}, "n_heads"},
		{"odd head size", []int32{6, 4, 1, 2, 1, 300, 8}, "dim"},
	} {
		_, _, err := ParseCheckpoint(legacyHeader(c.p...), CheckpointOptions{})
		var he *CheckpointHeaderError
		if !errors.As(err, &he) || he.Field != c.field {
			t.Errorf("%s: %v, want a CheckpointHeaderError for %s", c.name, err, c.field)
		}
	}
	v1 := func(version int32, flag byte, pad byte) []byte {
		b := binary.LittleEndian.AppendUint32(nil, checkpointMagic)
		b = binary.LittleEndian.AppendUint32(b, uint32(version))
		b = append(append(b, legacyHeader(8, 4, 1, 2, 1, 300, 8)...), flag)
		b = append(b, make([]byte, 256-len(b))...)
		b[255] = pad
		return b
	}
	for _, c := range []struct {
		name  string
		data  []byte
		field string
	}{
		{"version 2", v1(2, 1, 0), "version"},
		{"flag 2", v1(1, 2, 0), "shared_classifier"},
		{"padding", v1(1, 1, 7), "padding byte 255"},
	} {
		_, _, err := ParseCheckpoint(c.data, CheckpointOptions{})
		var he *CheckpointHeaderError
		if !errors.As(err, &he) || he.Field != c.field {
			t.Errorf("%s: %v, want a CheckpointHeaderError for %s", c.name, err, c.field)
		}
	}
	// The Vocab floor and the KV type are ModelConfig's.
	if _, _, err := ParseCheckpoint(legacyHeader(8, 4, 1, 2, 1, 100, 8), CheckpointOptions{}); err == nil || !strings.Contains(err.Error(), "Vocab (100)") {
		t.Errorf("vocabulary of 100: %v", err)
	}
	if _, _, err := ParseCheckpoint(legacyHeader(8, 4, 1, 2, 1, 300, 8), CheckpointOptions{KVDType: 99}); err == nil || !strings.Contains(err.Error(), "KVDType (99)") {
		t.Errorf("KV type 99: %v", err)
	}
	for _, short := range [][]byte{nil, legacyHeader(64, 172)} {
		var se *CheckpointSizeError
		if _, _, err := ParseCheckpoint(short, CheckpointOptions{}); !errors.As(err, &se) || se.Want != 28 {
			t.Errorf("%d-byte file: %v, want a CheckpointSizeError wanting the 28-byte header", len(short), err)
		}
	}
}

// TestCheckpointHugeHeaderAllocatesNothing: a 28-byte file whose header
// claims a model ModelConfig accepts, of 65536 layers (about 2^47 bytes of
// weights), is refused by its size before the weights are allocated.
func TestCheckpointHugeHeaderAllocatesNothing(t *testing.T) {
	const m = modelDimMax
	data := legacyHeader(4096, m, m, 32, 8, -m, m)
	before := allocatedBytes()
	_, _, err := ParseCheckpoint(data, CheckpointOptions{})
	allocated := allocatedBytes() - before
	var se *CheckpointSizeError
	if !errors.As(err, &se) || se.Have != 28 || se.Want < 1<<46 {
		t.Fatalf("%v, want a CheckpointSizeError of 28 bytes against more than 2^46", err)
	}
	if allocated > 1<<20 {
		t.Fatalf("refusing the header allocated %d bytes", allocated)
	}
}

// allocatedBytes is the bytes the program has allocated so far. It reads
// runtime/metrics rather than runtime.ReadMemStats, which stops the world
// and would slow a fuzzer to a crawl.
func allocatedBytes() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// weightArrays lists every array of w in one fixed order, for comparisons.
func weightArrays(w Weights) [][]float32 {
	a := [][]float32{w.Embed.F32, w.Norm, w.Out.F32}
	for _, l := range w.Layers {
		a = append(a, l.AttnNorm, l.WQ.F32, l.WK.F32, l.WV.F32, l.WO.F32, l.MLPNorm, l.W1.F32, l.W2.F32, l.W3.F32)
	}
	return a
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func sameWeights(t *testing.T, got, want Weights) {
	t.Helper()
	g, w := weightArrays(got), weightArrays(want)
	if len(g) != len(w) {
		t.Fatalf("%d arrays, want %d", len(g), len(w))
	}
	for i := range g {
		if !sameBits(g[i], w[i]) {
			t.Fatalf("array %d of weightArrays differs", i)
		}
	}
}

// version1File writes w as export.py's version1_export does: magic, version
// 1, the seven parameters, the shared-classifier flag, zeros to 256 bytes;
// then every attention norm, every FFN norm, the final norm, the
// embedding, then wq, wk, wv, wo, w1, w2, w3 for all layers in turn, then
// the classifier unless it is shared. It is written from export.py's
// source, independently of the reader, so that loading it checks the reader
// against the documented layout.
func version1File(cfg ModelConfig, w Weights) []byte {
	var b bytes.Buffer
	put := func(v any) {
		if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
			panic(err)
		}
	}
	put(uint32(0x616b3432))
	put(int32(1))
	for _, v := range []int{cfg.Dim, cfg.HiddenDim, cfg.Layers, cfg.Heads, cfg.KVHeads, cfg.Vocab, cfg.ContextTokens} {
		put(int32(v))
	}
	shared := uint8(0)
	if cfg.TiedEmbeddings {
		shared = 1
	}
	put(shared)
	b.Write(make([]byte, 256-b.Len()))
	var arrays [][]float32
	layer := func(f func(LayerWeights) []float32) {
		for _, l := range w.Layers {
			arrays = append(arrays, f(l))
		}
	}
	layer(func(l LayerWeights) []float32 { return l.AttnNorm })
	layer(func(l LayerWeights) []float32 { return l.MLPNorm })
	arrays = append(arrays, w.Norm, w.Embed.F32)
	layer(func(l LayerWeights) []float32 { return l.WQ.F32 })
	layer(func(l LayerWeights) []float32 { return l.WK.F32 })
	layer(func(l LayerWeights) []float32 { return l.WV.F32 })
	layer(func(l LayerWeights) []float32 { return l.WO.F32 })
	layer(func(l LayerWeights) []float32 { return l.W1.F32 })
	layer(func(l LayerWeights) []float32 { return l.W2.F32 })
	layer(func(l LayerWeights) []float32 { return l.W3.F32 })
	if !cfg.TiedEmbeddings {
		arrays = append(arrays, w.Out.F32)
	}
	for _, a := range arrays {
		put(a)
	}
	return b.Bytes()
}

// separateClassifier is the legacy file data with the classifier stored
// separately (a negative vocab_size and the classifier appended), and the
// classifier it appends: the embedding negated, so that it differs.
func separateClassifier(data []byte, vocab int32, w Weights) ([]byte, []float32) {
	c := slices.Clone(data)
	binary.LittleEndian.PutUint32(c[20:], uint32(-vocab))
	out := make([]float32, len(w.Embed.F32))
	for i, f := range w.Embed.F32 {
		out[i] = -f
		c = binary.LittleEndian.AppendUint32(c, math.Float32bits(out[i]))
	}
	return c, out
}

func TestCheckpointSeparateClassifier(t *testing.T) {
	cfg, w, data := readStories260K(t)
	sep, out := separateClassifier(data, int32(cfg.Vocab), w)
	cfg2, w2, err := ParseCheckpoint(sep, CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := cfg
	want.TiedEmbeddings = false
	if cfg2 != want {
		t.Fatalf("config %+v, want %+v", cfg2, want)
	}
	if !sameBits(w2.Out.F32, out) || !sameBits(w2.Embed.F32, w.Embed.F32) {
		t.Fatal("the separate classifier or the embedding was not read from its place")
	}
	w.Out = F32Matrix(cfg.Vocab, cfg.Dim, out)
	sameWeights(t, w2, w)
}

// TestCheckpointVersion1 loads version-1 files written by version1File
// from the legacy file's weights, shared and separate classifier, and
// requires the same config and the same weights, bit for bit.
func TestCheckpointVersion1(t *testing.T) {
	cfg, w, data := readStories260K(t)
	sep, out := separateClassifier(data, int32(cfg.Vocab), w)
	cfgSep, wSep, err := ParseCheckpoint(sep, CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg ModelConfig
		w   Weights
	}{{cfg, w}, {cfgSep, wSep}} {
		v1 := version1File(c.cfg, c.w)
		cfg1, w1, err := ParseCheckpoint(v1, CheckpointOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cfg1 != c.cfg {
			t.Fatalf("version 1 config %+v, legacy %+v", cfg1, c.cfg)
		}
		sameWeights(t, w1, c.w)
		if tied := w1.tied(); tied != c.cfg.TiedEmbeddings {
			t.Fatalf("version 1 classifier shared %v, want %v", tied, c.cfg.TiedEmbeddings)
		}
		var se *CheckpointSizeError
		if _, _, err := ParseCheckpoint(v1[:len(v1)-4], CheckpointOptions{}); !errors.As(err, &se) || se.Want != int64(len(v1)) {
			t.Fatalf("truncated version 1: %v", err)
		}
	}
	if !sameBits(wSep.Out.F32, out) {
		t.Fatal("separate classifier lost")
	}
}

// tinyCheckpoint is a valid legacy checkpoint of the smallest model
// ModelConfig accepts, with weights from a counter: a seed for the fuzzer.
func tinyCheckpoint(shared bool) []byte {
	const dim, hidden, layers, heads, kvHeads, vocab, seq = 2, 1, 1, 1, 1, TokenizerVocab, 1
	v := int32(vocab)
	if !shared {
		v = -v
	}
	b := legacyHeader(dim, hidden, layers, heads, kvHeads, v, seq)
	n := vocab*dim + layers*(2*dim+2*dim*dim+2*(dim/heads*kvHeads)*dim+3*dim*hidden) + dim + seq*dim/heads
	if !shared {
		n += vocab * dim
	}
	for i := range n {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(i%7)/7))
	}
	return b
}

func TestTinyCheckpoint(t *testing.T) {
	for _, shared := range []bool{true, false} {
		cfg, w, err := ParseCheckpoint(tinyCheckpoint(shared), CheckpointOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := NewEngine(cfg, w); err != nil {
			t.Fatal(err)
		}
		v1 := version1File(cfg, w)
		cfg1, w1, err := ParseCheckpoint(v1, CheckpointOptions{})
		if err != nil || cfg1 != cfg {
			t.Fatalf("version 1 of the tiny checkpoint: %+v, %v", cfg1, err)
		}
		sameWeights(t, w1, w)
	}
}

// FuzzParseCheckpoint: any bytes either load into a config that validates
// and weights NewEngine accepts, or are refused; nothing panics, and what
// parsing allocates is bounded by the input's size.
func FuzzParseCheckpoint(f *testing.F) {
	for _, shared := range []bool{true, false} {
		d := tinyCheckpoint(shared)
		f.Add(d)
		cfg, w, err := ParseCheckpoint(d, CheckpointOptions{})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(version1File(cfg, w))
	}
	f.Add(legacyHeader(modelDimMax, modelDimMax, modelDimMax, 2, 1, -modelDimMax, modelDimMax))
	f.Add([]byte{0x32, 0x34, 0x6b, 0x61})
	f.Fuzz(func(t *testing.T, data []byte) {
		before := allocatedBytes()
		cfg, w, err := ParseCheckpoint(data, CheckpointOptions{})
		if d, limit := allocatedBytes()-before, 2*uint64(len(data))+1<<20; d > limit {
			t.Fatalf("parsing %d bytes allocated %d", len(data), d)
		}
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("loaded a config that does not validate: %v", err)
		}
		if _, err := NewEngine(cfg, w); err != nil {
			t.Fatalf("loaded weights NewEngine refuses: %v", err)
		}
	})
}
