package handoff

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/messages"
)

// vocabTokenizer has every id a token prompt can hold, BOS 1: all a token
// prompt needs of a tokenizer.
type vocabTokenizer struct{ engine.ByteTokenizer }

func (vocabTokenizer) Vocab() int { return TokenPromptIDMax + 1 }

func (vocabTokenizer) BOS() int { return 1 }

// TestTokenPromptRoundTrip: any tokens of the vocabulary, BOS first, come
// back from Encode as they went into TokenPrompt, in valid UTF-8 of at
// most 4 bytes a token that a GenerateRequest carries; ids about the
// surrogates, which UTF-8 cannot hold, and the largest included.
func TestTokenPromptRoundTrip(t *testing.T) {
	tok := vocabTokenizer{}
	l := Limits{ContextTokens: 1 << 20}
	check := func(tb interface{ Fatalf(string, ...any) }, ids []int) {
		p := TokenPrompt(ids)
		if !IsTokenPrompt(p) || !utf8.ValidString(p) || len(p) > 3+4*len(ids) {
			tb.Fatalf("TokenPrompt(%v) = %q", ids, p)
		}
		if err := (&messages.GenerateRequest{RequestID: 1, Tenant: "t", Prompt: p, MaxTokens: 1}).Validate(); err != nil {
			tb.Fatalf("TokenPrompt(%v) is no request's prompt: %v", ids, err)
		}
		if got, err := Encode(l, tok, p, true); err != nil || !slices.Equal(got, ids) {
			tb.Fatalf("Encode(TokenPrompt(%v)) = %v, %v", ids, got, err)
		}
	}
	check(t, []int{1, 0, 0x7f, 0x80, 0x7ff, 0x800, 0xd7ff, 0xd800, 0xdfff, 0xe000, 0xfffd, 0xfffd - 0x800, 0xffff, 0x10000,
		TokenPromptIDMax})
	rapid.Check(t, func(rt *rapid.T) {
		ids := append([]int{1}, rapid.SliceOfN(rapid.IntRange(0, TokenPromptIDMax), 0, 64).Draw(rt, "ids")...)
		check(rt, ids)
	})
}

// TestTokenPromptRefusals: Encode refuses a token prompt of what is no
// token, that does not start with BOS or has no tokens, with the place;
// and one over the context window, with its count, before reading it.
func TestTokenPromptRefusals(t *testing.T) {
	tok := vocabTokenizer{}
	l := Limits{ContextTokens: 8}
	for _, c := range []struct {
		name, prompt string
		index, token int
		msg          string
	}{
		{"outside", TokenPrompt([]int{1, 2, 5}), 2, -2, ""},
		{"not BOS", TokenPrompt([]int{2, 1}), 0, 2, "starts with token 2, not BOS (1)"},
		{"empty", TokenPrompt(nil), 0, -1, "starts with no token, not BOS (1)"},
		{"no UTF-8", TokenPrompt([]int{1}) + "\xff", 1, -1, "token 1 of a token prompt is no UTF-8"},
	} {
		ids, err := Encode(l, smallVocab{tok}, c.prompt, true)
		var te *TokenPromptError
		if ids != nil || !errors.As(err, &te) || te.Index != c.index || (c.token != -2 && te.Token != c.token) ||
			!strings.Contains(err.Error(), c.msg) || Wire(err).Code != messages.CodeBadRequest {
			t.Errorf("%s: %v, %v", c.name, ids, err)
		}
	}
	if _, err := Encode(l, smallVocab{tok}, TokenPrompt([]int{1, 2, 5}), true); err == nil ||
		err.Error() != "handoff: bad request: token 2 of a token prompt is 5, outside the vocabulary [0, 4)" {
		t.Errorf("outside: %v", err)
	}
	var long *PromptTooLongError
	if _, err := Encode(l, tok, TokenPrompt(make([]int, 9)), true); !errors.As(err, &long) || long.Tokens != 9 || long.Limit != 8 ||
		long.AtLeast {
		t.Errorf("9 tokens in a window of 8: %v", err)
	}
	// A text prompt is text, however like one it looks.
	if ids, err := Encode(Limits{ContextTokens: 64}, engine.ByteTokenizer{}, "x"+TokenPrompt([]int{1}), false); err != nil || len(ids) != 6 {
		t.Errorf("text: %v, %v", ids, err)
	}
	// From a sender that may not send tokens, a token prompt is refused,
	// however valid.
	var te *TokenPromptError
	if ids, err := Encode(l, tok, TokenPrompt([]int{1, 2}), false); ids != nil || !errors.As(err, &te) || te.Index != -1 ||
		!strings.Contains(err.Error(), "only a node's own API sends") || Wire(err).Code != messages.CodeBadRequest {
		t.Errorf("a token prompt from a tenant: %v, %v", ids, err)
	}
}

// smallVocab is a tokenizer of 4 tokens.
type smallVocab struct{ vocabTokenizer }

func (smallVocab) Vocab() int { return 4 }
