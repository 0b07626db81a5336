package engine

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvwarden/kvwarden/internal/stories"
)

// storiesVocab is the vocabulary of stories260K-f32.gguf as the GGUF
// reader finds it.
func storiesVocab(tb testing.TB) *GGUFVocab {
	tb.Helper()
	m, err := readGGUF(stories.GGUF(tb, "f32"), GGUFOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return &m.vocab
}

// tok512Vocab is tok512.bin converted as the README says the GGUF files
// were: spaces written "▁", BOS and EOS "<s>" and "</s>", ids 0 to 2
// unknown and control, 3 to 258 byte tokens, the rest normal.
func tok512Vocab(tb testing.TB) *GGUFVocab {
	bpe := readTok512(tb)
	v := &GGUFVocab{Model: "llama", Scores: bpe.scores, BOS: 1, EOS: 2, Unknown: 0, Padding: -1, AddBOS: true,
		AddSpacePrefix: true}
	for i, p := range bpe.pieces {
		typ := int32(tokenNormal)
		switch {
		case i == 0:
			typ = tokenUnknown
		case i < bpeByte:
			typ = tokenControl
		case i < bpeOrdinary:
			typ = tokenByte
		}
		piece := strings.ReplaceAll(string(p), " ", spmSpace)
		if typ == tokenControl {
			piece = []string{"", "<s>", "</s>"}[i]
		}
		v.Tokens, v.Types = append(v.Tokens, piece), append(v.Types, typ)
	}
	return v
}

func mustSPM(tb testing.TB, v *GGUFVocab) *spmTokenizer {
	tb.Helper()
	t, err := newSPMTokenizer("test.gguf", v)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// spmAgreeingTexts are texts on which llama2.c's encoding and llama.cpp's
// must agree: every valid UTF-8 text, and invalid UTF-8 whose characters
// both cut alike (lone continuation bytes, sequences cut short at the end
// of the text, overlong and surrogate forms).
var spmAgreeingTexts = append(slices.DeleteFunc(slices.Clone(roundTripTexts), func(s string) bool { return s == "a\x80b" }),
	" ", "  ", "\n", "\n\n\n", "a", "Hello, World!", "don't stop; go: (now) [then] {end}?!",
	"line one\nline two\r\nline three\ttabbed", "Lily's mom said, \"Lily, let's go to the park.\"",
	"naïve café façade — “quoted” ‘single’ …", "日本語のテキスト", "Ελληνικά κείμενα", "🙂🙃🤖 emoji 👩‍👩‍👧",
	"<s> </s> <unk> <0x0A>", "trailing spaces   ", "   leading spaces",
	"\x80\x81\xbf", "abc\xe2\x82", "\xc0\x80 overlong", "\xed\xa0\x80 surrogate", "\xf0\x9f\x98\x80\x80",
	strings.Repeat("Once upon a time there was a cat. ", 300))

// TestSPMStories: the GGUF file's vocabulary is tok512.bin's, and its
// tokenizer encodes every text as tok512.bin's does and decodes every
// token alike.
func TestSPMStories(t *testing.T) {
	v := storiesVocab(t)
	conv := tok512Vocab(t)
	if !slices.Equal(v.Tokens, conv.Tokens) || !slices.Equal(v.Scores, conv.Scores) || !slices.Equal(v.Types, conv.Types) ||
		v.BOS != 1 || v.EOS != 2 || v.Unknown != 0 || !v.AddBOS || v.AddEOS || !v.AddSpacePrefix {
		t.Fatalf("the GGUF vocabulary is not tok512.bin's as the README converts it")
	}
	spm, bpe := mustSPM(t, v), readTok512(t)
	if spm.BOS() != bpe.BOS() || spm.Stop() != 2 || spm.Vocab() != bpe.Vocab() {
		t.Fatalf("BOS %d, Stop %d, Vocab %d", spm.BOS(), spm.Stop(), spm.Vocab())
	}
	// "▁" is 3 bytes where tok512.bin has a space: its longest, " the",
	// is 7 bytes there.
	if spm.PieceBytesMax() < bpe.PieceBytesMax() || spm.PieceBytesMax() > bpe.PieceBytesMax()+2 {
		t.Errorf("PieceBytesMax %d; tok512.bin's is %d", spm.PieceBytesMax(), bpe.PieceBytesMax())
	}
	for _, text := range append(slices.Clone(spmAgreeingTexts), stories.Published(t)) {
		got, want := spm.Encode(text), bpe.Encode(text)
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, tok512.bin's %v", text, got, want)
		}
		if d, w := DecodeText(spm, -1, got), DecodeText(bpe, -1, want); d != w {
			t.Errorf("DecodeText(Encode(%q)) = %q, tok512.bin's %q", text, d, w)
		}
	}
	for id := -1; id <= spm.Vocab(); id++ {
		for _, prev := range []int{spm.BOS(), id, 0, 2} {
			if got, want := spm.Piece(prev, id), bpe.Piece(prev, id); string(got) != string(want) || (got == nil) != (want == nil) {
				t.Errorf("Piece(%d, %d) = %q, tok512.bin's %q", prev, id, got, want)
			}
		}
	}
}

// TestSPMStoriesProperties: on the stories vocabulary, for any valid
// UTF-8 text, Encode is tok512.bin's, starts with BOS, holds only tokens
// that stand for text, decodes back to the text, and is at least as many
// tokens as EncodeWithin assumes; for any bytes at all it is what
// llama.cpp's algorithm, done the slow way, gives.
func TestSPMStoriesProperties(t *testing.T) {
	spm, bpe := mustSPM(t, storiesVocab(t)), readTok512(t)
	chars := rapid.SampledFrom([]rune("  \n\tabcdeghilmnorstuwy.,'!?éü世界🙂<>0xAF"))
	rapid.Check(t, func(rt *rapid.T) {
		text := string(rapid.SliceOfN(chars, 0, 64).Draw(rt, "runes"))
		ids := spm.Encode(text)
		if want := bpe.Encode(text); !slices.Equal(ids, want) {
			rt.Fatalf("Encode(%q) = %v, tok512.bin's %v", text, ids, want)
		}
		if ids[0] != spm.BOS() {
			rt.Fatalf("Encode(%q) = %v does not start with BOS", text, ids)
		}
		for _, id := range ids[1:] {
			if typ := spm.types[id]; typ != tokenNormal && typ != tokenByte {
				rt.Fatalf("Encode(%q) = %v holds token %d of type %d", text, ids, id, typ)
			}
		}
		if got := DecodeText(spm, -1, ids); got != text {
			rt.Fatalf("DecodeText(Encode(%q)) = %q", text, got)
		}
		if least := 1 + (len(text)+spm.PieceBytesMax()-1)/spm.PieceBytesMax(); len(ids) < least {
			rt.Fatalf("Encode(%q) is %d tokens, fewer than EncodeWithin's %d", text, len(ids), least)
		}
	})
	rapid.Check(t, func(rt *rapid.T) {
		raw := rapid.SliceOfN(rapid.SampledFrom([]byte("ab \xc3\xa9\x80\xbf\xe2\x96\x81\xf0\x9f\xffs")), 0, 48).Draw(rt, "bytes")
		text := string(raw)
		if got, want := spm.Encode(text), naiveSPM(spm, text); !slices.Equal(got, want) {
			rt.Fatalf("Encode(%q) = %v, llama.cpp's algorithm %v", text, got, want)
		}
		if least := 1 + (len(text)+spm.PieceBytesMax()-1)/spm.PieceBytesMax(); len(spm.Encode(text)) < least {
			rt.Fatalf("Encode(%q) is fewer tokens than EncodeWithin's %d", text, least)
		}
	})
}

// naiveSPM is llama.cpp's tokenize of text for t's vocabulary, the slow
// way: user-defined tokens cut out one token at a time, longest first;
// then each run between them, a space prefixed where llama.cpp prefixes
// one, rescanned for the best pair after every merge.
func naiveSPM(t *spmTokenizer, text string) []int {
	return naiveTokenize(t, text, tokenUserDefined)
}

// naiveTokenize is naiveSPM, cutting out the tokens of types cut: with
// control and unknown ones besides user-defined, llama.cpp's tokenize
// with special tokens parsed.
func naiveTokenize(t *spmTokenizer, text string, cut ...int32) []int {
	var user []int
	for id, typ := range t.types {
		if slices.Contains(cut, typ) {
			user = append(user, id)
		}
	}
	slices.SortStableFunc(user, func(a, b int) int { return len(t.pieces[b]) - len(t.pieces[a]) })
	var frags []fragment
	if text != "" {
		frags = []fragment{{text: text, token: -1}}
	}
	for _, id := range user {
		p := t.pieces[id]
		var out []fragment
		for _, f := range frags {
			if f.token >= 0 {
				out = append(out, f)
				continue
			}
			rest := f.text
			for i := strings.Index(rest, p); i >= 0; i = strings.Index(rest, p) {
				if i > 0 {
					out = append(out, fragment{text: rest[:i], token: -1})
				}
				out = append(out, fragment{token: id})
				rest = rest[i+len(p):]
			}
			if rest != "" {
				out = append(out, fragment{text: rest, token: -1})
			}
		}
		frags = out
	}
	ids := []int{t.bos}
	afterToken := true
	for _, f := range frags {
		if f.token >= 0 {
			ids, afterToken = append(ids, f.token), true
			continue
		}
		s := strings.ReplaceAll(f.text, " ", spmSpace)
		if t.addSpace && afterToken {
			s = spmSpace + s
		}
		afterToken = false
		var syms []string
		for i := 0; i < len(s); {
			n := 1 // ASCII, or a continuation byte
			switch {
			case s[i] >= 0xf0:
				n = 4
			case s[i] >= 0xe0:
				n = 3
			case s[i] >= 0xc0:
				n = 2
			}
			j := min(len(s), i+n)
			syms = append(syms, s[i:j])
			i = j
		}
		for {
			best, bestScore := -1, float32(0)
			for i := 0; i+1 < len(syms); i++ {
				if id, ok := t.index[syms[i]+syms[i+1]]; ok && (best < 0 || t.scores[id] > bestScore) {
					best, bestScore = i, t.scores[id]
				}
			}
			if best < 0 {
				break
			}
			syms = slices.Replace(syms, best, best+2, syms[best]+syms[best+1])
		}
		for _, sym := range syms {
			if id, ok := t.index[sym]; ok {
				ids = append(ids, id)
				continue
			}
			for _, b := range []byte(sym) {
				ids = append(ids, t.fallback[b])
			}
		}
	}
	if t.addEOS {
		ids = append(ids, t.eos)
	}
	return ids
}

// TestSPMCutsAsLlamaCpp: a leading byte takes as many bytes as it says its
// character has, continuation bytes or not, as llama.cpp cuts text
// (llama2.c cuts at the first byte that is no continuation), so that what
// it takes falls back to byte tokens whole.
func TestSPMCutsAsLlamaCpp(t *testing.T) {
	spm := mustSPM(t, storiesVocab(t))
	b := func(c byte) int { return bpeByte + int(c) }
	sp := spm.index[spmSpace]
	for _, c := range []struct {
		text string
		want []int
	}{
		{"\xc3A", []int{1, sp, b(0xc3), b('A')}},                               // "A" is a piece, but the cut takes it
		{"\xffabc", []int{1, sp, b(0xff), b('a'), b('b'), b('c')}},             // 0xFF says 4 bytes
		{"\xe2\x96", []int{1, sp, b(0xe2), b(0x96)}},                           // cut short by the end
		{"\xf0\x9f\x98\x80", []int{1, sp, b(0xf0), b(0x9f), b(0x98), b(0x80)}}, // 🙂 is no piece
	} {
		if got := spm.Encode(c.text); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
		if got := naiveSPM(spm, c.text); !slices.Equal(got, c.want) {
			t.Errorf("the slow way, Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

// specialVocab is a small SentencePiece vocabulary: unknown, BOS, EOS,
// the byte tokens, ordinary pieces scored by length, and the extra tokens
// given as "piece/type".
func specialVocab(extra ...string) *GGUFVocab {
	v := &GGUFVocab{Model: "llama", BOS: 1, EOS: 2, Unknown: 0, Padding: -1, AddBOS: true, AddSpacePrefix: true,
		Tokens: []string{"<unk>", "<s>", "</s>"}, Types: []int32{tokenUnknown, tokenControl, tokenControl}}
	for b := range 256 {
		v.Tokens, v.Types = append(v.Tokens, fmt.Sprintf("<0x%02X>", b)), append(v.Types, tokenByte)
	}
	for _, p := range []string{"▁", "a", "b", "c", "▁a", "▁b", "ab", "▁ab", "abc", "▁abc", "<", ">", "|", "m", "e", "n", "d"} {
		v.Tokens, v.Types = append(v.Tokens, p), append(v.Types, tokenNormal)
	}
	for _, e := range extra {
		p, typ, _ := strings.Cut(e, "/")
		v.Tokens, v.Types = append(v.Tokens, p), append(v.Types, int32(typ[0]-'0'))
	}
	for i, p := range v.Tokens {
		score := float32(0)
		if v.Types[i] == tokenNormal {
			score = float32(len(p))
		}
		v.Scores = append(v.Scores, score)
	}
	return v
}

// TestSPMSentencePieceSpace: a "▁" in a text is a space to SentencePiece:
// it merges with what follows as a space would, and decodes as one.
func TestSPMSentencePieceSpace(t *testing.T) {
	spm := mustSPM(t, storiesVocab(t))
	if got, want := spm.Encode("a\u2581time\u2581"), spm.Encode("a time "); !slices.Equal(got, want) {
		t.Errorf("Encode(\"a▁time▁\") = %v, Encode(\"a time \") %v", got, want)
	}
	if got := DecodeText(spm, -1, spm.Encode("\u2581x")); got != " x" {
		t.Errorf("\"▁x\" decodes to %q", got)
	}
}

// TestSPMUserDefined: a user-defined token is taken whole from text, the
// longest first, before merging; the text after it gets a space prefix,
// as llama.cpp's does; it decodes to its piece as it is. A control token
// and an unknown one never come from text, and decode to nothing, as do
// unused and undefined ones.
func TestSPMUserDefined(t *testing.T) {
	spm := mustSPM(t, specialVocab("<tag>/4", "<tag>>/4", "a▁b/4", "<ctl>/3", "ctl/5", "c▁d/0"))
	id := func(p string) int { return slices.Index(spm.pieces, p) }
	sp, sab := id("▁"), id("▁ab")
	for _, c := range []struct {
		text string
		want []int
	}{
		{"ab<tag>ab", []int{1, sab, id("<tag>"), sab}},
		{"ab<tag>>ab", []int{1, sab, id("<tag>>"), sab}}, // the longest first
		{"<tag>", []int{1, id("<tag>")}},                 // no text, no space
		{"a▁b", []int{1, id("a▁b")}},                     // matched as the text holds it
		{"x a▁b", []int{1, sp, spm.fallback['x'], id("▁"), id("a▁b")}},
		{"a b", []int{1, id("▁a"), id("▁b")}}, // a space is no "▁" of a user-defined piece
		{"<ctl>", []int{1, id("▁"), id("<"), id("c"), spm.fallback['t'], spm.fallback['l'], id(">")}},
		{"ctl", []int{1, id("▁"), id("c"), spm.fallback['t'], spm.fallback['l']}},
	} {
		if got := spm.Encode(c.text); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
		if got := naiveSPM(spm, c.text); !slices.Equal(got, c.want) {
			t.Errorf("the slow way, Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
	for p, want := range map[string]string{"<tag>": "<tag>", "a▁b": "a▁b", "▁ab": " ab", "<ctl>": "", "ctl": "", "c▁d": "",
		"<unk>": "", "<s>": "", "</s>": "", "<0x41>": "A"} {
		if got := string(spm.Piece(-1, id(p))); got != want {
			t.Errorf("Piece of %q = %q, want %q", p, got, want)
		}
	}
	if got := spm.PieceBytesMax(); got != len("<tag>>") {
		t.Errorf("PieceBytesMax %d, want %d (<tag>>)", got, len("<tag>>"))
	}
}

// TestSPMEndOfGeneration: a piece llama.cpp takes for an end of turn is a
// control token whatever type the file gives it.
func TestSPMEndOfGeneration(t *testing.T) {
	spm := mustSPM(t, specialVocab("<|im_end|>/4", "<end_of_turn>/1"))
	for _, p := range []string{"<|im_end|>", "<end_of_turn>"} {
		id := slices.Index(spm.pieces, p)
		if spm.types[id] != tokenControl || spm.Piece(-1, id) != nil || slices.Contains(spm.Encode("x"+p), id) {
			t.Errorf("%q: type %d, piece %q, taken from text: %v", p, spm.types[id], spm.Piece(-1, id), spm.Encode(p))
		}
	}
}

// TestSPMFallback: a byte without a byte token is the piece of that byte,
// else the unknown token; a vocabulary without either is refused.
func TestSPMFallback(t *testing.T) {
	v := &GGUFVocab{Model: "llama", Tokens: []string{"<unk>", "<s>", "</s>", "▁", "a", "▁a"},
		Types: []int32{tokenUnknown, tokenControl, tokenControl, tokenNormal, tokenNormal, tokenNormal},
		BOS:   -1, EOS: -1, Unknown: -1, Padding: -1, AddSpacePrefix: true}
	spm := mustSPM(t, v)
	if got, want := spm.Encode("a\xc3\xa9 aa"), []int{1, 5, 0, 0, 5, 4}; !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if spm.BOS() != 1 || spm.Stop() != 2 {
		t.Errorf("BOS %d, Stop %d: llama.cpp's defaults are 1 and 2", spm.BOS(), spm.Stop())
	}
	v.Tokens = v.Tokens[1:]
	v.Types = v.Types[1:]
	var ve *VocabError
	if _, err := newSPMTokenizer("x.gguf", v); !errors.As(err, &ve) || ve.Field != "fallback" || ve.Value != 0 ||
		!strings.Contains(err.Error(), "x.gguf has no token for the byte 0x00") {
		t.Errorf("no unknown token: %v", err)
	}
}

// TestSPMFallbackTypes: a byte that no piece covers falls back only to a
// token text may become: its byte token <0xHH>, else a normal or
// user-defined piece of the byte, else the unknown token; never to a
// token of another type that has either piece, such as a control
// "<0x78>". Without any of them the vocabulary is refused.
func TestSPMFallbackTypes(t *testing.T) {
	for _, c := range []struct {
		name  string
		typ   int32  // <0x78>'s type
		extra string // a piece "x", as "piece/type"
		want  string // the piece 'x' falls back to
	}{
		{"byte", tokenByte, "x/3", "<0x78>"},
		{"control byte piece", tokenControl, "", "<unk>"},
		{"normal piece", tokenControl, "x/1", "x"},
		{"user-defined piece", tokenUnused, "x/4", "x"},
		{"control piece", tokenControl, "x/3", "<unk>"},
		{"unused piece", tokenUndefined, "x/5", "<unk>"},
	} {
		var extra []string
		if c.extra != "" {
			extra = append(extra, c.extra)
		}
		v := specialVocab(extra...)
		v.Types[3+'x'] = c.typ
		spm := mustSPM(t, v)
		if got := spm.pieces[spm.fallback['x']]; got != c.want {
			t.Errorf("%s: 'x' falls back to %q, want %q", c.name, got, c.want)
		}
		for _, id := range spm.Encode("x ax \xf0x") {
			if typ := spm.types[id]; typ == tokenControl && id != spm.BOS() || typ == tokenUnused || typ == tokenUndefined {
				t.Errorf("%s: text encodes to %q, of type %d", c.name, spm.pieces[id], typ)
			}
		}
	}
	v := specialVocab()
	v.Types[3+'x'], v.Types[0] = tokenControl, tokenControl
	var ve *VocabError
	if _, err := newSPMTokenizer("x.gguf", v); !errors.As(err, &ve) || ve.Field != "fallback" || ve.Value != 'x' {
		t.Errorf("a control <0x78> and no unknown token: %v", err)
	}
}

// TestSPMSpecialOverlaps: user-defined pieces that overlap in every way
// are taken from text as llama.cpp takes them, the longest first, each
// from the left where no piece taken before overlaps it, not the longest
// at the leftmost place.
func TestSPMSpecialOverlaps(t *testing.T) {
	spm := mustSPM(t, specialVocab("y/4", "xy/4", "yzx/4", "zxyz/4", "xyzxy/4", "yzxyzx/4", "zzzzzzz/4", "zzzzzzzzz/4"))
	for text, want := range map[string][]string{
		"xyzxyzx":           {" ", "x", "yzxyzx"},         // not xyzxy at the left
		"zxyzxy":            {" ", "z", "xyzxy"},          // zxyz is shorter
		"yzxyzxy":           {"yzxyzx", "y"},              // xyzxy and xy end there too, each overlapping yzxyzx
		"ayzxyzxya":         {" a", "yzxyzx", "y", " a"},  // the text after a token is prefixed a space
		"zzzzzzzzzzz":       {"zzzzzzzzz", " ", "z", "z"}, // the 9 from the left, no 7 in the rest
		"zzzzzzzzzzzzzzzzz": {"zzzzzzzzz", "zzzzzzz", " ", "z"},
	} {
		var got []string
		for _, id := range spm.Encode(text)[1:] {
			got = append(got, string(spm.Piece(-1, id)))
		}
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %q, want %q", text, got, want)
		}
	}
	rapid.Check(t, func(rt *rapid.T) {
		text := rapid.StringMatching(`[xyz a]{0,40}`).Draw(rt, "text")
		if got, want := spm.Encode(text), naiveSPM(spm, text); !slices.Equal(got, want) {
			rt.Fatalf("Encode(%q) = %v, llama.cpp's algorithm %v", text, got, want)
		}
	})
}

// TestSPMRefusals: each fault of a vocabulary is refused with the token
// and what is wrong.
func TestSPMRefusals(t *testing.T) {
	for _, c := range []struct {
		name  string
		edit  func(v *GGUFVocab)
		field string
		token int
		msg   string
	}{
		{"no tokens", func(v *GGUFVocab) { v.Tokens, v.Types, v.Scores = nil, nil, nil }, "size", -1, "has no tokens"},
		{"scores", func(v *GGUFVocab) { v.Scores = v.Scores[1:] }, "length", -1, "has 275 scores for 276 tokens"},
		{"empty", func(v *GGUFVocab) { v.Tokens[270] = "" }, "piece", 270, "token 270: its piece is 0 bytes"},
		{"long", func(v *GGUFVocab) { v.Tokens[270] = strings.Repeat("x", TokenPieceMaxBytes+1) }, "piece", 270, "1025 bytes"},
		{"duplicate", func(v *GGUFVocab) { v.Tokens[275] = "▁ab" }, "duplicate", 275, `piece "▁ab" is token 266's too`},
		{"score", func(v *GGUFVocab) { v.Scores[262] = float32(math.NaN()) }, "score", 262, "score NaN must be finite"},
		{"infinite", func(v *GGUFVocab) { v.Scores[262] = float32(math.Inf(-1)) }, "score", 262, "score -Inf"},
		{"type", func(v *GGUFVocab) { v.Types[262] = 7 }, "type", 262, "type 7; types are 0 to 6"},
		{"byte", func(v *GGUFVocab) { v.Types[262] = tokenByte }, "byte", 262, `its piece "c" is not <0xHH>`},
		{"byte hex", func(v *GGUFVocab) { v.Tokens[3] = "<0xG0>" }, "byte", 3, "<0xG0>"},
		{"bos", func(v *GGUFVocab) { v.BOS = 400 }, "bos", 400, "of 276 tokens: its BOS token 400"},
		{"eos", func(v *GGUFVocab) { v.EOS = 276 }, "eos", 276, "EOS token 276"},
	} {
		v := specialVocab()
		c.edit(v)
		_, err := NewGGUFTokenizer("m.gguf", v)
		var ve *VocabError
		if !errors.As(err, &ve) || ve.Field != c.field || ve.Token != c.token || ve.Path != "m.gguf" ||
			!strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want a VocabError of m.gguf, token %d, %s: %q", c.name, err, c.token, c.field, c.msg)
		}
	}
	// Hex digits of either case are a byte, as llama.cpp reads them.
	v := specialVocab()
	v.Tokens[3+0xab] = "<0xab>"
	spm := mustSPM(t, v)
	if got := spm.Piece(-1, 3+0xab); string(got) != "\xab" {
		t.Errorf("<0xab> decodes to %q", got)
	}
}

func TestTokenizerModelRefused(t *testing.T) {
	for _, c := range []struct{ model, pre, want string }{
		{"gpt2", "llama-bpe", "engine: m.gguf tokenizer model gpt2 (pre-tokenizer llama-bpe) is not supported yet; supported: llama (SentencePiece)"},
		{"bert", "", "engine: m.gguf tokenizer model bert is not supported yet; supported: llama (SentencePiece)"},
	} {
		v := specialVocab()
		v.Model, v.Pre = c.model, c.pre
		var me *TokenizerModelError
		if _, err := NewGGUFTokenizer("m.gguf", v); !errors.As(err, &me) || me.Model != c.model || me.Pre != c.pre ||
			err.Error() != c.want {
			t.Errorf("%s: %v, want %q", c.model, err, c.want)
		}
	}
}

// TestSPMFlags: without a space prefix nothing is prefixed and no space is
// dropped after BOS; with add_eos_token EOS ends every prompt.
func TestSPMFlags(t *testing.T) {
	v := specialVocab()
	v.AddSpacePrefix, v.AddEOS = false, true
	spm := mustSPM(t, v)
	id := func(p string) int { return slices.Index(spm.pieces, p) }
	if got, want := spm.Encode("ab ab"), []int{1, id("ab"), id("▁ab"), 2}; !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if got, want := spm.Encode(""), []int{1, 2}; !slices.Equal(got, want) {
		t.Errorf("Encode(\"\") = %v, want %v", got, want)
	}
	if got := string(spm.Piece(1, id("▁ab"))); got != " ab" {
		t.Errorf("after BOS without a space prefix, %q", got)
	}
}

// TestSPMFingerprintData: what decides encoding is in the fingerprint
// data; a score changes it.
func TestSPMFingerprintData(t *testing.T) {
	a := mustSPM(t, specialVocab()).fingerprintData()
	v := specialVocab()
	v.Scores[270]++
	if b := mustSPM(t, v).fingerprintData(); string(a) == string(b) {
		t.Error("a changed score leaves the fingerprint data alike")
	}
	v = specialVocab()
	v.AddSpacePrefix = false
	if b := mustSPM(t, v).fingerprintData(); string(a) == string(b) {
		t.Error("add_space_prefix leaves the fingerprint data alike")
	}
}

// TestSPMSmallVocabRoundTrip: on a small vocabulary, where many
// characters fall back to bytes and "▁" is a piece of its own, every text
// decodes back and encodes as llama.cpp's algorithm does.
//
// A "▁" in a text is no part of this: it encodes as a space does, as in
// SentencePiece, and decodes as one (TestSPMSentencePieceSpace).
func TestSPMSmallVocabRoundTrip(t *testing.T) {
	spm := mustSPM(t, specialVocab())
	rapid.Check(t, func(rt *rapid.T) {
		text := rapid.StringMatching(`[ab cé\n]{0,24}`).Draw(rt, "text")
		ids := spm.Encode(text)
		if got := DecodeText(spm, -1, ids); got != text {
			rt.Fatalf("DecodeText(Encode(%q)) = %q (%v)", text, got, ids)
		}
		if got := naiveSPM(spm, text); !slices.Equal(got, ids) {
			rt.Fatalf("Encode(%q) = %v, llama.cpp's algorithm %v", text, ids, got)
		}
	})
}

// BenchmarkSPMEncode encodes 100 KiB of story text with the model's GGUF
// vocabulary.
func BenchmarkSPMEncode(b *testing.B) {
	spm := mustSPM(b, storiesVocab(b))
	text := encodeBenchText(b, 100<<10)
	b.SetBytes(int64(len(text)))
	tokens := 0
	for b.Loop() {
		tokens += len(spm.Encode(text))
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkSPMSpecialSplit cuts 64 KiB of text at 512 user-defined
// tokens, "<z", "<zzz", … of every even length to 1024, all starting with
// "<": text of "<" alone, each byte the start of a piece the next byte
// ends; the longest piece but its last "z", over and over, each "<" the
// start of 511 pieces the text holds; and text that holds no "<". Each
// costs about as much as the others, a step of the automaton a byte: a
// table lookup at the root and a map lookup or a few elsewhere, not a
// lookup for each length of piece that starts with the byte.
func BenchmarkSPMSpecialSplit(b *testing.B) {
	var extra []string
	for l := 2; l <= TokenPieceMaxBytes; l += 2 {
		extra = append(extra, "<"+strings.Repeat("z", l-1)+"/4")
	}
	spm := mustSPM(b, specialVocab(extra...))
	const n = 64 << 10
	for _, c := range []struct{ name, unit string }{
		{"lt", "<"}, {"prefixes", "<" + strings.Repeat("z", TokenPieceMaxBytes-2)}, {"plain", "ab c"},
	} {
		text := strings.Repeat(c.unit, n/len(c.unit))
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				spm.userDefined.split(text)
			}
		})
	}
}
