package engine

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/kvwarden/kvwarden/kv"
)

// The AVX2 kernels are generated, with the summation order of the generic
// kernels built in (see internal/asm); the .s file and its declarations are
// committed, so that building needs no generator.
//go:generate go run -C internal/asm . -out ../../kernels_amd64.s -stubs ../../kernels_stub_amd64.go -pkg engine

// avx2Kernels wraps the assembly: each wrapper checks the bounds the
// assembly relies on (so that a wrong length panics as Go code would,
// rather than reading past a slice) and hands shapes the assembly does not
// cover, such as a head width that is not a multiple of 8, to the generic
// kernel, which computes the same bits. The set needs F16C besides AVX2:
// the weight kernels widen F16 with it.
var avx2Kernels = kernelSet{
	name: "avx2", dot: dotAVX2Slices, matmul: matmulAVX2, matmulW: matmulWAVX2, scores: scoresAVX2, accumV: accumVAVX2,
	prefetch: prefetchAVX2Slice, max: maxAVX2Slice, expSubSum: expSubSumAVX2Slice, scale: scaleAVX2Slice, mulScale: mulScaleAVX2Slices,
	add: addAVX2Slices, swiGLU: swiGLUAVX2Slices,
}

// fastKernels are the sets this CPU can run besides the generic one, for
// the tests that compare them bit for bit.
var fastKernels []*kernelSet

func init() {
	if cpu.X86.HasAVX2 && hasF16C() {
		kern = &avx2Kernels
		fastKernels = append(fastKernels, &avx2Kernels)
	}
}

func dotAVX2Slices(a, b []float32) float32 {
	if len(a) == 0 {
		return 0
	}
	b = b[:len(a)]
	return dotAVX2(&a[0], &b[0], len(a))
}

// matmulTile is one generated block kernel: rows of x against cols rows of
// w, c at a time. W is what w holds: float32 elements, or the bytes of
// another weight type.
type matmulTile[W float32 | byte] struct {
	c int
	f func(x *float32, xStride int, w *W, n int, cols int, out *float32, outStride int)
}

// matmulTiles[r] are the kernels for r rows of x, widest block first.
type matmulTiles[W float32 | byte] [5][]matmulTile[W]

var matmulF32Tiles = matmulTiles[float32]{
	1: {{8, matmulF32R1C8}, {4, matmulF32R1C4}, {2, matmulF32R1C2}, {1, matmulF32R1C1}},
	2: {{4, matmulF32R2C4}, {2, matmulF32R2C2}, {1, matmulF32R2C1}},
	3: {{2, matmulF32R3C2}, {1, matmulF32R3C1}},
	4: {{2, matmulF32R4C2}, {1, matmulF32R4C1}},
}

// matmulWTiles are the kernels of the other weight types. A Q8_0 or Q4_0
// kernel keeps each row's block scale in a register beside the
// accumulators, so its blocks are narrower.
var matmulWTiles = map[WeightType]*matmulTiles[byte]{
	WeightF16: {
		1: {{8, matmulF16R1C8}, {4, matmulF16R1C4}, {2, matmulF16R1C2}, {1, matmulF16R1C1}},
		2: {{4, matmulF16R2C4}, {2, matmulF16R2C2}, {1, matmulF16R2C1}},
		3: {{2, matmulF16R3C2}, {1, matmulF16R3C1}},
		4: {{2, matmulF16R4C2}, {1, matmulF16R4C1}},
	},
	WeightBF16: {
		1: {{8, matmulBF16R1C8}, {4, matmulBF16R1C4}, {2, matmulBF16R1C2}, {1, matmulBF16R1C1}},
		2: {{4, matmulBF16R2C4}, {2, matmulBF16R2C2}, {1, matmulBF16R2C1}},
		3: {{2, matmulBF16R3C2}, {1, matmulBF16R3C1}},
		4: {{2, matmulBF16R4C2}, {1, matmulBF16R4C1}},
	},
	WeightQ8_0: {
		1: {{4, matmulQ8_0R1C4}, {2, matmulQ8_0R1C2}, {1, matmulQ8_0R1C1}},
		2: {{2, matmulQ8_0R2C2}, {1, matmulQ8_0R2C1}},
		3: {{2, matmulQ8_0R3C2}, {1, matmulQ8_0R3C1}},
		4: {{2, matmulQ8_0R4C2}, {1, matmulQ8_0R4C1}},
	},
	WeightQ4_0: {
		1: {{4, matmulQ4_0R1C4}, {2, matmulQ4_0R1C2}, {1, matmulQ4_0R1C1}},
		2: {{2, matmulQ4_0R2C2}, {1, matmulQ4_0R2C1}},
		3: {{2, matmulQ4_0R3C2}, {1, matmulQ4_0R3C1}},
		4: {{2, matmulQ4_0R4C2}, {1, matmulQ4_0R4C1}},
	},
}

// A product of many rows of x goes in blocks: a block of rows of x (at
// least matmulBlockRows, more while they take at most matmulRowBytes)
// against a block of rows of w (at most matmulColBytes, small enough to
// stay in the L1 cache while each group of four rows of x reads it again).
// A decode batch's rows of x are one block, so that w, too large for the
// caches, streams from memory once per product.
const (
	matmulBlockRows = 16
	matmulRowBytes  = 16 << 10
	matmulColBytes  = 8 << 10
)

func matmulAVX2(out, x, w []float32, in, outs, j0, j1 int) {
	if rows := matmulRows(out, x, len(w), in, WeightF32, in, outs, j0, j1); rows > 0 {
		matmulTiled(out, x, w, in, &matmulF32Tiles, rows, in, outs, j0, j1)
	}
}

func matmulWAVX2(out, x []float32, w []byte, t WeightType, rb, in, outs, j0, j1 int) {
	rows := matmulRows(out, x, len(w), rb, t, in, outs, j0, j1)
	tiles := matmulWTiles[t]
	need, whole := t.RowBytes(in)
	switch {
	case rows == 0:
	case tiles == nil || !whole || rb != need:
		// A type without kernels, rows that are not whole blocks, or
		// rows not exactly their bytes apart.
		matmulWGeneric(out, x, w, t, rb, in, outs, j0, j1)
	case in%8 != 0:
		// F16 and BF16 rows that end in part of a chunk of 8, which the
		// weight kernels do not read: each row widened (exactly) and
		// multiplied by the F32 kernel, which does, in the same order.
		var small [512]float32
		row := small[:0]
		if in > len(small) {
			row = make([]float32, in)
		}
		row = row[:in]
		for j := j0; j < j1; j++ {
			widen(row, w[j*rb:(j+1)*rb], t, 0)
			matmulAVX2(out[j:], x, row, in, outs, 0, 1)
		}
	default:
		matmulTiled(out, x, w, rb, tiles, rows, in, outs, j0, j1)
	}
}

// matmulRows is the rows of x, or 0 when there is nothing to compute. It
// panics unless x is whole rows of in elements, w (wLen elements of w's
// slice, a row every rowW) holds the rows j0 ≤ j < j1 and out their
// outputs for every row of x.
func matmulRows(out, x []float32, wLen, rowW int, t WeightType, in, outs, j0, j1 int) int {
	rows := len(x) / in
	if rows == 0 || j0 >= j1 {
		return 0
	}
	if j0 < 0 || j1 > outs || len(x) != rows*in || wLen < j1*rowW || len(out) < (rows-1)*outs+j1 {
		panic(fmt.Sprintf("engine: matmul of %d×%d by %d×%d %s into %d outputs, columns [%d, %d)",
			rows, in, wLen/max(rowW, 1), in, t, len(out), j0, j1))
	}
	return rows
}

// matmulTiled computes the rows of x against the rows j0 ≤ j < j1 of w,
// rowW elements of w's slice apart, with tiles, in the blocks above.
func matmulTiled[W float32 | byte](out, x []float32, w []W, rowW int, tiles *matmulTiles[W], rows, in, outs, j0, j1 int) {
	rowBlock, colBlock := rows, j1-j0
	if rows > 4 {
		rowBlock = max(matmulBlockRows, matmulRowBytes/(4*in)&^3)
		colBlock = max(8, matmulColBytes/(rowW*int(unsafe.Sizeof(w[0])))&^7)
	}
	for tb := 0; tb < rows; tb += rowBlock {
		te := min(tb+rowBlock, rows)
		for jb := j0; jb < j1; jb += colBlock {
			je := min(jb+colBlock, j1)
			for t := tb; t < te; {
				r := min(te-t, 4)
				j := jb
				for _, tile := range tiles[r] {
					if cols := (je - j) / tile.c * tile.c; cols > 0 {
						tile.f(&x[t*in], in, &w[j*rowW], in, cols, &out[t*outs+j], outs)
						j += cols
					}
				}
				t += r
			}
		}
	}
}

// dtypeIndex numbers the KV dtypes the kernels decode: f32, f16, bf16.
func dtypeIndex(dt kv.DType) int {
	switch dt {
	case kv.F32:
		return 0
	case kv.F16:
		return 1
	case kv.BF16:
		return 2
	}
	panic(fmt.Sprintf("engine: KV dtype %s has no kernel", dt))
}

// scoresTile is one generated scores kernel: heads query heads against
// cols rows of keys, c at a time.
type scoresTile struct {
	c int
	f func(q *float32, hdStride int, k *byte, nextK *byte, nextV *byte, stride int, hd int, cols int, out *float32, outStride int, scale float32)
}

// scoresTiles[dtype][h] are the kernels for h query heads, widest block
// first.
var scoresTiles = [3][5][]scoresTile{
	{
		1: {{8, scoresF32R1C8}, {4, scoresF32R1C4}, {2, scoresF32R1C2}, {1, scoresF32R1C1}},
		2: {{4, scoresF32R2C4}, {2, scoresF32R2C2}, {1, scoresF32R2C1}},
		3: {{2, scoresF32R3C2}, {1, scoresF32R3C1}},
		4: {{2, scoresF32R4C2}, {1, scoresF32R4C1}},
	},
	{
		1: {{8, scoresF16R1C8}, {4, scoresF16R1C4}, {2, scoresF16R1C2}, {1, scoresF16R1C1}},
		2: {{4, scoresF16R2C4}, {2, scoresF16R2C2}, {1, scoresF16R2C1}},
		3: {{2, scoresF16R3C2}, {1, scoresF16R3C1}},
		4: {{2, scoresF16R4C2}, {1, scoresF16R4C1}},
	},
	{
		1: {{8, scoresBF16R1C8}, {4, scoresBF16R1C4}, {2, scoresBF16R1C2}, {1, scoresBF16R1C1}},
		2: {{4, scoresBF16R2C4}, {2, scoresBF16R2C2}, {1, scoresBF16R2C1}},
		3: {{2, scoresBF16R3C2}, {1, scoresBF16R3C1}},
		4: {{2, scoresBF16R4C2}, {1, scoresBF16R4C1}},
	},
}

// checkKV panics unless rows rows of hd elements of dt, stride bytes apart,
// lie in b.
func checkKV(b []byte, hd, rows, stride int, dt kv.DType) {
	if stride < 0 || len(b) < (rows-1)*stride+hd*dt.Size() {
		panic(fmt.Sprintf("engine: %d KV rows of %d %s elements %d bytes apart in %d bytes", rows, hd, dt, stride, len(b)))
	}
}

// nextRows is the first byte of next, the rows a kernel prefetches, or of
// k when there are none: a prefetch never faults, so rows past next's end
// are a hint wasted, no more.
func nextRows(next, k []byte) *byte {
	if len(next) > 0 {
		return &next[0]
	}
	return &k[0]
}

func scoresAVX2(dst []float32, dstStride int, q []float32, heads, hd int, k, nextK, nextV []byte, rows, stride int, dt kv.DType, scale float32) {
	if rows == 0 || heads == 0 {
		return
	}
	if hd%8 != 0 {
		scoresGeneric(dst, dstStride, q, heads, hd, k, nextK, nextV, rows, stride, dt, scale)
		return
	}
	checkKV(k, hd, rows, stride, dt)
	_, _ = q[heads*hd-1], dst[(heads-1)*dstStride+rows-1]
	tiles := &scoresTiles[dtypeIndex(dt)]
	for h := 0; h < heads; h += 4 {
		n, r := min(4, heads-h), 0
		for _, t := range tiles[n] {
			if cols := (rows - r) / t.c * t.c; cols > 0 {
				t.f(&q[h*hd], hd, &k[r*stride], nextRows(tail(nextK, r*stride), k), nextRows(tail(nextV, r*stride), k),
					stride, hd, cols, &dst[h*dstStride+r], dstStride, scale)
				r += cols
			}
		}
	}
}

// accumVTile is one generated weighted-sum kernel: h heads, d chunks of 8
// lanes at a time.
type accumVTile struct {
	d int
	f func(out *float32, hd int, w *float32, wStride int, v *byte, stride int, n int)
}

// accumVTiles[dtype][h-1] are the kernels for h heads, most chunks first.
var accumVTiles = [3][4][]accumVTile{
	{
		{{4, accumVF32H1D4}, {2, accumVF32H1D2}, {1, accumVF32H1D1}},
		{{4, accumVF32H2D4}, {2, accumVF32H2D2}, {1, accumVF32H2D1}},
		{{2, accumVF32H3D2}, {1, accumVF32H3D1}},
		{{2, accumVF32H4D2}, {1, accumVF32H4D1}},
	},
	{
		{{4, accumVF16H1D4}, {2, accumVF16H1D2}, {1, accumVF16H1D1}},
		{{2, accumVF16H2D2}, {1, accumVF16H2D1}},
		{{2, accumVF16H3D2}, {1, accumVF16H3D1}},
		{{2, accumVF16H4D2}, {1, accumVF16H4D1}},
	},
	{
		{{4, accumVBF16H1D4}, {2, accumVBF16H1D2}, {1, accumVBF16H1D1}},
		{{4, accumVBF16H2D4}, {2, accumVBF16H2D2}, {1, accumVBF16H2D1}},
		{{2, accumVBF16H3D2}, {1, accumVBF16H3D1}},
		{{2, accumVBF16H4D2}, {1, accumVBF16H4D1}},
	},
}

func accumVAVX2(out []float32, heads, hd int, w []float32, wStride int, v []byte, rows, stride int, dt kv.DType) {
	if rows == 0 || heads == 0 {
		return
	}
	if hd%8 != 0 {
		accumVGeneric(out, heads, hd, w, wStride, v, rows, stride, dt)
		return
	}
	checkKV(v, hd, rows, stride, dt)
	_, _ = out[heads*hd-1], w[(heads-1)*wStride+rows-1]
	tiles := &accumVTiles[dtypeIndex(dt)]
	for h := 0; h < heads; h += 4 {
		n := min(4, heads-h)
		for _, t := range tiles[n-1] {
			if hd%(8*t.d) == 0 {
				t.f(&out[h*hd], hd, &w[h*wStride], wStride, &v[0], stride, rows)
				break
			}
		}
	}
}

// prefetchAVX2Slice asks for rows of b; a prefetch never faults, so rows
// past the end of b are only a hint wasted.
func prefetchAVX2Slice(b []byte, rows, stride, bytes int) {
	if len(b) > 0 && rows > 0 && bytes > 0 {
		prefetchAVX2(&b[0], stride, rows, bytes)
	}
}

func maxAVX2Slice(x []float32) float32 {
	_ = x[0]
	return maxAVX2(&x[0], len(x))
}

func expSubSumAVX2Slice(x []float32, mx float32) float32 {
	if len(x) == 0 {
		return 0
	}
	return expSubSumAVX2(&x[0], len(x), mx)
}

func scaleAVX2Slice(x []float32, s float32) {
	if len(x) > 0 {
		scaleAVX2(&x[0], len(x), s)
	}
}

func mulScaleAVX2Slices(out, x, w []float32, s float32) {
	if len(out) > 0 {
		x, w = x[:len(out)], w[:len(out)]
		mulScaleAVX2(&out[0], &x[0], &w[0], len(out), s)
	}
}

func addAVX2Slices(x, d []float32) {
	if len(x) > 0 {
		d = d[:len(x)]
		addAVX2(&x[0], &d[0], len(x))
	}
}

func swiGLUAVX2Slices(gate, up []float32) {
	if len(gate) > 0 {
		up = up[:len(gate)]
		swiGLUAVX2(&gate[0], &up[0], len(gate))
	}
}
