package engine

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"unsafe"

	"github.com/kvwarden/kvwarden/kv"
)

// GGUFOptions are the settings of a GGUF model its file does not decide.
type GGUFOptions struct {
	// KVDType is the element type of K and V in KV pages; zero means
	// kv.F32.
	KVDType kv.DType
	// ContextTokens caps the model's context window, in tokens: the
	// window is the file's llama.context_length, or this when it is
	// smaller. Zero takes the file's, which must then be at most the
	// engine's bound (65,536).
	ContextTokens int
}

// ggufArch is the one architecture the engine computes: llama.cpp's
// "llama" (RMSNorm, rotary positions on adjacent pairs, grouped-query
// attention, SwiGLU), which Llama 1 to 3, Mistral 7B, TinyLlama, SmolLM
// and llama2.c's models convert to.
const ggufArch = "llama"

// ggufModel is what a GGUF file holds for the engine: the config, the
// weights (slices of the file where their type allows) and the
// vocabulary.
type ggufModel struct {
	cfg   ModelConfig
	w     Weights
	vocab ggufVocab
}

// readGGUF reads the GGUF file at path and its llama model. The file is
// read once, whole, into memory the model keeps (its weights are slices
// of it): a file mapped instead would kill the process (SIGBUS) when
// truncated while served, and change its weights under its fingerprint
// when rewritten in place. Read, the file may change or go; the node
// serves what it read.
func readGGUF(path string, opt GGUFOptions) (*ggufModel, error) {
	data, err := readWhole(path)
	if err != nil {
		return nil, err
	}
	f, err := parseGGUF(path, data)
	if err != nil {
		return nil, err
	}
	return f.model(opt)
}

// readWhole reads the file at path, whose size must not change while it
// is read.
func readWhole(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() < 24 || fi.Size() > math.MaxInt {
		return nil, &GGUFError{Path: path, Offset: -1, Reason: fmt.Sprintf("the file is %d bytes; a GGUF file is at least 24", fi.Size())}
	}
	data := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("engine: reading GGUF %s (%d bytes, as it was opened): %w", path, fi.Size(), err)
	}
	if n, _ := f.Read(make([]byte, 1)); n > 0 {
		return nil, fmt.Errorf("engine: GGUF %s grew past %d bytes while it was read", path, fi.Size())
	}
	return data, nil
}

// model maps the file's metadata and tensors to a llama model.
func (f *ggufFile) model(opt GGUFOptions) (*ggufModel, error) {
	arch, err := f.string("general.architecture")
	if err != nil {
		return nil, err
	}
	if arch != ggufArch {
		return nil, f.keyError("general.architecture", "%q is not an architecture the engine computes (%s)", arch, ggufArch)
	}
	for _, key := range []string{"llama.expert_count", "llama.attention.sliding_window"} {
		if n, err := f.uint(key); f.has(key) && (err != nil || n > 0) {
			return nil, f.keyError(key, "the engine computes neither mixtures of experts nor sliding-window attention")
		}
	}
	if s, err := f.string("llama.rope.scaling.type"); f.has("llama.rope.scaling.type") && (err != nil || s != "none") {
		return nil, f.keyError("llama.rope.scaling.type", "%q: the engine computes rotary positions without scaling", s)
	}
	cfg := ModelConfig{KVDType: opt.KVDType, TiedEmbeddings: f.tensors["output.weight"] == nil}
	for _, k := range []struct {
		key string
		v   *int
	}{{"llama.embedding_length", &cfg.Dim}, {"llama.block_count", &cfg.Layers}, {"llama.feed_forward_length", &cfg.HiddenDim},
		{"llama.attention.head_count", &cfg.Heads}, {"llama.context_length", &cfg.ContextTokens}} {
		n, err := f.uint(k.key)
		if err != nil {
			return nil, err
		}
		if n < 1 || n > 1<<30 {
			return nil, f.keyError(k.key, "%d is not in [1, 2^30]", n)
		}
		*k.v = int(n)
	}
	cfg.KVHeads = cfg.Heads
	if f.has("llama.attention.head_count_kv") {
		n, err := f.uint("llama.attention.head_count_kv")
		if err != nil {
			return nil, err
		}
		if n < 1 || n > uint64(cfg.Heads) {
			return nil, f.keyError("llama.attention.head_count_kv", "%d is not in [1, head_count %d]", n, cfg.Heads)
		}
		cfg.KVHeads = int(n)
	}
	if cfg.Dim%cfg.Heads != 0 {
		return nil, f.keyError("llama.attention.head_count", "%d heads do not divide embedding_length %d", cfg.Heads, cfg.Dim)
	}
	cfg.HeadDim = cfg.Dim / cfg.Heads
	for _, key := range []string{"llama.rope.dimension_count", "llama.attention.key_length", "llama.attention.value_length"} {
		if !f.has(key) {
			continue
		}
		n, err := f.uint(key)
		if err != nil {
			return nil, err
		}
		if n != uint64(cfg.HeadDim) {
			return nil, f.keyError(key, "%d is not the head size %d (embedding_length %d ÷ head_count %d): the engine rotates and attends over whole heads",
				n, cfg.HeadDim, cfg.Dim, cfg.Heads)
		}
	}
	if cfg.NormEps, err = f.float("llama.attention.layer_norm_rms_epsilon"); err != nil {
		return nil, err
	}
	cfg.RoPETheta = 10000
	if f.has("llama.rope.freq_base") {
		if cfg.RoPETheta, err = f.float("llama.rope.freq_base"); err != nil {
			return nil, err
		}
	}
	if opt.ContextTokens < 0 {
		return nil, fmt.Errorf("engine: GGUF context cap %d must not be negative", opt.ContextTokens)
	}
	if opt.ContextTokens > 0 {
		cfg.ContextTokens = min(cfg.ContextTokens, opt.ContextTokens)
	} else if cfg.ContextTokens > modelDimMax {
		return nil, f.keyError("llama.context_length", "%d is more than the engine's %d: cap the window (--context-tokens)", cfg.ContextTokens, modelDimMax)
	}
	var vocab ggufVocab
	if err := f.readVocab(&vocab); err != nil {
		return nil, err
	}
	cfg.Vocab = len(vocab.Tokens)
	if f.has("llama.vocab_size") {
		n, err := f.uint("llama.vocab_size")
		if err != nil {
			return nil, err
		}
		if n != uint64(cfg.Vocab) {
			return nil, f.keyError("llama.vocab_size", "%d, but tokenizer.ggml.tokens has %d tokens", n, cfg.Vocab)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, &GGUFError{Path: f.path, Offset: -1, Reason: err.Error()}
	}
	m := &ggufModel{cfg: cfg, vocab: vocab}
	if err := f.weights(m); err != nil {
		return nil, err
	}
	return m, nil
}

// weights takes every tensor of a llama model from the file, each of the
// shape cfg implies, and refuses a tensor the model does not use.
func (f *ggufFile) weights(m *ggufModel) error {
	c := m.cfg
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	used := map[string]bool{}
	take := func(name string, dims ...int) (*ggufTensor, error) {
		t := f.tensors[name]
		if t == nil {
			return nil, &GGUFError{Path: f.path, Offset: -1, Reason: fmt.Sprintf("the tensor %q, which a llama model of %d layers needs, is missing", name, c.Layers)}
		}
		if !slices.Equal(t.dims, dims) {
			return nil, &GGUFError{Path: f.path, Offset: t.entry, Reason: fmt.Sprintf("tensor %q has shape %v; the model's metadata implies %v", name, t.dims, dims)}
		}
		used[name] = true
		return t, nil
	}
	// A matrix of GGUF shape [in, out] is out rows of in elements.
	matrix := func(dst *Matrix, name string, in, out int) error {
		t, err := take(name, in, out)
		if err != nil {
			return err
		}
		*dst = Matrix{Type: t.typ, Rows: out, Cols: in}
		if t.typ != WeightF32 {
			dst.Raw = t.data
		} else if dst.F32 = floatsOf(t.data); dst.F32 == nil {
			dst.F32 = make([]float32, in*out)
			decodeKV(dst.F32, t.data, kv.F32) // the same little-endian floats
		}
		return nil
	}
	norm := func(dst *[]float32, name string) error {
		t, err := take(name, c.Dim)
		if err != nil {
			return err
		}
		if t.typ != WeightF32 && t.typ != WeightF16 && t.typ != WeightBF16 {
			return &GGUFError{Path: f.path, Offset: t.entry, Reason: fmt.Sprintf("norm %q is %s; norms must be F32, F16 or BF16", name, t.typ)}
		}
		*dst = make([]float32, c.Dim)
		if t.typ == WeightF32 {
			decodeKV(*dst, t.data, kv.F32)
		} else {
			widen(*dst, t.data, t.typ, 0)
		}
		return nil
	}
	w := &m.w
	if err := matrix(&w.Embed, "token_embd.weight", c.Dim, c.Vocab); err != nil {
		return err
	}
	w.Out = w.Embed
	if !c.TiedEmbeddings {
		if err := matrix(&w.Out, "output.weight", c.Dim, c.Vocab); err != nil {
			return err
		}
	}
	if err := norm(&w.Norm, "output_norm.weight"); err != nil {
		return err
	}
	if least := 9*c.Layers + 2; len(f.names) < least {
		return &GGUFError{Path: f.path, Offset: -1, Reason: fmt.Sprintf("the file has %d tensors; a llama model of %d layers has at least %d",
			len(f.names), c.Layers, least)}
	}
	w.Layers = make([]LayerWeights, c.Layers)
	for i := range w.Layers {
		l, p := &w.Layers[i], fmt.Sprintf("blk.%d.", i)
		for _, mt := range []struct {
			dst     *Matrix
			name    string
			in, out int
		}{{&l.WQ, "attn_q", c.Dim, qd}, {&l.WK, "attn_k", c.Dim, kvd}, {&l.WV, "attn_v", c.Dim, kvd},
			{&l.WO, "attn_output", qd, c.Dim}, {&l.W1, "ffn_gate", c.Dim, c.HiddenDim},
			{&l.W2, "ffn_down", c.HiddenDim, c.Dim}, {&l.W3, "ffn_up", c.Dim, c.HiddenDim}} {
			if err := matrix(mt.dst, p+mt.name+".weight", mt.in, mt.out); err != nil {
				return err
			}
		}
		if err := norm(&l.AttnNorm, p+"attn_norm.weight"); err != nil {
			return err
		}
		if err := norm(&l.MLPNorm, p+"ffn_norm.weight"); err != nil {
			return err
		}
	}
	for _, name := range f.names {
		if !used[name] {
			t := f.tensors[name]
			why := "a llama model of this shape has no such tensor"
			if strings.HasPrefix(name, "rope_freqs") {
				why = "rotary frequency factors (RoPE scaling) are not computed by the engine"
			}
			return &GGUFError{Path: f.path, Offset: t.entry, Reason: fmt.Sprintf("tensor %q: %s", name, why)}
		}
	}
	return nil
}

// floatsOf is the float32 elements stored little-endian in b, in place, or
// nil when b is not aligned for float32 (a file whose alignment is below
// 4): then the caller copies.
func floatsOf(b []byte) []float32 {
	if len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// readVocab reads the tokenizer.* keys into v, checking every id and
// array length against the vocabulary.
func (f *ggufFile) readVocab(v *ggufVocab) error {
	var err error
	if v.Model, err = f.string("tokenizer.ggml.model"); err != nil {
		return err
	}
	if v.Tokens, err = f.strings("tokenizer.ggml.tokens"); err != nil {
		return err
	}
	n := len(v.Tokens)
	if f.has("tokenizer.ggml.pre") {
		if v.Pre, err = f.string("tokenizer.ggml.pre"); err != nil {
			return err
		}
	}
	if f.has("tokenizer.ggml.scores") {
		v.Scores = make([]float32, n)
		if err := f.numbers("tokenizer.ggml.scores", n, func(i int, x float64) { v.Scores[i] = float32(x) }); err != nil {
			return err
		}
	}
	if f.has("tokenizer.ggml.token_type") {
		v.Types = make([]int32, n)
		bad, badType := -1, 0.0 // the first token of no type
		if err := f.numbers("tokenizer.ggml.token_type", n, func(i int, x float64) {
			if (x != math.Trunc(x) || x < 0 || x > 6) && bad < 0 {
				bad, badType = i, x
			}
			v.Types[i] = int32(x)
		}); err != nil {
			return err
		}
		if bad >= 0 {
			return f.keyError("tokenizer.ggml.token_type", "token %d has type %g; types are 0 to 6", bad, badType)
		}
	}
	for _, id := range []struct {
		key string
		v   *int
	}{{"tokenizer.ggml.bos_token_id", &v.BOS}, {"tokenizer.ggml.eos_token_id", &v.EOS},
		{"tokenizer.ggml.unknown_token_id", &v.Unknown}, {"tokenizer.ggml.padding_token_id", &v.Padding}} {
		*id.v = -1
		if !f.has(id.key) {
			continue
		}
		x, err := f.uint(id.key)
		if err != nil {
			return err
		}
		if x >= uint64(n) {
			return f.keyError(id.key, "id %d is outside the %d tokens", x, n)
		}
		*id.v = int(x)
	}
	for _, b := range []struct {
		key string
		v   *bool
		def bool
	}{{"tokenizer.ggml.add_bos_token", &v.AddBOS, true}, {"tokenizer.ggml.add_eos_token", &v.AddEOS, false},
		{"tokenizer.ggml.add_space_prefix", &v.AddSpacePrefix, true}} {
		if *b.v, err = f.bool(b.key, b.def); err != nil {
			return err
		}
	}
	if f.has("tokenizer.chat_template") {
		if v.ChatTemplate, err = f.string("tokenizer.chat_template"); err != nil {
			return err
		}
	}
	return nil
}
