package httpapi

import (
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestStopText: fed in pieces, the text released is the text before the
// first stop sequence, never any part of one, and all of it without one.
func TestStopText(t *testing.T) {
	for _, tc := range []struct {
		stops  []string
		pieces []string
		want   string
		hit    bool
	}{
		{nil, []string{"a", "b"}, "ab", false},
		{[]string{"\nUser:"}, []string{"Hi", "\n", "Us", "er", ": more"}, "Hi", true},
		{[]string{"\nUser:"}, []string{"Hi", "\n", "Use", "d"}, "Hi\nUsed", false},
		{[]string{"cd", "bc"}, []string{"ab", "cd"}, "a", true},
		{[]string{"abcd", "c"}, []string{"abcd"}, "ab", true},
		{[]string{"\n", "b\n"}, []string{"b\n"}, "", true},
		{[]string{"é"}, []string{"caf", "é!"}, "caf", true},
		{[]string{"xx"}, []string{"axx"}, "a", true},
	} {
		s := newStopText(tc.stops)
		var out strings.Builder
		hit := false
		for _, p := range tc.pieces {
			got, h := s.feed(p)
			out.WriteString(got)
			if hit = h; hit {
				break
			}
		}
		if !hit {
			out.WriteString(s.flush())
		}
		if out.String() != tc.want || hit != tc.hit {
			t.Errorf("stops %q over %q: %q (hit %v), want %q (hit %v)", tc.stops, tc.pieces, out.String(), hit, tc.want, tc.hit)
		}
	}
}

// stopByteByByte is the text a client is owed: the text grown one byte at
// a time until it first holds a stop sequence, cut where the earliest of
// those it then holds begins.
func stopByteByByte(text string, stops []string) string {
	for n := 1; n <= len(text); n++ {
		at := -1
		for _, st := range stops {
			if i := strings.Index(text[:n], st); i >= 0 && (at < 0 || i < at) {
				at = i
			}
		}
		if at >= 0 {
			return text[:at]
		}
	}
	return text
}

// TestStopTextProperty: however the text is cut into pieces, the result
// is the text grown byte by byte, cut before the first stop sequence it
// comes to hold.
func TestStopTextProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		alpha := rapid.SampledFrom([]rune("ab\n:é"))
		word := rapid.StringOfN(alpha, 1, 4, -1)
		stops := rapid.SliceOfN(word, 0, 3).Draw(t, "stops")
		pieces := rapid.SliceOfN(rapid.StringOfN(alpha, 0, 5, -1), 0, 8).Draw(t, "pieces")
		text := strings.Join(pieces, "")
		want := stopByteByByte(text, stops)
		s := newStopText(stops)
		var out strings.Builder
		for _, p := range pieces {
			got, hit := s.feed(p)
			out.WriteString(got)
			if hit {
				break
			}
		}
		out.WriteString(s.flush())
		if out.String() != want {
			t.Fatalf("stops %q over %q: %q, want %q", stops, pieces, out.String(), want)
		}
	})
}
