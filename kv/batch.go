package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// A batch is the unit of transfer and back-pressure: a bounded number of
// frames, each at most one page's token range, sent and acknowledged as one.
// Wire layout, little-endian:
//
//	off  size  field
//	  0     4  magic "KVB1"
//	  4     4  frame count, 1..PagesMax
//	  8     8  body length in bytes, ≤ BytesMax
//	 16     …  frames back to back, exactly body length bytes
//
// Each frame carries its own checksum; the batch header needs none, since a
// corrupted count or length makes the frames fail to line up with the body
// and the batch is refused.
const (
	batchMagic = "KVB1"
	// BatchHeaderBytes is the length of a batch header.
	BatchHeaderBytes = 16
)

// BatchLimits bound a batch. Both are validated by the transfer
// configuration that owns them.
type BatchLimits struct {
	// PagesMax is the most frames one batch may carry. Must be ≥ 1.
	PagesMax int
	// BytesMax is the most body bytes (frames with headers) one batch may
	// carry. Must hold at least one full-page frame.
	BytesMax int
	// Frame bounds each frame.
	Frame FrameLimits
}

// Validate reports a bound that cannot carry even one page.
func (l BatchLimits) Validate() error {
	if l.PagesMax < 1 {
		return fmt.Errorf("kv: batch PagesMax (%d) must be at least 1", l.PagesMax)
	}
	if need := l.Frame.FrameBytesMax(); l.BytesMax < need {
		return fmt.Errorf("kv: batch BytesMax (%d) must hold one full-page frame (%d bytes)", l.BytesMax, need)
	}
	return nil
}

// AppendBatchHeader encodes the header of a batch of count frames whose
// encoded frames take bodyBytes, for a sender that writes the frames
// itself (AppendFrameHeader and each payload from where it lies).
func AppendBatchHeader(dst []byte, count, bodyBytes int, lim BatchLimits) ([]byte, error) {
	if count < 1 || count > lim.PagesMax {
		return dst, &FrameError{Field: "batch frame count", Value: uint64(max(count, 0)), Limit: uint64(lim.PagesMax)}
	}
	if bodyBytes < 0 || bodyBytes > lim.BytesMax {
		return dst, &FrameError{Field: "batch body length", Value: uint64(max(bodyBytes, 0)), Limit: uint64(lim.BytesMax)}
	}
	dst = append(dst, batchMagic...)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(count))
	return binary.LittleEndian.AppendUint64(dst, uint64(bodyBytes)), nil
}

// AppendBatch encodes frames as one batch onto dst. It refuses a batch over
// its limits instead of splitting it: the sender decides what goes together.
func AppendBatch(dst []byte, frames []Frame, lim BatchLimits) ([]byte, error) {
	start := len(dst)
	// dst grows once, to the batch's length, where it would grow many
	// times, copying what it held each time: a batch is up to megabytes.
	need := BatchHeaderBytes
	for i := range frames {
		need += FrameBytes(&frames[i])
	}
	if need <= BatchHeaderBytes+lim.BytesMax {
		dst = slices.Grow(dst, need)
	}
	dst, err := AppendBatchHeader(dst, len(frames), 0, lim)
	if err != nil {
		return dst, err
	}
	for i := range frames {
		if dst, frames[i].Checksum, err = AppendFrame(dst, &frames[i], lim.Frame); err != nil {
			return dst[:start], err
		}
	}
	body := len(dst) - start - BatchHeaderBytes
	if body > lim.BytesMax {
		return dst[:start], &FrameError{Field: "batch body length", Value: uint64(body), Limit: uint64(lim.BytesMax)}
	}
	binary.LittleEndian.PutUint64(dst[start+8:], uint64(body))
	return dst, nil
}

// DecodeBatch decodes one batch at the start of buf and returns its frames
// (payloads alias buf) and the bytes it took. A buffer holding only part of
// a batch yields a *FrameShortError; everything else wrong is refused with a
// typed error, and nothing is returned of a batch with any bad frame.
func DecodeBatch(buf []byte, lim BatchLimits) ([]Frame, int, error) {
	n := min(len(buf), len(batchMagic))
	if string(buf[:n]) != batchMagic[:n] {
		return nil, 0, &FrameError{Field: "batch magic", Value: uint64(n), Limit: uint64(len(batchMagic))}
	}
	if len(buf) < BatchHeaderBytes {
		return nil, 0, &FrameShortError{Need: BatchHeaderBytes, Have: len(buf)}
	}
	count := binary.LittleEndian.Uint32(buf[4:])
	body := binary.LittleEndian.Uint64(buf[8:])
	if count < 1 || uint64(count) > uint64(lim.PagesMax) {
		return nil, 0, &FrameError{Field: "batch frame count", Value: uint64(count), Limit: uint64(lim.PagesMax)}
	}
	if body > uint64(lim.BytesMax) {
		return nil, 0, &FrameError{Field: "batch body length", Value: body, Limit: uint64(lim.BytesMax)}
	}
	total := BatchHeaderBytes + int(body)
	if len(buf) < total {
		return nil, 0, &FrameShortError{Need: total, Have: len(buf)}
	}
	frames := make([]Frame, 0, count)
	rest := buf[BatchHeaderBytes:total]
	for range count {
		f, used, err := DecodeFrame(rest, lim.Frame)
		if err != nil {
			// A frame that runs past the body means the header lied.
			var short *FrameShortError
			if errors.As(err, &short) {
				return nil, 0, &FrameError{Field: "frame length past batch body", Value: uint64(short.Need), Limit: uint64(len(rest))}
			}
			return nil, 0, err
		}
		frames = append(frames, f)
		rest = rest[used:]
	}
	if len(rest) != 0 {
		return nil, 0, &FrameError{Field: "batch trailing bytes", Value: uint64(len(rest)), Limit: 0}
	}
	return frames, total, nil
}
