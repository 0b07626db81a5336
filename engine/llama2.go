package engine

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/kvwarden/kvwarden/kv"
)

// llama2.c checkpoints come in two float32 layouts, both little-endian:
//
// Version 0 ("legacy"): seven int32 (dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size, seq_len), then the embedding, every layer's
// attention norm, wq, wk, wv, wo, FFN norm, w1, w2, w3 (each array for all
// layers in turn), the final norm, two RoPE tables of seq_len × head_size/2
// that the model recomputes and the loader skips, and the classifier only
// when vocab_size is negative (a negative vocabulary marks a classifier of
// its own; positive, it shares the embedding).
//
// Version 1 (export.py's version1_export): uint32 magic "ak42", int32
// version 1, the same seven int32 (vocab_size positive), a uint8
// shared-classifier flag and zeros to 256 bytes; then every layer's
// attention norm, every layer's FFN norm, the final norm, the embedding,
// wq, wk, wv, wo, w1, w2, w3 (each for all layers in turn), and the
// classifier when it is not shared. It has no RoPE tables.

// checkpointMagic is "ak42" read as a little-endian uint32. As a legacy
// file's first int32 (dim) it would be far above modelDimMax, so the two
// layouts never read each other.
const checkpointMagic = 0x616b3432

// Header sizes in bytes.
const (
	legacyHeaderBytes = 7 * 4
	v1HeaderBytes     = 256
)

// llama2.c's fixed hyperparameters, which its files do not carry.
const (
	llama2RoPETheta = 10000
	llama2NormEps   = 1e-5
)

// CheckpointOptions are the model settings a llama2.c checkpoint does not
// carry.
type CheckpointOptions struct {
	// KVDType is the element type of K and V in KV pages; zero means
	// kv.F32.
	KVDType kv.DType
}

// CheckpointSizeError: the file is not the size its header implies: a
// truncated or padded file, or the wrong kind of file. When the file is
// shorter than its header, Want is the header's size.
type CheckpointSizeError struct {
	Path       string // empty for ParseCheckpoint
	Have, Want int64  // bytes
}

func (e *CheckpointSizeError) Error() string {
	return fmt.Sprintf("engine: checkpoint %sis %d bytes; its header implies %d", pathPrefix(e.Path), e.Have, e.Want)
}

// CheckpointHeaderError: a header value is out of range or inconsistent
// with another. Field is llama2.c's name for it.
type CheckpointHeaderError struct {
	Path  string // empty for ParseCheckpoint
	Field string
	Value int64
	Rule  string // what the value must be, with the numbers it is held to
}

func (e *CheckpointHeaderError) Error() string {
	return fmt.Sprintf("engine: checkpoint %sheader %s is %d: it %s", pathPrefix(e.Path), e.Field, e.Value, e.Rule)
}

// pathPrefix is path and a space, so that messages read the same with and
// without a file name.
func pathPrefix(path string) string {
	if path == "" {
		return ""
	}
	return path + " "
}

// checkpointLayout is what a checkpoint's header says.
type checkpointLayout struct {
	cfg     ModelConfig
	version int   // 0 (legacy) or 1
	header  int64 // bytes before the first weight
	size    int64 // bytes of the whole file
}

// ReadCheckpoint loads a llama2.c float32 checkpoint, legacy (version 0) or
// version 1. It reads the header and refuses a file whose size is not the
// one the header implies before reading the weights; see ParseCheckpoint for
// what else it refuses.
func ReadCheckpoint(path string, opt CheckpointOptions) (ModelConfig, Weights, error) {
	f, err := os.Open(path)
	if err != nil {
		return ModelConfig{}, Weights{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ModelConfig{}, Weights{}, err
	}
	head := make([]byte, min(fi.Size(), v1HeaderBytes))
	if _, err := f.ReadAt(head, 0); err != nil {
		return ModelConfig{}, Weights{}, err
	}
	lay, err := parseCheckpointHeader(path, head, fi.Size(), opt)
	if err != nil {
		return ModelConfig{}, Weights{}, err
	}
	data := make([]byte, lay.size)
	if _, err := f.ReadAt(data, 0); err != nil {
		if err == io.EOF { // the file shrank after Stat
			err = io.ErrUnexpectedEOF
		}
		return ModelConfig{}, Weights{}, err
	}
	return decodeCheckpoint(path, data, opt)
}

// ParseCheckpoint decodes a llama2.c float32 checkpoint held in data,
// legacy (version 0) or version 1, into the model's config and weights. It
// validates the header before allocating anything: every dimension in [1,
// 65536], dim a multiple of n_heads, n_heads a multiple of n_kv_heads, an
// even head size, and len(data) exactly the size the header implies
// (*CheckpointHeaderError, *CheckpointSizeError). A NaN or infinite weight
// gives a *WeightError naming the array. The config has llama2.c's fixed
// RoPE theta (10000) and RMSNorm epsilon (1e-5); a shared classifier sets
// TiedEmbeddings and makes Out the same slice as Embed. The weights share
// one backing array, copied out of data.
func ParseCheckpoint(data []byte, opt CheckpointOptions) (ModelConfig, Weights, error) {
	return decodeCheckpoint("", data, opt)
}

func decodeCheckpoint(path string, data []byte, opt CheckpointOptions) (ModelConfig, Weights, error) {
	lay, err := parseCheckpointHeader(path, data, int64(len(data)), opt)
	if err != nil {
		return ModelConfig{}, Weights{}, err
	}
	w := lay.weights(data)
	if err := w.check(lay.cfg); err != nil {
		return ModelConfig{}, Weights{}, err
	}
	return lay.cfg, w, nil
}

// parseCheckpointHeader reads the header at the start of head (at least
// the header's bytes, when the file has them) of a file of size bytes, and
// checks size against it.
func parseCheckpointHeader(path string, head []byte, size int64, opt CheckpointOptions) (checkpointLayout, error) {
	le := binary.LittleEndian
	lay := checkpointLayout{header: legacyHeaderBytes}
	if len(head) >= 4 && le.Uint32(head) == checkpointMagic {
		lay.version, lay.header = 1, v1HeaderBytes
	}
	if size < lay.header {
		return lay, &CheckpointSizeError{Path: path, Have: size, Want: lay.header}
	}
	params := head[:legacyHeaderBytes]
	if lay.version == 1 {
		if v := int32(le.Uint32(head[4:])); v != 1 {
			return lay, &CheckpointHeaderError{Path: path, Field: "version", Value: int64(v), Rule: "must be 1, the float32 layout (2 is int8-quantised)"}
		}
		params = head[8 : 8+legacyHeaderBytes]
	}
	var p [7]int64
	for i := range p {
		p[i] = int64(int32(le.Uint32(params[4*i:])))
	}
	dim, hidden, layers, heads, kvHeads, vocab, seqLen := p[0], p[1], p[2], p[3], p[4], p[5], p[6]
	shared := vocab > 0
	switch lay.version {
	case 0:
		vocab = max(vocab, -vocab)
	case 1:
		flag := head[8+legacyHeaderBytes]
		if flag > 1 {
			return lay, &CheckpointHeaderError{Path: path, Field: "shared_classifier", Value: int64(flag), Rule: "must be 0 or 1"}
		}
		shared = flag == 1
		for i, b := range head[8+legacyHeaderBytes+1 : v1HeaderBytes] {
			if b != 0 {
				return lay, &CheckpointHeaderError{Path: path, Field: fmt.Sprintf("padding byte %d", 8+legacyHeaderBytes+1+i), Value: int64(b), Rule: "must be 0"}
			}
		}
	}
	for i, name := range [7]string{"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"} {
		v, rule := p[i], "must be in [1, %d]"
		if i == 5 && lay.version == 0 {
			v, rule = vocab, "must have a magnitude in [1, %d] (negative: a classifier of its own)"
		}
		if v < 1 || v > modelDimMax {
			return lay, &CheckpointHeaderError{Path: path, Field: name, Value: p[i], Rule: fmt.Sprintf(rule, modelDimMax)}
		}
	}
	switch {
	case dim%heads != 0:
		return lay, &CheckpointHeaderError{Path: path, Field: "dim", Value: dim, Rule: fmt.Sprintf("must be a multiple of n_heads (%d)", heads)}
	case heads%kvHeads != 0:
		return lay, &CheckpointHeaderError{Path: path, Field: "n_heads", Value: heads, Rule: fmt.Sprintf("must be a multiple of n_kv_heads (%d)", kvHeads)}
	case (dim/heads)%2 != 0:
		return lay, &CheckpointHeaderError{Path: path, Field: "dim", Value: dim, Rule: fmt.Sprintf("must give an even head size (dim / n_heads %d = %d) for rotary pairs", heads, dim/heads)}
	}
	lay.cfg = ModelConfig{
		Vocab: int(vocab), Dim: int(dim), Layers: int(layers), Heads: int(heads), KVHeads: int(kvHeads),
		HeadDim: int(dim / heads), HiddenDim: int(hidden), ContextTokens: int(seqLen),
		RoPETheta: llama2RoPETheta, NormEps: llama2NormEps, TiedEmbeddings: shared, KVDType: opt.KVDType,
	}
	if err := lay.cfg.Validate(); err != nil {
		return lay, err
	}
	lay.size = lay.header + 4*(lay.weightFloats()+lay.skippedFloats())
	if size != lay.size {
		return lay, &CheckpointSizeError{Path: path, Have: size, Want: lay.size}
	}
	return lay, nil
}

// weightFloats is the number of weights the model keeps. Every dimension is
// at most modelDimMax = 2^16, so no term exceeds 2^16·7·2^32 < 2^51 and the
// int64 arithmetic cannot overflow.
func (lay checkpointLayout) weightFloats() int64 {
	c := lay.cfg
	dim, kvDim, hidden := int64(c.Dim), int64(c.KVHeads*c.HeadDim), int64(c.HiddenDim)
	perLayer := 2*dim + 2*dim*dim + 2*kvDim*dim + 3*hidden*dim
	n := int64(c.Vocab)*dim + int64(c.Layers)*perLayer + dim
	if !c.TiedEmbeddings {
		n += int64(c.Vocab) * dim
	}
	return n
}

// skippedFloats is the number of floats in the file the model does not
// keep: the legacy layout's two RoPE tables.
func (lay checkpointLayout) skippedFloats() int64 {
	if lay.version != 0 {
		return 0
	}
	return int64(lay.cfg.ContextTokens) * int64(lay.cfg.HeadDim)
}

// weights decodes data, whose size parseCheckpointHeader has checked, into
// one backing array in the file's order.
func (lay checkpointLayout) weights(data []byte) Weights {
	c := lay.cfg
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	floats := make([]float32, lay.weightFloats())
	w := Weights{Layers: make([]LayerWeights, c.Layers)}
	src, dst := data[lay.header:], floats
	// next decodes the next n floats of the file into their own stretch of
	// the backing array, capped so that an append cannot run into the next.
	next := func(n int) []float32 {
		v := dst[:n:n]
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
		src, dst = src[4*n:], dst[n:]
		return v
	}
	each := func(n int, field func(*LayerWeights) *[]float32) {
		for i := range w.Layers {
			*field(&w.Layers[i]) = next(n)
		}
	}
	eachMatrix := func(rows, cols int, field func(*LayerWeights) *Matrix) {
		for i := range w.Layers {
			*field(&w.Layers[i]) = F32Matrix(rows, cols, next(rows*cols))
		}
	}
	attnNorm := func(l *LayerWeights) *[]float32 { return &l.AttnNorm }
	mlpNorm := func(l *LayerWeights) *[]float32 { return &l.MLPNorm }
	if lay.version == 1 {
		each(c.Dim, attnNorm)
		each(c.Dim, mlpNorm)
		w.Norm = next(c.Dim)
	}
	w.Embed = F32Matrix(c.Vocab, c.Dim, next(c.Vocab*c.Dim))
	if lay.version == 0 {
		each(c.Dim, attnNorm)
	}
	eachMatrix(qd, c.Dim, func(l *LayerWeights) *Matrix { return &l.WQ })
	eachMatrix(kvd, c.Dim, func(l *LayerWeights) *Matrix { return &l.WK })
	eachMatrix(kvd, c.Dim, func(l *LayerWeights) *Matrix { return &l.WV })
	eachMatrix(c.Dim, qd, func(l *LayerWeights) *Matrix { return &l.WO })
	if lay.version == 0 {
		each(c.Dim, mlpNorm)
	}
	eachMatrix(c.HiddenDim, c.Dim, func(l *LayerWeights) *Matrix { return &l.W1 })
	eachMatrix(c.Dim, c.HiddenDim, func(l *LayerWeights) *Matrix { return &l.W2 })
	eachMatrix(c.HiddenDim, c.Dim, func(l *LayerWeights) *Matrix { return &l.W3 })
	if lay.version == 0 {
		w.Norm = next(c.Dim)
		src = src[4*lay.skippedFloats():]
	}
	w.Out = w.Embed
	if !c.TiedEmbeddings {
		w.Out = F32Matrix(c.Vocab, c.Dim, next(c.Vocab*c.Dim))
	}
	if len(src) != 0 || len(dst) != 0 {
		panic(fmt.Sprintf("engine: checkpoint layout left %d bytes and %d weights over", len(src), len(dst)))
	}
	return w
}
