package engine

import (
	"fmt"
	"math"
)

// The forward pass is written once and shared by every path (prefill, paged
// decode, the contiguous reference): they differ only in where the KV rows
// of earlier positions live. Attention visits positions in order, and every
// sum is taken in one fixed order, so the same tokens give the same bits
// whatever pages hold the KV.

// scratch holds the activations of a forward pass over up to rows tokens.
// A sequence allocates it once and reuses it on every step.
type scratch struct {
	rows   int
	x      []float32 // rows × Dim: the residual stream
	xb     []float32 // rows × Dim: normalised input of a sublayer
	q      []float32 // rows × Heads·HeadDim
	k, v   []float32 // rows × KVHeads·HeadDim
	att    []float32 // rows × Heads·HeadDim: attention output
	o      []float32 // rows × Dim: sublayer output
	h1, h3 []float32 // rows × HiddenDim
	scores []float32 // ContextTokens: one head's attention weights
	logits []float32 // Vocab
}

func newScratch(c ModelConfig, rows int) *scratch {
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	return &scratch{
		rows: rows,
		x:    make([]float32, rows*c.Dim), xb: make([]float32, rows*c.Dim),
		q: make([]float32, rows*qd), k: make([]float32, rows*kvd), v: make([]float32, rows*kvd),
		att: make([]float32, rows*qd), o: make([]float32, rows*c.Dim),
		h1: make([]float32, rows*c.HiddenDim), h3: make([]float32, rows*c.HiddenDim),
		scores: make([]float32, c.ContextTokens), logits: make([]float32, c.Vocab),
	}
}

// forward runs tokens, at positions pos0, pos0+1, …, through the model and
// returns the greedy next token after the last of them.
//
// past holds the KV rows of positions 0..pos0-1 in order, as segments of
// whole token rows (a page's bytes, a tail, or one contiguous cache); rows
// receives the KV rows of the new tokens, len(tokens) × BytesPerToken bytes.
// Each new token attends to past and to the new rows up to itself.
func (m *model) forward(s *scratch, tokens []int, pos0 int, past [][]byte, rows []byte) int {
	c := &m.cfg
	n := len(tokens)
	if n < 1 || n > s.rows || len(rows) != n*m.geo.BytesPerToken() || pos0+n > c.ContextTokens {
		panic(fmt.Sprintf("engine: forward of %d tokens at position %d into %d row bytes: scratch holds %d, row is %d bytes, context %d",
			n, pos0, len(rows), s.rows, m.geo.BytesPerToken(), c.ContextTokens))
	}
	if held := rowsIn(past, m.geo.BytesPerToken()); held != pos0 {
		panic(fmt.Sprintf("engine: forward at position %d given %d past rows", pos0, held))
	}
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	for t, tok := range tokens {
		copy(s.x[t*c.Dim:(t+1)*c.Dim], m.w.Embed[tok*c.Dim:(tok+1)*c.Dim])
	}
	x, xb := s.x[:n*c.Dim], s.xb[:n*c.Dim]
	for l := range m.w.Layers {
		w := &m.w.Layers[l]
		rmsNorm(xb, x, w.AttnNorm, c.Dim, float32(c.NormEps))
		matmulRows(s.q[:n*qd], xb, w.WQ, c.Dim)
		matmulRows(s.k[:n*kvd], xb, w.WK, c.Dim)
		matmulRows(s.v[:n*kvd], xb, w.WV, c.Dim)
		for t := range n {
			m.rope(s.q[t*qd:(t+1)*qd], pos0+t)
			m.rope(s.k[t*kvd:(t+1)*kvd], pos0+t)
			m.storeKV(rows[t*m.geo.BytesPerToken():], l, s.k[t*kvd:(t+1)*kvd], s.v[t*kvd:(t+1)*kvd])
		}
		for t := range n {
			m.attend(s, l, s.q[t*qd:(t+1)*qd], s.att[t*qd:(t+1)*qd], past, rows[:(t+1)*m.geo.BytesPerToken()])
		}
		matmulRows(s.o[:n*c.Dim], s.att[:n*qd], w.WO, qd)
		addInto(x, s.o[:n*c.Dim])
		rmsNorm(xb, x, w.MLPNorm, c.Dim, float32(c.NormEps))
		matmulRows(s.h1[:n*c.HiddenDim], xb, w.W1, c.Dim)
		matmulRows(s.h3[:n*c.HiddenDim], xb, w.W3, c.Dim)
		swiGLU(s.h1[:n*c.HiddenDim], s.h3[:n*c.HiddenDim])
		matmulRows(s.o[:n*c.Dim], s.h1[:n*c.HiddenDim], w.W2, c.HiddenDim)
		addInto(x, s.o[:n*c.Dim])
	}
	last := xb[:c.Dim]
	rmsNorm(last, x[(n-1)*c.Dim:], m.w.Norm, c.Dim, float32(c.NormEps))
	matmulRows(s.logits, last, m.w.Out, c.Dim)
	return argmax(s.logits)
}

func rowsIn(segs [][]byte, bpt int) int {
	n := 0
	for _, b := range segs {
		if len(b)%bpt != 0 {
			panic(fmt.Sprintf("engine: KV segment of %d bytes is not whole %d-byte rows", len(b), bpt))
		}
		n += len(b) / bpt
	}
	return n
}

// storeKV encodes one token's K and V of layer l into its KV row.
func (m *model) storeKV(row []byte, l int, k, v []float32) {
	hd, dt := m.cfg.HeadDim, m.geo.DType
	for h := range m.cfg.KVHeads {
		encodeKV(row[m.geo.Offset(l, h, false):], k[h*hd:(h+1)*hd], dt)
		encodeKV(row[m.geo.Offset(l, h, true):], v[h*hd:(h+1)*hd], dt)
	}
}

// attend computes every query head of one position in layer l over the KV
// rows of past then cur, in position order.
func (m *model) attend(s *scratch, l int, q, out []float32, past [][]byte, cur []byte) {
	c := &m.cfg
	hd, bpt, dt := c.HeadDim, m.geo.BytesPerToken(), m.geo.DType
	group := c.Heads / c.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	for h := range c.Heads {
		qh, oh := q[h*hd:(h+1)*hd], out[h*hd:(h+1)*hd]
		kOff, vOff := m.geo.Offset(l, h/group, false), m.geo.Offset(l, h/group, true)
		n := 0
		for _, seg := range past {
			for r := 0; r < len(seg); r += bpt {
				s.scores[n] = dotKV(qh, seg[r+kOff:], dt) * scale
				n++
			}
		}
		for r := 0; r < len(cur); r += bpt {
			s.scores[n] = dotKV(qh, cur[r+kOff:], dt) * scale
			n++
		}
		softmax(s.scores[:n])
		clear(oh)
		n = 0
		for _, seg := range past {
			for r := 0; r < len(seg); r += bpt {
				axpyKV(oh, s.scores[n], seg[r+vOff:], dt)
				n++
			}
		}
		for r := 0; r < len(cur); r += bpt {
			axpyKV(oh, s.scores[n], cur[r+vOff:], dt)
			n++
		}
	}
}

// rope rotates each head's consecutive pairs (x[2i], x[2i+1]) by the angle
// of position pos and frequency i.
func (m *model) rope(x []float32, pos int) {
	half := m.cfg.HeadDim / 2
	cos, sin := m.cos[pos*half:(pos+1)*half], m.sin[pos*half:(pos+1)*half]
	for h := 0; h < len(x); h += m.cfg.HeadDim {
		for i := range half {
			a, b := x[h+2*i], x[h+2*i+1]
			x[h+2*i] = float32(a*cos[i]) - float32(b*sin[i])
			x[h+2*i+1] = float32(a*sin[i]) + float32(b*cos[i])
		}
	}
}

// dot is the one inner product every matrix product uses. Four partial sums
// break the dependency chain; their order is fixed, so results are too.
//
// The explicit float32 conversions of products here and in the other
// kernels forbid the compiler to fuse a multiply and an add (Go does on
// arm64, not on amd64), so that the same inputs give the same bits on every
// platform: the KV computed by one node is decoded by another.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += float32(a[i] * b[i])
		s1 += float32(a[i+1] * b[i+1])
		s2 += float32(a[i+2] * b[i+2])
		s3 += float32(a[i+3] * b[i+3])
	}
	for ; i < len(a); i++ {
		s0 += float32(a[i] * b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// matmulRows sets out[t][j] = dot(x[t], w[j]) for every row t of x (width
// in) and every row j of w. The loop over w is outside so that a weight row
// is read from memory once for all of x's rows.
func matmulRows(out, x, w []float32, in int) {
	rows, outs := len(x)/in, len(w)/in
	for j := range outs {
		wj := w[j*in : (j+1)*in]
		for t := range rows {
			out[t*outs+j] = dot(x[t*in:(t+1)*in], wj)
		}
	}
}

// rmsNorm normalises each dim-wide row of x by its root mean square and
// scales it by weight.
func rmsNorm(out, x, weight []float32, dim int, eps float32) {
	for r := 0; r+dim <= len(out); r += dim {
		xr := x[r : r+dim]
		ss := dot(xr, xr)/float32(dim) + eps
		inv := float32(1 / math.Sqrt(float64(ss)))
		for i, w := range weight {
			out[r+i] = xr[i] * inv * w
		}
	}
}

// swiGLU sets gate[i] = silu(gate[i]) · up[i].
func swiGLU(gate, up []float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		gate[i] = g / (1 + exp32(-g)) * up[i]
	}
}

func addInto(x, d []float32) {
	d = d[:len(x)]
	for i := range x {
		x[i] += d[i]
	}
}

// softmax replaces x with exp(x - max) / sum, subtracting the max so that
// exp cannot overflow.
func softmax(x []float32) {
	mx := x[0]
	for _, v := range x[1:] {
		mx = max(mx, v)
	}
	var sum float32
	for i, v := range x {
		e := exp32(v - mx)
		x[i] = e
		sum += e
	}
	inv := 1 / sum
	for i := range x {
		x[i] *= inv
	}
}

// argmax is the greedy choice: the first index of the largest value, so ties
// resolve the same way everywhere.
func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// exp32 is e^x rounded to float32. It is computed here, with additions,
// products rounded one by one and exact scaling by a power of two, because
// math.Exp has per-architecture assembly whose last bits differ, and an
// attention weight one ulp off can change a greedy token on another node.
//
// x = k·ln2 + r with |r| ≤ ln2/2; e^r is its Taylor series to r^11/11!,
// whose truncation error (below 1e-13 relative) vanishes in the rounding to
// float32.
func exp32(x float32) float32 {
	switch {
	case x != x:
		return x
	case x > 89:
		return float32(math.Inf(1))
	case x < -104:
		return 0
	}
	const (
		log2e = 1.4426950408889634
		ln2Hi = 6.93147180369123816490e-01 // ln2's leading bits: k·ln2Hi is exact
		ln2Lo = 1.90821492927058770002e-10
	)
	xd := float64(x)
	k := math.Floor(float64(xd*log2e) + 0.5)
	r := float64(xd-float64(k*ln2Hi)) - float64(k*ln2Lo)
	p := 1.0 / 39916800 // 1/11!
	for _, c := range expTaylor {
		p = float64(p*r) + c
	}
	return float32(math.Ldexp(p, int(k)))
}

// expTaylor is 1/10!, 1/9!, …, 1/1!, 1/0!: Horner's order for exp32.
var expTaylor = [...]float64{1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720,
	1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1, 1}
