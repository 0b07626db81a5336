package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/stories"
)

// vocabEntry is one token of a tokenizer file.
type vocabEntry struct {
	score float32
	piece string
}

// tokenizerFile writes entries in llama2.c's tokenizer.bin format.
func tokenizerFile(maxLen int32, entries []vocabEntry) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(maxLen))
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(e.score))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e.piece)))
		b = append(b, e.piece...)
	}
	return b
}

// vocabEntries is llama2.c's fixed start of a vocabulary (<unk>, BOS, EOS,
// the 256 byte pieces, all of score 0) followed by ordinary.
func vocabEntries(ordinary ...vocabEntry) []vocabEntry {
	e := []vocabEntry{{0, "<unk>"}, {0, "\n<s>\n"}, {0, "\n</s>\n"}}
	for b := range 256 {
		e = append(e, vocabEntry{0, fmt.Sprintf("<0x%02X>", b)})
	}
	return append(e, ordinary...)
}

// tinyBPE is a tokenizer of llama2.c's fixed start and the ordinary
// pieces after it.
func tinyBPE(tb testing.TB, ordinary ...vocabEntry) *BPETokenizer {
	tb.Helper()
	e := vocabEntries(ordinary...)
	maxLen := 0
	for _, x := range e {
		maxLen = max(maxLen, len(x.piece))
	}
	bpe, err := ParseTokenizer(tokenizerFile(int32(maxLen), e), len(e))
	if err != nil {
		tb.Fatal(err)
	}
	return bpe
}

// ordinaryPieces gives each piece the score -100, below every merge a test
// scores explicitly.
func ordinaryPieces(p ...string) []vocabEntry {
	e := make([]vocabEntry, len(p))
	for i, s := range p {
		e[i] = vocabEntry{-100, s}
	}
	return e
}

// idsOf maps pieces to their ids in bpe.
func idsOf(tb testing.TB, bpe *BPETokenizer, p ...string) []int {
	tb.Helper()
	ids := make([]int, len(p))
	for i, s := range p {
		id, ok := bpe.index[s]
		if !ok {
			tb.Fatalf("no piece %q", s)
		}
		ids[i] = id
	}
	return ids
}

func readTok512(tb testing.TB) *BPETokenizer {
	tb.Helper()
	_, tokPath := stories.Files(tb)
	bpe, err := ReadTokenizer(tokPath, 512)
	if err != nil {
		tb.Fatal(err)
	}
	return bpe
}

// naiveEncode is llama2.c's encode transcribed, the oracle for Encode: the
// code-point loop over bytes as run.c writes it, then a rescan of every
// adjacent pair for each merge. With llama2c set it also looks text up
// among the specials and byte pieces and lets BOS merge with the first
// token, as run.c does; without, it follows the tokenizer's rules.
func naiveEncode(t *BPETokenizer, text string, llama2c bool) []int {
	index := t.index
	if llama2c {
		index = make(map[string]int, len(t.pieces))
		for i := len(t.pieces) - 1; i >= 0; i-- {
			index[string(t.pieces[i])] = i
		}
	}
	tokens := []int{bpeBOS}
	if text != "" {
		tokens = append(tokens, index[" "])
	}
	var buf []byte
	for i := 0; i < len(text); i++ {
		if text[i]&0xC0 != 0x80 {
			buf = buf[:0]
		}
		buf = append(buf, text[i])
		if i+1 < len(text) && text[i+1]&0xC0 == 0x80 && len(buf) < 4 {
			continue
		}
		if id, ok := index[string(buf)]; ok {
			tokens = append(tokens, id)
		} else {
			for _, b := range buf {
				tokens = append(tokens, int(b)+3)
			}
		}
		buf = buf[:0]
	}
	first := 1
	if llama2c {
		first = 0
	}
	for {
		best, bestID, bestIdx := float32(-1e10), -1, -1
		for i := first; i < len(tokens)-1; i++ {
			id, ok := index[string(t.pieces[tokens[i]])+string(t.pieces[tokens[i+1]])]
			if ok && t.scores[id] > best {
				best, bestID, bestIdx = t.scores[id], id, i
			}
		}
		if bestIdx < 0 {
			return tokens
		}
		tokens[bestIdx] = bestID
		tokens = slices.Delete(tokens, bestIdx+1, bestIdx+2)
	}
}

func TestBPEEncodeEmpty(t *testing.T) {
	bpe := tinyBPE(t, ordinaryPieces(" ")...)
	if got := bpe.Encode(""); !slices.Equal(got, []int{1}) {
		t.Fatalf("Encode(\"\") = %v, want [BOS]", got)
	}
}

func TestBPEByteFallback(t *testing.T) {
	bpe := tinyBPE(t, ordinaryPieces(" ", "a", "é")...)
	sp, a, e := bpe.space, idsOf(t, bpe, "a")[0], idsOf(t, bpe, "é")[0]
	b := func(x byte) int { return int(x) + 3 }
	for _, c := range []struct {
		text string
		want []int
	}{
		{"é", []int{1, sp, e}},                // a code point in the vocabulary
		{"ü", []int{1, sp, b(0xC3), b(0xBC)}}, // one that is not: its bytes
		{"🙂", []int{1, sp, b(0xF0), b(0x9F), b(0x99), b(0x82)}},
		{"\xff", []int{1, sp, 258}},                                                             // invalid UTF-8
		{"a\x80", []int{1, sp, b('a'), b(0x80)}},                                                // llama2.c looks "a\x80" up as one run, and falls back for both bytes
		{"\x80\x80\x80\x80\x80a", []int{1, sp, b(0x80), b(0x80), b(0x80), b(0x80), b(0x80), a}}, // runs of at most 4 bytes
		{"\x00", []int{1, sp, 3}},
		{"<0x41>", append([]int{1, sp}, b('<'), b('0'), b('x'), b('4'), b('1'), b('>'))}, // text never becomes a byte token
	} {
		if got := bpe.Encode(c.text); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

func TestBPEMergesByScore(t *testing.T) {
	for _, c := range []struct {
		name  string
		vocab []vocabEntry
		text  string
		want  []string // pieces after BOS and the space
	}{
		{"ab scores higher", []vocabEntry{{-1, "ab"}, {-2, "bc"}}, "abc", []string{"ab", "c"}},
		{"bc scores higher", []vocabEntry{{-2, "ab"}, {-1, "bc"}}, "abc", []string{"a", "bc"}},
		{"then abc", []vocabEntry{{-2, "ab"}, {-1, "bc"}, {-3, "abc"}}, "abc", []string{"abc"}},
		{"equal scores: leftmost", []vocabEntry{{-1, "aa"}}, "aaa", []string{"aa", "a"}},
		{"score beats position", []vocabEntry{{-2, "aa"}, {-1, "ab"}}, "aab", []string{"a", "ab"}},
		{"the space merges", []vocabEntry{{-1, " a"}, {-2, "ab"}}, "ab", []string{" a", "b"}},
		{"at llama2.c's floor: never", []vocabEntry{{-1e10, "ab"}}, "ab", []string{"a", "b"}},
		{"above the floor", []vocabEntry{{-9.9e9, "ab"}}, "ab", []string{"ab"}},
	} {
		bpe := tinyBPE(t, append(ordinaryPieces(" ", "a", "b", "c"), c.vocab...)...)
		want := append([]int{1}, idsOf(t, bpe, c.want...)...)
		if c.want[0][0] != ' ' {
			want = slices.Insert(want, 1, bpe.space)
		}
		got := bpe.Encode(c.text)
		if !slices.Equal(got, want) {
			t.Errorf("%s: Encode(%q) = %v, want %v %q", c.name, c.text, got, want, c.want)
		}
		if n := naiveEncode(bpe, c.text, true); !slices.Equal(n, got) {
			t.Errorf("%s: llama2.c's algorithm gives %v, Encode %v", c.name, n, got)
		}
	}
}

func TestBPEPiece(t *testing.T) {
	bpe := tinyBPE(t, ordinaryPieces(" ", " a", "b")...)
	sa, b := idsOf(t, bpe, " a")[0], idsOf(t, bpe, "b")[0]
	for _, c := range []struct {
		prev, id int
		want     string
		isNil    bool
	}{
		{1, sa, "a", false},        // after BOS the leading space goes
		{b, sa, " a", false},       // elsewhere it stays
		{1, b, "b", false},         // a piece without one is whole
		{b, 3 + 'A', "A", false},   // a byte token is its byte
		{1, 3 + ' ', " ", false},   // even a space, after BOS: it is no piece's leading space
		{b, 0, "", true},           // <unk>
		{b, 1, "", true},           // BOS
		{b, 2, "", true},           // EOS
		{b, -1, "", true},          // out of range
		{b, bpe.Vocab(), "", true}, // out of range
	} {
		got := bpe.Piece(c.prev, c.id)
		if string(got) != c.want || (got == nil) != c.isNil {
			t.Errorf("Piece(%d, %d) = %q, want %q", c.prev, c.id, got, c.want)
		}
	}
	if bpe.BOS() != 1 || bpe.Stop() != 1 || bpe.Vocab() != 259+3 {
		t.Fatalf("BOS %d, Stop %d, Vocab %d", bpe.BOS(), bpe.Stop(), bpe.Vocab())
	}
}

// roundTripTexts are texts every tokenizer must give back: ASCII, letters
// and symbols outside a small vocabulary, whitespace, and invalid UTF-8,
// which comes back with U+FFFD for each invalid byte.
var roundTripTexts = []string{
	"", "héllo 世界 🙂", "Once upon a time, there was a little girl named Lily.",
	" leading space", "two  spaces", "tabs\tand\nnewlines\n", "<0x41> \n<s>\n",
	"\xff\xfe", "a\x80b", "\xe4\xb8", "\xe4\xb8\x96\x96", "nul\x00byte",
}

func checkRoundTrip(t *testing.T, bpe *BPETokenizer, text string) {
	t.Helper()
	ids := bpe.Encode(text)
	if ids[0] != bpe.BOS() {
		t.Fatalf("Encode(%q) = %v does not start with BOS", text, ids)
	}
	for _, id := range ids[1:] {
		if id < bpeByte || id >= bpe.Vocab() {
			t.Fatalf("Encode(%q) = %v has id %d, outside the text tokens", text, ids, id)
		}
	}
	want := string([]rune(text))
	if got := DecodeText(bpe, -1, ids); got != want {
		t.Fatalf("DecodeText(Encode(%q)) = %q, want %q", text, got, want)
	}
}

func TestTokenizerRoundTrip(t *testing.T) {
	tiny := tinyBPE(t, append(ordinaryPieces(" ", "a", "é", "l", "o"), vocabEntry{-1, "ll"}, vocabEntry{-2, " h"})...)
	for _, text := range roundTripTexts {
		checkRoundTrip(t, tiny, text)
	}
	bpe := readTok512(t)
	for _, text := range roundTripTexts {
		checkRoundTrip(t, bpe, text)
	}
}

// TestStories260KEncode: on the model's own vocabulary, Encode gives what
// llama2.c's algorithm gives, lookups of specials and byte pieces and a
// BOS merge included.
func TestStories260KEncode(t *testing.T) {
	bpe := readTok512(t)
	for _, text := range append(slices.Clone(roundTripTexts), stories.Published(t)) {
		if got, want := bpe.Encode(text), naiveEncode(bpe, text, true); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, llama2.c's %v", text, got, want)
		}
	}
}

func TestTokenizerWrongVocab(t *testing.T) {
	_, tokPath := stories.Files(t)
	data, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, vocab := range []int{511, 513, 32000} {
		var ve *TokenizerVocabError
		if _, err := ReadTokenizer(tokPath, vocab); !errors.As(err, &ve) || ve.Have != 512 || ve.Want != vocab || ve.Path != tokPath {
			t.Errorf("vocab %d: %v, want a TokenizerVocabError of %s with 512 and %d tokens", vocab, err, tokPath, vocab)
		}
		if _, err := ParseTokenizer(data, vocab); !errors.As(err, &ve) || ve.Have != 512 || ve.Want != vocab {
			t.Errorf("vocab %d: ParseTokenizer: %v", vocab, err)
		}
	}
	// A file larger than a vocabulary of 4 could be is refused unread.
	var fe *TokenizerFormatError
	if _, err := ReadTokenizer(tokPath, 4); !errors.As(err, &fe) || fe.Field != "size" || fe.Value != float64(len(data)) {
		t.Errorf("vocab 4: %v, want a TokenizerFormatError for the size", err)
	}
}

func TestTokenizerMalformed(t *testing.T) {
	good := vocabEntries(ordinaryPieces(" ", "ab")...)
	file := func(maxLen int32, e []vocabEntry) []byte { return tokenizerFile(maxLen, e) }
	with := func(i int, e vocabEntry) []vocabEntry {
		c := slices.Clone(good)
		c[i] = e
		return c
	}
	without := func(i int) []vocabEntry { return slices.Delete(slices.Clone(good), i, i+1) }
	lengthAt := func(d []byte, token int, v int32) []byte { // sets the length field of an entry
		off := 4
		for range token {
			off += 8 + int(binary.LittleEndian.Uint32(d[off+4:]))
		}
		binary.LittleEndian.PutUint32(d[off+4:], uint32(v))
		return d
	}
	n := len(good)
	for _, c := range []struct {
		name  string
		data  []byte
		vocab int
		field string
		token int
	}{
		{"max_token_length 0", file(0, good), n, "max_token_length", -1},
		{"max_token_length too large", file(TokenPieceMaxBytes+1, good), n, "max_token_length", -1},
		{"piece longer than max_token_length", file(5, good), n, "length", 2}, // "\n</s>\n" is 6 bytes
		{"negative length", lengthAt(file(6, good), 7, -1), n, "length", 7},
		{"length past the end", lengthAt(file(6, good), n-1, 6), n, "entry", n - 1},
		{"NaN score", file(6, with(260, vocabEntry{float32(math.NaN()), "ab"})), n, "score", 260},
		{"infinite score", file(6, with(3, vocabEntry{float32(math.Inf(1)), "<0x00>"})), n, "score", 3},
		{"trailing bytes", append(file(6, good), 1, 2, 3), n, "entry", n},
		{"no header", []byte{7, 0}, n, "entry", -1},
		{"byte piece", file(6, with(3+0x41, vocabEntry{0, "<0x41 "})), n, "byte piece", 3 + 0x41},
		{"no space", file(6, without(259)), n - 1, "space", -1},
		{"no room for byte fallback", file(6, good[:258]), 258, "vocab", -1},
	} {
		_, err := ParseTokenizer(c.data, c.vocab)
		var fe *TokenizerFormatError
		if !errors.As(err, &fe) || fe.Field != c.field || fe.Token != c.token {
			t.Errorf("%s: %v, want a TokenizerFormatError for %s of token %d", c.name, err, c.field, c.token)
		}
	}
	var ve *TokenizerVocabError
	if _, err := ParseTokenizer(file(6, append(slices.Clone(good), vocabEntry{0, "x"})), n); !errors.As(err, &ve) || ve.Have != n+1 || ve.Want != n {
		t.Errorf("an entry too many: %v, want a TokenizerVocabError of %d and %d", err, n+1, n)
	}
	if _, err := ParseTokenizer(file(6, good), n); err != nil {
		t.Fatalf("the good file: %v", err)
	}
}

// FuzzBPEEncode: on the model's vocabulary every text encodes to BOS and
// text tokens, as llama2.c's algorithm does, and decodes back.
func FuzzBPEEncode(f *testing.F) {
	bpe := readTok512(f)
	for _, s := range roundTripTexts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		checkRoundTrip(t, bpe, text)
		if got, want := bpe.Encode(text), naiveEncode(bpe, text, true); !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) = %v, llama2.c's %v", text, got, want)
		}
	})
}

// fuzzVocab is a tokenizer of the fixed start, " ", and the pieces between
// "|" in spec (at most 64 of up to 12 bytes, empty ones included), each
// scored by its first byte modulo 4 so that equal scores are common.
func fuzzVocab(t *testing.T, spec string) *BPETokenizer {
	ordinary := ordinaryPieces(" ")
	for i, p := range strings.Split(spec, "|") {
		if i == 64 {
			break
		}
		p = p[:min(len(p), 12)]
		score := float32(-1)
		if p != "" {
			score = -float32(p[0] % 4)
		}
		ordinary = append(ordinary, vocabEntry{score, p})
	}
	return tinyBPE(t, ordinary...)
}

// FuzzBPEMerges: over vocabularies the fuzzer makes up, the heap merge
// equals the rescan, and every text decodes back.
func FuzzBPEMerges(f *testing.F) {
	f.Add("ab|bc|abc|aa| a| b", "abc aab aaa")
	f.Add("he|ll|hell|o|hello| h|l", "hello hello hell")
	f.Add("||a|", "aaaa")
	f.Add("é|世|界|世界", "héllo 世界 🙂")
	f.Fuzz(func(t *testing.T, spec, text string) {
		bpe := fuzzVocab(t, spec)
		checkRoundTrip(t, bpe, text)
		if got, want := bpe.Encode(text), naiveEncode(bpe, text, false); !slices.Equal(got, want) {
			t.Fatalf("vocabulary %q: Encode(%q) = %v, the rescan %v", spec, text, got, want)
		}
	})
}

// FuzzParseTokenizer: any bytes either parse into a tokenizer of the
// given vocabulary, which encodes and decodes, or are refused; nothing
// panics, and what parsing allocates is bounded by the input's size.
func FuzzParseTokenizer(f *testing.F) {
	good := vocabEntries(ordinaryPieces(" ", "ab", "a", "b")...)
	f.Add(tokenizerFile(6, good), len(good))
	f.Add(tokenizerFile(6, good), 300)
	f.Add(tokenizerFile(-1, good), len(good))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0x80, 0x7f, 1, 0, 0, 0}, 1)
	f.Fuzz(func(t *testing.T, data []byte, vocab int) {
		before := allocatedBytes()
		bpe, err := ParseTokenizer(data, vocab)
		if d, limit := allocatedBytes()-before, 64*uint64(len(data))+1<<20; d > limit {
			t.Fatalf("parsing %d bytes allocated %d", len(data), d)
		}
		if err != nil {
			return
		}
		if bpe.Vocab() != vocab {
			t.Fatalf("Vocab %d, want %d", bpe.Vocab(), vocab)
		}
		checkRoundTrip(t, bpe, string(data[:min(len(data), 64)]))
	})
}

// encodeBenchText is about n bytes of the model card's story, repeated.
func encodeBenchText(b *testing.B, n int) string {
	s := stories.Published(b) + "\n"
	return strings.Repeat(s, n/len(s)+1)[:n]
}

// BenchmarkBPEEncode encodes 100 KiB of story text with the model's
// vocabulary.
func BenchmarkBPEEncode(b *testing.B) {
	bpe := readTok512(b)
	text := encodeBenchText(b, 100<<10)
	b.SetBytes(int64(len(text)))
	tokens := 0
	for b.Loop() {
		tokens += len(bpe.Encode(text))
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkBPEEncodeHeapVsNaive times Encode and llama2.c's rescan on the
// same 4 KiB text in one run and reports how many times faster Encode is.
func BenchmarkBPEEncodeHeapVsNaive(b *testing.B) {
	bpe := readTok512(b)
	text := encodeBenchText(b, 4<<10)
	var heap, naive time.Duration
	for b.Loop() {
		t0 := time.Now()
		got := bpe.Encode(text)
		t1 := time.Now()
		want := naiveEncode(bpe, text, false)
		heap, naive = heap+t1.Sub(t0), naive+time.Since(t1)
		if !slices.Equal(got, want) {
			b.Fatal("Encode and the rescan differ")
		}
	}
	b.ReportMetric(naive.Seconds()/heap.Seconds(), "naive/heap")
}

// TestTokenizerFile checks tokenizerFile against the real tok512.bin,
// whose fixed start vocabEntries must reproduce byte for byte.
func TestTokenizerFile(t *testing.T) {
	_, tokPath := stories.Files(t)
	data, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	bpe := readTok512(t)
	e := vocabEntries()
	for i := len(e); i < bpe.Vocab(); i++ {
		e = append(e, vocabEntry{bpe.scores[i], string(bpe.pieces[i])})
	}
	if got := tokenizerFile(int32(bpe.maxLen), e); string(got) != string(data) {
		t.Fatalf("tokenizerFile does not rewrite %s", filepath.Base(tokPath))
	}
}
