package client

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvwarden/kvwarden/messages"
)

// TestDeliveryContinuation: a continuation's tokens and text that were
// delivered are checked and withheld, what follows is passed on; the text
// is skipped by bytes, however the two streams cut it into chunks.
func TestDeliveryContinuation(t *testing.T) {
	d := &delivery{}
	d.attempt("a:1")
	for _, c := range []struct {
		tokens []uint32
		text   string
	}{{[]uint32{1, 2}, "Once"}, {[]uint32{3}, " up"}} {
		if fresh, text, err := d.chunk(c.tokens, c.text); err != nil || !slices.Equal(fresh, c.tokens) || text != c.text {
			t.Fatalf("first attempt: %v %q %v", fresh, text, err)
		}
	}
	d.attempt("b:1")
	var got []uint32
	var text string
	for _, c := range []struct {
		tokens []uint32
		text   string
	}{{[]uint32{1}, "On"}, {[]uint32{2, 3, 4}, "ce upon"}, {[]uint32{5}, " a"}} {
		fresh, s, err := d.chunk(c.tokens, c.text)
		if err != nil {
			t.Fatal(err)
		}
		got, text = append(got, fresh...), text+s
	}
	if !slices.Equal(got, []uint32{4, 5}) || text != "on a" || d.replayed != 3 {
		t.Fatalf("continuation passed on %v %q, replayed %d; want [4 5] \"on a\", 3", got, text, d.replayed)
	}
	if err := d.result([]uint32{1, 2, 3, 4, 5, 6}, "Once upon a time"); err != nil {
		t.Fatal(err)
	}
}

// TestDeliveryRefusesADifferentReplay: a continuation whose token, text or
// answer disagrees with what was delivered is an integrity failure.
func TestDeliveryRefusesADifferentReplay(t *testing.T) {
	start := func() *delivery {
		d := &delivery{}
		d.attempt("a:1")
		if _, _, err := d.chunk([]uint32{1, 2, 3}, "abc"); err != nil {
			t.Fatal(err)
		}
		d.attempt("b:1")
		return d
	}
	integrity := &messages.WireError{Code: messages.CodeIntegrity}
	if _, _, err := start().chunk([]uint32{1, 9}, "ab"); !errors.Is(err, integrity) {
		t.Errorf("a different token: %v", err)
	}
	if _, _, err := start().chunk([]uint32{1, 2}, "aX"); !errors.Is(err, integrity) {
		t.Errorf("a different text: %v", err)
	}
	if err := start().result([]uint32{1, 2}, "ab"); !errors.Is(err, integrity) {
		t.Errorf("an answer shorter than what was delivered: %v", err)
	}
	if err := start().result([]uint32{1, 2, 4}, "abd"); !errors.Is(err, integrity) {
		t.Errorf("an answer with a different token: %v", err)
	}
	if err := start().result([]uint32{1, 2, 3}, "abX"); !errors.Is(err, integrity) {
		t.Errorf("an answer with a different text: %v", err)
	}
}
