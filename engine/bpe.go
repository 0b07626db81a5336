package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
)

// llama2.c's tokenizer.bin: int32 max_token_length, then for each of the
// model's vocab_size tokens a float32 merge score, an int32 byte length and
// that many bytes. The file has no count: the model's vocabulary says how
// many entries it must hold.

// Token ids of llama2.c's SentencePiece vocabularies: 0 is <unk>, 1 BOS, 2
// EOS, then the byte pieces.
const (
	bpeBOS  = 1 // also the stop token: generation ends when the model emits BOS
	bpeByte = 3 // ids 3 to 258 are the bytes 0x00 to 0xFF ("<0x00>" … "<0xFF>")
	// bpeOrdinary is the first id that is neither special nor a byte: the
	// smallest vocabulary the byte fallback fits in.
	bpeOrdinary = bpeByte + 256
)

// TokenPieceMaxBytes bounds a tokenizer file's max_token_length, in bytes,
// so that the merge buffer and every piece a file may declare stay small.
// SentencePiece's pieces are at most 16 characters (64 bytes) by default;
// tok512.bin's longest is 7 bytes.
const TokenPieceMaxBytes = 1024

// bpeMergeFloor is llama2.c's starting best score: a pair whose merged
// token scores at or below it is never merged.
const bpeMergeFloor float32 = -1e10

// tokenizerEntryMinBytes is the size of an entry with an empty piece.
const tokenizerEntryMinBytes = 8

// BPETokenizer is a llama2.c tokenizer: SentencePiece-style BPE over a
// vocabulary of scored pieces with byte fallback. It is immutable once
// parsed and safe for concurrent use.
type BPETokenizer struct {
	pieces [][]byte
	scores []float32
	// index maps the text of every ordinary piece (id ≥ 259) to its id, the
	// lowest where pieces repeat.
	index  map[string]int
	space  int // the id of " ", which starts every non-empty text
	maxLen int // max_token_length: no merge can make a longer piece
}

var _ Tokenizer = (*BPETokenizer)(nil)

// TokenizerVocabError: a tokenizer file holds a different number of tokens
// from the model's vocabulary.
type TokenizerVocabError struct {
	Path       string // empty for ParseTokenizer and NewModel
	Have, Want int    // tokens in the file (or tokenizer), tokens in the model
}

func (e *TokenizerVocabError) Error() string {
	return fmt.Sprintf("engine: tokenizer %sholds %d tokens; the model's vocabulary has %d", pathPrefix(e.Path), e.Have, e.Want)
}

// TokenizerFormatError: a tokenizer file is malformed.
type TokenizerFormatError struct {
	Path   string // empty for ParseTokenizer
	Token  int    // the entry's id; -1 for the file's header
	Offset int    // the byte offset of the field in the file
	// Field is what is wrong: "max_token_length", "length", "score",
	// "entry" (the file ends inside it), "size" (the file is larger than
	// the vocabulary's entries can be), "vocab" (too few tokens for the
	// byte fallback), "byte piece" or "space" (no piece is " ").
	Field string
	Value float64 // the value read, where there is one
	Limit int     // the bound it broke
	Piece string  // the piece read, for "byte piece"
}

func (e *TokenizerFormatError) Error() string {
	p := pathPrefix(e.Path)
	switch e.Field {
	case "max_token_length":
		return fmt.Sprintf("engine: tokenizer %smax_token_length %.0f must be in [1, %d] bytes", p, e.Value, e.Limit)
	case "length":
		return fmt.Sprintf("engine: tokenizer %stoken %d at byte %d: length %.0f must be in [0, max_token_length %d]", p, e.Token, e.Offset, e.Value, e.Limit)
	case "score":
		return fmt.Sprintf("engine: tokenizer %stoken %d at byte %d: score %g must be finite", p, e.Token, e.Offset, e.Value)
	case "entry":
		if e.Token < 0 {
			return fmt.Sprintf("engine: tokenizer %sis %d bytes, shorter than its 4-byte header", p, e.Limit)
		}
		return fmt.Sprintf("engine: tokenizer %stoken %d at byte %d: the file ends inside the entry (%d bytes left)", p, e.Token, e.Offset, e.Limit)
	case "vocab":
		return fmt.Sprintf("engine: tokenizer %sof %.0f tokens: byte fallback needs at least %d", p, e.Value, e.Limit)
	case "byte piece":
		return fmt.Sprintf("engine: tokenizer %stoken %d is %q; byte fallback needs <0x%02X>", p, e.Token, e.Piece, e.Token-bpeByte)
	case "size":
		return fmt.Sprintf("engine: tokenizer %sis %.0f bytes, more than the %d its vocabulary's tokens can take", p, e.Value, e.Limit)
	case "space":
		return fmt.Sprintf("engine: tokenizer %shas no piece \" \", which starts every non-empty text", p)
	}
	return fmt.Sprintf("engine: tokenizer %stoken %d at byte %d: bad %s", p, e.Token, e.Offset, e.Field)
}

// ReadTokenizer loads a llama2.c tokenizer.bin for a model of vocab
// tokens; see ParseTokenizer. A file larger than vocab entries of the
// largest piece could be is refused before it is read.
func ReadTokenizer(path string, vocab int) (*BPETokenizer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	entries := int64(min(max(vocab, 0), modelDimMax)) // no model has more
	if limit := 4 + entries*(tokenizerEntryMinBytes+TokenPieceMaxBytes); fi.Size() > limit {
		return nil, &TokenizerFormatError{Path: path, Token: -1, Field: "size", Value: float64(fi.Size()), Limit: int(limit)}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseTokenizer(path, data, vocab)
}

// ParseTokenizer decodes a llama2.c tokenizer.bin held in data for a model
// of vocab tokens. It refuses (*TokenizerVocabError) a file that does not
// hold exactly vocab entries, and (*TokenizerFormatError) a
// max_token_length outside [1, TokenPieceMaxBytes], a piece longer than
// max_token_length, a score that is not finite, ids 3 to 258 other than the
// byte pieces "<0x00>" to "<0xFF>", and a vocabulary without the piece " ".
// It walks the file once before allocating, so what it allocates is
// proportional to len(data).
func ParseTokenizer(data []byte, vocab int) (*BPETokenizer, error) {
	return parseTokenizer("", data, vocab)
}

func parseTokenizer(path string, data []byte, vocab int) (*BPETokenizer, error) {
	le := binary.LittleEndian
	if len(data) < 4 {
		return nil, &TokenizerFormatError{Path: path, Token: -1, Field: "entry", Limit: len(data)}
	}
	maxLen := int64(int32(le.Uint32(data)))
	if maxLen < 1 || maxLen > TokenPieceMaxBytes {
		return nil, &TokenizerFormatError{Path: path, Token: -1, Field: "max_token_length", Value: float64(maxLen), Limit: TokenPieceMaxBytes}
	}
	// The first pass checks every entry and counts them.
	n := 0
	for off := 4; off < len(data); n++ {
		if len(data)-off < tokenizerEntryMinBytes {
			return nil, &TokenizerFormatError{Path: path, Token: n, Offset: off, Field: "entry", Limit: len(data) - off}
		}
		score := le.Uint32(data[off:])
		if f := math.Float32frombits(score); math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return nil, &TokenizerFormatError{Path: path, Token: n, Offset: off, Field: "score", Value: float64(f)}
		}
		l := int64(int32(le.Uint32(data[off+4:])))
		if l < 0 || l > maxLen {
			return nil, &TokenizerFormatError{Path: path, Token: n, Offset: off + 4, Field: "length", Value: float64(l), Limit: int(maxLen)}
		}
		if int64(len(data)-off-tokenizerEntryMinBytes) < l {
			return nil, &TokenizerFormatError{Path: path, Token: n, Offset: off, Field: "entry", Limit: len(data) - off}
		}
		off += tokenizerEntryMinBytes + int(l)
	}
	if n != vocab {
		return nil, &TokenizerVocabError{Path: path, Have: n, Want: vocab}
	}
	if n < bpeOrdinary {
		return nil, &TokenizerFormatError{Path: path, Token: -1, Field: "vocab", Value: float64(n), Limit: bpeOrdinary}
	}
	t := &BPETokenizer{pieces: make([][]byte, n), scores: make([]float32, n), index: make(map[string]int, n-bpeOrdinary),
		maxLen: int(maxLen)}
	// Pieces share one copy of the file's bytes, each capped at its end so
	// that an append to one cannot overwrite the next.
	text := make([]byte, 0, len(data))
	for i, off := 0, 4; i < n; i++ {
		t.scores[i] = math.Float32frombits(le.Uint32(data[off:]))
		l := int(le.Uint32(data[off+4:]))
		start := len(text)
		text = append(text, data[off+tokenizerEntryMinBytes:off+tokenizerEntryMinBytes+l]...)
		t.pieces[i] = text[start:len(text):len(text)]
		off += tokenizerEntryMinBytes + l
	}
	for b := range 256 {
		if p := t.pieces[bpeByte+b]; string(p) != fmt.Sprintf("<0x%02X>", b) {
			return nil, &TokenizerFormatError{Path: path, Token: bpeByte + b, Field: "byte piece", Piece: string(p)}
		}
	}
	for i := n - 1; i >= bpeOrdinary; i-- { // downwards, so that the lowest id of a repeated piece stays
		t.index[string(t.pieces[i])] = i
	}
	var ok bool
	if t.space, ok = t.index[" "]; !ok {
		return nil, &TokenizerFormatError{Path: path, Token: -1, Field: "space"}
	}
	return t, nil
}

// Vocab is the number of token ids.
func (t *BPETokenizer) Vocab() int { return len(t.pieces) }

// BOS is id 1, which every encoded prompt starts with.
func (t *BPETokenizer) BOS() int { return bpeBOS }

// PieceBytesMax is the file's max_token_length: no piece, and no merge, is
// longer.
func (t *BPETokenizer) PieceBytesMax() int { return t.maxLen }

// Stop is id 1, BOS: llama2.c's models end a text by starting the next.
func (t *BPETokenizer) Stop() int { return bpeBOS }

// Piece is the bytes of id after prev: a byte token (ids 3 to 258) is its
// raw byte, any other token its piece, without a leading space when prev is
// BOS (the dummy prefix Encode adds). The specials (ids 0 to 2) and ids
// outside the vocabulary give nil. The slice is the tokenizer's: callers
// must not change it.
func (t *BPETokenizer) Piece(prev, id int) []byte {
	switch {
	case id < bpeByte || id >= len(t.pieces):
		return nil
	case id < bpeOrdinary:
		b := id - bpeByte
		return everyByte[b : b+1 : b+1]
	}
	p := t.pieces[id]
	if prev == bpeBOS && len(p) > 0 && p[0] == ' ' {
		p = p[1:]
	}
	return p
}

// Encode returns BOS followed by text's tokens, as llama2.c's encode makes
// them: a space first if text is not empty (SentencePiece's dummy prefix);
// then, for each run of a byte and up to three continuation bytes after it
// (a UTF-8 character, when text is valid), the piece of that text or, when
// there is none, one byte token per byte (id = byte + 3), so that every
// string encodes, invalid UTF-8 and NUL bytes included; then, repeatedly,
// the adjacent pair whose joined text is the piece of highest score is
// merged, the leftmost among equal scores, until no pair joins into a
// piece.
//
// Unlike llama2.c, text never becomes BOS, EOS, unknown or a byte token
// other than by fallback, and BOS never merges with what follows it: only
// ordinary pieces (ids from 259) are looked up. SentencePiece does the
// same; with llama2.c's vocabularies the results are identical, because
// their pieces never join into those tokens' text ("<0x41>", "\n<s>\n").
//
// The merge keeps its candidates in a heap, so a text of n bytes takes
// O(n log n) time rather than the O(n²) of llama2.c's rescan.
func (t *BPETokenizer) Encode(text string) []int {
	ids := make([]int, 1, len(text)+2)
	ids[0] = bpeBOS
	if text == "" {
		return ids
	}
	ids = append(ids, t.space)
	for i := 0; i < len(text); {
		j := i + 1
		for j < len(text) && j-i < 4 && text[j]&0xC0 == 0x80 {
			j++
		}
		if id, ok := t.index[text[i:j]]; ok {
			ids = append(ids, id)
		} else {
			for k := i; k < j; k++ {
				ids = append(ids, bpeByte+int(text[k]))
			}
		}
		i = j
	}
	return ids[:1+len(t.merge(ids[1:]))]
}

// join is the token the pair (a, b) merges into and its score, with buf as
// scratch of at least 2·maxLen bytes; ok is false when the pair does not
// merge.
func (t *BPETokenizer) join(buf []byte, a, b int) (id int, score float32, ok bool) {
	pa, pb := t.pieces[a], t.pieces[b]
	if len(pa)+len(pb) > t.maxLen {
		return 0, 0, false
	}
	buf = append(append(buf[:0], pa...), pb...)
	id, ok = t.index[string(buf)]
	if !ok || !(t.scores[id] > bpeMergeFloor) {
		return 0, 0, false
	}
	return id, t.scores[id], true
}

// merge applies llama2.c's merges to ids in place (mergeSymbols, with
// ids' tokens as the symbols) and returns them.
func (t *BPETokenizer) merge(ids []int) []int {
	if len(ids) < 2 {
		return ids
	}
	buf := make([]byte, 0, 2*t.maxLen)
	left := mergeSymbols(ids, func(l, r int) (int, float32, bool) { return t.join(buf, ids[l], ids[r]) }, nil)
	out := ids[:0]
	for _, i := range left {
		out = append(out, ids[i]) // i ≥ len(out): nothing is overwritten before it is read
	}
	return out
}

// mergeCandidate is a pair of adjacent tokens, left and right, that joins
// into id; rightID is the right token when the pair was pushed.
type mergeCandidate struct {
	score       float32
	id, rightID int32
	left, right int
}

// before orders candidates as llama2.c picks them: the highest score, then
// the leftmost.
func (a mergeCandidate) before(b mergeCandidate) bool {
	if a.score != b.score {
		return a.score > b.score
	}
	return a.left < b.left
}

// mergeHeap is a binary heap of candidates, the next merge first.
type mergeHeap []mergeCandidate

func (h *mergeHeap) push(c mergeCandidate) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s[i].before(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeCandidate {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		c := 2*i + 1
		if c >= len(s) {
			break
		}
		if c+1 < len(s) && s[c+1].before(s[c]) {
			c++
		}
		if !s[c].before(s[i]) {
			break
		}
		s[i], s[c] = s[c], s[i]
		i = c
	}
	*h = s
	return top
}
