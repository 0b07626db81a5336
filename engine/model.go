package engine

import (
	"fmt"
	"math"

	"github.com/kvwarden/kvwarden/kv"
)

// ModelConfig is the shape of a decoder-only transformer: token embedding,
// then Layers blocks of (RMSNorm, grouped-query attention with rotary
// positions, RMSNorm, SwiGLU MLP), then a final RMSNorm and the output head.
// Widths are in elements (float32 values), not bytes.
type ModelConfig struct {
	// Vocab is the number of token ids, 0 to Vocab-1. Must be at least
	// TokenizerVocab, so that every id the byte tokenizer makes is in range.
	Vocab int
	// Dim is the width of the residual stream. Must be at least 1.
	Dim int
	// Layers is the number of transformer blocks. Must be at least 1.
	Layers int
	// Heads is the number of query heads per layer. Must be at least 1 and
	// a multiple of KVHeads.
	Heads int
	// KVHeads is the number of key/value heads per layer; each serves
	// Heads/KVHeads query heads (grouped-query attention). Must be at least
	// 1.
	KVHeads int
	// HeadDim is the width of one head's query, key and value. Must be even
	// and at least 2, because rotary positions rotate pairs of elements.
	HeadDim int
	// HiddenDim is the width of the SwiGLU MLP's hidden layer. Must be at
	// least 1.
	HiddenDim int
	// ContextTokens is the context window: the most positions (prompt plus
	// generated tokens whose KV is kept) one sequence may hold. Must be at
	// least 1.
	ContextTokens int
	// RoPETheta is the base of the rotary position frequencies. Must be
	// greater than 1.
	RoPETheta float64
	// NormEps is added to the mean square in RMSNorm so that a zero vector
	// does not divide by zero. Must be positive.
	NormEps float64
	// TiedEmbeddings reuses the token embedding as the output head when true;
	// false gives the output head its own weights. Tied heads with random
	// weights tend to predict the input token again, so the default is
	// false.
	TiedEmbeddings bool
	// Seed determines every generated weight: two models with the same
	// config compute the same function, bit for bit. Zero is a seed like
	// any other.
	Seed uint64
	// KVDType is the element type of K and V in KV pages. Zero means kv.F32.
	// F16 and BF16 halve the bytes per token; the model rounds K and V to
	// that type when it writes them and reads the rounded values back,
	// whichever path (paged or contiguous) it runs.
	KVDType kv.DType
}

// TokenizerVocab is the number of ids the byte tokenizer uses: 256 bytes
// and the BOS and EOS specials.
const TokenizerVocab = 258

// Special token ids of the byte tokenizer.
const (
	// BOS marks the beginning of a sequence.
	BOS = 256
	// EOS marks the end of a generation; the engine does not stop on it,
	// its caller does.
	EOS = 257
)

// modelDimMax bounds every width so that products of two of them, and the
// weight counts, stay far inside int on 64-bit platforms.
const modelDimMax = 1 << 16

// DefaultModelConfig is a 4-layer model of width 128 (about 0.6 M
// parameters, 2.4 MB of float32 weights): a 256-token prompt prefills in a
// fraction of a second on one core, and a KV token takes 2 KiB.
func DefaultModelConfig() ModelConfig {
	return ModelConfig{
		Vocab: TokenizerVocab, Dim: 128, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 32,
		HiddenDim: 256, ContextTokens: 2048, RoPETheta: 10000, NormEps: 1e-5,
		Seed: 1, KVDType: kv.F32,
	}
}

// LargeModelConfig is an 8-layer model of width 256 (about 5 M parameters,
// 20 MB of float32 weights, more than a CPU's last-level cache on most
// machines): the size at which decode becomes bound by memory bandwidth
// rather than by cache.
func LargeModelConfig() ModelConfig {
	c := DefaultModelConfig()
	c.Dim, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.HiddenDim = 256, 8, 8, 2, 32, 768
	c.ContextTokens = 4096
	return c
}

// Validate reports the first field out of range, with its value.
func (c ModelConfig) Validate() error {
	for _, f := range []struct {
		name   string
		v, min int
	}{
		{"Vocab", c.Vocab, TokenizerVocab}, {"Dim", c.Dim, 1}, {"Layers", c.Layers, 1},
		{"Heads", c.Heads, 1}, {"KVHeads", c.KVHeads, 1}, {"HeadDim", c.HeadDim, 2},
		{"HiddenDim", c.HiddenDim, 1}, {"ContextTokens", c.ContextTokens, 1},
	} {
		if f.v < f.min || f.v > modelDimMax {
			return fmt.Errorf("engine: model %s (%d) must be in [%d, %d]", f.name, f.v, f.min, modelDimMax)
		}
	}
	switch {
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("engine: model Heads (%d) must be a multiple of KVHeads (%d)", c.Heads, c.KVHeads)
	case c.HeadDim%2 != 0:
		return fmt.Errorf("engine: model HeadDim (%d) must be even for rotary positions", c.HeadDim)
	case !(c.RoPETheta > 1) || math.IsInf(c.RoPETheta, 0):
		return fmt.Errorf("engine: model RoPETheta (%g) must be a finite number greater than 1", c.RoPETheta)
	case !(c.NormEps > 0) || math.IsInf(c.NormEps, 0):
		return fmt.Errorf("engine: model NormEps (%g) must be a finite positive number", c.NormEps)
	case c.KVDType != 0 && c.KVDType.Size() == 0:
		return fmt.Errorf("engine: model KVDType (%d) must be zero, f32, f16 or bf16", uint8(c.KVDType))
	}
	return c.Geometry(1).Validate()
}

// kvDType is KVDType with zero resolved to kv.F32.
func (c ModelConfig) kvDType() kv.DType {
	if c.KVDType == 0 {
		return kv.F32
	}
	return c.KVDType
}

// Geometry is the KV-page geometry of the model for pages of pageTokens
// tokens. A pool must have exactly this geometry for the model to use it.
func (c ModelConfig) Geometry(pageTokens int) kv.Geometry {
	return kv.Geometry{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
		PageTokens: pageTokens, DType: c.kvDType()}
}

// Params is the number of weights, norms included.
func (c ModelConfig) Params() int {
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	perLayer := 2*c.Dim + 2*qd*c.Dim + 2*kvd*c.Dim + 3*c.HiddenDim*c.Dim
	n := c.Vocab*c.Dim + c.Layers*perLayer + c.Dim
	if !c.TiedEmbeddings {
		n += c.Vocab * c.Dim
	}
	return n
}

// WeightBytes is the bytes of the config's weights in float32, which
// decode reads once per step; a model of other weight types says its own
// (Model.WeightBytes).
func (c ModelConfig) WeightBytes() int64 { return 4 * int64(c.Params()) }

// Weights are a model's parameters in llama2.c's layout: every matrix is
// row-major with one row per output element ([out][in], y = W·x), so every
// output is one dot product over a contiguous row. Matrices may be of any
// WeightType; norms are float32.
type Weights struct {
	Embed  Matrix // Vocab × Dim
	Layers []LayerWeights
	Norm   []float32 // Dim: the final RMSNorm
	// Out is the output head, Vocab × Dim; the same matrix as Embed when
	// the config's TiedEmbeddings is set.
	Out Matrix
}

// LayerWeights are one block's weights.
type LayerWeights struct {
	AttnNorm []float32 // Dim
	WQ       Matrix    // Heads·HeadDim × Dim
	WK, WV   Matrix    // KVHeads·HeadDim × Dim
	WO       Matrix    // Dim × Heads·HeadDim
	MLPNorm  []float32 // Dim
	W1, W3   Matrix    // HiddenDim × Dim (gate, up)
	W2       Matrix    // Dim × HiddenDim (down)
}

// Bytes is the bytes of every weight, which decode reads once per step
// (a tied output head counted once).
func (w *Weights) Bytes() int64 {
	n := w.Embed.Bytes() + 4*int64(len(w.Norm))
	if !w.tied() {
		n += w.Out.Bytes()
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		n += 4 * int64(len(l.AttnNorm)+len(l.MLPNorm))
		for _, m := range l.matrices() {
			n += m.Bytes()
		}
	}
	return n
}

// tied says Out is Embed's storage.
func (w *Weights) tied() bool {
	e, o := &w.Embed, &w.Out
	switch {
	case e.Type != o.Type:
		return false
	case e.Type == WeightF32:
		return len(e.F32) > 0 && len(o.F32) > 0 && &e.F32[0] == &o.F32[0]
	}
	return len(e.Raw) > 0 && len(o.Raw) > 0 && &e.Raw[0] == &o.Raw[0]
}

// allMatrices are every block's matrices, in order.
func (w *Weights) allMatrices() []*Matrix {
	var ms []*Matrix
	for i := range w.Layers {
		ms = append(ms, w.Layers[i].matrices()...)
	}
	return ms
}

// matrices are the block's matrices in a fixed order.
func (l *LayerWeights) matrices() []*Matrix {
	return []*Matrix{&l.WQ, &l.WK, &l.WV, &l.WO, &l.W1, &l.W2, &l.W3}
}

// check reports the first matrix or norm whose shape is not what c
// implies, and the first weight that is NaN or infinite.
func (w *Weights) check(c ModelConfig) error {
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	if len(w.Layers) != c.Layers {
		return fmt.Errorf("engine: weights have %d layers, the model %d", len(w.Layers), c.Layers)
	}
	type shaped struct {
		name       string
		m          *Matrix
		rows, cols int
	}
	type norm struct {
		name string
		v    []float32
	}
	matrices := []shaped{{"embedding", &w.Embed, c.Vocab, c.Dim}}
	if !w.tied() {
		matrices = append(matrices, shaped{"output head", &w.Out, c.Vocab, c.Dim})
	}
	norms := []norm{{"final norm", w.Norm}}
	for i := range w.Layers {
		l := &w.Layers[i]
		p := fmt.Sprintf("layer %d ", i)
		matrices = append(matrices, shaped{p + "wq", &l.WQ, qd, c.Dim}, shaped{p + "wk", &l.WK, kvd, c.Dim},
			shaped{p + "wv", &l.WV, kvd, c.Dim}, shaped{p + "wo", &l.WO, c.Dim, qd},
			shaped{p + "w1", &l.W1, c.HiddenDim, c.Dim}, shaped{p + "w2", &l.W2, c.Dim, c.HiddenDim},
			shaped{p + "w3", &l.W3, c.HiddenDim, c.Dim})
		norms = append(norms, norm{p + "attention norm", l.AttnNorm}, norm{p + "ffn norm", l.MLPNorm})
	}
	for _, n := range norms {
		if len(n.v) != c.Dim {
			return fmt.Errorf("engine: %s has %d weights, the model %d", n.name, len(n.v), c.Dim)
		}
		if err := checkFinite(n.name, n.v); err != nil {
			return err
		}
	}
	for _, m := range matrices {
		if err := m.m.check(m.name, m.rows, m.cols); err != nil {
			return err
		}
	}
	return nil
}

// WeightError: a weight is NaN or infinite.
type WeightError struct {
	Array string
	Index int
	Value float32
}

func (e *WeightError) Error() string {
	return fmt.Sprintf("engine: %s weight %d is %g: every weight must be finite", e.Array, e.Index, e.Value)
}

// model is the immutable part of the reference engine: weights and rotary
// tables. Nothing in it changes after newModel, so any number of sequences
// may read it.
type model struct {
	cfg ModelConfig
	geo kv.Geometry // PageTokens is 1: only the token-row layout is used
	w   Weights
	cos []float32 // ContextTokens × HeadDim/2
	sin []float32
}

// Gains applied to the generated weights. Uniform weights in ±sqrt(3/fanIn)
// keep each projection's output at the variance of its input; the query gain
// sharpens attention so that what a position attends to, and so every byte
// of KV, shows in the output, instead of attention averaging the context
// away.
const (
	queryGain = 2.5
	unitGain  = 1.0
)

// seededWeights generates the weights of cfg from its Seed.
func seededWeights(cfg ModelConfig) Weights {
	rng := splitMix64(cfg.Seed)
	qd, kvd := cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	// matrix draws rows × cols weights for fan-in cols.
	matrix := func(rows, cols int, gain float64) Matrix {
		return F32Matrix(rows, cols, rng.uniform(rows*cols, cols, gain))
	}
	w := Weights{Embed: F32Matrix(cfg.Vocab, cfg.Dim, rng.uniform(cfg.Vocab*cfg.Dim, 1, unitGain)), Layers: make([]LayerWeights, cfg.Layers)}
	for i := range w.Layers {
		w.Layers[i] = LayerWeights{
			AttnNorm: ones(cfg.Dim),
			WQ:       matrix(qd, cfg.Dim, queryGain),
			WK:       matrix(kvd, cfg.Dim, unitGain),
			WV:       matrix(kvd, cfg.Dim, unitGain),
			WO:       matrix(cfg.Dim, qd, unitGain),
			MLPNorm:  ones(cfg.Dim),
			W1:       matrix(cfg.HiddenDim, cfg.Dim, unitGain),
			W3:       matrix(cfg.HiddenDim, cfg.Dim, unitGain),
			W2:       matrix(cfg.Dim, cfg.HiddenDim, unitGain),
		}
	}
	w.Norm = ones(cfg.Dim)
	w.Out = w.Embed
	if !cfg.TiedEmbeddings {
		w.Out = matrix(cfg.Vocab, cfg.Dim, unitGain)
	}
	return w
}

// newModel validates cfg and w against each other and precomputes the
// rotary tables. The model keeps w; nothing may change it afterwards.
func newModel(cfg ModelConfig, w Weights) (*model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := w.check(cfg); err != nil {
		return nil, err
	}
	m := &model{cfg: cfg, geo: cfg.Geometry(1), w: w}
	m.cos, m.sin = ropeTables(cfg.ContextTokens, cfg.HeadDim, cfg.RoPETheta)
	return m, nil
}

func ones(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// ropeTables precomputes cos and sin of position × frequency for every
// position of the context, in float64 rounded to float32. The frequencies
// theta^(-2i/headDim) come from expLn and lnOf, the package's own, not
// math.Pow: math.Exp picks a fused-multiply-add path by CPU at run time,
// and at long contexts a last-bit difference in a frequency rounds a table
// entry differently, so that two nodes of one build would compute
// different KV. math.Cos and math.Sin are plain Go, the same everywhere.
func ropeTables(positions, headDim int, theta float64) (cos, sin []float32) {
	half := headDim / 2
	cos = make([]float32, positions*half)
	sin = make([]float32, positions*half)
	lnTheta := lnOf(theta)
	freq := make([]float64, half)
	for i := range freq {
		freq[i] = expLn(float64(-float64(2*i)/float64(headDim)) * lnTheta)
	}
	for p := range positions {
		for i, f := range freq {
			a := float64(float64(p) * f)
			cos[p*half+i] = float32(math.Cos(a))
			sin[p*half+i] = float32(math.Sin(a))
		}
	}
	return cos, sin
}

// ln2Hi and ln2Lo split ln 2 so that k·ln2Hi is exact for the k a float64
// exponent takes.
const (
	ln2Hi = 6.93147180369123816490e-01
	ln2Lo = 1.90821492927058770002e-10
)

// lnOf is the natural logarithm of x > 0 in float64, every product and
// sum rounded on its own (the explicit conversions forbid fusing): x =
// m·2^k with m in [√½, √2), and ln m = 2·atanh(s), s = (m-1)/(m+1), to
// s^41, below float64's precision for |s| ≤ 0.172.
func lnOf(x float64) float64 {
	m, k := math.Frexp(x) // m in [½, 1)
	if m < math.Sqrt2/2 {
		m, k = float64(2*m), k-1
	}
	s := float64(float64(m-1) / float64(m+1))
	s2 := float64(s * s)
	sum := 1.0 / 41
	for n := 39; n >= 1; n -= 2 {
		sum = float64(float64(sum*s2) + 1/float64(n))
	}
	lnm := float64(2 * float64(s*sum))
	return float64(float64(float64(k)*ln2Hi) + float64(float64(float64(k)*ln2Lo)+lnm))
}

// expLn is e^x in float64, each step rounded on its own: x = k·ln2 + r
// with |r| ≤ ln2/2, and e^r by its Taylor series to r^20/20!, below
// float64's precision.
func expLn(x float64) float64 {
	k := math.Floor(float64(x*(1/math.Ln2)) + 0.5)
	r := float64(float64(x-float64(k*ln2Hi)) - float64(k*ln2Lo))
	p := 1.0
	for n := 20; n >= 1; n-- {
		p = float64(float64(float64(p*r)/float64(n)) + 1)
	}
	return math.Ldexp(p, int(k))
}

// splitMix64 is Vigna's SplitMix64: a tiny, fast generator whose output
// depends only on the seed, so weights never depend on math/rand's
// algorithm or version.
type splitMix64 uint64

func (s *splitMix64) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform returns n weights drawn uniformly from ±gain·sqrt(3/fanIn), whose
// variance is gain²/fanIn.
func (s *splitMix64) uniform(n, fanIn int, gain float64) []float32 {
	a := gain * math.Sqrt(3/float64(fanIn))
	v := make([]float32, n)
	for i := range v {
		u := float64(s.next()>>11) / (1 << 53) // [0, 1)
		v[i] = float32((2*u - 1) * a)
	}
	return v
}

// TokenMACs is about the multiply-accumulates one decode step of a
// sequence computes with context positions already in its KV: every
// weight matrix once (attention's projections, the MLP, the output head)
// and, in attention, each query head's scores and weighted values over
// the context. Schedulers weigh a step by it: a step at a long context
// costs several short ones.
func (c ModelConfig) TokenMACs(context int) float64 {
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	perLayer := c.Dim*(q+2*kv) + q*c.Dim + 3*c.Dim*c.HiddenDim
	attention := 2 * c.Heads * c.HeadDim
	return float64(c.Layers*perLayer+c.Dim*c.Vocab) + float64(c.Layers*attention)*float64(context+1)
}
