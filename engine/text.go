package engine

import (
	"strings"
	"unicode/utf8"
)

// TextDecoder turns generated tokens into text as they come. A character
// may span the pieces of several tokens (byte-fallback tokens are one byte
// each), so the decoder holds back an incomplete UTF-8 sequence at the end
// of what it has seen, at most 3 bytes, until the bytes that complete it
// arrive. What it returns is always valid UTF-8: a byte that cannot be part
// of a character becomes U+FFFD, one per byte, as Go's string-to-rune
// conversion does, so the concatenated output of every Push and the final
// Flush is string([]rune(string(bytes))) of the pieces' bytes.
type TextDecoder struct {
	t    Tokenizer
	prev int
	held [utf8.UTFMax - 1]byte
	n    int // bytes held
	buf  []byte
}

// NewTextDecoder decodes tokens of t that follow prev, the last token
// before them (the prompt's last, or -1 for none).
func NewTextDecoder(t Tokenizer, prev int) *TextDecoder {
	return &TextDecoder{t: t, prev: prev}
}

// Push adds id's piece and returns the text it completes.
func (d *TextDecoder) Push(id int) string {
	p := d.t.Piece(d.prev, id)
	d.prev = id
	if len(p) == 0 {
		return ""
	}
	d.buf = append(append(d.buf[:0], d.held[:d.n]...), p...)
	var b strings.Builder
	i := 0
	for i < len(d.buf) && utf8.FullRune(d.buf[i:]) {
		i += writeRune(&b, d.buf[i:])
	}
	d.n = copy(d.held[:], d.buf[i:])
	return b.String()
}

// Flush returns the bytes held back, each as U+FFFD since no byte can
// complete them now, and empties the decoder.
func (d *TextDecoder) Flush() string {
	var b strings.Builder
	for i := 0; i < d.n; {
		i += writeRune(&b, d.held[i:d.n])
	}
	d.n = 0
	return b.String()
}

// writeRune writes the character p starts with, or U+FFFD for an invalid
// first byte, and returns the bytes it used.
func writeRune(b *strings.Builder, p []byte) int {
	r, size := utf8.DecodeRune(p)
	if r == utf8.RuneError && size == 1 {
		b.WriteRune(utf8.RuneError)
	} else {
		b.Write(p[:size])
	}
	return size
}

// DecodeText is the text of ids, tokens of t that follow prev: every Push
// of a TextDecoder, then its Flush.
func DecodeText(t Tokenizer, prev int, ids []int) string {
	d := NewTextDecoder(t, prev)
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(d.Push(id))
	}
	b.WriteString(d.Flush())
	return b.String()
}
