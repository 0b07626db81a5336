// Command asm generates the engine's AVX2 kernels: kernels_amd64.s and the
// Go declarations in kernels_stub_amd64.go (run by go generate in engine).
//
// Every kernel computes exactly the bits of its pure-Go counterpart in
// engine/kernels_generic.go, which defines the order of every sum: a dot
// product of n elements keeps eight partial sums, element i going to sum
// i mod 8 in increasing i, and adds them as ((s0+s1)+(s2+s3)) +
// ((s4+s5)+(s6+s7)). In a vector register the eight sums are the eight
// lanes of one accumulator, and the tree is two horizontal adds and the
// sum of the two 128-bit halves. Multiplications and additions stay
// separate instructions (no FMA), because the Go code rounds each product
// before adding it, and exp is the package's own: float64 Horner steps and
// an exact scaling by 2^k, the same operations in four lanes.
//
// A matrix of weights of another type than F32 (F16, BF16, or ggml's Q8_0
// and Q4_0 blocks of 32 elements with an F16 scale) is widened a chunk of
// eight elements at a time in registers, never into memory. Every widened
// element is exact in float32 (a block's scale times its integer quant
// included), so a kernel computes the F32 kernel's bits for the widened
// matrix while reading half (F16, BF16) to a seventh (Q4_0) of its bytes.
//
// A tail of fewer than eight elements is read with a masked load, which
// reads zeros into the lanes past the end (and never faults there). A zero
// lane adds +0 to its partial sum, which changes nothing: a sum that starts
// at +0 is never -0 under round-to-nearest, and x + (+0) = x for every
// other x.
package main

import (
	"fmt"
	"math"
	"math/bits"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

func main() {
	constants()
	cpuidKernel()
	dotKernel()
	for _, f := range append([]format{f32}, wtypes...) {
		for _, t := range matmulTiles {
			if matmulFits(f, t[0], t[1]) {
				matmulKernel(f, t[0], t[1])
			}
		}
	}
	for _, dt := range dtypes {
		for _, t := range matmulTiles {
			scoresKernel(dt, t[0], t[1])
		}
		for h := 1; h <= 4; h++ {
			for _, d := range []int{1, 2, 4} {
				if accumVFits(dt, h, d) {
					accumVKernel(dt, h, d)
				}
			}
		}
	}
	prefetchKernel()
	maxKernel()
	expSubSumKernel()
	scaleKernel()
	mulScaleKernel()
	addKernel()
	swiGLUKernel()
	Generate()
}

// matmulTiles are the (rows of x, rows of w) blocks a matmul or scores
// kernel computes at once: at most eight accumulators, so that they, the
// loaded vectors and the mask fit in the sixteen YMM registers.
var matmulTiles = [][2]int{{1, 8}, {1, 4}, {1, 2}, {1, 1}, {2, 4}, {2, 2}, {2, 1}, {3, 2}, {3, 1}, {4, 2}, {4, 1}}

// format is how a row of w (a weight matrix, or keys or values in KV pages)
// stores its elements: whole blocks of block elements in bytes bytes, each
// widened to float32 eight elements, a chunk, at a time. Every widening is
// exact, so a kernel computes the float32 product of the widened elements.
type format struct {
	name         string
	block, bytes int
	// A scaled block starts with its F16 scale d; element i is d times
	// what chunk widens, a product exact in float32 (an F16's 11
	// significant bits times an integer of at most 8 bits).
	scaled bool
	// A row of F32 may end in a part chunk, which a kernel reads masked;
	// a row of any other format is whole blocks.
	tail bool
	// chunk widens the elements 8j, …, 8j+7 of the block at m.
	chunk func(m Mem, j int) VecVirtual
}

// The formats: F32; F16 and BF16 as KV pages hold them; and the weight
// types of engine/weights.go (F16 and BF16, ggml's Q8_0 and Q4_0).
var (
	f32 = format{name: "F32", block: 8, bytes: 32, tail: true, chunk: func(m Mem, _ int) VecVirtual {
		v := YMM()
		VMOVUPS(m, v)
		return v
	}}
	bf16 = format{name: "BF16", block: 8, bytes: 16, chunk: func(m Mem, _ int) VecVirtual {
		v := YMM()
		VPMOVZXWD(m, v)
		VPSLLD(U8(16), v, v)
		return v
	}}
	// A KV page's F16 is widened without F16C, keeping a NaN's payload as
	// engine's f16ToF32 does (VCVTPH2PS would quiet it).
	kvF16 = format{name: "F16", block: 8, bytes: 16, chunk: f16ToF32}
	// A weight matrix holds no NaN (engine checks every weight), and a
	// number or an infinity VCVTPH2PS converts exactly, in one instruction.
	wF16 = format{name: "F16", block: 8, bytes: 16, chunk: func(m Mem, _ int) VecVirtual {
		v := YMM()
		VCVTPH2PS(m, v)
		return v
	}}
	// Q8_0: the scale, then 32 int8.
	q8_0 = format{name: "Q8_0", block: 32, bytes: 34, scaled: true, chunk: func(m Mem, j int) VecVirtual {
		v := YMM()
		VPMOVSXBD(m.Offset(2+8*j), v)
		VCVTDQ2PS(v, v)
		return v
	}}
	// Q4_0: the scale, then 16 bytes: element i < 16 is the low nibble of
	// byte i, element i ≥ 16 the high nibble of byte i-16, each minus 8.
	q4_0 = format{name: "Q4_0", block: 32, bytes: 18, scaled: true, chunk: func(m Mem, j int) VecVirtual {
		v := YMM()
		VPMOVZXBD(m.Offset(2+8*(j%2)), v)
		if j < 2 {
			VPAND(cLowNibble, v, v)
		} else {
			VPSRLD(U8(4), v, v)
		}
		VPSUBD(cEight, v, v)
		VCVTDQ2PS(v, v)
		return v
	}}
)

// dtypes are the element types of K and V in KV pages; wtypes the weight
// types besides F32 that the matmul kernels read.
var (
	dtypes = []format{f32, kvF16, bf16}
	wtypes = []format{wF16, bf16, q8_0, q4_0}
)

// Constants, each repeated across a whole YMM register so that it can be
// an instruction's memory operand.
var (
	cMask                                          Mem // eight all-ones lanes, then eight zero lanes
	cSign, cAbs7FFF, cF16Bias, cF16InfNaN, cF16Min Mem
	cF16Sub, cOne, cInf, cNegInf, c89, cNeg104     Mem
	cLog2e, cHalf, cLn2Hi, cLn2Lo, cP11, c1023     Mem
	cLowNibble, cEight                             Mem
	cTaylor                                        []Mem
)

// expTaylor is 1/10!, …, 1/0!, as in exp32.
var expTaylor = []float64{1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720,
	1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1, 1}

func constants() {
	tab := GLOBL("kconst", RODATA|NOPTR)
	off := 0
	u32 := func(v uint32) Mem {
		m := tab.Offset(off)
		for i := 0; i < 8; i++ {
			DATA(off, U32(v))
			off += 4
		}
		return m
	}
	u64 := func(v uint64) Mem {
		m := tab.Offset(off)
		for i := 0; i < 4; i++ {
			DATA(off, U64(v))
			off += 8
		}
		return m
	}
	f32 := func(v float32) Mem { return u32(math.Float32bits(v)) }
	f64 := func(v float64) Mem { return u64(math.Float64bits(v)) }
	cMask = u32(0xffffffff)
	u32(0)
	cSign = u32(0x80000000)
	cAbs7FFF = u32(0x7fff)
	cF16Bias = u32(112 << 23) // binary16 exponent bias 15 to binary32's 127
	cF16InfNaN = u32(0x7bff)  // above it: exponent 31, infinity or NaN
	cF16Min = u32(0x3ff)      // above it: a normal number
	cF16Sub = f32(1.0 / (1 << 24))
	cOne = f32(1)
	cInf = f32(float32(math.Inf(1)))
	cNegInf = f32(float32(math.Inf(-1)))
	c89 = f32(89)
	cNeg104 = f32(-104)
	cLog2e = f64(1.4426950408889634)
	cHalf = f64(0.5)
	cLn2Hi = f64(6.93147180369123816490e-01)
	cLn2Lo = f64(1.90821492927058770002e-10)
	cP11 = f64(1.0 / 39916800)
	for _, c := range expTaylor {
		cTaylor = append(cTaylor, f64(c))
	}
	c1023 = u64(1023)
	cLowNibble = u32(0xf)
	cEight = u32(8)
}

// cpuidKernel reads the CPU's F16C flag, which golang.org/x/sys/cpu (as
// of the version the engine builds with) does not report.
func cpuidKernel() {
	TEXT("hasF16C", NOSPLIT, "func() bool")
	Doc("hasF16C says whether the CPU has F16C, the conversions of F16 (CPUID leaf 1, ECX bit 29).")
	MOVL(U32(1), EAX)
	XORL(ECX, ECX)
	CPUID()
	SHRL(U8(29), ECX)
	ANDL(U8(1), ECX)
	Store(CL, ReturnIndex(0))
	RET()
}

// gpParam loads the integer or pointer parameter name.
func gpParam(name string) GPVirtual {
	r := GP64()
	Load(Param(name), r)
	return r
}

// imm is the constant v ≥ 0, in a byte if it fits.
func imm(v int) Constant {
	if v < 256 {
		return U8(uint8(v))
	}
	return U32(uint32(v))
}

// label returns a label name unique in the file.
var labels int

func label(name string) string {
	labels++
	return fmt.Sprintf("%s%d", name, labels)
}

// tailMask loads the mask of the first rem lanes (0 < rem < 8).
func tailMask(rem GPVirtual) VecVirtual {
	base, idx, mask := GP64(), GP64(), YMM()
	LEAQ(cMask, base)
	MOVQ(rem, idx)
	NEGQ(idx)
	VMOVDQU(Mem{Base: base, Index: idx, Scale: 4, Disp: 32}, mask)
	return mask
}

// hadd is VHADDPS: pairwise sums of a's lanes, then b's, in each half.
func hadd(a, b VecVirtual) VecVirtual {
	d := YMM()
	VHADDPS(b, a, d)
	return d
}

// reduce sums each accumulator's eight lanes in the canonical tree and
// returns the sums in lanes 0, 1, … of one register: an XMM register for up
// to four accumulators, a YMM register for five to eight.
func reduce(accs []VecVirtual) VecVirtual {
	pairs := func(v []VecVirtual) []VecVirtual {
		var out []VecVirtual
		for i := 0; i < len(v); i += 2 {
			b := v[i]
			if i+1 < len(v) {
				b = v[i+1]
			}
			out = append(out, hadd(v[i], b))
		}
		return out
	}
	l1 := pairs(accs)
	l2 := pairs(l1)
	if len(accs) <= 4 {
		hi, r := XMM(), XMM()
		VEXTRACTF128(U8(1), l2[0], hi)
		VADDPS(hi, l2[0].AsX(), r)
		return r
	}
	lo, hi, r := YMM(), YMM(), YMM()
	VPERM2F128(U8(0x20), l2[1], l2[0], lo)
	VPERM2F128(U8(0x31), l2[1], l2[0], hi)
	VADDPS(hi, lo, r)
	return r
}

// lane returns an XMM register whose lane i%4 is lane i of r.
func lane(r VecVirtual, i int) Register {
	if i < 4 {
		return r.AsX()
	}
	hi := XMM()
	VEXTRACTF128(U8(1), r, hi)
	return hi
}

// storeLane stores lane i of r (as lane returns it) to m.
func storeLane(x Register, i int, m Mem) {
	if i%4 == 0 {
		VMOVSS(x, m)
	} else {
		VEXTRACTPS(U8(i%4), x, m)
	}
}

func dotKernel() {
	TEXT("dotAVX2", NOSPLIT, "func(a, b *float32, n int) float32")
	Doc("dotAVX2 is dotGeneric of the n elements at a and b.")
	a, b, n := gpParam("a"), gpParam("b"), gpParam("n")
	acc := YMM()
	VXORPS(acc, acc, acc)
	chunks := GP64()
	MOVQ(n, chunks)
	SHRQ(U8(3), chunks)
	loop, tail, done := label("loop"), label("tail"), label("done")
	Label(loop)
	TESTQ(chunks, chunks)
	JZ(LabelRef(tail))
	t := YMM()
	VMOVUPS(Mem{Base: a}, t)
	VMULPS(Mem{Base: b}, t, t)
	VADDPS(t, acc, acc)
	ADDQ(U8(32), a)
	ADDQ(U8(32), b)
	DECQ(chunks)
	JMP(LabelRef(loop))
	Label(tail)
	ANDQ(U8(7), n)
	JZ(LabelRef(done))
	mask := tailMask(n)
	x, y := YMM(), YMM()
	VMASKMOVPS(Mem{Base: a}, mask, x)
	VMASKMOVPS(Mem{Base: b}, mask, y)
	VMULPS(y, x, x)
	VADDPS(x, acc, acc)
	Label(done)
	r := reduce([]VecVirtual{acc})
	VZEROUPPER()
	Store(r, ReturnIndex(0))
	RET()
}

// rowAddr addresses row i of rows stride bytes apart starting at base, with
// the registers newRowAddr sets up.
type rowAddr struct {
	base, base3     GPVirtual // row 0, row 3 (for more than five rows)
	stride, stride3 GPVirtual // one row, three rows
}

func newRowAddr(base, stride GPVirtual, rows int) rowAddr {
	a := rowAddr{base: base, stride: stride}
	if rows > 3 {
		a.stride3 = GP64()
		LEAQ(Mem{Base: stride, Index: stride, Scale: 2}, a.stride3)
	}
	if rows > 5 {
		a.base3 = GP64()
		LEAQ(Mem{Base: base, Index: a.stride3, Scale: 1}, a.base3)
	}
	return a
}

// at is the address of row i (i < 8) plus disp bytes.
func (a rowAddr) at(i, disp int) Mem {
	switch i {
	case 0:
		return Mem{Base: a.base, Disp: disp}
	case 1, 2, 4:
		return Mem{Base: a.base, Index: a.stride, Scale: uint8(i), Disp: disp}
	case 3:
		return Mem{Base: a.base, Index: a.stride3, Scale: 1, Disp: disp}
	case 5:
		return Mem{Base: a.base3, Index: a.stride, Scale: 2, Disp: disp}
	case 6:
		return Mem{Base: a.base, Index: a.stride3, Scale: 2, Disp: disp}
	case 7:
		return Mem{Base: a.base3, Index: a.stride, Scale: 4, Disp: disp}
	}
	panic("row out of range")
}

// advance moves row 0 (and row 3) on by d bytes.
func (a rowAddr) advance(d Op) {
	ADDQ(d, a.base)
	if a.base3 != nil {
		ADDQ(d, a.base3)
	}
}

func (a rowAddr) retreat(d Op) {
	SUBQ(d, a.base)
	if a.base3 != nil {
		SUBQ(d, a.base3)
	}
}

// matmulFits says whether a matmul kernel of format f fits in the sixteen
// YMM registers: its R·C accumulators, a scale per row of w if f is
// scaled, the chunks of the C rows of w it widens once for all R > 1 rows
// of x (one chunk at a time for R = 1), a chunk of x and a product.
func matmulFits(f format, R, C int) bool {
	scales, held := 0, 1
	if f.scaled {
		scales = C
	}
	if R > 1 {
		held = C
	}
	return R*C+scales+held+2 <= 16
}

// matmulKernel computes R rows of x against cols rows of w of format f, C
// rows of w at a time: out[r·outStride + c] = dot(x[r·xStride:], w_c) over
// n elements, where the rows w_c of w are whole blocks, one after another.
func matmulKernel(f format, R, C int) {
	name := fmt.Sprintf("matmul%sR%dC%d", f.name, R, C)
	elem := "byte"
	doc := []string{
		name + " sets out[r·outStride+c] = dotWGeneric(x[r·xStride:][:n], w[c·rowBytes:], " + f.name + ")",
		fmt.Sprintf("for r < %d and c < cols, %d rows of w at a time; cols is a multiple of %d, n of %d,", R, C, C, max(8, f.block)),
		"and rowBytes is the bytes of n elements.",
	}
	if f.name == "F32" {
		elem = "float32"
		doc = []string{
			name + " sets out[r·outStride+c] = dotGeneric(x[r·xStride:][:n], w[c·n:][:n])",
			fmt.Sprintf("for r < %d and c < cols, %d rows of w at a time; cols is a multiple of %d.", R, C, C),
		}
	}
	TEXT(name, NOSPLIT, "func(x *float32, xStride int, w *"+elem+", n int, cols int, out *float32, outStride int)")
	Doc(doc...)
	x, xs, w, n := gpParam("x"), gpParam("xStride"), gpParam("w"), gpParam("n")
	ws := GP64() // bytes per row of w
	MOVQ(n, ws)
	scaleBy(ws, f.bytes, f.block)
	tileKernel(R, C, f, x, xs, w, n, ws, nil)
}

// scaleBy sets r to r·num/den, for an r that is a multiple of den (a power
// of two) once the fraction is reduced.
func scaleBy(r GPVirtual, num, den int) {
	for num%2 == 0 && den%2 == 0 {
		num, den = num/2, den/2
	}
	if den > 1 {
		SHRQ(U8(bits.TrailingZeros(uint(den))), r)
	}
	switch {
	case num == 1:
	case num&(num-1) == 0:
		SHLQ(U8(bits.TrailingZeros(uint(num))), r)
	default:
		IMUL3Q(U32(num), r, r)
	}
}

// scoresKernel computes the attention scores of R query heads against cols
// rows of keys of type dt, C rows at a time: out[h·outStride + c] =
// dot(q[h·hd:][:hd], K_c)·scale, where K_c is hd elements at k[c·stride:],
// and hd is a multiple of 8.
func scoresKernel(dt format, R, C int) {
	name := fmt.Sprintf("scores%sR%dC%d", dt.name, R, C)
	TEXT(name, NOSPLIT, "func(q *float32, hdStride int, k *byte, nextK *byte, nextV *byte, stride int, hd int, cols int, out *float32, outStride int, scale float32)")
	Doc(name+" sets out[h·outStride+c] = dotKVGeneric(q[h·hdStride:][:hd], k[c·stride:])·scale",
		fmt.Sprintf("for h < %d and c < cols, %d rows of %s keys at a time; cols is a multiple of %d, hd of 8.", R, C, dt.name, C),
		"It prefetches the keys at nextK and the values at nextV as it reads the keys at k: those",
		"of the same rows of the page to be scored next, whose values are then read while in cache.")
	q, qs, k := gpParam("q"), gpParam("hdStride"), gpParam("k")
	n, ws := gpParam("hd"), gpParam("stride")
	sx := Load(Param("scale"), XMM())
	scale := YMM()
	VBROADCASTSS(sx, scale)
	tileKernel(R, C, dt, q, qs, k, n, ws, scale)
}

// tileKernel is the body of matmulKernel and scoresKernel: the dot
// products of n elements of R rows of x (xs elements apart) with C rows of
// w of format f (ws bytes apart) at a time, for the parameter cols rows of
// w in all, into the parameter out, multiplied by scale if it is not nil.
// The elements go block by block; a tail of n mod 8 elements of F32 is
// read masked.
func tileKernel(R, C int, f format, x, xs, w, n, ws GPVirtual, scale VecVirtual) {
	cols, out, os := gpParam("cols"), gpParam("out"), gpParam("outStride")
	SHLQ(U8(2), xs)
	SHLQ(U8(2), os)
	xa := newRowAddr(x, xs, R)
	wa := newRowAddr(w, ws, C)
	// A block of rows of x reads w once for each group of R rows: the
	// first reads it from memory, in a stream the hardware prefetchers
	// keep ahead of only when many streams run at once, as in the R = 1
	// kernels of F32. Prefetches keep matmulPrefetchTiles blocks of C rows
	// of w ahead of the ones computed on.
	// An R = 1 kernel of another format spends longer widening each line
	// than reading it, and the hardware alone keeps too few lines in
	// flight: it prefetches the next block of C rows at the offset it
	// reads in this one. Measured on 4096×4096 matrices streaming from
	// memory, Q8_0 went from 8.8 to 12 GB/s and F16 from 13.5 to 14.5
	// (F32's own rate); prefetching more blocks ahead, or 256 B to 2 KiB
	// ahead in the same rows, gained less or lost, and F32 gained nothing.
	// A scores kernel prefetches the keys and values of the next page's
	// rows at the offsets it reads in this one.
	var pw, pv rowAddr
	prefetch := R > 1 || scale != nil || f.name != "F32"
	if prefetch {
		pw = rowAddr{base: GP64(), stride: ws, stride3: wa.stride3}
		if scale != nil {
			Load(Param("nextK"), pw.base)
			pv = rowAddr{base: GP64(), stride: ws, stride3: wa.stride3}
			Load(Param("nextV"), pv.base)
		} else {
			ahead := matmulPrefetchTiles
			if R == 1 {
				ahead = 1
			}
			IMUL3Q(U32(ahead*C), ws, pw.base)
			ADDQ(w, pw.base)
		}
		for _, a := range []*rowAddr{&pw, &pv} {
			if a.base != nil && C > 5 {
				a.base3 = GP64()
				LEAQ(Mem{Base: a.base, Index: wa.stride3, Scale: 1}, a.base3)
			}
		}
	}
	// prefetchRows asks for the lines at the current offset of the rows
	// ahead, once per 64 bytes of x (every block of a quantized format,
	// whose 34 or 18 bytes then start in every line).
	prefetchRows := func(k GPVirtual) {
		skip := label("noprefetch")
		TESTQ(U32(63), k)
		JNZ(LabelRef(skip))
		for c := 0; c < C; c++ {
			PREFETCHT0(pw.at(c, 0))
			if pv.base != nil {
				PREFETCHT0(pv.at(c, 0))
			}
		}
		Label(skip)
	}
	xb := GP64() // bytes of a row of x, and of its whole blocks
	MOVQ(n, xb)
	SHLQ(U8(2), xb)
	fb := GP64()
	MOVQ(xb, fb)
	ANDQ(I32(-4*f.block), fb)
	var mask VecVirtual
	if f.tail {
		rem := GP64()
		MOVQ(n, rem)
		ANDQ(U8(7), rem)
		noMask := label("nomask")
		mask = YMM()
		VXORPS(mask, mask, mask)
		JZ(LabelRef(noMask))
		m := tailMask(rem)
		VMOVUPS(m, mask)
		Label(noMask)
	}

	outer, end := label("cols"), label("end")
	Label(outer)
	TESTQ(cols, cols)
	JZ(LabelRef(end))
	acc := make([]VecVirtual, R*C)
	for i := range acc {
		acc[i] = YMM()
		VXORPS(acc[i], acc[i], acc[i])
	}
	k := GP64() // bytes of x done
	XORQ(k, k)
	// body computes on a block, or on the masked tail.
	body := func(masked bool) {
		loadX := func(m Mem) VecVirtual {
			v := YMM()
			if masked {
				VMASKMOVPS(m, mask, v)
			} else {
				VMOVUPS(m, v)
			}
			return v
		}
		if prefetch && !masked {
			prefetchRows(k)
		}
		// A block's scale, widened once, multiplies each of its chunks:
		// exactly, so that each element is what the generic kernel
		// widens.
		var scales []VecVirtual
		if f.scaled {
			for c := 0; c < C; c++ {
				scales = append(scales, blockScale(wa.at(c, 0)))
			}
		}
		loadW := func(c, j int) VecVirtual {
			if masked {
				v := YMM()
				VMASKMOVPS(wa.at(c, 0), mask, v)
				return v
			}
			v := f.chunk(wa.at(c, 0), j)
			if f.scaled {
				VMULPS(scales[c], v, v)
			}
			return v
		}
		for j := range f.block / 8 {
			if R == 1 {
				xv := loadX(xa.at(0, 32*j))
				for c := 0; c < C; c++ {
					t := YMM()
					if !masked && f.name == "F32" {
						VMULPS(wa.at(c, 0), xv, t)
					} else {
						VMULPS(xv, loadW(c, j), t)
					}
					VADDPS(t, acc[c], acc[c])
				}
				continue
			}
			wv := make([]VecVirtual, C)
			for c := range wv {
				wv[c] = loadW(c, j)
			}
			for r := 0; r < R; r++ {
				xv := loadX(xa.at(r, 32*j))
				for c := 0; c < C; c++ {
					t := YMM()
					VMULPS(wv[c], xv, t)
					VADDPS(t, acc[r*C+c], acc[r*C+c])
				}
			}
		}
	}
	loop, tail, store := label("loop"), label("tail"), label("store")
	Label(loop)
	CMPQ(k, fb)
	JAE(LabelRef(tail))
	body(false)
	ADDQ(imm(4*f.block), k)
	xa.advance(imm(4 * f.block))
	wa.advance(imm(f.bytes))
	if prefetch {
		pw.advance(imm(f.bytes))
		if pv.base != nil {
			pv.advance(imm(f.bytes))
		}
	}
	JMP(LabelRef(loop))
	Label(tail)
	if mask != nil {
		CMPQ(k, xb)
		JAE(LabelRef(store))
		body(true)
	}
	Label(store)
	xa.retreat(k)
	scaleBy(k, f.bytes, 4*f.block) // the bytes of a row of w done
	wa.retreat(k)
	for _, a := range []rowAddr{pw, pv} {
		if a.base != nil {
			a.retreat(k)
			LEAQ(Mem{Base: a.base, Index: ws, Scale: uint8(C)}, a.base)
			if a.base3 != nil {
				LEAQ(Mem{Base: a.base, Index: wa.stride3, Scale: 1}, a.base3)
			}
		}
	}
	r := reduce(acc)
	if scale != nil {
		if len(acc) <= 4 {
			VMULPS(scale.AsX(), r, r)
		} else {
			VMULPS(scale, r, r)
		}
	}
	p := GP64()
	MOVQ(out, p)
	for row := 0; row < R; row++ {
		if row > 0 {
			ADDQ(os, p)
		}
		first := row * C
		switch {
		case C == 8:
			VMOVUPS(r, Mem{Base: p})
		case C == 4:
			VMOVUPS(lane(r, first), Mem{Base: p})
		case C == 2 && first%4 == 0:
			VMOVLPS(lane(r, first), Mem{Base: p})
		case C == 2:
			VMOVHPS(lane(r, first), Mem{Base: p})
		default:
			storeLane(lane(r, first), first, Mem{Base: p})
		}
	}
	// Next C rows of w, C outputs on.
	LEAQ(Mem{Base: w, Index: ws, Scale: uint8(C)}, w)
	if wa.base3 != nil {
		LEAQ(Mem{Base: w, Index: wa.stride3, Scale: 1}, wa.base3)
	}
	ADDQ(U32(4*C), out)
	SUBQ(U32(C), cols)
	JMP(LabelRef(outer))
	Label(end)
	VZEROUPPER()
	RET()
}

// blockScale is the F16 scale at m, the start of a block, widened and
// repeated in every lane.
func blockScale(m Mem) VecVirtual {
	h, s := XMM(), YMM()
	VCVTPH2PS(m, h) // the scale and the block's first bytes, in four lanes
	VBROADCASTSS(h, s)
	return s
}

// f16ToF32 reads eight F16 at m, widened to float32 exactly as engine's
// f16ToF32 does, a NaN's payload kept as it is.
func f16ToF32(m Mem, _ int) VecVirtual {
	v, h, em, sgn := YMM(), YMM(), YMM(), YMM()
	VPMOVZXWD(m, h)
	VPAND(cAbs7FFF, h, em)
	VPXOR(em, h, sgn)
	VPSLLD(U8(16), sgn, sgn)
	VPSLLD(U8(13), em, v)
	VPADDD(cF16Bias, v, v) // a normal number's bits
	VPCMPGTD(cF16InfNaN, em, h)
	VPAND(cF16Bias, h, h)
	VPADDD(h, v, v)       // exponent 31 goes to 255
	VCVTDQ2PS(em, h)      // a subnormal's value: its mantissa …
	VMULPS(cF16Sub, h, h) // … times 2^-24, exactly
	VPCMPGTD(cF16Min, em, em)
	VBLENDVPS(em, v, h, v) // normal (or more) where em > 0x3ff, else subnormal
	VPOR(sgn, v, v)
	return v
}

// matmulPrefetchTiles is how many blocks of rows of w ahead a matmul
// kernel of more than one row of x prefetches.
const matmulPrefetchTiles = 8

// accumVFits says whether the accumulators, the loaded rows and the
// temporaries of an accumV kernel fit in the YMM registers.
func accumVFits(dt format, H, D int) bool {
	temps := 2 // the broadcast weight and a product
	if dt.name == "F16" {
		temps += 3
	}
	return H*D <= 8 && H*D+D+temps <= 16
}

// accumVKernel: out[h·hd + d] += w[h·wStride + r] · V_r[d] for r = 0, 1, …,
// n-1 in order, for the H heads at out and the n rows of values at v, stride
// bytes apart; hd is a multiple of 8·D. Each output lane is one chain of
// additions in row order, as in the generic code; D chunks of eight lanes
// at a time keep H·D chains in flight.
func accumVKernel(dt format, H, D int) {
	name := fmt.Sprintf("accumV%sH%dD%d", dt.name, H, D)
	TEXT(name, NOSPLIT, "func(out *float32, hd int, w *float32, wStride int, v *byte, stride int, n int)")
	Doc(name+" adds w[h·wStride+r]·V_r to out[h·hd:][:hd] for the rows r < n of "+dt.name+" values",
		fmt.Sprintf("in order, for the %d heads h; hd is a multiple of %d.", H, 8*D))
	out, hd := gpParam("out"), gpParam("hd")
	w, ws := gpParam("w"), gpParam("wStride")
	v, stride, n := gpParam("v"), gpParam("stride"), gpParam("n")
	SHLQ(U8(2), ws)
	SHLQ(U8(2), hd) // bytes of one head's output
	wh := make([]GPVirtual, H)
	for h := range wh {
		wh[h] = GP64()
		if h == 0 {
			MOVQ(w, wh[h])
		} else {
			LEAQ(Mem{Base: wh[h-1], Index: ws, Scale: 1}, wh[h])
		}
	}
	dq := GP64() // byte offset of the chunk in a head's output
	XORQ(dq, dq)
	groups, done := label("groups"), label("done")
	Label(groups)
	CMPQ(dq, hd)
	JAE(LabelRef(done))
	acc := make([]VecVirtual, H*D)
	p := GP64()
	MOVQ(out, p)
	for h := 0; h < H; h++ {
		if h > 0 {
			ADDQ(hd, p)
		}
		for d := 0; d < D; d++ {
			acc[h*D+d] = YMM()
			VMOVUPS(Mem{Base: p, Index: dq, Scale: 1, Disp: 32 * d}, acc[h*D+d])
		}
	}
	vp := GP64()
	MOVQ(dq, vp)
	scaleBy(vp, dt.bytes, 32) // 32 bytes of output, one chunk of values
	ADDQ(v, vp)
	cnt := GP64()
	MOVQ(n, cnt)
	rows, rowsDone := label("rows"), label("rowsdone")
	Label(rows)
	TESTQ(cnt, cnt)
	JZ(LabelRef(rowsDone))
	vv := make([]VecVirtual, D)
	for d := range vv {
		vv[d] = dt.chunk(Mem{Base: vp, Disp: dt.bytes * d}, 0)
	}
	for h := 0; h < H; h++ {
		b := YMM()
		VBROADCASTSS(Mem{Base: wh[h]}, b)
		for d := 0; d < D; d++ {
			t := YMM()
			VMULPS(vv[d], b, t)
			VADDPS(t, acc[h*D+d], acc[h*D+d])
		}
		ADDQ(U8(4), wh[h])
	}
	ADDQ(stride, vp)
	DECQ(cnt)
	JMP(LabelRef(rows))
	Label(rowsDone)
	MOVQ(out, p)
	for h := 0; h < H; h++ {
		if h > 0 {
			ADDQ(hd, p)
		}
		for d := 0; d < D; d++ {
			VMOVUPS(acc[h*D+d], Mem{Base: p, Index: dq, Scale: 1, Disp: 32 * d})
		}
	}
	// Back to row 0 of the weights for the next chunks.
	MOVQ(n, cnt)
	SHLQ(U8(2), cnt)
	for h := range wh {
		SUBQ(cnt, wh[h])
	}
	ADDQ(U32(32*D), dq)
	JMP(LabelRef(groups))
	Label(done)
	VZEROUPPER()
	RET()
}

func prefetchKernel() {
	TEXT("prefetchAVX2", NOSPLIT, "func(p *byte, stride int, n int, bytes int)")
	Doc("prefetchAVX2 asks for the cache lines of n rows of bytes ≥ 1 bytes at p, stride bytes apart.")
	p, stride, n, bytes := gpParam("p"), gpParam("stride"), gpParam("n"), gpParam("bytes")
	DECQ(bytes) // the offset of a row's last byte
	rows, done := label("rows"), label("done")
	Label(rows)
	TESTQ(n, n)
	JZ(LabelRef(done))
	off := GP64()
	XORQ(off, off)
	lines, linesDone := label("lines"), label("linesdone")
	Label(lines)
	CMPQ(off, bytes)
	JAE(LabelRef(linesDone))
	PREFETCHT0(Mem{Base: p, Index: off, Scale: 1})
	ADDQ(U8(64), off)
	JMP(LabelRef(lines))
	Label(linesDone)
	PREFETCHT0(Mem{Base: p, Index: bytes, Scale: 1})
	ADDQ(stride, p)
	DECQ(n)
	JMP(LabelRef(rows))
	Label(done)
	RET()
}

// elementwise emits a loop over the n float32 elements at the pointers
// ptrs, eight at a time, then a masked tail: body gets the byte offset of
// the chunk and, in the tail, the mask (nil in whole chunks).
func elementwise(n GPVirtual, body func(off GPVirtual, mask VecVirtual)) {
	off, fb := GP64(), GP64()
	XORQ(off, off)
	MOVQ(n, fb)
	SHLQ(U8(2), fb)
	ANDQ(I8(-32), fb)
	loop, tail, done := label("loop"), label("tail"), label("done")
	Label(loop)
	CMPQ(off, fb)
	JAE(LabelRef(tail))
	body(off, nil)
	ADDQ(U8(32), off)
	JMP(LabelRef(loop))
	Label(tail)
	ANDQ(U8(7), n)
	JZ(LabelRef(done))
	body(off, tailMask(n))
	Label(done)
}

// loadF32 loads eight float32 at m, or the lanes of mask (zeros elsewhere).
func loadF32(m Mem, mask VecVirtual) VecVirtual {
	v := YMM()
	if mask == nil {
		VMOVUPS(m, v)
	} else {
		VMASKMOVPS(m, mask, v)
	}
	return v
}

func storeF32(v VecVirtual, m Mem, mask VecVirtual) {
	if mask == nil {
		VMOVUPS(v, m)
	} else {
		VMASKMOVPS(v, mask, m)
	}
}

// maxPair is the larger of a and b lane by lane as Go's max has it for
// numbers: VMAXPS returns its second operand when both are zeros, so the
// AND of both orders makes max(-0, +0) +0 either way.
func maxPair(a, b VecVirtual) VecVirtual {
	m1, m2 := YMM(), YMM()
	VMAXPS(b, a, m1)
	VMAXPS(a, b, m2)
	VANDPS(m2, m1, m1)
	return m1
}

func maxKernel() {
	TEXT("maxAVX2", NOSPLIT, "func(x *float32, n int) float32")
	Doc("maxAVX2 is the largest of the n ≥ 1 elements at x, as Go's max gives it; NaN if any is NaN.")
	x, n := gpParam("x"), gpParam("n")
	m, nan := YMM(), YMM()
	VMOVUPS(cNegInf, m)
	VXORPS(nan, nan, nan)
	elementwise(n, func(off GPVirtual, mask VecVirtual) {
		v := loadF32(Mem{Base: x, Index: off, Scale: 1}, mask)
		if mask != nil {
			ni := YMM()
			VMOVUPS(cNegInf, ni)
			VBLENDVPS(mask, v, ni, v) // lanes past the end are -Inf
		}
		u := YMM()
		VCMPPS(U8(3), v, v, u)
		VORPS(u, nan, nan)
		VMOVUPS(maxPair(m, v), m)
	})
	hi := YMM()
	VPERM2F128(U8(0x11), m, m, hi)
	m4 := maxPair(m, hi)
	s := YMM()
	VPERMILPS(U8(0x4e), m4, s)
	m2 := maxPair(m4, s)
	VPERMILPS(U8(0xb1), m2, s)
	m1 := maxPair(m2, s)
	bits := GP32()
	VMOVMSKPS(nan, bits)
	isNum := label("num")
	TESTL(bits, bits)
	JZ(LabelRef(isNum))
	VMOVUPS(cInf, m1) // an infinity minus itself is NaN
	VSUBPS(m1, m1, m1)
	Label(isNum)
	VZEROUPPER()
	Store(m1.AsX(), ReturnIndex(0))
	RET()
}

// exp32x8 is exp32 of each lane of x.
func exp32x8(x VecVirtual) VecVirtual {
	// The two halves' float64 lanes go step by step side by side, so that
	// the out-of-order core has two chains of Horner steps to overlap.
	var xd, t, kd, r, p [2]VecVirtual
	for h := range 2 {
		xs := x.AsX()
		if h == 1 {
			xs = XMM()
			VEXTRACTF128(U8(1), x, xs)
		}
		xd[h], t[h], kd[h], r[h], p[h] = YMM(), YMM(), YMM(), YMM(), YMM()
		VCVTPS2PD(xs, xd[h])
	}
	for h := range 2 {
		VMULPD(cLog2e, xd[h], t[h])
	}
	for h := range 2 {
		VADDPD(cHalf, t[h], t[h])
		VROUNDPD(U8(9), t[h], kd[h]) // floor
	}
	for h := range 2 {
		VMULPD(cLn2Hi, kd[h], t[h])
		VSUBPD(t[h], xd[h], r[h])
	}
	for h := range 2 {
		VMULPD(cLn2Lo, kd[h], t[h])
		VSUBPD(t[h], r[h], r[h])
		VMOVUPD(cP11, p[h])
	}
	for _, c := range cTaylor {
		for h := range 2 {
			VMULPD(r[h], p[h], p[h])
		}
		for h := range 2 {
			VADDPD(c, p[h], p[h])
		}
	}
	res := YMM()
	for h := range 2 {
		ki, e := XMM(), YMM()
		VCVTTPD2DQY(kd[h], ki)
		VPMOVSXDQ(ki, e)
		VPADDQ(c1023, e, e)
		VPSLLQ(U8(52), e, e) // 2^k, exactly: k is in [-151, 129] here
		VMULPD(e, p[h], p[h])
		if h == 0 {
			VCVTPD2PSY(p[h], res.AsX())
		} else {
			f := XMM()
			VCVTPD2PSY(p[h], f)
			VINSERTF128(U8(1), f, res, res)
		}
	}
	m := YMM()
	VCMPPS(U8(0x1e), c89, x, m) // x > 89
	VBLENDVPS(m, cInf, res, res)
	VCMPPS(U8(0x11), cNeg104, x, m) // x < -104
	VANDNPS(res, m, res)
	VCMPPS(U8(3), x, x, m) // NaN
	VBLENDVPS(m, x, res, res)
	return res
}

func expSubSumKernel() {
	TEXT("expSubSumAVX2", NOSPLIT, "func(x *float32, n int, mx float32) float32")
	Doc("expSubSumAVX2 is expSubSumGeneric of the n elements at x.")
	x, n := gpParam("x"), gpParam("n")
	mxs := Load(Param("mx"), XMM())
	mx, acc := YMM(), YMM()
	VBROADCASTSS(mxs, mx)
	VXORPS(acc, acc, acc)
	elementwise(n, func(off GPVirtual, mask VecVirtual) {
		m := Mem{Base: x, Index: off, Scale: 1}
		v := loadF32(m, mask)
		VSUBPS(mx, v, v)
		e := exp32x8(v)
		storeF32(e, m, mask)
		if mask != nil {
			VANDPS(mask, e, e)
		}
		VADDPS(e, acc, acc)
	})
	r := reduce([]VecVirtual{acc})
	VZEROUPPER()
	Store(r, ReturnIndex(0))
	RET()
}

func scaleKernel() {
	TEXT("scaleAVX2", NOSPLIT, "func(x *float32, n int, s float32)")
	Doc("scaleAVX2 multiplies the n elements at x by s.")
	x, n := gpParam("x"), gpParam("n")
	ss := Load(Param("s"), XMM())
	s := YMM()
	VBROADCASTSS(ss, s)
	elementwise(n, func(off GPVirtual, mask VecVirtual) {
		m := Mem{Base: x, Index: off, Scale: 1}
		v := loadF32(m, mask)
		VMULPS(s, v, v)
		storeF32(v, m, mask)
	})
	VZEROUPPER()
	RET()
}

func mulScaleKernel() {
	TEXT("mulScaleAVX2", NOSPLIT, "func(out, x, w *float32, n int, s float32)")
	Doc("mulScaleAVX2 sets out[i] = x[i]·s·w[i] for the n elements.")
	out, x, w := gpParam("out"), gpParam("x"), gpParam("w")
	n := gpParam("n")
	ss := Load(Param("s"), XMM())
	s := YMM()
	VBROADCASTSS(ss, s)
	elementwise(n, func(off GPVirtual, mask VecVirtual) {
		v := loadF32(Mem{Base: x, Index: off, Scale: 1}, mask)
		VMULPS(s, v, v)
		VMULPS(loadF32(Mem{Base: w, Index: off, Scale: 1}, mask), v, v)
		storeF32(v, Mem{Base: out, Index: off, Scale: 1}, mask)
	})
	VZEROUPPER()
	RET()
}

func addKernel() {
	TEXT("addAVX2", NOSPLIT, "func(x, d *float32, n int)")
	Doc("addAVX2 adds the n elements at d to those at x.")
	x, d, n := gpParam("x"), gpParam("d"), gpParam("n")
	elementwise(n, func(off GPVirtual, mask VecVirtual) {
		m := Mem{Base: x, Index: off, Scale: 1}
		v := loadF32(m, mask)
		VADDPS(loadF32(Mem{Base: d, Index: off, Scale: 1}, mask), v, v)
		storeF32(v, m, mask)
	})
	VZEROUPPER()
	RET()
}

func swiGLUKernel() {
	TEXT("swiGLUAVX2", NOSPLIT, "func(gate, up *float32, n int)")
	Doc("swiGLUAVX2 sets gate[i] = gate[i] / (1 + exp32(-gate[i])) · up[i] for the n elements.")
	gate, up, n := gpParam("gate"), gpParam("up"), gpParam("n")
	elementwise(n, func(off GPVirtual, mask VecVirtual) {
		m := Mem{Base: gate, Index: off, Scale: 1}
		g := loadF32(m, mask)
		ng := YMM()
		VXORPS(cSign, g, ng)
		e := exp32x8(ng)
		VADDPS(cOne, e, e)
		VDIVPS(e, g, g)
		VMULPS(loadF32(Mem{Base: up, Index: off, Scale: 1}, mask), g, g)
		storeF32(g, m, mask)
	})
	VZEROUPPER()
	RET()
}
