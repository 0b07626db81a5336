package engine

import (
	"encoding/binary"
	"fmt"
	"math"
)

// WeightType is how a weight matrix stores its elements: float32, one of
// the 16-bit floats, or one of ggml's block quantizations. The values are
// ggml's type numbers, which GGUF files carry.
//
// Every type the engine computes with widens exactly to float32: a
// half-precision float has 11 significant bits, a block's scale is such a
// float and its quants integers of at most 8 bits, so scale × quant fits a
// float32's 24 bits with nothing rounded. A matrix of any type therefore
// computes exactly what the float32 matrix of its widened elements
// computes, in the kernels' one summation order; the type changes the
// bytes read per step, never the arithmetic's order.
type WeightType uint32

// The weight types the engine computes with.
const (
	WeightF32  WeightType = 0
	WeightF16  WeightType = 1
	WeightQ4_0 WeightType = 2
	WeightQ8_0 WeightType = 8
	WeightBF16 WeightType = 30
)

// quantBlock is the elements of one block of Q8_0 and Q4_0: a row of
// either is whole blocks of this many elements.
const quantBlock = 32

// weightTypes describes each type the engine computes with: its name as
// GGUF and llama.cpp print it, and the bytes of a block of elements.
var weightTypes = map[WeightType]struct {
	name               string
	blockElems, blockB int
}{
	WeightF32: {"F32", 1, 4}, WeightF16: {"F16", 1, 2}, WeightBF16: {"BF16", 1, 2},
	WeightQ8_0: {"Q8_0", quantBlock, 2 + quantBlock}, WeightQ4_0: {"Q4_0", quantBlock, 2 + quantBlock/2},
}

// String is the type's name, or its number when the engine does not know
// it.
func (t WeightType) String() string {
	if d, ok := weightTypes[t]; ok {
		return d.name
	}
	return fmt.Sprintf("type %d", uint32(t))
}

// Known says the engine computes with t.
func (t WeightType) Known() bool { _, ok := weightTypes[t]; return ok }

// RowBytes is the bytes of a row of cols elements of t; ok is false when t
// is unknown or cols is not whole blocks of t.
func (t WeightType) RowBytes(cols int) (n int, ok bool) {
	d, known := weightTypes[t]
	if !known || cols < 0 || cols%d.blockElems != 0 {
		return 0, false
	}
	return cols / d.blockElems * d.blockB, true
}

// Matrix is a weight matrix of Rows rows of Cols elements, row-major with
// one row per output ([out][in], y = W·x). A float32 matrix holds its
// elements in F32; any other type holds its rows' bytes, little-endian as
// GGUF stores them, in Raw. A Matrix is immutable once a model holds it.
type Matrix struct {
	Type       WeightType
	Rows, Cols int
	F32        []float32 // Type WeightF32: Rows × Cols
	Raw        []byte    // other types: Rows × Type.RowBytes(Cols)
}

// F32Matrix is the float32 matrix of rows × cols elements v.
func F32Matrix(rows, cols int, v []float32) Matrix {
	return Matrix{Type: WeightF32, Rows: rows, Cols: cols, F32: v}
}

// Bytes is the bytes a step reads to multiply by m.
func (m *Matrix) Bytes() int64 {
	if m.Type == WeightF32 {
		return 4 * int64(len(m.F32))
	}
	return int64(len(m.Raw))
}

// rowBytes is the bytes of one row of m's type; m must have been checked.
func (m *Matrix) rowBytes() int {
	n, _ := m.Type.RowBytes(m.Cols)
	return n
}

// check reports a shape that is not rows × cols, data that is not the
// shape's size, and the first element that widens to NaN or an infinity.
func (m *Matrix) check(name string, rows, cols int) error {
	rb, ok := m.Type.RowBytes(cols)
	switch {
	case !ok:
		return fmt.Errorf("engine: %s is %s with rows of %d elements: the engine computes F32, F16, BF16, and Q8_0 and Q4_0 rows of whole %d-element blocks",
			name, m.Type, cols, quantBlock)
	case m.Rows != rows || m.Cols != cols:
		return fmt.Errorf("engine: %s is %d×%d, the model's %d×%d", name, m.Rows, m.Cols, rows, cols)
	case m.Type == WeightF32 && len(m.F32) != rows*cols:
		return fmt.Errorf("engine: %s has %d weights, the model %d", name, len(m.F32), rows*cols)
	case m.Type != WeightF32 && len(m.Raw) != rows*rb:
		return fmt.Errorf("engine: %s has %d bytes of %s, the model %d", name, len(m.Raw), m.Type, rows*rb)
	}
	if m.Type == WeightF32 {
		return checkFinite(name, m.F32)
	}
	// An element is finite when its half-precision float is: the element
	// of F16 and BF16, the block's scale of Q8_0 and Q4_0 (times a small
	// integer). The exponent's bits, all ones, mark the others.
	le := binary.LittleEndian
	step, elems, mask := 2, 1, uint16(0x7c00)
	switch m.Type {
	case WeightBF16:
		mask = 0x7f80
	case WeightQ8_0, WeightQ4_0:
		d := weightTypes[m.Type]
		step, elems = d.blockB, d.blockElems
	}
	for i := 0; i < len(m.Raw); i += step {
		if h := le.Uint16(m.Raw[i:]); h&mask == mask {
			at := i / step * elems
			var v [1]float32
			widen(v[:], m.Raw[at/m.Cols*rb:], m.Type, at%m.Cols)
			return &WeightError{Array: name, Index: at, Value: v[0]}
		}
	}
	return nil
}

// checkFinite reports the first weight of v that is NaN or infinite: its
// exponent bits all ones. A weight at a time, by its bits, as fast as the
// weights stream in (a model's load checks gigabytes).
func checkFinite(name string, v []float32) error {
	for j, f := range v {
		if math.Float32bits(f)&0x7f800000 == 0x7f800000 {
			return &WeightError{Array: name, Index: j, Value: f}
		}
	}
	return nil
}

// row widens row r of m into dst (Cols elements).
func (m *Matrix) row(r int, dst []float32) {
	if m.Type == WeightF32 {
		copy(dst[:m.Cols], m.F32[r*m.Cols:(r+1)*m.Cols])
		return
	}
	rb := m.rowBytes()
	widen(dst[:m.Cols], m.Raw[r*rb:(r+1)*rb], m.Type, 0)
}

// widen sets dst to the elements i0, i0+1, … of the row w of type t (not
// F32). A chunk the kernels widen starts at a multiple of 8, so it never
// straddles two blocks.
func widen(dst []float32, w []byte, t WeightType, i0 int) {
	le := binary.LittleEndian
	switch t {
	case WeightF16:
		for k := range dst {
			dst[k] = f16Widened[le.Uint16(w[2*(i0+k):])]
		}
	case WeightBF16:
		for k := range dst {
			dst[k] = math.Float32frombits(uint32(le.Uint16(w[2*(i0+k):])) << 16)
		}
	case WeightQ8_0:
		for k := range dst {
			i := i0 + k
			b := w[i/quantBlock*(2+quantBlock):]
			dst[k] = f16Widened[le.Uint16(b)] * float32(int8(b[2+i%quantBlock]))
		}
	case WeightQ4_0:
		for k := range dst {
			i := i0 + k
			b := w[i/quantBlock*(2+quantBlock/2):]
			o := i % quantBlock
			q := b[2+o%(quantBlock/2)]
			if o >= quantBlock/2 {
				q >>= 4
			}
			dst[k] = f16Widened[le.Uint16(b)] * float32(int(q&0xF)-8)
		}
	default:
		panic(fmt.Sprintf("engine: weights of %s cannot widen", t))
	}
}

// f16Widened is every half-precision float widened (f16ToF32), so that
// widening one is a load.
var f16Widened = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for h := range t {
		t[h] = f16ToF32(uint16(h))
	}
	return &t
}()

// dotWGeneric is dotGeneric of x and the len(x) elements of the row w of
// type t, widened eight at a time: the widened elements are exact, so it
// equals dotGeneric(x, widened row) bit for bit.
func dotWGeneric(x []float32, w []byte, t WeightType) float32 {
	var s [8]float32
	for i := 0; i < len(x); i += 8 {
		var xc, wc [8]float32
		m := copy(xc[:], x[i:])
		widen(wc[:m], w, t, i)
		acc8(&s, xc[:], wc[:])
	}
	return sum8(&s)
}

// matmulWGeneric is matmulGeneric for a matrix w of type t (not F32) whose
// rows are rb bytes: out[r·outs+j] = dot(x[r], w[j]) for every row r of x
// (in wide) and the rows j0 ≤ j < j1 of w.
func matmulWGeneric(out, x []float32, w []byte, t WeightType, rb, in, outs, j0, j1 int) {
	rows := len(x) / in
	for j := j0; j < j1; j++ {
		wj := w[j*rb : (j+1)*rb]
		for r := range rows {
			out[r*outs+j] = dotWGeneric(x[r*in:(r+1)*in], wj, t)
		}
	}
}

// matmulM multiplies by the rows j0 ≤ j < j1 of m with the kernels ks:
// out[r·Rows+j] = dot(x[r], m[j]).
func (ks *kernelSet) matmulM(out, x []float32, m *Matrix, j0, j1 int) {
	if m.Type == WeightF32 {
		ks.matmul(out, x, m.F32, m.Cols, m.Rows, j0, j1)
		return
	}
	ks.matmulW(out, x, m.Raw, m.Type, m.rowBytes(), m.Cols, m.Rows, j0, j1)
}
