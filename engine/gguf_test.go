package engine

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/internal/stories"
	"github.com/kvwarden/kvwarden/kv"
)

// readStoriesGGUF reads the stories260K GGUF file of type typ.
func readStoriesGGUF(t testing.TB, typ string) (*ggufModel, []byte) {
	t.Helper()
	path := stories.GGUF(t, typ)
	m, err := readGGUF(path, GGUFOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return m, data
}

// widened is w with every matrix widened to float32.
func widened(w Weights) Weights {
	f := func(m Matrix) Matrix {
		out := make([]float32, m.Rows*m.Cols)
		for r := range m.Rows {
			m.row(r, out[r*m.Cols:(r+1)*m.Cols])
		}
		return F32Matrix(m.Rows, m.Cols, out)
	}
	tied := w.tied()
	w.Embed = f(w.Embed)
	if tied {
		w.Out = w.Embed
	} else {
		w.Out = f(w.Out)
	}
	w.Layers = slices.Clone(w.Layers)
	for i := range w.Layers {
		for _, m := range w.Layers[i].matrices() {
			*m = f(*m)
		}
	}
	return w
}

// TestGGUFStories reads the three GGUF files of stories260K and requires
// the README's geometry, tensor types and vocabulary, and weights equal to
// the llama2.c checkpoint's: bit for bit in F32, and in F16 and Q8_0 the
// bytes ggml's reference conversion makes of the checkpoint's floats
// (quantize, written from ggml's description, not from the reader).
func TestGGUFStories(t *testing.T) {
	binCfg, bin, _ := readStories260K(t)
	bpe, err := ReadTokenizer(stories.Dir()+"/tok512.bin", 512)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file, typ string // and the README's tensor types
		wt        WeightType
	}{{"f32", "F32 47", WeightF32}, {"f16", "F16 36, F32 11", WeightF16}, {"q8_0", "Q8_0 31, F32 11, F16 5", WeightQ8_0}} {
		m, _ := readStoriesGGUF(t, c.file)
		want := binCfg
		want.NormEps = float64(float32(1e-5)) // the file's float32
		if m.cfg != want {
			t.Fatalf("%s: config %+v, the checkpoint's %+v", c.file, m.cfg, want)
		}
		loaded, err := LoadGGUF(stories.GGUF(t, c.file), GGUFOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := loaded.WeightTypes(); got != c.typ {
			t.Fatalf("%s: tensor types %s, the README's %s", c.file, got, c.typ)
		}
		if !m.w.tied() {
			t.Fatalf("%s: the output head is not the embedding", c.file)
		}
		same := func(name string, got Matrix, want Matrix) {
			typ := c.wt
			if c.wt == WeightQ8_0 && strings.Contains(name, "w2") {
				typ = WeightF16 // ffn_down rows of 172 are not whole blocks
			}
			if got.Type != typ || got.Rows != want.Rows || got.Cols != want.Cols {
				t.Fatalf("%s: %s is %s %d×%d, want %s %d×%d", c.file, name, got.Type, got.Rows, got.Cols, typ, want.Rows, want.Cols)
			}
			if typ == WeightF32 {
				if !sameBits(got.F32, want.F32) {
					t.Fatalf("%s: %s differs from the checkpoint", c.file, name)
				}
				return
			}
			if q := quantize(want.F32, typ); !slices.Equal(got.Raw, q) {
				i := 0
				for i < len(q) && got.Raw[i] == q[i] {
					i++
				}
				t.Fatalf("%s: %s differs from the checkpoint's floats as %s at byte %d", c.file, name, typ, i)
			}
		}
		same("embedding", m.w.Embed, bin.Embed)
		for i := range bin.Layers {
			g, b := &m.w.Layers[i], &bin.Layers[i]
			for j, name := range []string{"wq", "wk", "wv", "wo", "w1", "w2", "w3"} {
				same(name, *g.matrices()[j], *b.matrices()[j])
			}
			if !sameBits(g.AttnNorm, b.AttnNorm) || !sameBits(g.MLPNorm, b.MLPNorm) {
				t.Fatalf("%s: layer %d norms differ", c.file, i)
			}
		}
		if !sameBits(m.w.Norm, bin.Norm) {
			t.Fatalf("%s: final norm differs", c.file)
		}
		v := m.vocab
		if v.Model != "llama" || len(v.Tokens) != 512 || v.BOS != 1 || v.EOS != 2 || v.Unknown != 0 || v.Padding != -1 ||
			!v.AddBOS || v.AddEOS || !v.AddSpacePrefix || v.ChatTemplate != "" {
			t.Fatalf("%s: vocabulary %s, %d tokens, BOS %d EOS %d unknown %d padding %d, add BOS %v EOS %v space %v, template %q",
				c.file, v.Model, len(v.Tokens), v.BOS, v.EOS, v.Unknown, v.Padding, v.AddBOS, v.AddEOS, v.AddSpacePrefix, v.ChatTemplate)
		}
		for id, tok := range v.Tokens {
			wantType, wantPiece := int32(1), strings.ReplaceAll(string(bpe.pieces[id]), " ", "▁")
			switch {
			case id == 0:
				wantType = 2
			case id <= 2:
				wantType, wantPiece = 3, []string{"", "<s>", "</s>"}[id]
			case id < bpeOrdinary:
				wantType = 6
			}
			if v.Types[id] != wantType || tok != wantPiece || v.Scores[id] != bpe.scores[id] {
				t.Fatalf("%s: token %d is %q type %d score %g; want %q type %d score %g", c.file, id, tok, v.Types[id], v.Scores[id],
					wantPiece, wantType, bpe.scores[id])
			}
		}
	}
}

// TestGGUFComputesWidened: a model of F16 or Q8_0 weights computes
// exactly what the model of its weights widened to float32 computes, in
// every kernel set, since widening is exact and the order of every sum is
// the same.
func TestGGUFComputesWidened(t *testing.T) {
	prompt := []int{1, 403, 407, 261, 378, 308, 288, 480}
	for _, file := range []string{"f16", "q8_0"} {
		m, _ := readStoriesGGUF(t, file)
		for _, ks := range append([]*kernelSet{&genericKernels}, fastKernels...) {
			saved := kern
			kern = ks
			q, err := NewEngine(m.cfg, m.w)
			if err != nil {
				t.Fatal(err)
			}
			f, err := NewEngine(m.cfg, widened(m.w))
			if err != nil {
				t.Fatal(err)
			}
			got, err1 := q.Reference(prompt, 40)
			want, err2 := f.Reference(prompt, 40)
			kern = saved
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s, %s kernels: %v; widened to F32 %v", file, ks.name, got, want)
			}
		}
	}
}

// TestGGUFRefusals edits the F32 file one way each and requires the
// reader to refuse it with a GGUFError that says what is wrong.
func TestGGUFRefusals(t *testing.T) {
	path := stories.GGUF(t, "f32")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := parseGGUF(path, data)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(e func(b *ggufBuild)) []byte {
		b := buildOf(f)
		e(b)
		return b.bytes()
	}
	if got := edit(func(*ggufBuild) {}); !slices.Equal(got, data) {
		t.Fatal("the builder does not write the file it read (the edits below would test the builder)")
	}
	le := func(b []byte, off int, v uint64, n int) []byte {
		c := slices.Clone(b)
		for i := range n {
			c[off+i] = byte(v >> (8 * i))
		}
		return c
	}
	tooLong := func(b *ggufBuild) {
		b.set("general.name", ggufString, ggufStr(strings.Repeat("x", GGUFStringBytesMax+1)))
	}
	for _, c := range []struct {
		what, want string
		file       []byte
	}{
		{"empty", "shorter than GGUF's 24-byte header", nil},
		{"magic", `magic "GGUX"`, le(data, 0, 0x58554747, 4)},
		{"version 1", "version 1 is not 2 or 3", le(data, 4, 1, 4)},
		{"big-endian", "version 3 is big-endian", le(data, 4, 3<<24, 4)},
		{"tensor count", "1099511627776 tensors", le(data, 8, 1<<40, 8)},
		{"key count", "65537 metadata keys", le(data, 16, GGUFKeysMax+1, 8)},
		{"truncated index", "runs past the end", data[:5000]},
		{"truncated data", "run past the end of the", data[:len(data)-1]},
		{"string bound", "longer than the 1048576-byte bound", edit(tooLong)},
		{"array count", "does not fit", edit(func(b *ggufBuild) {
			b.set("tokenizer.ggml.scores", ggufArray, slices.Concat(ggufU32(ggufFloat32), le(make([]byte, 8), 0, 1<<50, 8)))
		})},
		{"duplicate key", `key "general.name" appears twice`, edit(func(b *ggufBuild) {
			b.kvs = append(b.kvs, ggufKVOut{"general.name", ggufString, ggufStr("a")}, ggufKVOut{"general.name", ggufString, ggufStr("b")})
		})},
		{"value type", "value type 13", edit(func(b *ggufBuild) { b.set("x", 13, nil) })},
		{"alignment", "general.alignment 48 is not a power of two", edit(func(b *ggufBuild) { b.set("general.alignment", ggufUint32, ggufU32(48)) })},
		{"architecture", `"qwen2" is not an architecture the engine computes`, edit(func(b *ggufBuild) {
			b.set("general.architecture", ggufString, ggufStr("qwen2"))
		})},
		{"missing key", `"llama.block_count", which a llama model needs, is missing`, edit(func(b *ggufBuild) { b.del("llama.block_count") })},
		{"key type", `key "llama.block_count": a string`, edit(func(b *ggufBuild) { b.set("llama.block_count", ggufString, ggufStr("5")) })},
		{"kv heads", "must be a multiple of KVHeads (3)", edit(func(b *ggufBuild) { b.set("llama.attention.head_count_kv", ggufUint32, ggufU32(3)) })},
		{"head size", "is not the head size 8", edit(func(b *ggufBuild) { b.set("llama.rope.dimension_count", ggufUint32, ggufU32(4)) })},
		{"rope scaling", "without scaling", edit(func(b *ggufBuild) { b.set("llama.rope.scaling.type", ggufString, ggufStr("yarn")) })},
		{"experts", "mixtures of experts", edit(func(b *ggufBuild) { b.set("llama.expert_count", ggufUint32, ggufU32(8)) })},
		{"vocab size", "512 tokens", edit(func(b *ggufBuild) { b.set("llama.vocab_size", ggufUint32, ggufU32(500)) })},
		{"scores", "511 values for 512 tokens", edit(func(b *ggufBuild) {
			b.set("tokenizer.ggml.scores", ggufArray, ggufArr(ggufFloat32, 511, make([]byte, 4*511)))
		})},
		{"token id", "id 512 is outside the 512 tokens", edit(func(b *ggufBuild) { b.set("tokenizer.ggml.eos_token_id", ggufUint32, ggufU32(512)) })},
		{"missing tensor", `"blk.4.ffn_up.weight", which a llama model of 5 layers needs, is missing`, edit(func(b *ggufBuild) {
			b.tensor("blk.4.ffn_up.weight").name = "blk.5.ffn_up.weight"
		})},
		{"tensor count", "the file has 46 tensors; a llama model of 5 layers has at least 47", edit(func(b *ggufBuild) {
			b.tensors = slices.DeleteFunc(b.tensors, func(t ggufTensorOut) bool { return t.name == "blk.4.ffn_up.weight" })
		})},
		{"array element type", "an array of type 200", edit(func(b *ggufBuild) { b.set("x", ggufArray, ggufArr(200, 1, make([]byte, 8))) })},
		{"token type", "token 7 has type 9", edit(func(b *ggufBuild) {
			types := make([]byte, 0, 4*512)
			for i := range 512 {
				typ := uint32(1)
				if i == 7 {
					typ = 9
				}
				types = append(types, ggufU32(typ)...)
			}
			b.set("tokenizer.ggml.token_type", ggufArray, ggufArr(ggufInt32, 512, types))
		})},
		{"extra tensor", `"rope_freqs.weight": rotary frequency factors`, edit(func(b *ggufBuild) {
			b.tensors = append(b.tensors, ggufTensorOut{"rope_freqs.weight", []int{4}, WeightF32, make([]byte, 16)})
		})},
		{"shape", `"blk.0.attn_k.weight" has shape [64 64]`, edit(func(b *ggufBuild) {
			tt := b.tensor("blk.0.attn_k.weight")
			tt.dims, tt.data = []int{64, 64}, make([]byte, 64*64*4)
		})},
		{"quant type", "ggml type 12 (Q4_K)", edit(func(b *ggufBuild) { b.tensor("blk.1.attn_q.weight").typ = 12 })},
		{"partial block", "rows of 172 elements are not whole Q8_0 blocks", edit(func(b *ggufBuild) {
			tt := b.tensor("blk.0.ffn_down.weight")
			tt.typ, tt.data = WeightQ8_0, make([]byte, 0)
		})},
		{"non-finite", "layer 2 w1 weight 7 is NaN", edit(func(b *ggufBuild) {
			copy(b.tensor("blk.2.ffn_gate.weight").data[28:], ggufF32(float32(math.NaN())))
		})},
		{"dimensions", "has 5 dimensions", edit(func(b *ggufBuild) { b.tensor("output_norm.weight").dims = []int{64, 1, 1, 1, 1} })},
	} {
		_, err := parseModelBytes(t, c.file)
		var ge *GGUFError
		var we *WeightError
		if err == nil || !errors.As(err, &ge) && !errors.As(err, &we) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want a GGUF error saying %q", c.what, err, c.want)
		}
	}
}

// parseModelBytes parses a GGUF file's bytes and maps them to a model, as
// readGGUF does with a file, then checks the weights as NewEngine does.
func parseModelBytes(t testing.TB, data []byte) (*ggufModel, error) {
	f, err := parseGGUF("test.gguf", data)
	if err != nil {
		return nil, err
	}
	m, err := f.model(GGUFOptions{})
	if err != nil {
		return nil, err
	}
	return m, m.w.check(m.cfg)
}

// FuzzGGUF feeds the reader edits of a small valid file: it must never
// panic, and must refuse with a GGUFError or a WeightError, or read a
// model that validates.
func FuzzGGUF(f *testing.F) {
	for _, typ := range []WeightType{WeightQ8_0, WeightF16, WeightQ4_0, WeightBF16} {
		seed := tinyGGUF(typ)
		if _, err := parseModelBytes(f, seed); err != nil {
			f.Fatalf("the %s seed is refused: %v", typ, err)
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseModelBytes(t, data)
		var ge *GGUFError
		var we *WeightError
		switch {
		case err == nil:
			if verr := m.cfg.Validate(); verr != nil {
				t.Fatalf("a model that does not validate was read: %v", verr)
			}
			fuzzGGUFVocab(t, &m.vocab)
		case !errors.As(err, &ge) && !errors.As(err, &we):
			t.Fatalf("refused with %T %v; want *GGUFError or *WeightError", err, err)
		}
	})
}

// fuzzGGUFVocab makes the tokenizer and chat template of a vocabulary the
// reader took: refused with a typed error, or one that encodes text to
// BOS and tokens of the vocabulary only, and decodes them.
func fuzzGGUFVocab(t *testing.T, v *GGUFVocab) {
	tok, err := NewGGUFTokenizer("fuzz.gguf", v)
	var ve *VocabError
	var me *TokenizerModelError
	switch {
	case errors.As(err, &ve) || errors.As(err, &me):
		return
	case err != nil:
		t.Fatalf("tokenizer refused with %T %v; want *VocabError or *TokenizerModelError", err, err)
	}
	for _, text := range []string{"", "Once upon a time", " <s></s>\n\xff\xfe wörld ▁▁", "<|im_start|>user"} {
		ids := tok.Encode(text)
		if len(ids) == 0 || ids[0] != tok.BOS() {
			t.Fatalf("%q encodes to %v, not BOS (%d) first", text, ids, tok.BOS())
		}
		for _, id := range ids {
			if id < 0 || id >= tok.Vocab() {
				t.Fatalf("%q encodes to %v: %d is outside the %d tokens", text, ids, id, tok.Vocab())
			}
		}
		DecodeText(tok, -1, ids)
	}
	if chat, _ := DetectChatTemplate(v.ChatTemplate, tok); chat != nil {
		chat.EncodeWithin([]ChatMessage{{Role: "system", Content: "s"}, {Role: "user", Content: "<|im_end|>u"}}, 1<<20)
	}
}

// tinyGGUF is a valid llama GGUF of the smallest shape whose rows are
// whole blocks: width 32, one layer, the vocabulary of the byte fallback.
func tinyGGUF(typ WeightType) []byte {
	cfg := ModelConfig{Vocab: bpeOrdinary + 5, Dim: 32, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 16, HiddenDim: 64,
		ContextTokens: 64, RoPETheta: 10000, NormEps: 1e-5, Seed: 3}
	return writeGGUF(cfg, seededWeights(cfg), typ, syntheticVocab(cfg.Vocab))
}

// syntheticVocab is a SentencePiece vocabulary of n tokens laid out as
// llama's: unknown, BOS, EOS, the 256 byte tokens, then pieces of a few
// letters each, scored so that longer pieces merge first.
func syntheticVocab(n int) ggufVocab {
	v := ggufVocab{Model: "llama", BOS: 1, EOS: 2, Unknown: 0, Padding: -1, AddBOS: true, AddSpacePrefix: true}
	v.Tokens = []string{"<unk>", "<s>", "</s>"}
	v.Types = []int32{2, 3, 3}
	for b := range 256 {
		v.Tokens = append(v.Tokens, fmt.Sprintf("<0x%02X>", b))
		v.Types = append(v.Types, 6)
	}
	for i := 0; len(v.Tokens) < n; i++ {
		piece := "▁"
		for j := i; ; j /= 26 {
			piece += string(rune('a' + j%26))
			if j < 26 {
				break
			}
		}
		v.Tokens = append(v.Tokens, piece)
		v.Types = append(v.Types, 1)
	}
	v.Scores = make([]float32, n)
	for i := bpeOrdinary; i < n; i++ {
		v.Scores[i] = float32(-i)
	}
	return v
}

// writeGGUF is a GGUF file of cfg's llama model with weights w, its
// matrices stored as typ where their rows are whole blocks of it (else
// F16, as llama.cpp's converter does), and the vocabulary v.
func writeGGUF(cfg ModelConfig, w Weights, typ WeightType, v ggufVocab) []byte {
	b := &ggufBuild{version: 3, align: ggufDefaultAlignment}
	u32 := func(k string, n int) { b.set(k, ggufUint32, ggufU32(uint32(n))) }
	b.set("general.architecture", ggufString, ggufStr("llama"))
	u32("llama.context_length", cfg.ContextTokens)
	u32("llama.embedding_length", cfg.Dim)
	u32("llama.block_count", cfg.Layers)
	u32("llama.feed_forward_length", cfg.HiddenDim)
	u32("llama.attention.head_count", cfg.Heads)
	u32("llama.attention.head_count_kv", cfg.KVHeads)
	u32("llama.rope.dimension_count", cfg.HeadDim)
	b.set("llama.attention.layer_norm_rms_epsilon", ggufFloat32, ggufF32(float32(cfg.NormEps)))
	b.set("llama.rope.freq_base", ggufFloat32, ggufF32(float32(cfg.RoPETheta)))
	b.set("tokenizer.ggml.model", ggufString, ggufStr(v.Model))
	var toks, scores, types []byte
	for i, s := range v.Tokens {
		toks = append(toks, ggufStr(s)...)
		scores = append(scores, ggufF32(v.Scores[i])...)
		types = append(types, ggufU32(uint32(v.Types[i]))...)
	}
	b.set("tokenizer.ggml.tokens", ggufArray, ggufArr(ggufString, len(v.Tokens), toks))
	b.set("tokenizer.ggml.scores", ggufArray, ggufArr(ggufFloat32, len(v.Tokens), scores))
	b.set("tokenizer.ggml.token_type", ggufArray, ggufArr(ggufInt32, len(v.Tokens), types))
	u32("tokenizer.ggml.bos_token_id", v.BOS)
	u32("tokenizer.ggml.eos_token_id", v.EOS)
	u32("tokenizer.ggml.unknown_token_id", v.Unknown)
	matrix := func(name string, m Matrix) {
		t := typ
		if _, ok := t.RowBytes(m.Cols); !ok {
			t = WeightF16
		}
		b.tensors = append(b.tensors, ggufTensorOut{name, []int{m.Cols, m.Rows}, t, quantize(m.F32, t)})
	}
	norm := func(name string, v []float32) {
		b.tensors = append(b.tensors, ggufTensorOut{name, []int{len(v)}, WeightF32, quantize(v, WeightF32)})
	}
	matrix("token_embd.weight", w.Embed)
	norm("output_norm.weight", w.Norm)
	if !cfg.TiedEmbeddings {
		matrix("output.weight", w.Out)
	}
	for i, l := range w.Layers {
		p := "blk." + strconv.Itoa(i) + "."
		norm(p+"attn_norm.weight", l.AttnNorm)
		matrix(p+"attn_q.weight", l.WQ)
		matrix(p+"attn_k.weight", l.WK)
		matrix(p+"attn_v.weight", l.WV)
		matrix(p+"attn_output.weight", l.WO)
		norm(p+"ffn_norm.weight", l.MLPNorm)
		matrix(p+"ffn_gate.weight", l.W1)
		matrix(p+"ffn_down.weight", l.W2)
		matrix(p+"ffn_up.weight", l.W3)
	}
	return b.bytes()
}

// TestLogitsFollowReference: the logits of a sequence computed in one pass
// pick, at every position, the token Reference generated there.
func TestLogitsFollowReference(t *testing.T) {
	m, _ := readStoriesGGUF(t, "q8_0")
	e, err := NewEngine(m.cfg, m.w)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int{1, 403, 407, 261}
	gen, err := e.Reference(prompt, 60)
	if err != nil {
		t.Fatal(err)
	}
	seq := append(slices.Clone(prompt), gen...)
	logits, err := e.Logits(seq[:len(seq)-1])
	if err != nil {
		t.Fatal(err)
	}
	v := m.cfg.Vocab
	if len(logits) != (len(seq)-1)*v {
		t.Fatalf("%d logits for %d positions of %d tokens", len(logits), len(seq)-1, v)
	}
	for i := len(prompt) - 1; i < len(seq)-1; i++ {
		if got := argmax(logits[i*v : (i+1)*v]); got != seq[i+1] {
			t.Fatalf("position %d: the logits pick %d, Reference %d", i, got, seq[i+1])
		}
	}
}

// TestGGUFModels loads each stories260K GGUF file as a node does: the F32
// file writes the model card's story from an empty prompt, and the three
// files, the llama2.c checkpoint among them, have four fingerprints, so
// that nodes serving different quantizations refuse each other.
func TestGGUFModels(t *testing.T) {
	seen := map[Fingerprint]string{loadStories(t, kv.F32).Fingerprint(): "stories260K.bin"}
	for _, typ := range []string{"f32", "f16", "q8_0"} {
		m, err := LoadGGUF(stories.GGUF(t, typ), GGUFOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := seen[m.Fingerprint()]; ok {
			t.Fatalf("%s has the fingerprint of %s", typ, other)
		}
		seen[m.Fingerprint()] = typ
		if m.Name() != "stories260K-"+typ || m.Tokenizer().Stop() != 2 || m.Tokenizer().BOS() != 1 {
			t.Fatalf("%s: name %q, BOS %d, stop %d", typ, m.Name(), m.Tokenizer().BOS(), m.Tokenizer().Stop())
		}
		if chat, why := m.ChatTemplate(); chat != nil || !strings.Contains(why, "no chat template") {
			t.Fatalf("%s: chat template %v (%q); the file has none", typ, chat, why)
		}
		if typ != "f32" {
			continue
		}
		if got, want := m.WeightBytes(), m.Config().WeightBytes(); got != want {
			t.Fatalf("F32 weight bytes %d; the config's %d", got, want)
		}
		tokens, err := m.Reference("", 256)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Text("", tokens); got != stories.Published(t) {
			t.Fatalf("the F32 GGUF writes\n%s\nnot the model card's\n%s", got, stories.Published(t))
		}
	}
}

// TestGGUFParseCostIsTheFiles: a file of a long key whose value is many
// strings, or of many numbers for a vocabulary they do not fit, costs the
// parser allocations in proportion to the file, not to the key's length
// times the strings, or eight bytes a byte.
func TestGGUFParseCostIsTheFiles(t *testing.T) {
	tiny, err := parseGGUF("tiny.gguf", tinyGGUF(WeightQ8_0))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		edit func(b *ggufBuild)
	}{
		{"a 64 KiB key of 100,000 empty strings", func(b *ggufBuild) {
			b.set(strings.Repeat("k", 64<<10), ggufArray, ggufArr(ggufString, 100_000, make([]byte, 8*100_000)))
		}},
		{"a million uint8 scores", func(b *ggufBuild) {
			b.set("tokenizer.ggml.scores", ggufArray, ggufArr(ggufUint8, 1<<20, make([]byte, 1<<20)))
		}},
	} {
		b := buildOf(tiny)
		c.edit(b)
		data := b.bytes()
		before := allocatedBytes()
		_, _ = parseModelBytes(t, data)
		if used := allocatedBytes() - before; used > 4*uint64(len(data)) {
			t.Errorf("%s: reading a %d-byte file allocated %d bytes", c.what, len(data), used)
		}
	}
}
