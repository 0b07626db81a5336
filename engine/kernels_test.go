package engine

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
)

// The fast kernels must compute the generic kernels' bits, for every length
// (the tails of fewer than eight elements included), every alignment of
// the slices and every KV dtype.

// kernelLengths are 0 to 67 and the widths of the models the engine runs.
var kernelLengths = func() []int {
	var n []int
	for i := range 68 {
		n = append(n, i)
	}
	return append(n, 128, 172, 256, 258, 512, 768)
}()

// withFastKernels runs f for each kernel set this CPU has besides the
// generic one, and skips when it has none.
func withFastKernels(t *testing.T, f func(t *testing.T, ks *kernelSet)) {
	t.Helper()
	if len(fastKernels) == 0 {
		t.Skip("no kernel set but the generic one on this CPU")
	}
	for _, ks := range fastKernels {
		t.Run(ks.name, func(t *testing.T) { f(t, ks) })
	}
}

// sameFloat says whether a and b are one float32: equal bits, or both NaN
// (the bits of a NaN are not part of the kernels' contract).
func sameFloat(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

func checkSame(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if !sameFloat(got[i], want[i]) {
			t.Fatalf("%s: element %d is %g (%08x), the generic kernel's %g (%08x)",
				what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// randomFloats are n values of mixed signs and magnitudes (2^-20 to 2^8),
// with a zero, a negative zero and a subnormal now and then, from seed.
func randomFloats(n int, seed uint64) []float32 {
	rng := splitMix64(seed)
	v := make([]float32, n)
	for i := range v {
		r := rng.next()
		switch r % 61 {
		case 0:
			v[i] = 0
		case 1:
			v[i] = float32(math.Copysign(0, -1))
		case 2:
			v[i] = math.Float32frombits(uint32(r>>40) & 0x807fffff) // subnormal
		default:
			f := float64(r>>11)/(1<<53)*2 - 1
			v[i] = float32(math.Ldexp(f, int(r%29)-20))
		}
	}
	return v
}

// misaligned is a copy of v starting off elements into a fresh slice, so
// that the kernels see every alignment.
func misaligned(v []float32, off int) []float32 {
	b := make([]float32, off+len(v))
	copy(b[off:], v)
	return b[off:]
}

func TestKernelDot(t *testing.T) {
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		for _, n := range kernelLengths {
			for off := range 8 {
				a, b := misaligned(randomFloats(n, uint64(n)), off), misaligned(randomFloats(n, uint64(n)+100), 7-off)
				got, want := ks.dot(a, b), dotGeneric(a, b)
				checkSame(t, fmt.Sprintf("dot of %d at offset %d", n, off), []float32{got}, []float32{want})
			}
		}
	})
}

// TestKernelMatmul covers every block shape: 1 to 9 rows of x, output widths
// that leave every remainder of the column blocks, inputs of every tail, and
// column ranges that start and end inside blocks.
func TestKernelMatmul(t *testing.T) {
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		for _, in := range []int{1, 3, 7, 8, 9, 16, 17, 31, 64, 67, 172} {
			for rows := 1; rows <= 9; rows++ {
				for _, outs := range []int{1, 2, 3, 5, 8, 11, 17, 19, 36} {
					x := misaligned(randomFloats(rows*in, uint64(in*rows)), rows%8)
					w := misaligned(randomFloats(outs*in, uint64(outs)), outs%8)
					for _, r := range [][2]int{{0, outs}, {outs / 3, outs}, {1, max(1, outs-2)}} {
						want, got := make([]float32, rows*outs), make([]float32, rows*outs)
						for i := range want {
							want[i], got[i] = float32(i), float32(i) // outside the range: untouched
						}
						matmulGeneric(want, x, w, in, outs, r[0], r[1])
						ks.matmul(got, x, w, in, outs, r[0], r[1])
						checkSame(t, fmt.Sprintf("%d×%d by %d×%d, columns %v", rows, in, outs, in, r), got, want)
					}
				}
			}
		}
	})
}

// TestKernelMatmulLarge is a prefill-sized product, large enough for the
// column blocks of many rows.
func TestKernelMatmulLarge(t *testing.T) {
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		for _, in := range []int{64, 172, 768} {
			rows, outs := 37, 300
			x, w := randomFloats(rows*in, 1), randomFloats(outs*in, 2)
			want, got := make([]float32, rows*outs), make([]float32, rows*outs)
			matmulGeneric(want, x, w, in, outs, 0, outs)
			ks.matmul(got, x, w, in, outs, 0, outs)
			checkSame(t, fmt.Sprintf("%d×%d by %d×%d", rows, in, outs, in), got, want)
		}
	})
}

// kvRows encodes rows rows of hd random elements of dt, stride bytes apart
// from byte off of the result, with bytes of filler around them.
func kvRows(rows, hd, stride, off int, dt kv.DType, seed uint64) []byte {
	b := make([]byte, off+rows*stride)
	rng := splitMix64(seed)
	for i := range b {
		b[i] = byte(rng.next())
	}
	for r := range rows {
		encodeKV(b[off+r*stride:], randomFloats(hd, seed+uint64(r)), dt)
	}
	return b[off:]
}

var kvDTypes = []kv.DType{kv.F32, kv.F16, kv.BF16}

func TestKernelAttention(t *testing.T) {
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		for _, dt := range kvDTypes {
			for _, hd := range []int{2, 6, 8, 16, 24, 32, 64, 128} {
				for heads := 1; heads <= 9; heads++ {
					for _, rows := range []int{1, 2, 5, 16, 33} {
						for off := range 3 {
							name := fmt.Sprintf("%s hd=%d heads=%d rows=%d off=%d", dt, hd, heads, rows, off)
							stride := hd*dt.Size() + 2*off
							k := kvRows(rows, hd, stride, 2*off, dt, uint64(hd*heads+rows))
							q := misaligned(randomFloats(heads*hd, uint64(rows)), off)
							dstStride := rows + off
							want, got := make([]float32, heads*dstStride), make([]float32, heads*dstStride)
							scoresGeneric(want, dstStride, q, heads, hd, k, nil, nil, rows, stride, dt, 0.17)
							ks.scores(got, dstStride, q, heads, hd, k, k[1:], nil, rows, stride, dt, 0.17)
							checkSame(t, "scores "+name, got, want)

							w := misaligned(randomFloats(heads*dstStride, uint64(hd)), off)
							want, got = randomFloats(heads*hd, 9), misaligned(randomFloats(heads*hd, 9), 1)
							accumVGeneric(want, heads, hd, w, dstStride, k, rows, stride, dt)
							ks.accumV(got, heads, hd, w, dstStride, k, rows, stride, dt)
							checkSame(t, "weighted values "+name, got, want)
						}
					}
				}
			}
		}
	})
}

// TestKernelF16Widening reads every binary16 bit pattern through the
// weighted-value kernel with weight 1 onto zeros, which gives each value as
// the kernel widened it.
func TestKernelF16Widening(t *testing.T) {
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		for _, dt := range []kv.DType{kv.F16, kv.BF16} {
			b := make([]byte, 2<<16)
			for h := range 1 << 16 {
				b[2*h], b[2*h+1] = byte(h), byte(h>>8)
			}
			const hd = 64
			rows := (1 << 16) / hd
			w := slices.Repeat([]float32{1}, rows)
			for r := range rows {
				want, got := make([]float32, hd), make([]float32, hd)
				accumVGeneric(want, 1, hd, w[r:], 0, b[r*2*hd:], 1, 2*hd, dt)
				ks.accumV(got, 1, hd, w[r:], 0, b[r*2*hd:], 1, 2*hd, dt)
				checkSame(t, fmt.Sprintf("%s from %04x", dt, r*hd), got, want)
			}
		}
	})
}

// specials are values every elementwise kernel must treat as the generic
// one does.
var specials = []float32{0, float32(math.Copysign(0, -1)), 1, -1, float32(math.Inf(1)), float32(math.Inf(-1)),
	float32(math.NaN()), math.Float32frombits(1), math.MaxFloat32, -math.MaxFloat32, 89, 89.0001, -104, -104.0001,
	88.72283, -87.33654, -103.97208, 1e-30, -1e-30}

// expInputs are n values spread over exp32's whole range and past it, with
// the specials mixed in.
func expInputs(n int, seed uint64) []float32 {
	rng := splitMix64(seed)
	v := make([]float32, n)
	for i := range v {
		r := rng.next()
		switch {
		case r%7 == 0:
			v[i] = specials[int(r>>8)%len(specials)]
		case r%7 == 1:
			v[i] = math.Float32frombits(uint32(r >> 20)) // any bits at all
		default:
			v[i] = float32(float64(r>>11)/(1<<53)*200 - 110)
		}
	}
	return v
}

func TestKernelElementwise(t *testing.T) {
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		for _, n := range kernelLengths {
			for off := range 8 {
				name := fmt.Sprintf("%d at offset %d", n, off)
				x, y := expInputs(n, uint64(n+off)), randomFloats(n, uint64(n))
				if n > 0 {
					got, want := ks.max(misaligned(x, off)), maxGeneric(x)
					checkSame(t, "max of "+name, []float32{got}, []float32{want})
				}
				for _, mx := range []float32{0, 3.5, -2} {
					want, got := slices.Clone(x), misaligned(x, off)
					ws, gs := expSubSumGeneric(want, mx), ks.expSubSum(got, mx)
					checkSame(t, fmt.Sprintf("exp(x-%g) of %s", mx, name), got, want)
					checkSame(t, fmt.Sprintf("sum of exp(x-%g) of %s", mx, name), []float32{gs}, []float32{ws})
				}
				want, got := slices.Clone(x), misaligned(x, off)
				swiGLUGeneric(want, y)
				ks.swiGLU(got, misaligned(y, 7-off))
				checkSame(t, "swiGLU of "+name, got, want)

				want, got = slices.Clone(y), misaligned(y, off)
				scaleGeneric(want, 0.3)
				ks.scale(got, 0.3)
				checkSame(t, "scale of "+name, got, want)

				want, got = make([]float32, n), misaligned(make([]float32, n), off)
				mulScaleGeneric(want, x, y, 1.7)
				ks.mulScale(got, misaligned(x, 3), misaligned(y, 5), 1.7)
				checkSame(t, "mulScale of "+name, got, want)

				want, got = slices.Clone(x), misaligned(x, off)
				addGeneric(want, y)
				ks.add(got, misaligned(y, 2))
				checkSame(t, "add of "+name, got, want)
			}
		}
	})
}

// TestKernelExpSweep takes exp over its whole range in small steps, where
// the float64 lanes of the fast kernel must round exactly as exp32 does.
func TestKernelExpSweep(t *testing.T) {
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		var x []float32
		for v := float32(-105); v < 90; v += 0.00093 {
			x = append(x, v)
		}
		want, got := slices.Clone(x), slices.Clone(x)
		expSubSumGeneric(want, 0)
		ks.expSubSum(got, 0)
		checkSame(t, "exp sweep", got, want)
	})
}

// TestMaxSignedZero: the fast max prefers +0 to -0 in either order, as Go's
// max does.
func TestMaxSignedZero(t *testing.T) {
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		neg := float32(math.Copysign(0, -1))
		for n := 1; n <= 19; n++ {
			for at := range n {
				x := slices.Repeat([]float32{neg}, n)
				x[at] = 0
				if got := ks.max(x); math.Float32bits(got) != 0 {
					t.Fatalf("max of -0s with +0 at %d of %d is %g (%08x)", at, n, got, math.Float32bits(got))
				}
			}
		}
	})
}

// withKernels runs f with ks as the engine's kernels.
func withKernels(ks *kernelSet, f func()) {
	saved := kern
	kern = ks
	defer func() { kern = saved }()
	f()
}

// forwardBits runs prompt through cfg's model in one pass, then steps more
// tokens one at a time, and returns the KV rows and the greedy tokens.
func forwardBits(t *testing.T, cfg ModelConfig, prompt []int, more int) ([]byte, []int) {
	t.Helper()
	e := engineFor(t, cfg)
	bpt := e.m.geo.BytesPerToken()
	cache := make([]byte, (len(prompt)+more)*bpt)
	sc := newScratch(cfg, len(prompt), 1)
	rows := sc.prefillRows(e.m, prompt, 0, nil, cache[:len(prompt)*bpt])
	e.m.forward(sc, rows)
	toks := []int{rows[len(rows)-1].next}
	for pos := len(prompt); pos < len(prompt)+more; pos++ {
		row := sc.prefillRows(e.m, toks[len(toks)-1:], pos, [][]byte{cache[:pos*bpt]}, cache[pos*bpt:(pos+1)*bpt])
		e.m.forward(sc, row)
		toks = append(toks, row[0].next)
	}
	return cache, toks
}

// oddModelConfig has the shape of the smallest real model the engine runs
// (head width 8, hidden width 172, eight query heads on four KV heads), and
// oddestModelConfig widths no kernel block divides.
func oddModelConfig() ModelConfig {
	c := DefaultModelConfig()
	c.Dim, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.HiddenDim = 64, 2, 8, 4, 8, 172
	c.Vocab, c.ContextTokens = 512, 512
	return c
}

func oddestModelConfig() ModelConfig {
	c := DefaultModelConfig()
	c.Dim, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.HiddenDim = 30, 2, 6, 2, 6, 37
	c.Vocab, c.ContextTokens = 259, 256
	return c
}

// TestForwardKernelsAgree runs whole models with each kernel set and
// compares every KV byte and every token.
func TestForwardKernelsAgree(t *testing.T) {
	var cfgs []ModelConfig
	for _, c := range []ModelConfig{DefaultModelConfig(), oddModelConfig(), oddestModelConfig()} {
		for _, dt := range kvDTypes {
			c.KVDType = dt
			cfgs = append(cfgs, c)
		}
	}
	cfgs = append(cfgs, LargeModelConfig())
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		for _, cfg := range cfgs {
			t.Run(fmt.Sprintf("dim=%d/%s", cfg.Dim, cfg.kvDType()), func(t *testing.T) {
				prompt := testPrompt(45, "kernels")
				var wantKV, gotKV []byte
				var want, got []int
				withKernels(&genericKernels, func() { wantKV, want = forwardBits(t, cfg, prompt, 12) })
				withKernels(ks, func() { gotKV, got = forwardBits(t, cfg, prompt, 12) })
				if !slices.Equal(got, want) {
					t.Fatalf("tokens %v, the generic kernels' %v", got, want)
				}
				if i := firstDiff(gotKV, wantKV); i >= 0 {
					t.Fatalf("KV byte %d differs from the generic kernels'", i)
				}
			})
		}
	})
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestSplitAgrees: a forward pass split between goroutines wherever it can
// be computes the bits of one computed on the caller alone.
func TestSplitAgrees(t *testing.T) {
	for _, cfg := range []ModelConfig{DefaultModelConfig(), oddModelConfig()} {
		prompt := testPrompt(70, "split")
		savedMM, savedAtt := matmulSplitMin, attendSplitMin
		matmulSplitMin, attendSplitMin = math.MaxInt, math.MaxInt
		wantKV, want := forwardBits(t, cfg, prompt, 10)
		matmulSplitMin, attendSplitMin = 0, 0
		gotKV, got := forwardBits(t, cfg, prompt, 10)
		matmulSplitMin, attendSplitMin = savedMM, savedAtt
		if !slices.Equal(got, want) || firstDiff(gotKV, wantKV) >= 0 {
			t.Fatalf("dim %d: split pass gives tokens %v and KV differing at byte %d; unsplit %v",
				cfg.Dim, got, firstDiff(gotKV, wantKV), want)
		}
	}
	// Parts beyond the helpers run on the caller, in any number.
	x, w := randomFloats(3*64, 1), randomFloats(100*64, 2)
	want := make([]float32, 3*100)
	kern.matmul(want, x, w, 64, 100, 0, 100)
	var s scratch
	for parts := 1; parts <= partsMax; parts++ {
		got := make([]float32, 3*100)
		s.mm = matmulJob{out: got, x: x, w: &Matrix{Rows: 100, Cols: 64, F32: w}}
		split(&s.mm, parts, &s.wg)
		checkSame(t, fmt.Sprintf("matmul in %d parts", parts), got, want)
	}
}

// countJob counts the runs of each of its parts.
type countJob struct{ runs []atomic.Int64 }

func (j *countJob) run(p, _ int) { j.runs[p].Add(1) }

// TestSplitFromManyCallers: callers splitting at once, with more parts
// than helpers and helpers held by one another's parts, get every part of
// every split run exactly once, and none waits for ever.
func TestSplitFromManyCallers(t *testing.T) {
	helpers.once.Do(startHelpers)
	const callers, splits = 8, 500
	parts := len(helpers.all) + 2
	done := make(chan []*countJob, callers)
	for range callers {
		go func() {
			var wg sync.WaitGroup
			var jobs []*countJob
			for range splits {
				j := &countJob{runs: make([]atomic.Int64, parts)}
				split(j, parts, &wg)
				jobs = append(jobs, j)
			}
			done <- jobs
		}()
	}
	for range callers {
		for i, j := range testwait.Recv(t, "a caller's splits", time.Minute, done) {
			for p := range j.runs {
				if n := j.runs[p].Load(); n != 1 {
					t.Fatalf("split %d: part %d of %d ran %d times", i, p, parts, n)
				}
			}
		}
	}
}
