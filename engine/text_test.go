package engine

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// pieceTokenizer is a Tokenizer whose id i stands for p[i] whatever comes
// before it: id 0 is BOS and the stop token, ids 1 to 256 the bytes, and
// the ids after them whatever pieces a test gives.
type pieceTokenizer [][]byte

func newPieceTokenizer(extra ...string) pieceTokenizer {
	p := pieceTokenizer{nil}
	for b := range 256 {
		p = append(p, []byte{byte(b)})
	}
	for _, s := range extra {
		p = append(p, []byte(s))
	}
	return p
}

func (p pieceTokenizer) Vocab() int { return len(p) }
func (p pieceTokenizer) BOS() int   { return 0 }
func (p pieceTokenizer) Stop() int  { return 0 }

func (p pieceTokenizer) PieceBytesMax() int {
	n := 1
	for _, piece := range p {
		n = max(n, len(piece))
	}
	return n
}

func (p pieceTokenizer) Encode(text string) []int {
	ids := []int{0}
	for i := range len(text) {
		ids = append(ids, 1+int(text[i]))
	}
	return ids
}

func (p pieceTokenizer) Piece(_, id int) []byte {
	if id <= 0 || id >= len(p) {
		return nil
	}
	return p[id]
}

// byteIDs are the pieceTokenizer ids of the bytes of s.
func byteIDs(s string) []int { return pieceTokenizer{}.Encode(s)[1:] }

func TestTextDecoderJoinsBytes(t *testing.T) {
	pt := newPieceTokenizer("a\xe4", "\xb8\x96b")
	for _, c := range []struct {
		name string
		ids  []int
		want []string // what each Push returns
		held string   // what Flush returns
	}{
		{"a character in three byte tokens", byteIDs("世a"), []string{"", "", "世", "a"}, ""},
		{"a character across two pieces", []int{257, 258}, []string{"a", "世b"}, ""},
		{"an invalid byte", byteIDs("\xffa"), []string{"\uFFFD", "a"}, ""},
		{"a stray continuation byte", byteIDs("\x80"), []string{"\uFFFD"}, ""},
		{"an interrupted character", byteIDs("\xe4a"), []string{"", "\uFFFDa"}, ""},
		{"an incomplete end", byteIDs("a\xf0\x9f\x99"), []string{"a", "", "", ""}, "\uFFFD\uFFFD\uFFFD"},
		{"BOS and out-of-range ids", []int{0, -1, 9999, 1 + 'x'}, []string{"", "", "", "x"}, ""},
	} {
		d := NewTextDecoder(pt, 0)
		var got []string
		for _, id := range c.ids {
			got = append(got, d.Push(id))
			if d.n > utf8.UTFMax-1 {
				t.Fatalf("%s: %d bytes held", c.name, d.n)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: Push gave %q, want %q", c.name, got, c.want)
		}
		if held := d.Flush(); held != c.held {
			t.Errorf("%s: Flush gave %q, want %q", c.name, held, c.held)
		}
		if again := d.Flush(); again != "" {
			t.Errorf("%s: a second Flush gave %q", c.name, again)
		}
	}
}

func TestDecodeTextBPE(t *testing.T) {
	bpe := tinyBPE(t, ordinaryPieces(" ", " a", "b")...)
	sa, b := idsOf(t, bpe, " a")[0], idsOf(t, bpe, "b")[0]
	é := []int{3 + 0xC3, 3 + 0xA9}
	for _, c := range []struct {
		prev int
		ids  []int
		want string
	}{
		{1, []int{sa, sa, b}, "a ab"},                   // the space goes only after BOS
		{b, []int{sa, sa, b}, " a ab"},                  // not after another token
		{-1, []int{1, sa, 2, sa}, "a a"},                // BOS within: the next loses its space; EOS is no text
		{b, append(append([]int{sa}, é...), b), " aéb"}, // byte tokens join into a character
		{b, é[:1], "\uFFFD"},                            // an unfinished one ends as U+FFFD
	} {
		if got := DecodeText(bpe, c.prev, c.ids); got != c.want {
			t.Errorf("DecodeText(%d, %v) = %q, want %q", c.prev, c.ids, got, c.want)
		}
	}
}

// TestDecodeTextByteTokenizer: the byte tokenizer's text is the bytes that
// are printable ASCII or newlines as they are, and each other one as its
// stand-in ('!' plus the byte's value modulo 94): no control character,
// DEL or byte of UTF-8 reaches a terminal from the built-in model.
func TestDecodeTextByteTokenizer(t *testing.T) {
	var bt ByteTokenizer
	for s, want := range map[string]string{"hello\nworld ~": "hello\nworld ~", "": "",
		"\x1b[2J\a\r": "<[2J(.", "é": "(l", "\x7f\xff": "Bd"} {
		if got := DecodeText(bt, -1, bt.Encode(s)); got != want {
			t.Errorf("DecodeText(Encode(%q)) = %q, want %q", s, got, want)
		}
	}
}

// FuzzTextDecoder: however bytes are cut into pieces, the decoded text is
// Go's conversion of the whole to runes, every Push returns valid UTF-8,
// and at most 3 bytes are held.
func FuzzTextDecoder(f *testing.F) {
	f.Add([]byte("héllo 世界 🙂"), []byte{1, 2, 3})
	f.Add([]byte("\xe4\xb8\x96\xe4\xb8\xff\x80\xf0\x9f"), []byte{0, 1})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		var chunks []string
		rest := data
		for _, c := range cuts {
			n := min(int(c)%8, len(rest))
			chunks = append(chunks, string(rest[:n]))
			rest = rest[n:]
		}
		chunks = append(chunks, string(rest))
		pt := newPieceTokenizer(chunks...)
		d := NewTextDecoder(pt, 0)
		var b strings.Builder
		for i := range chunks {
			s := d.Push(257 + i)
			if !utf8.ValidString(s) {
				t.Fatalf("Push gave invalid UTF-8 %q", s)
			}
			if d.n > utf8.UTFMax-1 {
				t.Fatalf("%d bytes held", d.n)
			}
			b.WriteString(s)
		}
		b.WriteString(d.Flush())
		if got, want := b.String(), string([]rune(string(data))); got != want {
			t.Fatalf("decoded %q in pieces %q as %q, want %q", data, chunks, got, want)
		}
	})
}
