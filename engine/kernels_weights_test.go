package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"
)

// The weight kernels must compute the generic kernel's bits for every
// weight type, shape and column range, and the generic kernel those of
// the float32 product of the widened matrix.

// kernelWeightTypes are the weight types besides F32.
var kernelWeightTypes = []WeightType{WeightF16, WeightBF16, WeightQ8_0, WeightQ4_0}

// randomHalf is the bits of a finite F16 of any sign and magnitude, with
// zeros, subnormals and the largest magnitude now and then.
func randomHalf(r uint64) uint16 {
	sign := uint16(r>>63) << 15
	switch r % 17 {
	case 0:
		return sign // ±0
	case 1:
		return sign | uint16(r>>20)&0x3ff // subnormal (or zero)
	case 2:
		return sign | 0x7bff // 65504
	}
	h := uint16(r >> 24)
	if h&0x7c00 == 0x7c00 {
		h &^= 0x4000 // an infinity or NaN's exponent to a finite one
	}
	return h
}

// randomBF16 is the bits of a BF16 of any sign, with zeros and subnormals
// now and then, at most 2^100 in magnitude so that no sum overflows.
func randomBF16(r uint64) uint16 {
	sign := uint16(r>>63) << 15
	switch r % 17 {
	case 0:
		return sign
	case 1:
		return sign | uint16(r>>20)&0x7f
	}
	exp := uint16(r>>8) % (127 + 101)
	return sign | exp<<7 | uint16(r>>24)&0x7f
}

// randomWeights is rows rows of cols random elements of t: F16 and BF16
// from randomHalf and randomBF16; Q8_0 and Q4_0 blocks with randomHalf
// scales and random quants, every fifth block's at the extremes (-128 and
// 127, nibbles 0 and 15).
func randomWeights(t WeightType, rows, cols int, seed uint64) []byte {
	rb, ok := t.RowBytes(cols)
	if !ok {
		panic(fmt.Sprintf("no rows of %d %s", cols, t))
	}
	b := make([]byte, rows*rb)
	rng := splitMix64(seed)
	le := binary.LittleEndian
	switch t {
	case WeightF16, WeightBF16:
		half := randomHalf
		if t == WeightBF16 {
			half = randomBF16
		}
		for i := 0; i < len(b); i += 2 {
			le.PutUint16(b[i:], half(rng.next()))
		}
	case WeightQ8_0, WeightQ4_0:
		d := weightTypes[t]
		for at := 0; at < len(b); at += d.blockB {
			le.PutUint16(b[at:], randomHalf(rng.next()))
			extreme := rng.next()%5 == 0
			for i := at + 2; i < at+d.blockB; i++ {
				r := rng.next()
				b[i] = byte(r)
				if extreme {
					b[i] = []byte{0x80, 0x7f, 0x0f, 0xf0}[r%4]
				}
			}
		}
	}
	return b
}

// widenMatrix is m's elements widened to float32.
func widenMatrix(m *Matrix) []float32 {
	w := make([]float32, m.Rows*m.Cols)
	for r := range m.Rows {
		m.row(r, w[r*m.Cols:(r+1)*m.Cols])
	}
	return w
}

// kernelWeightIns are the row widths of the tests: whole blocks of 32, for
// every type, and for F16 and BF16 widths of whole chunks of 8 and of a
// part chunk, which the generic kernel computes.
func kernelWeightIns(t WeightType) []int {
	ins := []int{32, 64, 96, 160, 352, 992}
	if t == WeightF16 || t == WeightBF16 {
		ins = append(ins, 8, 40, 1000, 3, 33, 999)
	}
	return ins
}

// checkBits fails unless got and want are the same float32s, bit for bit.
func checkBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d is %g (%08x), want %g (%08x)",
				what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// checkMatmulW compares, for the rows [j0, j1) of m and every row of x,
// matmulWGeneric with the float32 product of the widened matrix wide
// (matmulGeneric), and with each fast set's matmulW and matmul of wide;
// the outputs outside the range must stay untouched.
func checkMatmulW(t *testing.T, what string, m *Matrix, wide, x []float32, j0, j1 int) {
	t.Helper()
	rows := len(x) / m.Cols
	fresh := func() []float32 {
		out := make([]float32, rows*m.Rows)
		for i := range out {
			out[i] = float32(i) // outside the range: untouched
		}
		return out
	}
	want, got := fresh(), fresh()
	matmulWGeneric(want, x, m.Raw, m.Type, m.rowBytes(), m.Cols, m.Rows, j0, j1)
	matmulGeneric(got, x, wide, m.Cols, m.Rows, j0, j1)
	checkBits(t, what+", float32 product of the widened matrix", got, want)
	for _, ks := range fastKernels {
		got = fresh()
		ks.matmulW(got, x, m.Raw, m.Type, m.rowBytes(), m.Cols, m.Rows, j0, j1)
		checkBits(t, what+", "+ks.name+" kernel", got, want)
		got = fresh()
		ks.matmul(got, x, wide, m.Cols, m.Rows, j0, j1)
		checkBits(t, what+", "+ks.name+" float32 kernel on the widened matrix", got, want)
	}
}

// TestKernelMatmulWeights covers every block shape of every type: 1 to 9
// rows of x, output widths that leave every remainder of the column
// blocks, misaligned rows, and column ranges that start and end inside
// blocks, or are empty.
func TestKernelMatmulWeights(t *testing.T) {
	for _, wt := range kernelWeightTypes {
		t.Run(wt.String(), func(t *testing.T) {
			for _, in := range kernelWeightIns(wt) {
				for _, outs := range []int{1, 2, 3, 5, 8, 11, 17, 19, 36} {
					raw := randomWeights(wt, outs, in, uint64(in*outs))
					off := outs % 7 // the rows start at every byte alignment
					m := Matrix{Type: wt, Rows: outs, Cols: in, Raw: append(make([]byte, off), raw...)[off:]}
					wide := widenMatrix(&m)
					for rows := 1; rows <= 9; rows++ {
						x := misaligned(randomFloats(rows*in, uint64(in+rows)), rows%8)
						for _, r := range [][2]int{{0, outs}, {outs / 3, outs}, {1, max(1, outs-2)}, {outs / 2, outs / 2}} {
							checkMatmulW(t, fmt.Sprintf("%d×%d by %d×%d %s, columns %v", rows, in, outs, in, wt, r), &m, wide, x, r[0], r[1])
						}
					}
				}
			}
		})
	}
}

// TestKernelMatmulWeightsLarge is a prefill-sized product, large enough for
// the blocks of rows of x and of w.
func TestKernelMatmulWeightsLarge(t *testing.T) {
	for _, wt := range kernelWeightTypes {
		for _, in := range []int{256, 768} {
			rows, outs := 37, 300
			m := Matrix{Type: wt, Rows: outs, Cols: in, Raw: randomWeights(wt, outs, in, 3)}
			x := randomFloats(rows*in, 4)
			checkMatmulW(t, fmt.Sprintf("%d×%d by %d×%d %s", rows, in, outs, in, wt), &m, widenMatrix(&m), x, 0, outs)
		}
	}
}

// TestKernelMatmulWeightsBounds: a product the slices do not hold panics
// with the shapes, in the fast kernels as in Go code, before reading.
func TestKernelMatmulWeightsBounds(t *testing.T) {
	withFastKernels(t, func(t *testing.T, ks *kernelSet) {
		for _, wt := range kernelWeightTypes {
			const in, outs, rows = 64, 12, 3
			rb, _ := wt.RowBytes(in)
			w, x, out := randomWeights(wt, outs, in, 5), randomFloats(rows*in, 6), make([]float32, rows*outs)
			for _, c := range []struct {
				name   string
				w      []byte
				x, out []float32
				j0, j1 int
			}{
				{"w a byte short", w[:len(w)-1], x, out, 0, outs},
				{"w a row short", w[:len(w)-rb], x, out, 0, outs},
				{"x a part row", w, x[:len(x)-1], out, 0, outs},
				{"out an element short", w, x, out[:len(out)-1], 0, outs},
				{"columns past the rows", w, x, out, 0, outs + 1},
				{"columns before 0", w, x, out, -1, outs},
			} {
				func() {
					defer func() {
						msg, _ := recover().(string)
						if !strings.HasPrefix(msg, "engine: matmul of") {
							t.Errorf("%s %s: panic %q, want one with the shapes", wt, c.name, msg)
						}
					}()
					ks.matmulW(c.out, c.x, c.w, wt, rb, in, outs, c.j0, c.j1)
				}()
			}
		}
	})
}
