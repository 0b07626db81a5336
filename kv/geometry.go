package kv

import "fmt"

// DType is the element type of the K and V tensors stored in a page.
type DType uint8

const (
	// F32 is IEEE-754 binary32, 4 bytes an element.
	F32 DType = iota + 1
	// F16 is IEEE-754 binary16, 2 bytes an element.
	F16
	// BF16 is bfloat16, 2 bytes an element.
	BF16
)

// Size is the number of bytes one element of d occupies, or 0 for an
// unknown type.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType reads the names String writes.
func ParseDType(s string) (DType, error) {
	for _, d := range []DType{F32, F16, BF16} {
		if d.String() == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("kv: unknown dtype %q (want f32, f16 or bf16)", s)
}

// Geometry is the shape of the KV cache of one model: how many bytes one
// token's keys and values take across all layers, and how many tokens one
// page holds.
//
// A page's bytes are laid out token-major: token t of the page starts at
// t*BytesPerToken(); inside a token the order is layer, then K before V,
// then KV head, then head dimension. Token-major lets a writer append whole
// tokens and lets a frame carry a contiguous token range.
type Geometry struct {
	// Layers is the number of transformer layers. Must be at least 1.
	Layers int
	// KVHeads is the number of key/value heads per layer (grouped-query
	// attention shares each among several query heads). Must be at least 1.
	KVHeads int
	// HeadDim is the number of elements in one head's key (and value)
	// vector. Must be at least 1.
	HeadDim int
	// PageTokens is the number of tokens one page holds. Must be at least 1.
	PageTokens int
	// DType is the element type stored.
	DType DType
}

// Upper bounds that keep every product below computed in int64 range and
// every page addressable by an int on 64-bit platforms.
const (
	geometryDimMax  = 1 << 16
	pageBytesMaxAll = 1 << 31
)

// Validate reports the first field that is out of range, with its value.
func (g Geometry) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"Layers", g.Layers}, {"KVHeads", g.KVHeads}, {"HeadDim", g.HeadDim}, {"PageTokens", g.PageTokens}} {
		if f.v < 1 || f.v > geometryDimMax {
			return fmt.Errorf("kv: geometry %s (%d) must be in [1, %d]", f.name, f.v, geometryDimMax)
		}
	}
	if g.DType.Size() == 0 {
		return fmt.Errorf("kv: geometry DType (%d) must be f32, f16 or bf16", uint8(g.DType))
	}
	if pb := int64(g.PageTokens) * int64(g.bytesPerToken()); pb > pageBytesMaxAll {
		return fmt.Errorf("kv: geometry page of %d tokens × %d bytes/token = %d bytes exceeds the %d-byte page limit",
			g.PageTokens, g.bytesPerToken(), pb, int64(pageBytesMaxAll))
	}
	return nil
}

func (g Geometry) bytesPerToken() int64 {
	return 2 * int64(g.Layers) * int64(g.KVHeads) * int64(g.HeadDim) * int64(g.DType.Size())
}

// BytesPerToken is the bytes of K and V one token occupies over all layers.
func (g Geometry) BytesPerToken() int { return int(g.bytesPerToken()) }

// PageBytes is the bytes one page occupies.
func (g Geometry) PageBytes() int { return g.PageTokens * g.BytesPerToken() }

// PagesFor is the number of pages needed to hold tokens tokens.
func (g Geometry) PagesFor(tokens int) int { return (tokens + g.PageTokens - 1) / g.PageTokens }

// Offset is the byte offset, inside one token's row, of the K (v=false) or
// V (v=true) vector of the given layer and KV head.
func (g Geometry) Offset(layer, head int, v bool) int {
	kvIdx := 0
	if v {
		kvIdx = 1
	}
	return ((layer*2+kvIdx)*g.KVHeads + head) * g.HeadDim * g.DType.Size()
}

func (g Geometry) String() string {
	return fmt.Sprintf("layers=%d kv_heads=%d head_dim=%d page_tokens=%d dtype=%s (%d B/token, %d B/page)",
		g.Layers, g.KVHeads, g.HeadDim, g.PageTokens, g.DType, g.BytesPerToken(), g.PageBytes())
}
