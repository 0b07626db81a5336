package engine

import (
	"encoding/binary"
	"math"
	"slices"
)

// ggufBuild writes GGUF files for tests and benchmarks: the real files
// edited, and generated models. It follows the format as llama.cpp's
// gguf.cpp writes it, not the engine's reader.
type ggufBuild struct {
	version uint32
	align   int // general.alignment when set, else 32
	kvs     []ggufKVOut
	tensors []ggufTensorOut
}

// ggufKVOut is one metadata entry: its type and its value's bytes (for an
// array: element type, count and elements).
type ggufKVOut struct {
	key string
	typ uint32
	raw []byte
}

type ggufTensorOut struct {
	name string
	dims []int // innermost first
	typ  WeightType
	data []byte
}

// buildOf is the file f as a build, every value's bytes as the file has
// them.
func buildOf(f *ggufFile) *ggufBuild {
	b := &ggufBuild{version: f.version, align: ggufDefaultAlignment}
	for _, k := range f.order {
		kv := f.keys[k]
		raw := f.data[kv.off:kv.end]
		if kv.typ == ggufArray {
			raw = slices.Concat(binary.LittleEndian.AppendUint32(nil, kv.elem), binary.LittleEndian.AppendUint64(nil, kv.count), raw)
		}
		b.kvs = append(b.kvs, ggufKVOut{k, kv.typ, slices.Clone(raw)})
		if k == "general.alignment" {
			a, _ := f.uint(k)
			b.align = int(a)
		}
	}
	for _, n := range f.names {
		t := f.tensors[n]
		b.tensors = append(b.tensors, ggufTensorOut{n, slices.Clone(t.dims), t.typ, slices.Clone(t.data)})
	}
	return b
}

// set replaces key's value, or appends the key.
func (b *ggufBuild) set(key string, typ uint32, raw []byte) {
	for i := range b.kvs {
		if b.kvs[i].key == key {
			b.kvs[i] = ggufKVOut{key, typ, raw}
			return
		}
	}
	b.kvs = append(b.kvs, ggufKVOut{key, typ, raw})
}

// del removes key.
func (b *ggufBuild) del(key string) {
	b.kvs = slices.DeleteFunc(b.kvs, func(kv ggufKVOut) bool { return kv.key == key })
}

// tensor is the tensor named name.
func (b *ggufBuild) tensor(name string) *ggufTensorOut {
	for i := range b.tensors {
		if b.tensors[i].name == name {
			return &b.tensors[i]
		}
	}
	return nil
}

func ggufStr(s string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(s))), s...)
}

func ggufU32(v uint32) []byte  { return binary.LittleEndian.AppendUint32(nil, v) }
func ggufF32(v float32) []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)) }

// ggufArr is an array value of count elements of type elem, encoded in
// raw.
func ggufArr(elem uint32, count int, raw []byte) []byte {
	return slices.Concat(ggufU32(elem), binary.LittleEndian.AppendUint64(nil, uint64(count)), raw)
}

// bytes is the file.
func (b *ggufBuild) bytes() []byte {
	le := binary.LittleEndian
	out := le.AppendUint32(nil, ggufMagic)
	out = le.AppendUint32(out, b.version)
	out = le.AppendUint64(out, uint64(len(b.tensors)))
	out = le.AppendUint64(out, uint64(len(b.kvs)))
	for _, kv := range b.kvs {
		out = append(out, ggufStr(kv.key)...)
		out = le.AppendUint32(out, kv.typ)
		out = append(out, kv.raw...)
	}
	pad := func(n int) int { return (n + b.align - 1) / b.align * b.align }
	off := 0
	for _, t := range b.tensors {
		out = append(out, ggufStr(t.name)...)
		out = le.AppendUint32(out, uint32(len(t.dims)))
		for _, d := range t.dims {
			out = le.AppendUint64(out, uint64(d))
		}
		out = le.AppendUint32(out, uint32(t.typ))
		out = le.AppendUint64(out, uint64(off))
		off = pad(off + len(t.data))
	}
	out = append(out, make([]byte, pad(len(out))-len(out))...)
	for _, t := range b.tensors {
		out = append(out, t.data...)
		out = append(out, make([]byte, pad(len(t.data))-len(t.data))...)
	}
	return out
}

// quantize encodes the rows × cols float32 values v as type t, the way
// ggml's reference quantizers do (quantize_row_*_ref): Q8_0 scales each
// block of 32 by d = max|x| / 127 and rounds x·(1/d) half away from zero;
// Q4_0 takes d = m / -8 for the value m of largest magnitude and stores
// min(15, trunc(x·(1/d) + 8.5)); F16 and BF16 round to nearest, ties to
// even.
func quantize(v []float32, t WeightType) []byte {
	le := binary.LittleEndian
	var out []byte
	switch t {
	case WeightF32:
		for _, x := range v {
			out = le.AppendUint32(out, math.Float32bits(x))
		}
	case WeightF16:
		for _, x := range v {
			out = le.AppendUint16(out, f32ToF16(x))
		}
	case WeightBF16:
		for _, x := range v {
			out = le.AppendUint16(out, f32ToBF16(x))
		}
	case WeightQ8_0:
		for b := 0; b < len(v); b += quantBlock {
			blk := v[b : b+quantBlock]
			amax := float32(0)
			for _, x := range blk {
				amax = max(amax, float32(math.Abs(float64(x))))
			}
			d := amax / 127
			id := float32(0)
			if d != 0 {
				id = 1 / d
			}
			out = le.AppendUint16(out, f32ToF16(d))
			for _, x := range blk {
				out = append(out, byte(int8(math.Round(float64(x*id)))))
			}
		}
	case WeightQ4_0:
		for b := 0; b < len(v); b += quantBlock {
			blk := v[b : b+quantBlock]
			amax, m := float32(0), float32(0)
			for _, x := range blk {
				if a := float32(math.Abs(float64(x))); a > amax {
					amax, m = a, x
				}
			}
			d := m / -8
			id := float32(0)
			if d != 0 {
				id = 1 / d
			}
			out = le.AppendUint16(out, f32ToF16(d))
			q := func(x float32) byte { return byte(min(15, int8(x*id+8.5))) }
			for i := range quantBlock / 2 {
				out = append(out, q(blk[i])|q(blk[i+quantBlock/2])<<4)
			}
		}
	default:
		panic("quantize: type " + t.String())
	}
	return out
}
