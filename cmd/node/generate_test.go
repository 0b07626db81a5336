package main

import (
	"strings"
	"testing"
	"time"
)

// TestTokenPrinter: the streamed text is written as it comes, what the
// stream held back is written from the answer at the end, and on a
// terminal a control character is written as its escape, not obeyed.
func TestTokenPrinter(t *testing.T) {
	for _, tc := range []struct {
		escape bool
		chunks []string
		answer string
		want   string
	}{
		{false, []string{"Once", " upon\n"}, "Once upon\na time", "Once upon\na time"},
		{false, []string{"caf"}, "café", "café"}, // "é" held back: its bytes came in the last token
		{true, []string{"red \x1b[31mtext\x1b[0m\t\n"}, "red \x1b[31mtext\x1b[0m\t\n\u0085", `red \x1b[31mtext\x1b[0m` + "\t\n" + `\u0085`},
		{true, []string{"\x7f"}, "\x7f\xff", `\x7f` + "\uFFFD"},
	} {
		var out strings.Builder
		p := &tokenPrinter{w: &out, start: time.Now(), escape: tc.escape}
		for _, c := range tc.chunks {
			p.token(0)
			p.text(c)
		}
		p.rest(tc.answer)
		p.finish(false)
		p.text("after the end")
		if out.String() != tc.want {
			t.Errorf("chunks %q, answer %q: wrote %q, want %q", tc.chunks, tc.answer, out.String(), tc.want)
		}
	}
}
