package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/kv"
)

var benchModels = []struct {
	name string
	cfg  ModelConfig
}{{"default", DefaultModelConfig()}, {"large", LargeModelConfig()}}

const benchPageTokens = 16

// BenchmarkPrefill reports prompt tokens per second of Prefill, writing
// and sealing the pages included; the model's GFLOP/s (prefillFLOPs); and
// x-peak, that over the GFLOP/s of the engine's matrix kernel on data in
// cache (matmulPeak) on as many cores as prefill splits its work across,
// measured right after the prefills, so that both see the machine alike.
// At 2048 tokens most of the built-in model's work is attention
// (prefillFLOPs counts it), whose kernels run at about half the matrix
// kernel's rate.
func BenchmarkPrefill(b *testing.B) {
	helpers.once.Do(startHelpers)
	cores := len(helpers.all) + 1
	for _, bm := range benchModels {
		for _, n := range []int{64, 256, 2048} {
			b.Run(fmt.Sprintf("%s/prompt=%d", bm.name, n), func(b *testing.B) {
				e := engineFor(b, bm.cfg)
				g := bm.cfg.Geometry(benchPageTokens)
				p := fragmentedPool(b, g, 2*g.PagesFor(n)+4, 1, 1)
				prompt := testPrompt(n, "bench")
				for b.Loop() {
					prefill(b, e, p, ownerA, prompt)
					b.StopTimer()
					releaseAll(b, p, ownerA)
					b.StartTimer()
				}
				b.StopTimer()
				gflops := prefillFLOPs(bm.cfg, n) * float64(b.N) / b.Elapsed().Seconds() / 1e9
				peak := matmulPeak(cores)
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
				b.ReportMetric(gflops, "GFLOP/s")
				b.ReportMetric(gflops/peak, "x-peak")
				b.ReportMetric(peak, "peak-GFLOP/s")
				b.ReportMetric(float64(cores), "cores")
			})
		}
	}
}

// BenchmarkPrefillAfter times, side by side in one run, a prefill of a
// prompt computed whole and after a cached prefix of its first tokens, and
// reports x-whole, the second time over the first. The prompt is a
// 512-token prefix and 32 tokens more, or, where the context window is
// shorter (stories260K's is 512), the most whole pages that leave room for
// the 32 tokens (cached-tokens).
func BenchmarkPrefillAfter(b *testing.B) {
	const suffix = 32
	for _, m := range []struct {
		name   string
		engine func(testing.TB) *ReferenceEngine
	}{
		{"default", func(tb testing.TB) *ReferenceEngine { return engineFor(tb, DefaultModelConfig()) }},
		{"large", func(tb testing.TB) *ReferenceEngine { return engineFor(tb, LargeModelConfig()) }},
		{"stories260K", stories260K},
	} {
		b.Run(m.name, func(b *testing.B) {
			e := m.engine(b)
			g := e.Config().Geometry(benchPageTokens)
			cached := min(512, (e.Config().ContextTokens-suffix)/g.PageTokens*g.PageTokens)
			n := cached + suffix
			p := fragmentedPool(b, g, 5*g.PagesFor(n)+4, 1, 1)
			prompt := testPrompt(n, "bench")
			_, prefix := cachedPrefix(b, e, p, prompt, cached/g.PageTokens)
			var whole, after time.Duration
			for b.Loop() {
				start := time.Now()
				prefill(b, e, p, ownerA, prompt)
				whole += time.Since(start)
				start = time.Now()
				prefillAfter(b, e, p, reader, prompt, prefix)
				after += time.Since(start)
				b.StopTimer()
				releaseAll(b, p, ownerA)
				releaseAll(b, p, reader)
				b.StartTimer()
			}
			b.ReportMetric(float64(whole.Microseconds())/float64(b.N), "whole-us")
			b.ReportMetric(float64(after.Microseconds())/float64(b.N), "cached-us")
			b.ReportMetric(float64(after)/float64(whole), "x-whole")
			b.ReportMetric(float64(cached), "cached-tokens")
		})
	}
}

// prefillFLOPs counts the multiply-adds of a forward pass over a prompt of n
// tokens, two FLOPs each: every matrix product, the output head for the
// last token only, and attention's scores and weighted values, token t
// over positions 0 to t.
func prefillFLOPs(c ModelConfig, n int) float64 {
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	perToken := c.Layers * (2*qd*c.Dim + 2*kvd*c.Dim + 3*c.HiddenDim*c.Dim)
	attention := c.Layers * 2 * qd * n * (n + 1) / 2
	return 2 * float64(n*perToken+attention+c.Vocab*c.Dim)
}

// matmulPeak is the GFLOP/s of the engine's matrix kernel (kern.matmul)
// on cores goroutines at once, each on data that stays in its core's L1
// and L2 caches, 16 rows of 256 against 64: the most it does on those
// cores, the best of several rounds of at least 20 ms each.
func matmulPeak(cores int) float64 {
	const rows, in, outs = 16, 256, 64
	best := 0.0
	for range 10 {
		var wg sync.WaitGroup
		reps := make([]int, cores)
		start := time.Now()
		for c := range cores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x, w, out := benchFloats(rows*in, uint64(c)), benchFloats(outs*in, 2), make([]float32, rows*outs)
				for time.Since(start) < 20*time.Millisecond {
					kern.matmul(out, x, w, in, outs, 0, outs)
					reps[c]++
				}
			}()
		}
		wg.Wait()
		total := 0
		for _, r := range reps {
			total += r
		}
		best = max(best, float64(total)*2*rows*in*outs/time.Since(start).Seconds()/1e9)
	}
	return best
}

// BenchmarkDecode reports decode steps at a context of about ctx tokens,
// of batch sequences at a time (StepBatch; a batch of one steps with
// Step), and sets each against a roofline measured in the same run: the
// time copy takes to move the bytes one step must read (every weight once,
// and the KV of every position of every sequence). Copy also writes those
// bytes, so the roofline is generous: a ratio of 1 would mean the step
// runs at memcpy speed. A batch of more than one also reports x-batch1,
// its tokens per second over those of one sequence stepped alone in the
// same run, and x-batch1-roofline, the most x-batch1 can be when both run
// at the roofline: the KV of every sequence is read at every step, so a
// long context bounds what a batch gains.
//
// Each sequence has its own copy of one prompt's KV, so that the batch
// reads as many distinct bytes as different prompts would, and restarts
// from its prompt every restartSteps steps, so that the context stays near
// ctx however long the benchmark runs.
func BenchmarkDecode(b *testing.B) {
	for _, bm := range benchModels {
		for _, ctx := range []int{256, 1024} {
			for _, batch := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/ctx=%d/batch=%d", bm.name, ctx, batch), func(b *testing.B) {
					e := engineFor(b, bm.cfg)
					g := bm.cfg.Geometry(benchPageTokens)
					p := fragmentedPool(b, g, 2*(batch+1)*(g.PagesFor(ctx+restartSteps)+2), 1, 1)
					pfs := benchPrompts(b, e, p, ctx, batch)
					d := &decodeRun{e: e, p: p, pfs: pfs}
					for b.Loop() {
						if d.seqs == nil || d.seqs[0].Tokens() == ctx+restartSteps {
							b.StopTimer()
							d.restart(b)
							b.StartTimer()
						}
						d.step(b)
					}
					b.StopTimer()
					stepNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
					bytes := bm.cfg.WeightBytes() + int64(d.kvTokens/b.N)*int64(g.BytesPerToken())
					copyNs := copyTime(bytes)
					b.ReportMetric(float64(batch)*1e9/stepNs, "tok/s")
					b.ReportMetric(float64(bytes)/stepNs, "GB/s")
					b.ReportMetric(float64(bytes)/copyNs, "memcpy-GB/s")
					b.ReportMetric(stepNs/copyNs, "x-roofline")
					d.close(b)
					if batch > 1 {
						one := &decodeRun{e: e, p: p, pfs: pfs[:1]}
						b.ReportMetric(float64(batch)*one.stepTime(b, ctx)/stepNs, "x-batch1")
						one.close(b)
						// What x-batch1 would be if both steps ran at the
						// roofline: the batch reads the weights once, but
						// every sequence's KV.
						one1 := bm.cfg.WeightBytes() + (bytes-bm.cfg.WeightBytes())/int64(batch)
						b.ReportMetric(float64(batch)*float64(one1)/float64(bytes), "x-batch1-roofline")
					}
				})
			}
		}
	}
}

// restartSteps is how many steps a decode benchmark's sequences take from
// their prompt before they start again.
const restartSteps = 64

// benchPrompts prefills a prompt of ctx tokens as one owner and copies its
// pages to batch-1 others, each copy in pages of its own, written and
// sealed as prefill seals them.
func benchPrompts(b testing.TB, e *ReferenceEngine, p *kv.Pool, ctx, batch int) []Prefilled {
	pf := prefill(b, e, p, ownerA, testPrompt(ctx, "bench"))
	pfs := []Prefilled{pf}
	for i := 1; i < batch; i++ {
		o := kv.Owner{Request: uint64(1000 + i), Tenant: "bench"}
		tags := reserve(b, p, o, 0, len(pf.Manifest.Pages))
		m, err := kv.NewManifest(o, pf.Manifest.Tokens, p.Config().Geometry.PageTokens, tags)
		if err != nil {
			b.Fatal(err)
		}
		pos := 0
		for j, mp := range pf.Manifest.Pages {
			l, err := p.Lease(mp.Tag, ownerA)
			if err != nil {
				b.Fatal(err)
			}
			data, _, err := p.Read(l)
			if err == nil {
				err = p.Write(tags[j], o, pos, data)
			}
			if err == nil {
				err = p.Unlease(l)
			}
			if err == nil {
				m.Pages[j].Checksum, err = p.Seal(tags[j], o)
			}
			if err != nil {
				b.Fatal(err)
			}
			pos += mp.Tokens
		}
		pfs = append(pfs, Prefilled{First: pf.First, Manifest: m})
	}
	return pfs
}

// decodeRun is the sequences of a decode benchmark, one per prompt.
type decodeRun struct {
	e        *ReferenceEngine
	p        *kv.Pool
	pfs      []Prefilled
	seqs     []Sequence
	toks     []int
	errs     []error
	kvTokens int // summed over steps: positions each step read
}

// restart closes the sequences, gives back the pages they sealed, and
// starts each again from its prompt.
func (d *decodeRun) restart(b *testing.B) {
	d.close(b)
	for _, pf := range d.pfs {
		s, err := d.e.Decode(d.p, pf.Manifest, pf.First)
		if err != nil {
			b.Fatal(err)
		}
		d.seqs = append(d.seqs, s)
	}
	d.toks, d.errs = make([]int, len(d.seqs)), make([]error, len(d.seqs))
}

func (d *decodeRun) close(b *testing.B) {
	for i, s := range d.seqs {
		if err := s.Close(d.p); err != nil {
			b.Fatal(err)
		}
		for _, mp := range s.Manifest().Pages[len(d.pfs[i].Manifest.Pages):] {
			if _, err := d.p.Release(mp.Tag, s.Manifest().Owner, epoch); err != nil {
				b.Fatal(err)
			}
		}
	}
	d.seqs = d.seqs[:0]
}

// step steps every sequence once, granting the pages they ask for.
func (d *decodeRun) step(b *testing.B) {
	for _, s := range d.seqs {
		d.kvTokens += s.Tokens() + 1
		if at, need := s.NeedsPage(); need {
			if err := s.GrantPage(reserve(b, d.p, s.Manifest().Owner, at, 1)[0]); err != nil {
				b.Fatal(err)
			}
		}
	}
	if len(d.seqs) == 1 {
		_, d.errs[0] = d.seqs[0].Step(d.p)
	} else {
		StepBatch(d.p, d.seqs, d.toks, d.errs)
	}
	for _, err := range d.errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// stepTime is the nanoseconds of one step, over at least 200 ms of steps
// at a context near ctx, restarts left out.
func (d *decodeRun) stepTime(b *testing.B, ctx int) float64 {
	var spent time.Duration
	steps := 0
	for spent < 200*time.Millisecond {
		if len(d.seqs) == 0 || d.seqs[0].Tokens() == ctx+restartSteps {
			d.restart(b)
		}
		start := time.Now()
		d.step(b)
		spent += time.Since(start)
		steps++
	}
	return float64(spent.Nanoseconds()) / float64(steps)
}

// copyTime is the nanoseconds copy takes to move n bytes between two
// buffers, the best of several rounds of at least 20 ms each so that one
// interruption does not count.
func copyTime(n int64) float64 {
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	best := 0.0
	for range 5 {
		start, reps := time.Now(), 0
		for time.Since(start) < 20*time.Millisecond {
			copy(dst, src)
			reps++
		}
		if ns := float64(time.Since(start).Nanoseconds()) / float64(reps); best == 0 || ns < best {
			best = ns
		}
	}
	return best
}

// BenchmarkKernels times each kernel at the large model's widths against
// the scalar kernel it replaced (the old* functions below, as the engine
// computed before), run for as many iterations right after: old-ns/op is
// the old kernel's time and x-old the new one's over it.
func BenchmarkKernels(b *testing.B) {
	cfg := LargeModelConfig()
	m := engineFor(b, cfg).m
	d, hidden := cfg.Dim, cfg.HiddenDim
	x, y := benchFloats(256*hidden, 1), benchFloats(256*hidden, 2)
	w := benchFloats(hidden*d, 3)
	out := make([]float32, 256*hidden)
	b.Run("dot/256", func(b *testing.B) {
		sideBySide(b, func() { kern.dot(x[:d], y[:d]) }, func() { oldDot(x[:d], y[:d]) })
	})
	for _, mm := range [][3]int{{1, d, hidden}, {16, d, hidden}, {256, d, hidden}, {256, hidden, d}} {
		rows, in, outs := mm[0], mm[1], mm[2]
		b.Run(fmt.Sprintf("matmul/%dx%dx%d", rows, in, outs), func(b *testing.B) {
			sideBySide(b, func() { kern.matmul(out, x[:rows*in], w, in, outs, 0, outs) },
				func() { oldMatmulRows(out, x[:rows*in], w, in) })
		})
	}
	for _, dt := range []kv.DType{kv.F32, kv.F16} {
		c := cfg
		c.KVDType = dt
		m := &model{cfg: c, geo: c.Geometry(1), w: m.w, cos: m.cos, sin: m.sin}
		const ctx = 1024
		cache := make([]byte, ctx*m.geo.BytesPerToken())
		encodeKV(cache, benchFloats(len(cache)/dt.Size(), 4), dt)
		qd := c.Heads * c.HeadDim
		q, att := benchFloats(qd, 5), make([]float32, qd)
		scores := make([]float32, c.Heads*c.ContextTokens)
		past := [][]byte{cache[:(ctx-1)*m.geo.BytesPerToken()]}
		cur := cache[(ctx-1)*m.geo.BytesPerToken():]
		b.Run(fmt.Sprintf("attention/%s/ctx=%d", dt, ctx), func(b *testing.B) {
			sideBySide(b, func() { m.attendHeads(scores, 0, 0, c.KVHeads, q, att, past, cur) },
				func() { oldAttend(m, scores, 0, q, att, past, cur) })
		})
	}
	b.Run("softmax/1024", func(b *testing.B) {
		v := make([]float32, 1024)
		sideBySide(b, func() { copy(v, x); softmax(v) }, func() { copy(v, x); oldSoftmax(v) })
	})
	b.Run(fmt.Sprintf("swiglu/%d", hidden), func(b *testing.B) {
		sideBySide(b, func() { copy(out, x[:hidden]); kern.swiGLU(out[:hidden], y[:hidden]) },
			func() { copy(out, x[:hidden]); oldSwiGLU(out[:hidden], y[:hidden]) })
	})
	b.Run(fmt.Sprintf("rmsnorm/%d", d), func(b *testing.B) {
		sideBySide(b, func() { rmsNorm(out[:d], x[:d], w[:d], d, 1e-5) },
			func() { oldRMSNorm(out[:d], x[:d], w[:d], d, 1e-5) })
	})
	b.Run(fmt.Sprintf("add/%d", d), func(b *testing.B) {
		sideBySide(b, func() { kern.add(out[:d], y[:d]) }, func() { oldAddInto(out[:d], y[:d]) })
	})
}

// benchFloats are n values drawn uniformly from [-1, 1) from seed, like a
// model's weights and activations: no subnormals, which would time the
// CPU's slow path for them instead of the kernels.
func benchFloats(n int, seed uint64) []float32 {
	rng := splitMix64(seed)
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(float64(rng.next()>>11)/(1<<53)*2 - 1)
	}
	return v
}

// sideBySide times newf under the benchmark's loop, then oldf for as many
// iterations, and reports oldf's time and the ratio.
func sideBySide(b *testing.B, newf, oldf func()) {
	for b.Loop() {
		newf()
	}
	newNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.StopTimer()
	start := time.Now()
	for range b.N {
		oldf()
	}
	oldNs := float64(time.Since(start).Nanoseconds()) / float64(b.N)
	b.ReportMetric(oldNs, "old-ns/op")
	b.ReportMetric(newNs/oldNs, "x-old")
}

// The scalar kernels the engine computed with before the vector kernels,
// kept as the benchmarks' baseline (their sums run in another order, so
// their bits are not the engine's).

func oldDot(a, b []float32) float32 {
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

func oldMatmulRows(out, x, w []float32, in int) {
	rows, outs := len(x)/in, len(w)/in
	for j := range outs {
		wj := w[j*in : (j+1)*in]
		for t := range rows {
			out[t*outs+j] = oldDot(x[t*in:(t+1)*in], wj)
		}
	}
}

func oldRMSNorm(out, x, weight []float32, dim int, eps float32) {
	for r := 0; r+dim <= len(out); r += dim {
		xr := x[r : r+dim]
		ss := oldDot(xr, xr)/float32(dim) + eps
		inv := float32(1 / math.Sqrt(float64(ss)))
		for i, w := range weight {
			out[r+i] = xr[i] * inv * w
		}
	}
}

func oldSwiGLU(gate, up []float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		gate[i] = g / (1 + exp32(-g)) * up[i]
	}
}

func oldAddInto(x, d []float32) {
	d = d[:len(x)]
	for i := range x {
		x[i] += d[i]
	}
}

func oldSoftmax(x []float32) {
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

func oldDotKV(q []float32, b []byte, dt kv.DType) float32 {
	le := binary.LittleEndian
	var s0, s1, s2, s3 float32
	switch dt {
	case kv.F32:
		b = b[:4*len(q)]
		i := 0
		for ; i+4 <= len(q); i += 4 {
			s0 += float32(q[i] * math.Float32frombits(le.Uint32(b[4*i:])))
			s1 += float32(q[i+1] * math.Float32frombits(le.Uint32(b[4*i+4:])))
			s2 += float32(q[i+2] * math.Float32frombits(le.Uint32(b[4*i+8:])))
			s3 += float32(q[i+3] * math.Float32frombits(le.Uint32(b[4*i+12:])))
		}
		for ; i < len(q); i++ {
			s0 += float32(q[i] * math.Float32frombits(le.Uint32(b[4*i:])))
		}
	default:
		b = b[:2*len(q)]
		i := 0
		for ; i+4 <= len(q); i += 4 {
			s0 += float32(q[i] * half(le.Uint16(b[2*i:]), dt))
			s1 += float32(q[i+1] * half(le.Uint16(b[2*i+2:]), dt))
			s2 += float32(q[i+2] * half(le.Uint16(b[2*i+4:]), dt))
			s3 += float32(q[i+3] * half(le.Uint16(b[2*i+6:]), dt))
		}
		for ; i < len(q); i++ {
			s0 += float32(q[i] * half(le.Uint16(b[2*i:]), dt))
		}
	}
	return (s0 + s1) + (s2 + s3)
}

// oldAttend is the old attention of one position in layer l: every query
// head on its own, reading its KV head's rows once per query head.
func oldAttend(m *model, scores []float32, l int, q, out []float32, past [][]byte, cur []byte) {
	c := &m.cfg
	hd, bpt, dt := c.HeadDim, m.geo.BytesPerToken(), m.geo.DType
	group := c.Heads / c.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	for h := range c.Heads {
		qh, oh := q[h*hd:(h+1)*hd], out[h*hd:(h+1)*hd]
		kOff, vOff := m.geo.Offset(l, h/group, false), m.geo.Offset(l, h/group, true)
		n := 0
		for _, seg := range append(past, cur) {
			for r := 0; r < len(seg); r += bpt {
				scores[n] = oldDotKV(qh, seg[r+kOff:], dt) * scale
				n++
			}
		}
		oldSoftmax(scores[:n])
		clear(oh)
		n = 0
		for _, seg := range append(past, cur) {
			for r := 0; r < len(seg); r += bpt {
				axpyKV(oh, scores[n], seg[r+vOff:], dt)
				n++
			}
		}
	}
}
