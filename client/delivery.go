package client

import (
	"fmt"
	"strings"

	"github.com/kvwarden/kvwarden/messages"
)

// delivery is what one Generate has handed its caller, across the
// attempts that carry it: the tokens passed to onToken and the text passed
// to OnText. A continuation is a new request for the same prompt and
// max_tokens through another endpoint; greedy decoding is deterministic,
// so it streams the same tokens again from the first, and delivery checks
// that what it already handed on comes back identical, suppresses it and
// passes on only what follows. The text after k tokens is a deterministic
// prefix of the answer's, so the text is skipped by bytes delivered. It is
// the pure core of the continuation: no goroutines, no I/O.
type delivery struct {
	tokens []uint32
	text   strings.Builder
	// Of the current attempt: the tokens and text bytes it has streamed.
	seen, seenText int
	// where is the current attempt's endpoint, for errors.
	where string
	// replayed counts the tokens continuations streamed again and
	// delivery suppressed.
	replayed int
}

// attempt starts the stream of a new attempt through endpoint where.
func (d *delivery) attempt(where string) {
	d.where, d.seen, d.seenText = where, 0, 0
}

// chunk takes a streamed chunk of the current attempt and returns what of
// it is new to the caller; an error (integrity) when it disagrees with what
// was delivered.
func (d *delivery) chunk(tokens []uint32, text string) ([]uint32, string, error) {
	var fresh []uint32
	for _, t := range tokens {
		if d.seen < len(d.tokens) {
			if d.tokens[d.seen] != t {
				return nil, "", d.mismatch(fmt.Sprintf("token %d is %d, delivered as %d", d.seen, t, d.tokens[d.seen]))
			}
			d.replayed++
		} else {
			d.tokens = append(d.tokens, t)
			fresh = append(fresh, t)
		}
		d.seen++
	}
	// The attempt's text so far never runs past what was delivered: once
	// it reaches the end, what follows is delivered too.
	old := d.text.String()
	overlap := min(len(old)-d.seenText, len(text))
	if old[d.seenText:d.seenText+overlap] != text[:overlap] {
		return nil, "", d.mismatch(fmt.Sprintf("the text from byte %d differs from the %d bytes delivered", d.seenText, len(old)))
	}
	d.seenText += len(text)
	d.text.WriteString(text[overlap:])
	return fresh, text[overlap:], nil
}

// result checks an attempt's final answer against what was delivered: it
// must begin with every token and every byte of text handed on.
func (d *delivery) result(tokens []uint32, text string) error {
	if len(tokens) < len(d.tokens) {
		return d.mismatch(fmt.Sprintf("the answer has %d tokens, %d were delivered", len(tokens), len(d.tokens)))
	}
	for i, t := range d.tokens {
		if tokens[i] != t {
			return d.mismatch(fmt.Sprintf("the answer's token %d is %d, delivered as %d", i, tokens[i], t))
		}
	}
	if !strings.HasPrefix(text, d.text.String()) {
		return d.mismatch(fmt.Sprintf("the answer's text does not begin with the %d bytes delivered", d.text.Len()))
	}
	return nil
}

// mismatch is the integrity failure of an answer that disagrees with what
// the caller already has: withheld, never wrong output.
func (d *delivery) mismatch(what string) *messages.WireError {
	return &messages.WireError{Code: messages.CodeIntegrity, Where: d.where,
		Message: "the answer through " + d.where + " disagrees with what was already delivered: " + what,
		Have:    uint64(d.seen), Limit: uint64(len(d.tokens))}
}
