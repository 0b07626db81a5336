// Package mistake plants mistakes, one at a time, into the files a check
// reads, and requires the check to report each: the tests of
// deploy/kubernetes and deploy/monitoring keep their checks honest with it,
// since a check that stopped looking would pass the files as they are.
package mistake

import (
	"strings"
	"testing"
)

// Plant is text with old, which text must hold exactly once (else t
// fails: the mistake would be planted nowhere, or somewhere unmeant),
// replaced by new.
func Plant(t testing.TB, text, old, new string) string {
	t.Helper()
	if n := strings.Count(text, old); n != 1 {
		t.Fatalf("the text holds %q %d times, want once", old, n)
	}
	return strings.Replace(text, old, new, 1)
}

// Caught fails t unless one of problems, what the check said of the files
// with planted in them, contains want; it logs the one that does.
func Caught(t testing.TB, planted, want string, problems []string) {
	t.Helper()
	for _, p := range problems {
		if strings.Contains(p, want) {
			t.Logf("caught: %s", p)
			return
		}
	}
	t.Errorf("planted %q; want a problem containing %q, got %d:\n%s", planted, want, len(problems), strings.Join(problems, "\n"))
}
