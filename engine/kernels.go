package engine

import "github.com/kvwarden/kvwarden/kv"

// kernelSet is one implementation of the engine's vector kernels. Every set
// computes exactly the bits of genericKernels (kernels_generic.go defines
// the order of every sum), so the set a CPU runs changes the speed and
// nothing else.
type kernelSet struct {
	name string
	// dot is dotGeneric.
	dot func(a, b []float32) float32
	// matmul is matmulGeneric: out[t·outs+j] = dot(x[t], w[j]) for the
	// rows t of x and the rows j0 ≤ j < j1 of w.
	matmul func(out, x, w []float32, in, outs, j0, j1 int)
	// matmulW is matmulWGeneric: matmul for a matrix of another weight
	// type t, whose rows are rb bytes.
	matmulW func(out, x []float32, w []byte, t WeightType, rb, in, outs, j0, j1 int)
	// scores is scoresGeneric: each of heads query heads against the keys
	// of rows positions, stride bytes apart. A kernel may prefetch the
	// keys at nextK and the values at nextV of the rows of the page to be
	// scored after this one (nil if none).
	scores func(dst []float32, dstStride int, q []float32, heads, hd int, k, nextK, nextV []byte, rows, stride int, dt kv.DType, scale float32)
	// accumV is accumVGeneric: the weighted sum of the values of rows
	// positions into each of heads outputs, in position order.
	accumV func(out []float32, heads, hd int, w []float32, wStride int, v []byte, rows, stride int, dt kv.DType)
	// prefetch asks for rows rows of bytes bytes at b, stride bytes
	// apart, to be read soon; a hint, which changes no result.
	prefetch  func(b []byte, rows, stride, bytes int)
	max       func(x []float32) float32
	expSubSum func(x []float32, mx float32) float32
	scale     func(x []float32, s float32)
	mulScale  func(out, x, w []float32, s float32)
	add       func(x, d []float32)
	swiGLU    func(gate, up []float32)
}

// genericKernels is the pure-Go set: the definition, and what a CPU without
// a faster set runs.
var genericKernels = kernelSet{
	name: "generic", dot: dotGeneric, matmul: matmulGeneric, matmulW: matmulWGeneric, scores: scoresGeneric, accumV: accumVGeneric,
	prefetch: prefetchGeneric, max: maxGeneric, expSubSum: expSubSumGeneric, scale: scaleGeneric, mulScale: mulScaleGeneric,
	add: addGeneric, swiGLU: swiGLUGeneric,
}

// kern is the set the engine computes with: the fastest this CPU runs
// (kernels_amd64.go picks it at start-up).
var kern = &genericKernels
