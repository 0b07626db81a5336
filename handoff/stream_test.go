package handoff

import (
	"testing"

	"github.com/kvwarden/kvwarden/messages"
)

// TestStreamHearsOnlyItsNode: a stream passes on chunks in order from the
// node it is on, refuses another node's and another request's, and after a
// move's hand-over hears only the node it moved to, dropping what the node
// it left still sends; the word of a move is waited on until every chunk
// before it has passed.
func TestStreamHearsOnlyItsNode(t *testing.T) {
	s := NewStream(7, "a:1")
	for _, c := range []struct {
		from    string
		id      uint64
		ok      bool
		refused bool
	}{
		{"a:1", 7, true, false},
		{"b:1", 7, false, true},
		{"a:1", 8, false, true},
	} {
		ok, why := s.From(c.from, c.id)
		if ok != c.ok || (why != "") != c.refused {
			t.Errorf("From(%s, %d) = %t, %q; want %t, refused %t", c.from, c.id, ok, why, c.ok, c.refused)
		}
	}
	for _, seq := range []uint32{1, 2} {
		if why := s.Chunk(seq); why != "" {
			t.Fatalf("chunk %d: %s", seq, why)
		}
	}
	if why := s.Chunk(2); why == "" || s.Seq() != 2 {
		t.Fatalf("a repeated chunk 2 passed (%q), seq %d", why, s.Seq())
	}
	if why := s.Moved(&messages.StreamMoved{RequestID: 7, Seq: 1, To: "b:1"}); why == "" {
		t.Fatal("a move behind the chunks passed on was taken")
	}
	// Moved at chunk 3, before chunk 3 came: handed over after it.
	if why := s.Moved(&messages.StreamMoved{RequestID: 7, Seq: 3, To: "b:1"}); why != "" {
		t.Fatal(why)
	}
	if why := s.Moved(&messages.StreamMoved{RequestID: 7, Seq: 3, To: "c:1"}); why == "" {
		t.Fatal("a second move before the first was handed over was taken")
	}
	if m := s.HandOver(); m != nil || s.At() != "a:1" {
		t.Fatalf("handed over to %v before chunk 3", m)
	}
	if why := s.Chunk(3); why != "" {
		t.Fatal(why)
	}
	if m := s.HandOver(); m == nil || m.To != "b:1" || s.At() != "b:1" {
		t.Fatalf("hand-over after chunk 3: %+v, at %s", m, s.At())
	}
	if m := s.HandOver(); m != nil {
		t.Fatalf("handed over twice: %+v", m)
	}
	if ok, why := s.From("a:1", 7); ok || why != "" {
		t.Errorf("the node left: From = %t, %q; want dropped quietly", ok, why)
	}
	if ok, why := s.From("b:1", 7); !ok || why != "" {
		t.Errorf("the node moved to: From = %t, %q", ok, why)
	}
	if why := s.Chunk(4); why != "" {
		t.Fatalf("the sequence goes on across the move: %s", why)
	}
	// Back to a at chunk 4, before b streamed more: a copy of a's first
	// word, late, is refused; a's word of a new move to b is taken.
	back := &messages.StreamMoved{RequestID: 7, Seq: 4, To: "a:1", ToID: "r2", ToIncarnation: 1}
	if why := s.Moved(back); why != "" || s.HandOver() == nil || s.At() != "a:1" {
		t.Fatalf("the move back: %q, at %s", why, s.At())
	}
	first := &messages.StreamMoved{RequestID: 7, Seq: 4, To: "b:1"}
	if why := s.Moved(first); why == "" {
		t.Fatal("a copy of a hand-over made already was taken")
	}
	if why := s.Moved(&messages.StreamMoved{RequestID: 7, Seq: 4, To: "b:1", ToID: "r3"}); why != "" || s.HandOver() == nil {
		t.Fatalf("a new move to b: %q", why)
	}
	// A new run at the address the stream left is heard again once the
	// stream goes there.
	s.Leave("a:1")
	if ok, _ := s.From("a:1", 7); !ok {
		t.Error("the stream went back to a:1 and does not hear it")
	}
	if ok, why := s.From("b:1", 7); ok || why != "" {
		t.Errorf("b:1, left: From = %t, %q", ok, why)
	}
}
