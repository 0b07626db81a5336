package engine

// ByteTokenizer is the built-in model's tokenizer: ids 0 to 255 are the
// bytes, BOS and EOS the specials, and generation stops at EOS. It needs no
// vocabulary file and encodes every string, so a prompt is never refused
// for its encoding.
type ByteTokenizer struct{}

var _ Tokenizer = ByteTokenizer{}

// Vocab is TokenizerVocab.
func (ByteTokenizer) Vocab() int { return TokenizerVocab }

// BOS is the id every prompt starts with.
func (ByteTokenizer) BOS() int { return BOS }

// Stop is EOS.
func (ByteTokenizer) Stop() int { return EOS }

// Encode returns BOS and then one token per byte of s, ids 0 to 255.
func (ByteTokenizer) Encode(s string) []int {
	ids := make([]int, 1+len(s))
	ids[0] = BOS
	for i := range len(s) {
		ids[1+i] = int(s[i])
	}
	return ids
}

// PieceBytesMax is 1: every token is one byte.
func (ByteTokenizer) PieceBytesMax() int { return 1 }

// Piece is the text id stands for: its byte when that is printable text
// (newline and ASCII 0x20 to 0x7E), else a printable stand-in for it, so
// that the built-in model's noise never carries a control character, DEL
// or a byte that is no UTF-8 on its own into a terminal, a log or a pipe.
// BOS, EOS and ids outside 0 to 257 stand for none. The slice is shared;
// the caller must not change it.
func (ByteTokenizer) Piece(_, id int) []byte {
	if id >= 0 && id < 256 {
		return printedBytes[id : id+1 : id+1]
	}
	return nil
}

// printedBytes holds, for each byte, itself if it is printable text, else
// one of '!' to '~' by its value.
var printedBytes = func() (b [256]byte) {
	for i := range b {
		b[i] = byte(i)
		if i != '\n' && (i < 0x20 || i > 0x7e) {
			b[i] = '!' + byte(i%94)
		}
	}
	return b
}()

// everyByte holds the bytes 0 to 255 in order.
var everyByte = func() (b [256]byte) {
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()
