package engine

import (
	"fmt"
	"math"
	"sync"
)

// The forward pass is written once and shared by every path (prefill, paged
// decode one sequence or a batch at a time, the contiguous reference): they
// differ only in where the KV rows of earlier positions live and in which
// tokens go through the weights together. Each row of a pass carries its own
// position and KV, attention visits a row's positions in order, and every
// sum is taken in the kernels' one fixed order, so the same tokens give the
// same bits whatever pages hold the KV, whatever rows share the pass, and
// however many goroutines compute it.

// fwdRow is one token of a forward pass.
type fwdRow struct {
	tok int
	pos int // the token's position in its sequence
	// past holds the KV rows of the sequence's positions before those of
	// cur, in order, as segments of whole token rows (a page's bytes, a
	// tail, or one contiguous cache).
	past [][]byte
	// cur is the KV rows the pass computes for the sequence up to this
	// token: the last is the token's own, which the pass writes; those
	// before it are earlier rows of the same pass (a prompt's), written in
	// each layer before any row reads them.
	cur []byte
	// logits asks for the greedy next token, which the pass leaves in next.
	logits bool
	next   int
}

// scratch holds the activations of a forward pass over up to rows tokens,
// logitRows of which ask for logits. It is reused from pass to pass.
type scratch struct {
	rows, logitRows int
	x               []float32 // rows × Dim: the residual stream
	xb              []float32 // rows × Dim: normalised input of a sublayer
	q               []float32 // rows × Heads·HeadDim
	k, v            []float32 // rows × KVHeads·HeadDim
	att             []float32 // rows × Heads·HeadDim: attention output
	o               []float32 // rows × Dim: sublayer output
	h1, h3          []float32 // rows × HiddenDim
	logits          []float32 // logitRows × Vocab
	// scores holds, for each part attention may split into, the attention
	// weights of every query head: Heads × ContextTokens.
	scores [][]float32
	fwd    []fwdRow // rows: the pass's rows, for its callers to fill
	mm     matmulJob
	at     attendJob
	wg     sync.WaitGroup
}

func newScratch(c ModelConfig, rows, logitRows int) *scratch {
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	helpers.once.Do(startHelpers)
	s := &scratch{
		rows: rows, logitRows: logitRows,
		x: make([]float32, rows*c.Dim), xb: make([]float32, rows*c.Dim),
		q: make([]float32, rows*qd), k: make([]float32, rows*kvd), v: make([]float32, rows*kvd),
		att: make([]float32, rows*qd), o: make([]float32, rows*c.Dim),
		h1: make([]float32, rows*c.HiddenDim), h3: make([]float32, rows*c.HiddenDim),
		logits: make([]float32, logitRows*c.Vocab),
		scores: make([][]float32, len(helpers.all)+1),
		fwd:    make([]fwdRow, rows),
	}
	for i := range s.scores {
		s.scores[i] = make([]float32, c.Heads*c.ContextTokens)
	}
	return s
}

// prefillRows fills s.fwd with the rows of tokens at positions pos0,
// pos0+1, … of one sequence, after past, writing their KV to kv
// (len(tokens) rows); the last asks for logits. It returns the rows.
func (s *scratch) prefillRows(m *model, tokens []int, pos0 int, past [][]byte, kv []byte) []fwdRow {
	bpt := m.geo.BytesPerToken()
	rows := s.fwd[:len(tokens)]
	for t, tok := range tokens {
		rows[t] = fwdRow{tok: tok, pos: pos0 + t, past: past, cur: kv[:(t+1)*bpt], logits: t == len(tokens)-1}
	}
	return rows
}

// forward runs rows through the model: each row's token, at its position,
// attends to its past and cur. It writes each row's KV row (the last of its
// cur) and, for the rows that ask, the greedy next token.
func (m *model) forward(s *scratch, rows []fwdRow) {
	c := &m.cfg
	n, bpt := len(rows), m.geo.BytesPerToken()
	if n < 1 || n > s.rows {
		panic(fmt.Sprintf("engine: forward of %d rows with scratch for %d", n, s.rows))
	}
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	nl, work := 0, 0
	for t := range rows {
		r := &rows[t]
		if len(r.cur) < bpt || len(r.cur)%bpt != 0 || r.pos >= c.ContextTokens || r.tok < 0 || r.tok >= c.Vocab {
			panic(fmt.Sprintf("engine: forward of token %d at position %d with %d bytes of rows: rows are %d bytes, context %d, vocabulary %d",
				r.tok, r.pos, len(r.cur), bpt, c.ContextTokens, c.Vocab))
		}
		if held := rowsIn(r.past, bpt) + len(r.cur)/bpt - 1; held != r.pos {
			panic(fmt.Sprintf("engine: forward at position %d given %d earlier rows", r.pos, held))
		}
		if r.logits {
			nl++
		}
		work += (r.pos + 1) * 2 * qd
		m.w.Embed.row(r.tok, s.x[t*c.Dim:(t+1)*c.Dim])
	}
	if nl > s.logitRows {
		panic(fmt.Sprintf("engine: forward of %d rows for logits with scratch for %d", nl, s.logitRows))
	}
	attParts := splitParts(work, attendSplitMin)
	x, xb := s.x[:n*c.Dim], s.xb[:n*c.Dim]
	q, k, v, att := s.q[:n*qd], s.k[:n*kvd], s.v[:n*kvd], s.att[:n*qd]
	h1, h3, o := s.h1[:n*c.HiddenDim], s.h3[:n*c.HiddenDim], s.o[:n*c.Dim]
	for l := range m.w.Layers {
		w := &m.w.Layers[l]
		rmsNorm(xb, x, w.AttnNorm, c.Dim, float32(c.NormEps))
		s.matmul(q, xb, &w.WQ)
		s.matmul(k, xb, &w.WK)
		s.matmul(v, xb, &w.WV)
		for t := range rows {
			r := &rows[t]
			m.rope(q[t*qd:(t+1)*qd], r.pos)
			m.rope(k[t*kvd:(t+1)*kvd], r.pos)
			m.storeKV(r.cur[len(r.cur)-bpt:], l, k[t*kvd:(t+1)*kvd], v[t*kvd:(t+1)*kvd])
		}
		s.at = attendJob{m: m, s: s, l: l, rows: rows, perHead: len(rows) < attParts}
		split(&s.at, attParts, &s.wg)
		s.matmul(o, att, &w.WO)
		kern.add(x, o)
		rmsNorm(xb, x, w.MLPNorm, c.Dim, float32(c.NormEps))
		s.matmul(h1, xb, &w.W1)
		s.matmul(h3, xb, &w.W3)
		kern.swiGLU(h1, h3)
		s.matmul(o, h1, &w.W2)
		kern.add(x, o)
	}
	s.at = attendJob{}
	// Only the rows that ask go through the output head, the largest
	// matrix of a small model.
	j := 0
	for t := range rows {
		if rows[t].logits {
			rmsNorm(xb[j*c.Dim:(j+1)*c.Dim], x[t*c.Dim:(t+1)*c.Dim], m.w.Norm, c.Dim, float32(c.NormEps))
			j++
		}
	}
	s.matmul(s.logits[:nl*c.Vocab], xb[:nl*c.Dim], &m.w.Out)
	j = 0
	for t := range rows {
		if rows[t].logits {
			rows[t].next = argmax(s.logits[j*c.Vocab : (j+1)*c.Vocab])
			j++
		}
	}
}

// matmul sets out[t][j] = dot(x[t], w[j]) for every row t of x (width in)
// and every row j of w, split between goroutines when it is large.
func (s *scratch) matmul(out, x []float32, w *Matrix) {
	if parts := splitParts(len(x)*w.Rows, matmulSplitMin); parts > 1 && w.Rows >= 16*parts {
		s.mm = matmulJob{out: out, x: x, w: w}
		split(&s.mm, parts, &s.wg)
		s.mm = matmulJob{}
		return
	}
	kern.matmulM(out, x, w, 0, w.Rows)
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

// attendJob is one layer's attention for the rows of a pass, in items of
// one row's KV heads: all of them, or, when there are fewer rows than
// parts, one. Part p takes the items p, p+parts, …, so that the long rows
// of a prompt's end spread over the parts.
type attendJob struct {
	m       *model
	s       *scratch
	l       int
	rows    []fwdRow
	perHead bool
}

func (j *attendJob) run(p, parts int) {
	c := &j.m.cfg
	qd := c.Heads * c.HeadDim
	heads := 1
	if !j.perHead {
		heads = c.KVHeads
	}
	for i := p; i < len(j.rows)*c.KVHeads/heads; i += parts {
		t, g := i*heads/c.KVHeads, i*heads%c.KVHeads
		r := &j.rows[t]
		j.m.attendHeads(j.s.scores[p], j.l, g, g+heads, j.s.q[t*qd:(t+1)*qd], j.s.att[t*qd:(t+1)*qd], r.past, r.cur)
	}
}

// attendHeads computes, in layer l, the query heads that KV heads g0 to
// g1-1 serve (of the row whose queries are q) over the KV rows of past then
// cur, in position order, into their part of out. Each K and V row is read
// once for all of those heads, the K (and then the V) of all the KV heads
// of a row together, and the next segment's rows are asked for while a
// segment's are computed on: a sequence's pages lie anywhere in the pool.
func (m *model) attendHeads(scores []float32, l, g0, g1 int, q, out []float32, past [][]byte, cur []byte) {
	c := &m.cfg
	hd, bpt, dt, ctx := c.HeadDim, m.geo.BytesPerToken(), m.geo.DType, c.ContextTokens
	group := c.Heads / c.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	kOff, vOff := m.geo.Offset(l, g0, false), m.geo.Offset(l, g0, true)
	heads := (g1 - g0) * hd * dt.Size() // bytes of one row's K, or V, of the heads
	// The scores kernels prefetch the next segment's K and V as they read
	// a segment's K, so that the values are in cache when the weighted sum
	// reads them; the first segment's are asked for here.
	m.prefetchRows(segment(past, cur, 0), kOff, vOff-kOff+heads)
	n := 0
	for i := 0; i <= len(past); i++ {
		seg, next := segment(past, cur, i), m.nextSegment(past, cur, i)
		if rows := len(seg) / bpt; rows > 0 {
			for g := g0; g < g1; g++ {
				off, vo := m.geo.Offset(l, g, false), m.geo.Offset(l, g, true)
				kern.scores(scores[(g-g0)*group*ctx+n:], ctx, q[g*group*hd:(g+1)*group*hd], group, hd,
					seg[off:], tail(next, off), tail(next, vo), rows, bpt, dt, scale)
			}
			n += rows
		}
	}
	for h := range (g1 - g0) * group {
		softmax(scores[h*ctx : h*ctx+n])
	}
	out = out[g0*group*hd : g1*group*hd]
	clear(out)
	n = 0
	for i := 0; i <= len(past); i++ {
		seg := segment(past, cur, i)
		if rows := len(seg) / bpt; rows > 0 {
			for g := g0; g < g1; g++ {
				kern.accumV(out[(g-g0)*group*hd:], group, hd, scores[(g-g0)*group*ctx+n:], ctx,
					seg[m.geo.Offset(l, g, true):], rows, bpt, dt)
			}
			n += rows
		}
	}
}

// segment is the i-th segment of KV rows a row attends to: past's, then cur.
func segment(past [][]byte, cur []byte, i int) []byte {
	if i < len(past) {
		return past[i]
	}
	return cur
}

// nextSegment is the segment after the i-th that holds rows, nil if none.
func (m *model) nextSegment(past [][]byte, cur []byte, i int) []byte {
	for i++; i <= len(past); i++ {
		if seg := segment(past, cur, i); len(seg) >= m.geo.BytesPerToken() {
			return seg
		}
	}
	return nil
}

// tail is b from off on, nil if b is no longer than off.
func tail(b []byte, off int) []byte {
	if len(b) <= off {
		return nil
	}
	return b[off:]
}

// prefetchRowsMax bounds the rows prefetchRows asks for: a page's, not the
// whole of one contiguous cache.
const prefetchRowsMax = 32

// prefetchRows asks for the bytes at off of the first rows of seg.
func (m *model) prefetchRows(seg []byte, off, bytes int) {
	if bpt := m.geo.BytesPerToken(); len(seg) >= bpt {
		kern.prefetch(seg[off:], min(len(seg)/bpt, prefetchRowsMax), bpt, bytes)
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

// rmsNorm normalises each dim-wide row of x by its root mean square and
// scales it by weight.
func rmsNorm(out, x, weight []float32, dim int, eps float32) {
	for r := 0; r+dim <= len(out); r += dim {
		xr := x[r : r+dim]
		ss := kern.dot(xr, xr)/float32(dim) + eps
		inv := float32(1 / math.Sqrt(float64(ss)))
		kern.mulScale(out[r:r+dim], xr, weight, inv)
	}
}

// softmax replaces x with exp(x - max) / sum, subtracting the max so that
// exp cannot overflow.
func softmax(x []float32) {
	sum := kern.expSubSum(x, kern.max(x))
	kern.scale(x, 1/sum)
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
