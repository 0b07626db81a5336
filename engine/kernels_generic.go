package engine

import (
	"math"

	"github.com/kvwarden/kvwarden/kv"
)

// The generic kernels define the engine's arithmetic: every other kernel
// set (kernels_amd64.s) computes exactly their bits, so that a token's KV
// and its greedy successor do not depend on the CPU, on the batch the token
// was computed in, or on how the work was split between goroutines.
//
// A dot product of n elements keeps eight partial sums: element i is added
// to sum i mod 8, in increasing i, and the sums are added as the tree
// ((s0+s1)+(s2+s3)) + ((s4+s5)+(s6+s7)). Eight sums are the eight lanes of
// one AVX2 register, and the tree is what two horizontal adds and the sum of
// the register's halves compute. A last chunk of fewer than eight elements is
// padded with zeros: each padding lane adds 0·0 = +0 to its sum, which
// leaves it as it was (a sum that starts at +0 is never -0 under rounding to
// nearest), so padding and not adding give the same bits.
//
// Every product is rounded before it is added (the explicit float32
// conversions forbid the compiler to fuse them, as Go does on arm64), and
// exp is exp32, computed here. Sums over positions (attention's weighted sum
// of V, softmax's normaliser) run in position order, whatever pages hold
// the positions.

// acc8 adds a[i]·b[i] to s[i] for the eight elements of a chunk.
func acc8(s *[8]float32, a, b []float32) {
	a, b = a[:8], b[:8]
	s[0] += float32(a[0] * b[0])
	s[1] += float32(a[1] * b[1])
	s[2] += float32(a[2] * b[2])
	s[3] += float32(a[3] * b[3])
	s[4] += float32(a[4] * b[4])
	s[5] += float32(a[5] * b[5])
	s[6] += float32(a[6] * b[6])
	s[7] += float32(a[7] * b[7])
}

// sum8 adds the eight partial sums in the canonical tree.
func sum8(s *[8]float32) float32 {
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
}

// dotGeneric is the inner product every matrix product, norm and attention
// score uses.
func dotGeneric(a, b []float32) float32 {
	b = b[:len(a)]
	var s [8]float32
	n := len(a) &^ 7
	for i := 0; i < n; i += 8 {
		acc8(&s, a[i:i+8], b[i:i+8])
	}
	if n < len(a) {
		var ta, tb [8]float32
		copy(ta[:], a[n:])
		copy(tb[:], b[n:])
		acc8(&s, ta[:], tb[:])
	}
	return sum8(&s)
}

// dotKVGeneric is dotGeneric of q and the len(q) elements of type dt stored
// at the start of b.
func dotKVGeneric(q []float32, b []byte, dt kv.DType) float32 {
	var s [8]float32
	for i := 0; i < len(q); i += 8 {
		var qc, kc [8]float32
		m := copy(qc[:], q[i:])
		decodeKV(kc[:m], b[i*dt.Size():], dt)
		acc8(&s, qc[:], kc[:])
	}
	return sum8(&s)
}

// matmulGeneric sets out[t·outs+j] = dot(x[t], w[j]) for every row t of x
// (in wide) and the rows j0 ≤ j < j1 of w.
func matmulGeneric(out, x, w []float32, in, outs, j0, j1 int) {
	rows := len(x) / in
	for j := j0; j < j1; j++ {
		wj := w[j*in : (j+1)*in]
		for t := range rows {
			out[t*outs+j] = dotGeneric(x[t*in:(t+1)*in], wj)
		}
	}
}

// scoresGeneric sets dst[h·dstStride+r] = dotKV(q[h·hd:][:hd], K_r)·scale
// for the heads query heads at q and the rows keys K_r of hd elements of
// type dt at k[r·stride:]. It leaves prefetching nextK and nextV to the
// hardware.
func scoresGeneric(dst []float32, dstStride int, q []float32, heads, hd int, k, nextK, nextV []byte, rows, stride int, dt kv.DType, scale float32) {
	for r := range rows {
		kr := k[r*stride:]
		for h := range heads {
			dst[h*dstStride+r] = dotKVGeneric(q[h*hd:(h+1)*hd], kr, dt) * scale
		}
	}
}

// accumVGeneric adds w[h·wStride+r]·V_r to out[h·hd:][:hd] for the rows
// r < rows in order, for each of the heads: V_r is hd elements of type dt
// at v[r·stride:].
func accumVGeneric(out []float32, heads, hd int, w []float32, wStride int, v []byte, rows, stride int, dt kv.DType) {
	for r := range rows {
		vr := v[r*stride:]
		for h := range heads {
			axpyKV(out[h*hd:(h+1)*hd], w[h*wStride+r], vr, dt)
		}
	}
}

// prefetchGeneric leaves prefetching to the hardware.
func prefetchGeneric(b []byte, rows, stride, bytes int) {}

// maxGeneric is the largest element of x (at least one): the softmax's
// shift, which keeps exp from overflowing.
func maxGeneric(x []float32) float32 {
	mx := x[0]
	for _, v := range x[1:] {
		mx = max(mx, v)
	}
	return mx
}

// expSubSumGeneric replaces each x[i] with exp32(x[i] - mx) and returns
// their sum, in eight partial sums like a dot product's.
func expSubSumGeneric(x []float32, mx float32) float32 {
	var s [8]float32
	for i, v := range x {
		e := exp32(v - mx)
		x[i] = e
		s[i%8] += e
	}
	return sum8(&s)
}

// scaleGeneric multiplies x by s.
func scaleGeneric(x []float32, s float32) {
	for i := range x {
		x[i] *= s
	}
}

// mulScaleGeneric sets out[i] = x[i]·s·w[i]: the second half of RMSNorm.
func mulScaleGeneric(out, x, w []float32, s float32) {
	x, w = x[:len(out)], w[:len(out)]
	for i := range out {
		out[i] = x[i] * s * w[i]
	}
}

// addGeneric adds d to x.
func addGeneric(x, d []float32) {
	d = d[:len(x)]
	for i := range x {
		x[i] += d[i]
	}
}

// swiGLUGeneric sets gate[i] = silu(gate[i])·up[i].
func swiGLUGeneric(gate, up []float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		gate[i] = g / (1 + exp32(-g)) * up[i]
	}
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
	const log2e = 1.4426950408889634
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
