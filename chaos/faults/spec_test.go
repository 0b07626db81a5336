package faults

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseExample(t *testing.T) {
	const s = "seed=7,frame-drop=0.02,frame-dup=0.02,frame-reorder=0.02,frame-corrupt=0.01,frame-misdirect=0.01,ack-drop=0.02"
	sp, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{Seed: 7, Prob: [NumKinds]float64{0.02, 0.02, 0.02, 0.01, 0.01, 0.02}}
	if sp != want {
		t.Fatalf("Parse(%q) = %+v, want %+v", s, sp, want)
	}
	if got := sp.String(); got != s {
		t.Fatalf("String() = %q, want %q", got, s)
	}
}

func TestParseForms(t *testing.T) {
	for _, tc := range []struct {
		in, canonical string
	}{
		{"seed=1", "seed=1"},
		{"frame-drop=0.5", "seed=0,frame-drop=0.5"},
		{" ack-drop=1 , seed=18446744073709551615 ", "seed=18446744073709551615,ack-drop=1"},
		{"frame-corrupt=1e-3,frame-drop=0", "seed=0,frame-corrupt=0.001"},
		{"frame-misdirect=0.30000000000000004", "seed=0,frame-misdirect=0.30000000000000004"},
	} {
		sp, err := Parse(tc.in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.in, err)
		}
		if got := sp.String(); got != tc.canonical {
			t.Errorf("Parse(%q).String() = %q, want %q", tc.in, got, tc.canonical)
		}
		again, err := Parse(sp.String())
		if err != nil || again != sp {
			t.Errorf("round trip of %q: %+v, %v; want %+v", tc.in, again, err, sp)
		}
	}
}

// TestStringRoundTrips reads back the longest canonical specs exactly, and
// checks that they stay well under SpecBytesMax.
func TestStringRoundTrips(t *testing.T) {
	for _, p := range []float64{math.SmallestNonzeroFloat64, 2.2250738585072014e-308, 0.1 + 0.2, 1 - 1e-16, 1} {
		sp := Spec{Seed: math.MaxUint64}
		for k := range sp.Prob {
			sp.Prob[k] = p
		}
		s := sp.String()
		if len(s) >= 300 {
			t.Errorf("canonical spec of %d bytes: %s", len(s), s)
		}
		got, err := Parse(s)
		if err != nil || got != sp {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", s, got, err, sp)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	var syntax *SyntaxError
	var unknown *UnknownKeyError
	var prob *ProbabilityError
	var length *SpecLengthError
	for _, tc := range []struct {
		in   string
		as   any
		want []string
	}{
		{"", &syntax, []string{"empty", "seed, frame-drop"}},
		{"frame-drop", &syntax, []string{`"frame-drop"`, "key=value"}},
		{"frame-drop=0.1,frame-drop=0.2", &syntax, []string{"given twice"}},
		{"seed=-1", &syntax, []string{"seed", "18446744073709551615"}},
		{"seed=1,frame-drop=lots", &syntax, []string{"not a number"}},
		{"frame-drop=1.5", &prob, []string{"frame-drop=1.5", "[0, 1]"}},
		{"ack-drop=-0.1", &prob, []string{"ack-drop=-0.1", "[0, 1]"}},
		{"frame-dup=NaN", &prob, []string{"frame-dup=NaN", "[0, 1]"}},
		{"frame-dup=+Inf", &prob, []string{"frame-dup=+Inf"}},
		{"frame-delay=0.1", &unknown, []string{`"frame-delay"`, "seed, frame-drop, frame-dup, frame-reorder, frame-corrupt, frame-misdirect, ack-drop"}},
		{"seed=1," + strings.Repeat(" ", SpecBytesMax), &length, []string{"at most 512"}},
	} {
		_, err := Parse(tc.in)
		if err == nil {
			t.Errorf("Parse(%q) accepted", tc.in)
			continue
		}
		if !errors.As(err, tc.as) {
			t.Errorf("Parse(%q): %T %v, want %T", tc.in, err, err, tc.as)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Parse(%q): %q lacks %q", tc.in, err, w)
			}
		}
	}
	if err := (Spec{Prob: [NumKinds]float64{FrameReorder: 2}}).Validate(); !errors.As(err, &prob) || prob.Key != "frame-reorder" || prob.Value != 2 {
		t.Errorf("Validate of reorder 2: %v", err)
	}
}

func TestKindsStable(t *testing.T) {
	want := []string{"frame-drop", "frame-dup", "frame-reorder", "frame-corrupt", "frame-misdirect", "ack-drop"}
	for k, name := range want {
		if got := Kind(k).String(); got != name {
			t.Errorf("kind %d is %q, want %q", k, got, name)
		}
	}
	if NumKinds != len(want) || Kind(NumKinds).String() != "kind(6)" {
		t.Errorf("NumKinds %d, kind past the end %q", NumKinds, Kind(NumKinds))
	}
	if c := (Counts{1, 2, 3, 4, 5, 6}); c.Total() != 21 {
		t.Errorf("Total %d", c.Total())
	}
}
