package engine

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/kvwarden/kvwarden/kv"
)

// Model is what a node serves: a model's config and weights, the engine
// that computes them, the tokenizer that defines its tokens, and a
// fingerprint of all of these. It is immutable, and one Model is shared by
// every worker of a node.
type Model struct {
	name   string
	cfg    ModelConfig
	engine *ReferenceEngine
	tok    Tokenizer
	fp     Fingerprint
	// types counts the model's tensors (matrices and norms) of each
	// weight type.
	types map[WeightType]int
	// chat is the model's chat template, nil when it has none the engine
	// renders, and chatWhy then says why.
	chat    *ChatTemplate
	chatWhy string
}

// NewModel validates cfg, w and tok against each other (the tokenizer's
// vocabulary must be the model's) and computes the fingerprint. name says
// where the model came from, for people: a file name, or "builtin".
func NewModel(name string, cfg ModelConfig, w Weights, tok Tokenizer) (*Model, error) {
	if name == "" || len(name) > ModelNameBytesMax || !utf8.ValidString(name) {
		return nil, fmt.Errorf("engine: model name %q must be 1 to %d bytes of UTF-8", name, ModelNameBytesMax)
	}
	if tok.Vocab() != cfg.Vocab {
		return nil, &TokenizerVocabError{Have: tok.Vocab(), Want: cfg.Vocab}
	}
	for _, sp := range []struct {
		name string
		id   int
	}{{"BOS", tok.BOS()}, {"stop", tok.Stop()}} {
		if sp.id < 0 || sp.id >= cfg.Vocab {
			return nil, fmt.Errorf("engine: the tokenizer's %s token %d is outside the vocabulary [0, %d)", sp.name, sp.id, cfg.Vocab)
		}
	}
	e, err := NewEngine(cfg, w)
	if err != nil {
		return nil, err
	}
	types := map[WeightType]int{WeightF32: 1 + 2*len(w.Layers)} // the norms
	for _, m := range append([]*Matrix{&w.Embed}, w.allMatrices()...) {
		types[m.Type]++
	}
	if !w.tied() {
		types[w.Out.Type]++
	}
	return &Model{name: name, cfg: cfg, engine: e, tok: tok, fp: fingerprint(cfg, &w, tok), types: types}, nil
}

// BuiltinName is the name of every BuiltinModel.
const BuiltinName = "builtin"

// BuiltinModel is the embedded default of cfg: weights generated from its
// seed and the byte tokenizer. It needs no files.
func BuiltinModel(cfg ModelConfig) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return NewModel(BuiltinName, cfg, seededWeights(cfg), ByteTokenizer{})
}

// LoadModel reads a llama2.c checkpoint and its tokenizer
// (ReadCheckpoint, ReadTokenizer), each validated before its arrays are
// allocated, with K and V of type kvDType in KV pages (zero means f32).
// The model is named after the checkpoint's file, without its extension.
func LoadModel(modelPath, tokenizerPath string, kvDType kv.DType) (*Model, error) {
	cfg, w, err := ReadCheckpoint(modelPath, CheckpointOptions{KVDType: kvDType})
	if err != nil {
		return nil, err
	}
	tok, err := ReadTokenizer(tokenizerPath, cfg.Vocab)
	if err != nil {
		return nil, err
	}
	return NewModel(modelName(modelPath), cfg, w, tok)
}

// IsGGUF says the file at path starts as a GGUF file does.
func IsGGUF(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var b [4]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return false, nil // shorter than a magic: not GGUF
	}
	return binary.LittleEndian.Uint32(b[:]) == ggufMagic, nil
}

// LoadGGUF reads the GGUF file at path (see GGUFOptions) and serves it
// with the tokenizer its metadata describes. The file is read once: a
// change to it afterwards changes nothing served. The model is named
// after the file, without its extension.
func LoadGGUF(path string, opt GGUFOptions) (*Model, error) {
	g, err := readGGUF(path, opt)
	if err != nil {
		return nil, err
	}
	tok, err := NewGGUFTokenizer(path, &g.vocab)
	if err != nil {
		return nil, err
	}
	m, err := NewModel(modelName(path), g.cfg, g.w, tok)
	if err != nil {
		return nil, err
	}
	m.chat, m.chatWhy = DetectChatTemplate(g.vocab.ChatTemplate, tok)
	return m, nil
}

// modelName is the base name of path without its extension (what an API
// client names the model by: "stories260K"), shortened to
// ModelNameBytesMax bytes on a character boundary.
func modelName(path string) string {
	base := filepath.Base(path)
	if stem := strings.TrimSuffix(base, filepath.Ext(base)); stem != "" {
		base = stem
	}
	name := strings.ToValidUTF8(base, "\uFFFD")
	for len(name) > ModelNameBytesMax {
		_, size := utf8.DecodeLastRuneInString(name)
		name = name[:len(name)-size]
	}
	return name
}

// ModelNameBytesMax bounds a model's name, in bytes.
const ModelNameBytesMax = 128

// Name says where the model came from.
func (m *Model) Name() string { return m.name }

// Config is the model's shape.
func (m *Model) Config() ModelConfig { return m.cfg }

// Engine computes the model; it is shared, like the model.
func (m *Model) Engine() Engine { return m.engine }

// Tokenizer defines the model's tokens.
func (m *Model) Tokenizer() Tokenizer { return m.tok }

// WeightBytes is the bytes of the model's weights, which decode reads
// once per step (a tied output head counted once).
func (m *Model) WeightBytes() int64 { return m.engine.m.w.Bytes() }

// WeightTypes says how many of the model's tensors (matrices and norms)
// have each weight type, most first: "Q8_0 31, F32 11, F16 5".
func (m *Model) WeightTypes() string {
	types := slices.Collect(maps.Keys(m.types))
	slices.SortFunc(types, func(a, b WeightType) int {
		if m.types[a] != m.types[b] {
			return m.types[b] - m.types[a]
		}
		return int(a) - int(b)
	})
	parts := make([]string, len(types))
	for i, t := range types {
		parts[i] = fmt.Sprintf("%s %d", t, m.types[t])
	}
	return strings.Join(parts, ", ")
}

// ChatTemplate is the model's chat template, from its GGUF file; nil when
// it has none the engine renders, and why then says why, a line for the
// log ("" for a model that is no GGUF file's).
func (m *Model) ChatTemplate() (t *ChatTemplate, why string) { return m.chat, m.chatWhy }

// Logits is the engine's Logits over tokens.
func (m *Model) Logits(tokens []int) ([]float32, error) { return m.engine.Logits(tokens) }

// Fingerprint identifies the model's function: config, weights and
// tokenizer.
func (m *Model) Fingerprint() Fingerprint { return m.fp }

// Reference is the engine's Reference over the tokens of the text prompt:
// maxNew greedy tokens, not cut at the stop token. It may be called from
// any number of goroutines at once.
func (m *Model) Reference(prompt string, maxNew int) ([]int, error) {
	return m.engine.Reference(m.tok.Encode(prompt), maxNew)
}

// Answer is what a node serving m answers for the text prompt with at most
// maxNew tokens: the reference over the prompt's tokens, ending at the
// first Stop token if one comes (the Stop token included). Every serving
// path must give exactly this.
func (m *Model) Answer(prompt string, maxNew int) ([]int, error) {
	tokens, err := m.Reference(prompt, maxNew)
	if i := slices.Index(tokens, m.tok.Stop()); i >= 0 {
		tokens = tokens[:i+1]
	}
	return tokens, err
}

// Text is the text of tokens generated after prompt: the pieces after the
// prompt's last token, joined into UTF-8.
func (m *Model) Text(prompt string, tokens []int) string {
	p := m.tok.Encode(prompt)
	return DecodeText(m.tok, p[len(p)-1], tokens)
}
