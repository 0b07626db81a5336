package handoff

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/messages"
)

// A prompt that is already the model's tokens (a chat the API rendered in
// the model's own template, whose control tokens no text may become)
// travels where a text prompt does (messages.GenerateRequest.Prompt and
// the RoutedRequest it becomes), so that every node that admits it reads
// the same tokens: tokenPromptMark, then one character per token. Encode
// reads it back. The mark is U+FDD0, a Unicode noncharacter: reserved for
// a program's own use, it starts no text a person writes, and the API
// refuses a text prompt that starts with it.
const tokenPromptMark = "\uFDD0"

// tokenPromptSkip is how far a token from the first surrogate (U+D800) on
// is moved, past the surrogates, which UTF-8 cannot hold.
const tokenPromptSkip = 0xE000 - 0xD800

// TokenPromptIDMax is the largest id TokenPrompt can write.
const TokenPromptIDMax = utf8.MaxRune - tokenPromptSkip

// TokenPrompt is the prompt of ids, tokens of the model, as Encode reads
// it back: the mark and a character per token, at most 4 bytes each, so
// that a prompt of messages.PromptTokensMax tokens fits
// messages.PromptBytesMax. Each id must be 0 to TokenPromptIDMax.
func TokenPrompt(ids []int) string {
	var b strings.Builder
	b.Grow(len(tokenPromptMark) + utf8.UTFMax*len(ids))
	b.WriteString(tokenPromptMark)
	for _, id := range ids {
		if id < 0 || id > TokenPromptIDMax {
			panic(fmt.Sprintf("handoff: token %d cannot be written in a prompt (0 to %d)", id, TokenPromptIDMax))
		}
		r := rune(id)
		if r >= 0xD800 {
			r += tokenPromptSkip
		}
		b.WriteRune(r)
	}
	return b.String()
}

// IsTokenPrompt says prompt is one TokenPrompt wrote, as Encode takes it.
func IsTokenPrompt(prompt string) bool { return strings.HasPrefix(prompt, tokenPromptMark) }

// TokenPromptError: a token prompt holds at Index what is no token of the
// model's Vocab (Token is its id, -1 for a byte that is no UTF-8), or does
// not start with the model's BOS (Index 0, Token what it starts with, -1
// for nothing), or came from a sender that may not send one (Index -1).
type TokenPromptError struct {
	Index, Token, Vocab, BOS int
}

func (e *TokenPromptError) Error() string {
	switch {
	case e.Index < 0:
		return "handoff: bad request: a prompt starts with U+FDD0, the mark of a prompt of tokens, which only a node's own API sends"
	case e.Index == 0 && e.Token >= 0 && e.Token < e.Vocab:
		return fmt.Sprintf("handoff: bad request: a token prompt starts with token %d, not BOS (%d)", e.Token, e.BOS)
	case e.Index == 0 && e.Token < 0:
		return fmt.Sprintf("handoff: bad request: a token prompt starts with no token, not BOS (%d)", e.BOS)
	case e.Token < 0:
		return fmt.Sprintf("handoff: bad request: token %d of a token prompt is no UTF-8", e.Index)
	}
	return fmt.Sprintf("handoff: bad request: token %d of a token prompt is %d, outside the vocabulary [0, %d)", e.Index, e.Token, e.Vocab)
}

// Wire is what a client is told of e.
func (e *TokenPromptError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBadRequest, Message: e.Error()}
}

// decodeTokenPrompt reads a TokenPrompt of tok's tokens: BOS first, each a
// token of the vocabulary, at most l's context window of them (counted
// before they are read).
func decodeTokenPrompt(l Limits, tok engine.Tokenizer, prompt string) ([]int, error) {
	s := prompt[len(tokenPromptMark):]
	if n := utf8.RuneCountInString(s); n > l.ContextTokens {
		return nil, &PromptTooLongError{Tokens: n, Limit: l.ContextTokens, Where: "context window"}
	}
	var ids []int
	for i, r := range s {
		id := int(r)
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], string(utf8.RuneError)):
			id = -1
		case r >= 0xE000:
			id -= tokenPromptSkip
		}
		if id < 0 || id >= tok.Vocab() || len(ids) == 0 && id != tok.BOS() {
			return nil, &TokenPromptError{Index: len(ids), Token: id, Vocab: tok.Vocab(), BOS: tok.BOS()}
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil, &TokenPromptError{Token: -1, Vocab: tok.Vocab(), BOS: tok.BOS()}
	}
	return ids, nil
}
