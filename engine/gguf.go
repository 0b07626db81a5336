package engine

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"unicode/utf8"
)

// GGUF is llama.cpp's model file: a header, typed metadata (key, value
// type, value), an index of tensors (name, shape innermost first, ggml
// type, offset), then the tensors' bytes from the first multiple of
// general.alignment after the index. Versions 2 and 3 are the same layout
// with 64-bit counts; both are little-endian (a big-endian file's version
// reads byte-swapped and is refused as such).
//
// The parser walks the whole header before it keeps anything: every count
// is checked against the bytes left in the file (an element takes at least
// one byte, a string eight) before a slice of that many is made, every
// length and offset is overflow-safe, and a value is decoded only when the
// model asks for its key. Nothing the file declares can make the parser
// allocate more than twice the file's own size (a string array's headers),
// nor work more than in proportion to it.

// ggufMagic is "GGUF" read as a little-endian uint32.
const ggufMagic = 0x46554747

// Bounds on what a GGUF file may declare, far above any model's.
const (
	// GGUFTensorsMax bounds the tensor count (a 70 B llama has 723).
	GGUFTensorsMax = 1 << 16
	// GGUFKeysMax bounds the metadata keys (models carry 20 to 50).
	GGUFKeysMax = 1 << 16
	// GGUFStringBytesMax bounds one string: a key, a token, a chat
	// template.
	GGUFStringBytesMax = 1 << 20
	// ggufDimsMax is ggml's most dimensions of a tensor.
	ggufDimsMax = 4
	// ggufAlignmentMax bounds general.alignment, in bytes.
	ggufAlignmentMax = 1 << 16
	// ggufDefaultAlignment is general.alignment's default.
	ggufDefaultAlignment = 32
)

// GGUF metadata value types.
const (
	ggufUint8 uint32 = iota
	ggufInt8
	ggufUint16
	ggufInt16
	ggufUint32
	ggufInt32
	ggufFloat32
	ggufBool
	ggufString
	ggufArray
	ggufUint64
	ggufInt64
	ggufFloat64
)

// ggufScalarBytes is the size of each fixed-size value type; 0 for
// strings and arrays.
var ggufScalarBytes = [...]int{ggufUint8: 1, ggufInt8: 1, ggufUint16: 2, ggufInt16: 2, ggufUint32: 4,
	ggufInt32: 4, ggufFloat32: 4, ggufBool: 1, ggufString: 0, ggufArray: 0, ggufUint64: 8, ggufInt64: 8, ggufFloat64: 8}

var ggufTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
	"string", "array", "uint64", "int64", "float64"}

func ggufTypeName(t uint32) string {
	if int(t) < len(ggufTypeNames) {
		return ggufTypeNames[t]
	}
	return fmt.Sprintf("type %d", t)
}

// ggmlTypeNames names the ggml tensor types the engine does not compute
// with, for the error that refuses them.
var ggmlTypeNames = map[WeightType]string{3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K",
	12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
	20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
	29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}

// GGUFError: a GGUF file is malformed, or declares what the engine does
// not run. Offset is the byte of the file where the problem is, -1 when it
// is not one place.
type GGUFError struct {
	Path   string
	Offset int64
	// What is wrong, with the numbers.
	Reason string
}

func (e *GGUFError) Error() string {
	at := ""
	if e.Offset >= 0 {
		at = fmt.Sprintf(" at byte %d", e.Offset)
	}
	return fmt.Sprintf("engine: GGUF %s%s: %s", strings.TrimSuffix(pathPrefix(e.Path), " "), at, e.Reason)
}

// ggufKV is one metadata value, not yet decoded: its type, the element
// type and count of an array, and where its bytes start.
type ggufKV struct {
	typ, elem uint32
	count     uint64
	// off and end bound the value's bytes in the file (after its type,
	// and an array's element type and count).
	off, end int
}

// ggufTensor is one entry of the tensor index.
type ggufTensor struct {
	name  string
	dims  []int // innermost first, as GGUF has them
	typ   WeightType
	data  []byte // the tensor's bytes in the file
	entry int64  // the index entry's offset, for errors
	// off and size place data in the file's data section.
	off, size uint64
}

// ggufFile is a parsed GGUF file: metadata not yet decoded, tensors by name.
type ggufFile struct {
	path    string
	data    []byte
	version uint32
	keys    map[string]ggufKV
	order   []string // keys in file order
	tensors map[string]*ggufTensor
	names   []string // tensor names in file order
}

// ggufReader reads little-endian values from a file's bytes, every read
// bounds-checked; the first failure sticks and later reads return zeros.
type ggufReader struct {
	f   *ggufFile
	off int
	err error
}

func (r *ggufReader) fail(off int, format string, args ...any) {
	if r.err == nil {
		r.err = &GGUFError{Path: r.f.path, Offset: int64(off), Reason: fmt.Sprintf(format, args...)}
	}
}

// take returns the next n bytes of what (of the key or tensor named
// name, when name is not empty), or nil when the file ends first. The
// message is made only on failure: a read costs no allocation.
func (r *ggufReader) take(n int, what, name string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.f.data)-r.off {
		if name != "" {
			what = fmt.Sprintf("%s of %q", what, name)
		}
		r.fail(r.off, "%s of %d bytes runs past the end of the %d-byte file", what, n, len(r.f.data))
		return nil
	}
	b := r.f.data[r.off : r.off+n]
	r.off += n
	return b
}

func (r *ggufReader) u32(what, name string) uint32 {
	if b := r.take(4, what, name); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *ggufReader) u64(what, name string) uint64 {
	if b := r.take(8, what, name); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// str reads a string: a uint64 length and that many bytes, at most
// GGUFStringBytesMax. It makes no string: the bytes are the file's.
func (r *ggufReader) str(what, name string) []byte {
	at := r.off
	n := r.u64(what+" length", name)
	if r.err == nil && n > GGUFStringBytesMax {
		if name != "" {
			what = fmt.Sprintf("%s of %q", what, name)
		}
		r.fail(at, "%s of %d bytes is longer than the %d-byte bound", what, n, GGUFStringBytesMax)
	}
	return r.take(int(n), what, name)
}

// skipValue moves past one value of type t of the key named key (a
// string, or a fixed-size value; an array's elements one by one),
// checking every length on the way.
func (r *ggufReader) skipValue(t uint32, key string) {
	switch {
	case t == ggufString:
		r.str("a string", key)
	case int(t) < len(ggufScalarBytes) && t != ggufArray:
		r.take(ggufScalarBytes[t], "a value", key)
	default:
		r.fail(r.off, "key %q has value type %d; GGUF's are 0 to %d", key, t, len(ggufScalarBytes)-1)
	}
}

// parseGGUF parses data, the bytes of the file at path (for errors). It
// keeps data: tensors are slices of it.
func parseGGUF(path string, data []byte) (*ggufFile, error) {
	f := &ggufFile{path: path, data: data, keys: map[string]ggufKV{}, tensors: map[string]*ggufTensor{}}
	r := &ggufReader{f: f}
	if len(data) < 24 {
		return nil, &GGUFError{Path: path, Offset: -1, Reason: fmt.Sprintf("the file is %d bytes, shorter than GGUF's 24-byte header", len(data))}
	}
	if m := r.u32("magic", ""); m != ggufMagic {
		return nil, &GGUFError{Path: path, Offset: 0, Reason: fmt.Sprintf("magic %q is not \"GGUF\"", data[:4])}
	}
	switch f.version = r.u32("version", ""); {
	case f.version == 2 || f.version == 3:
	case bits.ReverseBytes32(f.version) == 2 || bits.ReverseBytes32(f.version) == 3:
		return nil, &GGUFError{Path: path, Offset: 4, Reason: fmt.Sprintf("version %d is big-endian; the engine reads little-endian files", bits.ReverseBytes32(f.version))}
	default:
		return nil, &GGUFError{Path: path, Offset: 4, Reason: fmt.Sprintf("version %d is not 2 or 3", f.version)}
	}
	nTensors, nKeys := r.u64("tensor count", ""), r.u64("metadata count", "")
	// Each key takes at least 12 bytes (an empty name's length and a
	// type), each tensor entry at least 24.
	left := uint64(len(data) - r.off)
	switch {
	case nTensors > GGUFTensorsMax || nTensors*24 > left:
		return nil, &GGUFError{Path: path, Offset: 8, Reason: fmt.Sprintf("%d tensors: at most %d, and at most 24 bytes each in the %d bytes left", nTensors, GGUFTensorsMax, left)}
	case nKeys > GGUFKeysMax || nKeys*12 > left:
		return nil, &GGUFError{Path: path, Offset: 16, Reason: fmt.Sprintf("%d metadata keys: at most %d, and at most 12 bytes each in the %d bytes left", nKeys, GGUFKeysMax, left)}
	}
	for range nKeys {
		at := r.off
		key := string(r.str("metadata key", ""))
		kv := ggufKV{typ: r.u32("the value type", key)}
		if r.err != nil {
			return nil, r.err
		}
		if _, dup := f.keys[key]; dup {
			return nil, &GGUFError{Path: path, Offset: int64(at), Reason: fmt.Sprintf("key %q appears twice", key)}
		}
		if kv.typ == ggufArray {
			kv.elem, kv.count = r.u32("the array type", key), r.u64("the array length", key)
			if r.err != nil {
				return nil, r.err
			}
			if kv.elem == ggufArray || int(kv.elem) >= len(ggufScalarBytes) {
				return nil, &GGUFError{Path: path, Offset: int64(at), Reason: fmt.Sprintf("key %q: an array of %s; elements are types 0 to %d but arrays",
					key, ggufTypeName(kv.elem), len(ggufScalarBytes)-1)}
			}
			// An element takes its size, a string at least eight bytes.
			least := uint64(ggufScalarBytes[kv.elem])
			if kv.elem == ggufString {
				least = 8 // the length
			}
			if kv.count > uint64(len(data)-r.off)/least {
				return nil, &GGUFError{Path: path, Offset: int64(at), Reason: fmt.Sprintf("key %q: an array of %d %s does not fit the %d bytes left",
					key, kv.count, ggufTypeName(kv.elem), len(data)-r.off)}
			}
			kv.off = r.off
			if kv.elem != ggufString {
				r.take(int(kv.count)*ggufScalarBytes[kv.elem], "an array", key)
			}
			for i := uint64(0); kv.elem == ggufString && i < kv.count && r.err == nil; i++ {
				r.skipValue(kv.elem, key)
			}
		} else {
			kv.off = r.off
			r.skipValue(kv.typ, key)
		}
		if r.err != nil {
			return nil, r.err
		}
		kv.end = r.off
		f.keys[key] = kv
		f.order = append(f.order, key)
	}
	align := uint64(ggufDefaultAlignment)
	if f.has("general.alignment") {
		a, err := f.uint("general.alignment")
		if err != nil {
			return nil, err
		}
		if a == 0 || a&(a-1) != 0 || a > ggufAlignmentMax {
			return nil, &GGUFError{Path: path, Offset: int64(f.keys["general.alignment"].off), Reason: fmt.Sprintf("general.alignment %d is not a power of two up to %d", a, ggufAlignmentMax)}
		}
		align = a
	}
	for range nTensors {
		t := &ggufTensor{entry: int64(r.off)}
		t.name = string(r.str("tensor name", ""))
		nd := r.u32("the dimension count", t.name)
		if r.err == nil && (nd < 1 || nd > ggufDimsMax) {
			return nil, &GGUFError{Path: path, Offset: t.entry, Reason: fmt.Sprintf("tensor %q has %d dimensions; 1 to %d", t.name, nd, ggufDimsMax)}
		}
		elems := uint64(1)
		for range nd {
			d := r.u64("a dimension", t.name)
			if r.err != nil {
				return nil, r.err
			}
			if d == 0 || d > uint64(len(data)) || elems > uint64(len(data))/d {
				return nil, &GGUFError{Path: path, Offset: t.entry, Reason: fmt.Sprintf("tensor %q: a dimension of %d makes it larger than the %d-byte file", t.name, d, len(data))}
			}
			elems *= d
			t.dims = append(t.dims, int(d))
		}
		t.typ = WeightType(r.u32("the type", t.name))
		off := r.u64("the offset", t.name)
		if r.err != nil {
			return nil, r.err
		}
		if _, dup := f.tensors[t.name]; dup {
			return nil, &GGUFError{Path: path, Offset: t.entry, Reason: fmt.Sprintf("tensor %q appears twice", t.name)}
		}
		if !t.typ.Known() {
			name := ggmlTypeNames[t.typ]
			if name == "" {
				name = "unknown"
			}
			return nil, &GGUFError{Path: path, Offset: t.entry, Reason: fmt.Sprintf("tensor %q is of ggml type %d (%s); the engine computes F32, F16, BF16, Q8_0 and Q4_0",
				t.name, uint32(t.typ), name)}
		}
		rb, ok := t.typ.RowBytes(t.dims[0])
		if !ok {
			return nil, &GGUFError{Path: path, Offset: t.entry, Reason: fmt.Sprintf("tensor %q: rows of %d elements are not whole %s blocks", t.name, t.dims[0], t.typ)}
		}
		if off%align != 0 {
			return nil, &GGUFError{Path: path, Offset: t.entry, Reason: fmt.Sprintf("tensor %q: offset %d is not a multiple of the alignment %d", t.name, off, align)}
		}
		t.off, t.size = off, uint64(rb)*(elems/uint64(t.dims[0]))
		f.tensors[t.name] = t
		f.names = append(f.names, t.name)
	}
	start := (uint64(r.off) + align - 1) / align * align
	if start > uint64(len(data)) {
		return nil, &GGUFError{Path: path, Offset: int64(r.off), Reason: fmt.Sprintf("the tensor data would start at byte %d, past the end of the %d-byte file", start, len(data))}
	}
	type span struct {
		lo, hi uint64
		name   string
	}
	spans := make([]span, 0, len(f.names))
	for _, name := range f.names {
		t := f.tensors[name]
		off, size := t.off, t.size
		if off > uint64(len(data))-start || size > uint64(len(data))-start-off {
			return nil, &GGUFError{Path: path, Offset: t.entry, Reason: fmt.Sprintf("tensor %q: %d bytes at offset %d run past the end of the %d bytes of data",
				name, size, off, uint64(len(data))-start)}
		}
		t.data = data[start+off : start+off+size : start+off+size]
		spans = append(spans, span{off, off + size, name})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return nil, &GGUFError{Path: path, Offset: -1, Reason: fmt.Sprintf("tensors %q and %q overlap at data offset %d", spans[i-1].name, spans[i].name, spans[i].lo)}
		}
	}
	return f, nil
}

// keyError is the error for key: what is wrong with its value.
func (f *ggufFile) keyError(key, format string, args ...any) error {
	off := int64(-1)
	if kv, ok := f.keys[key]; ok {
		off = int64(kv.off)
	}
	return &GGUFError{Path: f.path, Offset: off, Reason: fmt.Sprintf("key %q: ", key) + fmt.Sprintf(format, args...)}
}

// missing is the error for a required key the file does not have.
func (f *ggufFile) missing(key string) error {
	return &GGUFError{Path: f.path, Offset: -1, Reason: fmt.Sprintf("the key %q, which a %s model needs, is missing", key, ggufArch)}
}

// scalar decodes the value at off of type t as a float64 (integers exact
// to 2^53; larger ones are refused by uint).
func (f *ggufFile) scalar(t uint32, off int) (float64, bool) {
	le, b := binary.LittleEndian, f.data[off:]
	switch t {
	case ggufUint8:
		return float64(b[0]), true
	case ggufInt8:
		return float64(int8(b[0])), true
	case ggufUint16:
		return float64(le.Uint16(b)), true
	case ggufInt16:
		return float64(int16(le.Uint16(b))), true
	case ggufUint32:
		return float64(le.Uint32(b)), true
	case ggufInt32:
		return float64(int32(le.Uint32(b))), true
	case ggufUint64:
		v := le.Uint64(b)
		if v > 1<<53 {
			return math.Inf(1), true
		}
		return float64(v), true
	case ggufInt64:
		v := int64(le.Uint64(b))
		if v > 1<<53 || v < -(1<<53) {
			return math.Inf(int(v>>63 | 1)), true
		}
		return float64(v), true
	case ggufFloat32:
		return float64(math.Float32frombits(le.Uint32(b))), true
	case ggufFloat64:
		return math.Float64frombits(le.Uint64(b)), true
	}
	return 0, false
}

// uint is key's value as a non-negative integer below 2^53.
func (f *ggufFile) uint(key string) (uint64, error) {
	kv, ok := f.keys[key]
	if !ok {
		return 0, f.missing(key)
	}
	v, num := f.scalar(kv.typ, kv.off)
	if !num || v != math.Trunc(v) || v < 0 || v > 1<<53 {
		return 0, f.keyError(key, "a %s (%g) where a non-negative integer belongs", ggufTypeName(kv.typ), v)
	}
	return uint64(v), nil
}

// float is key's value as a finite number.
func (f *ggufFile) float(key string) (float64, error) {
	kv, ok := f.keys[key]
	if !ok {
		return 0, f.missing(key)
	}
	v, num := f.scalar(kv.typ, kv.off)
	if !num || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, f.keyError(key, "a %s (%g) where a finite number belongs", ggufTypeName(kv.typ), v)
	}
	return v, nil
}

// bool is key's value, def when the key is absent.
func (f *ggufFile) bool(key string, def bool) (bool, error) {
	kv, ok := f.keys[key]
	if !ok {
		return def, nil
	}
	if kv.typ != ggufBool || f.data[kv.off] > 1 {
		return false, f.keyError(key, "a %s where a bool (0 or 1) belongs", ggufTypeName(kv.typ))
	}
	return f.data[kv.off] == 1, nil
}

// string is key's value; ok is false when the key is absent.
func (f *ggufFile) string(key string) (s string, err error) {
	kv, ok := f.keys[key]
	if !ok {
		return "", f.missing(key)
	}
	if kv.typ != ggufString {
		return "", f.keyError(key, "a %s where a string belongs", ggufTypeName(kv.typ))
	}
	return f.stringAt(kv.off), nil
}

// stringAt is the string whose length is at off (checked by the parse).
func (f *ggufFile) stringAt(off int) string {
	n := int(binary.LittleEndian.Uint64(f.data[off:]))
	return string(f.data[off+8 : off+8+n])
}

// strings is key's value, an array of strings, each valid UTF-8.
func (f *ggufFile) strings(key string) ([]string, error) {
	kv, ok := f.keys[key]
	if !ok {
		return nil, f.missing(key)
	}
	if kv.typ != ggufArray || kv.elem != ggufString {
		return nil, f.keyError(key, "a %s where an array of strings belongs", f.describe(kv))
	}
	out := make([]string, kv.count)
	off := kv.off
	for i := range out {
		out[i] = f.stringAt(off)
		off += 8 + len(out[i])
		if !utf8.ValidString(out[i]) {
			return nil, f.keyError(key, "element %d (%q) is not UTF-8", i, out[i])
		}
	}
	return out, nil
}

// numbers is key's value, an array of n numbers, each passed to put with
// its index (as float64: integers exact to 2^53). The length is checked
// before anything is decoded.
func (f *ggufFile) numbers(key string, n int, put func(i int, v float64)) error {
	kv, ok := f.keys[key]
	if !ok {
		return f.missing(key)
	}
	if kv.typ != ggufArray || kv.elem == ggufString || kv.elem == ggufArray || kv.elem == ggufBool {
		return f.keyError(key, "a %s where an array of numbers belongs", f.describe(kv))
	}
	if kv.count != uint64(n) {
		return f.keyError(key, "%d values for %d tokens", kv.count, n)
	}
	w := ggufScalarBytes[kv.elem]
	for i := range n {
		v, _ := f.scalar(kv.elem, kv.off+i*w)
		put(i, v)
	}
	return nil
}

func (f *ggufFile) describe(kv ggufKV) string {
	if kv.typ == ggufArray {
		return fmt.Sprintf("array of %d %s", kv.count, ggufTypeName(kv.elem))
	}
	return ggufTypeName(kv.typ)
}

// has says the file has key.
func (f *ggufFile) has(key string) bool {
	_, ok := f.keys[key]
	return ok
}
