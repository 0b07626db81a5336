package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
)

// The token types of a GGUF vocabulary (tokenizer.ggml.token_type), as
// llama.cpp numbers them.
const (
	tokenUndefined   = 0
	tokenNormal      = 1
	tokenUnknown     = 2
	tokenControl     = 3
	tokenUserDefined = 4
	tokenUnused      = 5
	tokenByte        = 6
)

// spmSpace is SentencePiece's stand-in for a space in pieces, U+2581 "▁".
const spmSpace = "\u2581"

// spmEndOfGeneration are the pieces llama.cpp takes for the end of a
// generation or a turn whatever type the file gives them: it makes them
// control tokens, which text never becomes and which decode to nothing.
var spmEndOfGeneration = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>"}

// TokenizerModelError: a GGUF file's vocabulary is of a tokenizer model
// (tokenizer.ggml.model) the engine does not implement.
type TokenizerModelError struct {
	Path  string
	Model string // tokenizer.ggml.model: "gpt2", "bert", …
	Pre   string // tokenizer.ggml.pre, "" when the file has none
}

func (e *TokenizerModelError) Error() string {
	pre := ""
	if e.Pre != "" {
		pre = fmt.Sprintf(" (pre-tokenizer %s)", e.Pre)
	}
	return fmt.Sprintf("engine: %stokenizer model %s%s is not supported yet; supported: llama (SentencePiece)", pathPrefix(e.Path), e.Model, pre)
}

// VocabError: a GGUF file's vocabulary cannot be a tokenizer.
type VocabError struct {
	Path  string
	Token int // the token's id; -1 for the vocabulary as a whole
	// Field is what is wrong: "size" (no tokens), "length" (Value entries
	// in the array Piece, "scores" or "types", for Other tokens), "piece"
	// (empty, or Value bytes, more than TokenPieceMaxBytes), "duplicate"
	// (the piece of token Other too), "score" (Value is not finite),
	// "type" (Value is not a type, 0 to 6), "byte" (a byte token whose
	// piece is not <0xHH>), "bos" or "eos" (Token, the special id, is no
	// token of the Value), or "fallback" (the byte Value has neither a
	// byte token, nor a piece of its own, nor an unknown token to stand
	// for it).
	Field string
	Piece string
	Value float64
	Other int
}

func (e *VocabError) Error() string {
	p := pathPrefix(e.Path)
	switch e.Field {
	case "size":
		return fmt.Sprintf("engine: vocabulary %shas no tokens", p)
	case "length":
		return fmt.Sprintf("engine: vocabulary %shas %.0f %s for %d tokens", p, e.Value, e.Piece, e.Other)
	case "piece":
		return fmt.Sprintf("engine: vocabulary %stoken %d: its piece is %.0f bytes; want 1 to %d", p, e.Token, e.Value, TokenPieceMaxBytes)
	case "duplicate":
		return fmt.Sprintf("engine: vocabulary %stoken %d: piece %q is token %d's too", p, e.Token, e.Piece, e.Other)
	case "score":
		return fmt.Sprintf("engine: vocabulary %stoken %d: score %g must be finite", p, e.Token, e.Value)
	case "type":
		return fmt.Sprintf("engine: vocabulary %stoken %d: type %.0f; types are 0 to 6", p, e.Token, e.Value)
	case "byte":
		return fmt.Sprintf("engine: vocabulary %stoken %d is a byte token, but its piece %q is not <0xHH>", p, e.Token, e.Piece)
	case "bos", "eos":
		return fmt.Sprintf("engine: vocabulary %sof %.0f tokens: its %s token %d is none of them", p, e.Value, strings.ToUpper(e.Field), e.Token)
	case "fallback":
		return fmt.Sprintf("engine: vocabulary %shas no token for the byte 0x%02X: no byte token <0x%02X>, no piece of it, no token of the unknown type",
			p, int(e.Value), int(e.Value))
	}
	return fmt.Sprintf("engine: vocabulary %stoken %d: bad %s", p, e.Token, e.Field)
}

// NewGGUFTokenizer is the tokenizer of v, the vocabulary of the GGUF file
// name (for errors): llama.cpp's SentencePiece tokenizer for a "llama"
// vocabulary (see spmTokenizer). Any other tokenizer model, "gpt2" among
// them, is refused (*TokenizerModelError); so is a vocabulary that cannot
// encode every text (*VocabError).
func NewGGUFTokenizer(name string, v *GGUFVocab) (Tokenizer, error) {
	if v.Model != "llama" {
		return nil, &TokenizerModelError{Path: name, Model: v.Model, Pre: v.Pre}
	}
	return newSPMTokenizer(name, v)
}

// spmTokenizer is llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm
// and llama_vocab's tokenize and token_to_piece) over a GGUF file's
// "llama" vocabulary. Encode gives the ids llama.cpp's llama_tokenize does
// (special tokens added, not parsed), BOS always first, with one
// difference: text never becomes a control, unknown, unused or
// undefined token, nor a byte token other than by fallback (llama.cpp
// merges into any piece; SentencePiece does not), so that every token of a
// text decodes to text. It is immutable and safe for concurrent use.
type spmTokenizer struct {
	pieces []string // as the file has them, "▁" for a space
	scores []float32
	// types are the file's (normal for every token when it has none), the
	// pieces of spmEndOfGeneration made control, as llama.cpp does.
	types []int32
	// text is what each token decodes to: a normal token its piece with
	// "▁" as a space, a user-defined one its piece, a byte token its byte,
	// any other nothing.
	text [][]byte
	// index maps the pieces text may become (normal and user-defined) to
	// their ids; indexMax is the longest, in bytes.
	index    map[string]int
	indexMax int
	// userDefined are the user-defined tokens, taken whole from text
	// before it is merged; special are the control, user-defined and
	// unknown ones, which a chat template's own text may hold.
	userDefined, special *specialTokens
	// fallback is the token of each byte that no piece covers: its byte
	// token, else a piece of that byte that text may become, else the
	// unknown token.
	fallback         [256]int
	bos, eos         int
	addSpace, addEOS bool
}

var _ Tokenizer = (*spmTokenizer)(nil)

// newSPMTokenizer checks v and makes its tokenizer. Absent special ids
// take llama.cpp's defaults for a llama vocabulary: unknown 0, BOS 1, EOS
// 2.
func newSPMTokenizer(name string, v *GGUFVocab) (*spmTokenizer, error) {
	n := len(v.Tokens)
	if n == 0 {
		return nil, &VocabError{Path: name, Token: -1, Field: "size"}
	}
	for _, a := range []struct {
		name string
		n    int
	}{{"scores", len(v.Scores)}, {"types", len(v.Types)}} {
		if a.n != 0 && a.n != n {
			return nil, &VocabError{Path: name, Token: -1, Field: "length", Piece: a.name, Value: float64(a.n), Other: n}
		}
	}
	t := &spmTokenizer{pieces: v.Tokens, scores: v.Scores, types: make([]int32, n), text: make([][]byte, n),
		index: make(map[string]int, n), addSpace: v.AddSpacePrefix, addEOS: v.AddEOS}
	if t.scores == nil {
		t.scores = make([]float32, n)
	}
	all := make(map[string]int, n)
	for i, p := range v.Tokens {
		typ := int32(tokenNormal)
		if v.Types != nil {
			typ = v.Types[i]
		}
		switch s := t.scores[i]; {
		case len(p) == 0 || len(p) > TokenPieceMaxBytes:
			return nil, &VocabError{Path: name, Token: i, Field: "piece", Value: float64(len(p))}
		case math.IsNaN(float64(s)) || math.IsInf(float64(s), 0):
			return nil, &VocabError{Path: name, Token: i, Field: "score", Value: float64(s)}
		case typ < tokenUndefined || typ > tokenByte:
			return nil, &VocabError{Path: name, Token: i, Field: "type", Value: float64(typ)}
		}
		if first, ok := all[p]; ok {
			return nil, &VocabError{Path: name, Token: i, Field: "duplicate", Piece: p, Other: first}
		}
		all[p] = i
		t.types[i] = typ
	}
	for _, p := range spmEndOfGeneration {
		if id, ok := all[p]; ok {
			t.types[id] = tokenControl
		}
	}
	var user, special []int
	for i, p := range t.pieces {
		switch t.types[i] {
		case tokenNormal:
			t.text[i] = []byte(strings.ReplaceAll(p, spmSpace, " "))
		case tokenUserDefined:
			t.text[i] = []byte(p)
			user = append(user, i)
		case tokenByte:
			c, ok := parseBytePiece(p)
			if !ok {
				return nil, &VocabError{Path: name, Token: i, Field: "byte", Piece: p}
			}
			b := int(c)
			t.text[i] = everyByte[b : b+1 : b+1]
		}
		switch t.types[i] {
		case tokenNormal, tokenUserDefined:
			t.index[p] = i
			t.indexMax = max(t.indexMax, len(p))
		}
		switch t.types[i] {
		case tokenControl, tokenUserDefined, tokenUnknown:
			special = append(special, i)
		}
	}
	t.userDefined, t.special = newSpecialTokens(t.pieces, user), newSpecialTokens(t.pieces, special)
	t.bos, t.eos = specialID(v.BOS, 1, n), specialID(v.EOS, 2, n)
	for _, sp := range []struct {
		field string
		id    int
	}{{"bos", t.bos}, {"eos", t.eos}} {
		if sp.id < 0 || sp.id >= n {
			return nil, &VocabError{Path: name, Token: sp.id, Field: sp.field, Value: float64(n)}
		}
	}
	unknown := specialID(v.Unknown, 0, n)
	for b := range 256 {
		// A control, unused or undefined token of the piece <0xHH>, or of
		// the byte itself, is none a text may become.
		id, ok := all[fmt.Sprintf("<0x%02X>", b)]
		if !ok || t.types[id] != tokenByte {
			id, ok = t.index[string(everyByte[b:b+1])]
		}
		if !ok {
			if id, ok = unknown, unknown >= 0 && unknown < n && t.types[unknown] == tokenUnknown; !ok {
				return nil, &VocabError{Path: name, Token: -1, Field: "fallback", Value: float64(b)}
			}
		}
		t.fallback[b] = id
	}
	return t, nil
}

// specialID is id, or def where id is absent (-1) and def is a token of a
// vocabulary of n.
func specialID(id, def, n int) int {
	if id < 0 && def < n {
		return def
	}
	return id
}

// parseBytePiece is the byte of a byte token's piece, <0xHH> (hex digits
// of either case, as llama.cpp reads them).
func parseBytePiece(p string) (byte, bool) {
	if len(p) != 6 || p[:3] != "<0x" || p[5] != '>' {
		return 0, false
	}
	var b byte
	for _, c := range []byte(p[3:5]) {
		switch {
		case c >= '0' && c <= '9':
			b = b<<4 | (c - '0')
		case c >= 'A' && c <= 'F':
			b = b<<4 | (c - 'A' + 10)
		case c >= 'a' && c <= 'f':
			b = b<<4 | (c - 'a' + 10)
		default:
			return 0, false
		}
	}
	return b, true
}

// Vocab is the number of token ids.
func (t *spmTokenizer) Vocab() int { return len(t.pieces) }

// BOS is the file's BOS, which every encoded prompt starts with, even when
// the file's add_bos_token is false: a prompt here is never empty.
func (t *spmTokenizer) BOS() int { return t.bos }

// Stop is the file's EOS.
func (t *spmTokenizer) Stop() int { return t.eos }

// PieceBytesMax is the longest piece text may become, in bytes, at least
// 1 (a byte token's): every other token stands for one byte of text.
// Pieces are counted as the file has them, "▁" 3 bytes, since text may
// hold "▁" itself.
func (t *spmTokenizer) PieceBytesMax() int { return max(t.indexMax, 1) }

// Piece is what id decodes to after prev: a normal token its piece with
// "▁" as a space, a user-defined one its piece as it is, a byte token its
// byte; control, unknown, unused and undefined tokens, and ids outside the
// vocabulary, nothing. After BOS a normal token's leading space is dropped
// when the vocabulary adds a space prefix: it is the prefix (llama.cpp
// drops it too). The slice is the tokenizer's: callers must not change
// it.
func (t *spmTokenizer) Piece(prev, id int) []byte {
	if id < 0 || id >= len(t.text) {
		return nil
	}
	p := t.text[id]
	if prev == t.bos && t.addSpace && t.types[id] == tokenNormal && len(p) > 0 && p[0] == ' ' {
		p = p[1:]
	}
	return p
}

// Encode returns BOS followed by text's tokens, and EOS when the file's
// add_eos_token asks for it, as llama.cpp's llama_tokenize makes them:
// user-defined tokens are taken whole from the text first (the longest
// first); then each run of text between them, a space prefixed to it when
// the vocabulary adds one and it starts the text or follows such a token,
// is merged as SentencePiece does (spmTokenizer.appendPieces).
func (t *spmTokenizer) Encode(text string) []int {
	return t.encode(t.userDefined.split(text), nil)
}

// fragment is part of a prompt: text, or (token ≥ 0) a token as it is.
type fragment struct {
	text  string
	token int
}

// encode is BOS, then the tokens of frags, then EOS when the file asks for
// it; a text fragment follows a token fragment, never another text one.
// A text fragment is merged whole (appendPieces): the special tokens a
// text may hold are its caller's to take out, so that a chat message's
// content, which ChatTemplate leaves in its text fragments, never becomes
// one. Text never becomes a token of avoid (nil: none), by a merge or
// whole: a chat's text never becomes its template's markers, whatever
// pieces the vocabulary has that merge into them.
func (t *spmTokenizer) encode(frags []fragment, avoid map[int]bool) []int {
	ids := []int{t.bos}
	afterToken := true
	for _, f := range frags {
		if f.token >= 0 {
			ids, afterToken = append(ids, f.token), true
		} else {
			ids, afterToken = t.appendPieces(ids, f.text, t.addSpace && afterToken, avoid), false
		}
	}
	if t.addEOS {
		ids = append(ids, t.eos)
	}
	return ids
}

// appendPieces appends the tokens of text, a space before it if prefix,
// as llama.cpp's llm_tokenizer_spm makes them: spaces become "▁"; the
// text is cut into symbols, each a byte and as many more as its value
// says a UTF-8 character of that first byte has (so invalid UTF-8 cuts as
// llama.cpp cuts it); adjacent symbols are merged into the piece of
// highest score they make, the leftmost of equal scores, until none
// make a piece; a symbol that is no piece becomes the fallback of each of
// its bytes. No symbol becomes a token of avoid.
func (t *spmTokenizer) appendPieces(ids []int, text string, prefix bool, avoid map[int]bool) []int {
	s := strings.ReplaceAll(text, " ", spmSpace)
	if prefix {
		s = spmSpace + s
	}
	var start, end, sym []int
	for i := 0; i < len(s); {
		j := min(i+utf8LenOf(s[i]), len(s))
		id, ok := t.index[s[i:j]]
		if !ok || avoid[id] {
			id = -1
		}
		start, end, sym = append(start, i), append(end, j), append(sym, id)
		i = j
	}
	join := func(l, r int) (int, float32, bool) {
		if end[r]-start[l] > t.indexMax {
			return 0, 0, false
		}
		id, ok := t.index[s[start[l]:end[r]]]
		return id, t.scores[id], ok && !avoid[id]
	}
	for _, i := range mergeSymbols(sym, join, func(l, r int) { end[l] = end[r] }) {
		if sym[i] >= 0 {
			ids = append(ids, sym[i])
			continue
		}
		for k := start[i]; k < end[i]; k++ {
			ids = append(ids, t.fallback[s[k]])
		}
	}
	return ids
}

// utf8LenOf is the length of the UTF-8 character a byte starts, as
// llama.cpp's unicode_len_utf8 reads it from its high four bits: 1 for
// ASCII and for a continuation byte, 2, 3 or 4 for a leading byte.
func utf8LenOf(b byte) int {
	return [16]int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4}[b>>4]
}

// mergeSymbols merges adjacent symbols as SentencePiece's BPE does, in
// place: ids[i] is symbol i's token (-1 for a symbol that is none);
// join(l, r) is the token, and its score, that l and r make together, if
// any; merged(l, r) is told that r was merged into l (nil: nothing to
// tell). The pair of highest score merges first, the leftmost of equal
// scores, until no adjacent pair joins. It returns the symbols left, in
// order.
//
// Symbols form a linked list; every adjacent pair that joins is a heap
// entry. An entry (l, r) is current while next[l] is r and r still holds
// the token it was pushed with: l changes only by merging with its right
// neighbour, which is r for as long as r lives, and a merged-away
// symbol's next is -1. A text of n symbols takes O(n log n) time.
func mergeSymbols(ids []int, join func(l, r int) (int, float32, bool), merged func(l, r int)) []int {
	n := len(ids)
	next, prev := make([]int, n), make([]int, n)
	for i := range n {
		next[i], prev[i] = i+1, i-1
	}
	if n > 0 {
		next[n-1] = -1
	}
	var h mergeHeap
	push := func(l, r int) {
		if id, score, ok := join(l, r); ok {
			h.push(mergeCandidate{score: score, id: int32(id), rightID: int32(ids[r]), left: l, right: r})
		}
	}
	for i := range n - 1 {
		push(i, i+1)
	}
	for len(h) > 0 {
		c := h.pop()
		l, r := c.left, c.right
		if next[l] != r || ids[r] != int(c.rightID) {
			continue
		}
		if merged != nil {
			merged(l, r)
		}
		ids[l] = int(c.id)
		next[l] = next[r]
		if next[l] >= 0 {
			prev[next[l]] = l
		}
		next[r] = -1
		if p := prev[l]; p >= 0 {
			push(p, l)
		}
		if q := next[l]; q >= 0 {
			push(l, q)
		}
	}
	var left []int
	for i := 0; n > 0 && i >= 0; i = next[i] {
		left = append(left, i)
	}
	return left
}

// specialTokens are tokens a text holds whole (llama.cpp's special token
// partition), found by an Aho-Corasick automaton over their pieces. Its
// nodes are the prefixes of the pieces, node 0 the empty one: a text is
// read a byte at a time, the node after each byte the longest prefix of
// a piece that ends the text read, so that the pieces that end there are
// that node's match and the matches of its fail chain.
type specialTokens struct {
	root  [256]int32       // the node of each one-byte prefix, 0 for none
	edges map[uint64]int32 // node<<8 | byte: the node one byte longer, for nodes other than the root
	depth []int32          // the length of each node's prefix
	fail  []int32          // the longest proper suffix of each node's prefix that is a node
	match []int32          // the longest piece that ends each node's prefix (the node itself when it is one), -1 for none
	id    []int32          // the token each node's prefix is, -1 for none
}

// newSpecialTokens is the automaton of the tokens ids of pieces.
func newSpecialTokens(pieces []string, ids []int) *specialTokens {
	s := &specialTokens{edges: map[uint64]int32{}, depth: []int32{0}, fail: []int32{0}, id: []int32{-1}}
	parent, via := []int32{0}, []byte{0}
	for _, id := range ids {
		p, n := pieces[id], int32(0)
		for i := range len(p) {
			c, ok := s.child(n, p[i])
			if !ok {
				c = int32(len(s.depth))
				s.depth, s.fail, s.id = append(s.depth, int32(i+1)), append(s.fail, 0), append(s.id, -1)
				parent, via = append(parent, n), append(via, p[i])
				if n == 0 {
					s.root[p[i]] = c
				} else {
					s.edges[uint64(n)<<8|uint64(p[i])] = c
				}
			}
			n = c
		}
		s.id[n] = int32(id)
	}
	// The shallowest first: a node's fail and match are those of shorter
	// prefixes, found already.
	order := make([]int32, len(s.depth))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return int(s.depth[a] - s.depth[b]) })
	s.match = make([]int32, len(s.depth))
	s.match[0] = -1
	for _, n := range order[1:] {
		if s.depth[n] > 1 {
			s.fail[n] = s.next(s.fail[parent[n]], via[n])
		}
		s.match[n] = s.match[s.fail[n]]
		if s.id[n] >= 0 {
			s.match[n] = n
		}
	}
	return s
}

// child is the node one byte c longer than n, if any.
func (s *specialTokens) child(n int32, c byte) (int32, bool) {
	if n == 0 {
		return s.root[c], s.root[c] != 0
	}
	next, ok := s.edges[uint64(n)<<8|uint64(c)]
	return next, ok
}

// next is the node after n when the byte c is read: at the root, one
// table lookup, and a byte that starts no piece stays there; elsewhere, a
// lookup for each node of the fail chain tried. Each fail shortens the
// prefix and each byte lengthens it by one at most, so a text is as
// many fails as bytes at most.
func (s *specialTokens) next(n int32, c byte) int32 {
	for {
		if next, ok := s.child(n, c); ok || n == 0 {
			return next
		}
		n = s.fail[n]
	}
}

// lookup is the special token whose piece is text.
func (s *specialTokens) lookup(text string) (int, bool) {
	n := int32(0)
	for i := range len(text) {
		next, ok := s.child(n, text[i])
		if !ok {
			return 0, false
		}
		n = next
	}
	return int(s.id[n]), s.id[n] >= 0
}

// specialMatch is a piece found in a text: the node of the piece, and the
// end of the text it ends.
type specialMatch struct {
	end  int
	node int32
}

// split cuts text at the special tokens it holds, as llama.cpp's
// tokenizer_st_partition does: the longest pieces are taken first, those
// of one length from the left, each only where no piece taken before
// overlaps it; what is between them is text. An empty text has no
// fragments.
//
// One pass of the automaton finds the longest piece ending at each byte;
// those of each length are then taken in turn, the longest first. A
// piece overlaps one taken before, which is no shorter, only if it holds
// that one's first or last byte, so a look at its own first and last
// bytes tells: where its last byte is taken, so is the last byte of
// every piece ending there; where only its first is, the next shorter
// piece ending there is tried with its length.
func (s *specialTokens) split(text string) []fragment {
	var found []specialMatch
	longest := int32(0)
	for n, i := int32(0), 0; i < len(text); i++ {
		n = s.next(n, text[i])
		if m := s.match[n]; m >= 0 {
			found = append(found, specialMatch{end: i + 1, node: m})
			longest = max(longest, s.depth[m])
		}
	}
	if len(found) == 0 {
		if text == "" {
			return nil
		}
		return []fragment{{text: text, token: -1}}
	}
	byLength := make([][]specialMatch, longest+1)
	for _, m := range found {
		byLength[s.depth[m.node]] = append(byLength[s.depth[m.node]], m)
	}
	taken := make([]bool, len(text))
	var tokens []specialMatch
	for l := longest; l > 0; l-- {
		ms := byLength[l]
		slices.SortFunc(ms, func(a, b specialMatch) int { return a.end - b.end })
		for _, m := range ms {
			start := m.end - int(l)
			switch {
			case taken[m.end-1]:
			case taken[start]:
				if shorter := s.match[s.fail[m.node]]; shorter >= 0 {
					byLength[s.depth[shorter]] = append(byLength[s.depth[shorter]], specialMatch{end: m.end, node: shorter})
				}
			default:
				for k := start; k < m.end; k++ {
					taken[k] = true
				}
				tokens = append(tokens, m)
			}
		}
	}
	slices.SortFunc(tokens, func(a, b specialMatch) int { return a.end - b.end })
	var frags []fragment
	last := 0
	for _, m := range tokens {
		if start := m.end - int(s.depth[m.node]); start > last {
			frags = append(frags, fragment{text: text[last:start], token: -1})
		}
		frags = append(frags, fragment{token: int(s.id[m.node])})
		last = m.end
	}
	if last < len(text) {
		frags = append(frags, fragment{text: text[last:], token: -1})
	}
	return frags
}

// fingerprintData is what decides how text encodes besides what Piece
// says: every piece as the file has it, its score and type, the fallback
// of each byte, and whether a space is prefixed and EOS appended.
func (t *spmTokenizer) fingerprintData() []byte {
	le := binary.LittleEndian
	var b []byte
	for i, p := range t.pieces {
		b = le.AppendUint32(b, uint32(len(p)))
		b = append(b, p...)
		b = le.AppendUint32(b, math.Float32bits(t.scores[i]))
		b = append(b, byte(t.types[i]))
	}
	for _, id := range t.fallback {
		b = le.AppendUint32(b, uint32(id))
	}
	flag := func(v bool) byte {
		if v {
			return 1
		}
		return 0
	}
	return append(b, flag(t.addSpace), flag(t.addEOS))
}
