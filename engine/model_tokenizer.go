package engine

import "strings"

// ByteTokenizer maps text to token ids byte by byte: ids 0 to 255 are the
// bytes, BOS and EOS the specials. It needs no vocabulary file and encodes
// every string, so a prompt is never refused for its encoding.
type ByteTokenizer struct{}

// Encode returns one token per byte of s, ids 0 to 255, with
// no specials added (prepend BOS where a caller wants one).
func (ByteTokenizer) Encode(s string) []int {
	ids := make([]int, len(s))
	for i := range len(s) {
		ids[i] = int(s[i])
	}
	return ids
}

// Decode turns ids back into bytes. BOS and EOS are dropped; any other id
// outside 0 to 255 (possible when Vocab is larger than TokenizerVocab)
// becomes U+FFFD, so that it shows in the text instead of vanishing.
// Decode(Encode(s)) == s for every s.
func (ByteTokenizer) Decode(ids []int) string {
	var b strings.Builder
	b.Grow(len(ids))
	for _, id := range ids {
		switch {
		case id >= 0 && id < 256:
			b.WriteByte(byte(id))
		case id == BOS || id == EOS:
		default:
			b.WriteRune('\uFFFD')
		}
	}
	return b.String()
}
