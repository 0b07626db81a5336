package engine

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kvwarden/kvwarden/kv"
)

// K and V live in pages as little-endian bytes of the pool's DType. The
// model computes in float32, rounds to the page type when it stores a row,
// and reads the rounded values back for attention — also for the token it
// has just computed — so that every path sees exactly the stored bits.
// The generic kernels read through encoding/binary rather than an unsafe
// cast: the Go compiler turns the little-endian load into one instruction,
// and pages stay plain bytes with one defined layout on every platform. The
// AVX2 kernels load the same little-endian lanes directly.

// encodeKV stores src as len(src) elements of type dt at the start of dst.
// Every NaN is stored as the one quiet NaN of its type: the vector and
// generic kernels agree on every number but not on a NaN's sign and
// payload, and a page's bytes must be the same whichever computed them
// (decode compares the KV row it recomputes with the one it received).
func encodeKV(dst []byte, src []float32, dt kv.DType) {
	le := binary.LittleEndian
	switch dt {
	case kv.F32:
		dst = dst[:4*len(src)]
		for i, f := range src {
			b := math.Float32bits(f)
			if b&0x7fffffff > 0x7f800000 {
				b = canonicalNaN32
			}
			le.PutUint32(dst[4*i:], b)
		}
	case kv.F16:
		dst = dst[:2*len(src)]
		for i, f := range src {
			le.PutUint16(dst[2*i:], f32ToF16(f))
		}
	case kv.BF16:
		dst = dst[:2*len(src)]
		for i, f := range src {
			le.PutUint16(dst[2*i:], f32ToBF16(f))
		}
	default:
		panic(fmt.Sprintf("engine: KV dtype %s has no codec", dt))
	}
}

// decodeKV widens the len(dst) elements of type dt stored at the start of
// src to float32.
func decodeKV(dst []float32, src []byte, dt kv.DType) {
	le := binary.LittleEndian
	if dt == kv.F32 {
		src = src[:4*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(le.Uint32(src[4*i:]))
		}
		return
	}
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = half(le.Uint16(src[2*i:]), dt)
	}
}

// axpyKV adds w times the len(out) elements stored at the start of b to
// out.
func axpyKV(out []float32, w float32, b []byte, dt kv.DType) {
	le := binary.LittleEndian
	if dt == kv.F32 {
		b = b[:4*len(out)]
		for i := range out {
			out[i] += float32(w * math.Float32frombits(le.Uint32(b[4*i:])))
		}
		return
	}
	b = b[:2*len(out)]
	for i := range out {
		out[i] += float32(w * half(le.Uint16(b[2*i:]), dt))
	}
}

// half widens one 16-bit element of type dt (F16 or BF16) to float32.
func half(h uint16, dt kv.DType) float32 {
	if dt == kv.BF16 {
		return math.Float32frombits(uint32(h) << 16)
	}
	return f16ToF32(h)
}

// canonicalNaN32 is the quiet NaN every stored f32 NaN becomes; 0x7fc0
// and 0x7e00 are bf16's and f16's.
const canonicalNaN32 = 0x7fc00000

// f32ToBF16 rounds to nearest, ties to even; every NaN becomes 0x7fc0.
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return 0x7fc0
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// f32ToF16 rounds to nearest, ties to even, to IEEE binary16: overflow goes
// to infinity, tiny values to subnormals or zero, every NaN to 0x7e00.
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	man := b & 0x7fffff
	switch {
	case b&0x7fffffff > 0x7f800000:
		return 0x7e00 // the one quiet NaN, whatever the sign
	case exp >= 0x1f:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		// Subnormal: shift the 24-bit significand down to units of 2^-24.
		man |= 0x800000
		shift := uint(14 - exp)
		r, rem, halfway := man>>shift, man&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > halfway || rem == halfway && r&1 == 1 {
			r++
		}
		return sign | uint16(r)
	}
	// A carry out of the mantissa moves the exponent on, up to infinity,
	// which is the correct rounding.
	r, rem := uint32(exp)<<10|man>>13, man&0x1fff
	if rem > 0x1000 || rem == 0x1000 && r&1 == 1 {
		r++
	}
	return sign | uint16(r)
}

// f16ToF32 widens IEEE binary16 exactly.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch exp {
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case 0:
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}
