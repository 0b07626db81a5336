package handoff

import (
	"fmt"

	"github.com/kvwarden/kvwarden/internal/mutant"
	"github.com/kvwarden/kvwarden/messages"
)

// Stream is the pure core of a router's relay of one request's stream:
// which decode node it hears (by the remote address the remote boundary
// proved), the chunks passed on, and a move's hand-over. A chunk or a
// result counts only from the node the stream is on, for the request's id;
// a node the stream left is dropped quietly (what it still sends is late,
// not a stranger's), and a node the stream never went to is refused. The
// word that the stream moved counts only from the node it is on, at a
// chunk not behind the last passed on, and never for a hand-over already
// made (a copy of an earlier word, once the stream came back to the node
// that sent it); the stream is handed over once every chunk up to that one
// has been, and from then on only the node it moved to is heard. The relay
// adds nothing to these rules.
type Stream struct {
	id     uint64
	at     string          // the decode node heard
	left   map[string]bool // addresses the stream left
	seq    uint32          // the last chunk passed on
	moving *messages.StreamMoved
	handed map[handedTo]bool // the hand-overs made, one a move
}

// handedTo names a hand-over: the request it went to, on its node's run.
type handedTo struct {
	to, id string
	inc    uint64
}

// NewStream is the stream of request id, on the decode node at address at.
func NewStream(id uint64, at string) *Stream {
	return &Stream{id: id, at: at, left: map[string]bool{}, handed: map[handedTo]bool{}}
}

// Seq is the last chunk's sequence number passed on, 0 before the first.
func (s *Stream) Seq() uint32 { return s.seq }

// At is the address of the decode node the stream is on.
func (s *Stream) At() string { return s.at }

// From says whether a message for request id from the decode node at
// address from is the stream's. Not the stream's, refuse says why, or is ""
// for a late message of a node the stream left.
func (s *Stream) From(from string, id uint64) (ok bool, refuse string) {
	switch {
	case s.left[from] && !mutant.Is(mutant.RelayUnhanded):
		return false, ""
	case from != s.at && !mutant.Is(mutant.RelayUnhanded):
		return false, fmt.Sprintf("from %s, the request went to %s", from, s.at)
	case id != s.id:
		return false, fmt.Sprintf("for request %d, this is %d", id, s.id)
	}
	return true, ""
}

// Chunk passes on chunk seq of the stream's node (From said so), or says
// why not: chunks go one after the other from 1.
func (s *Stream) Chunk(seq uint32) (refuse string) {
	if seq != s.seq+1 {
		return fmt.Sprintf("token chunk %d after %d", seq, s.seq)
	}
	s.seq = seq
	return ""
}

// Moved takes the stream's node's word that the stream moved (From said
// so), or says why not: it cannot be behind the chunks passed on, and one
// move is handed over before the next.
func (s *Stream) Moved(m *messages.StreamMoved) (refuse string) {
	if m.Seq < s.seq || s.moving != nil {
		return fmt.Sprintf("stream moved at chunk %d, %d passed on", m.Seq, s.seq)
	}
	if s.handed[handedTo{m.To, m.ToID, m.ToIncarnation}] {
		return fmt.Sprintf("stream moved to %s, a hand-over made already", m.To)
	}
	s.moving = m
	return ""
}

// HandOver hands the stream over to the node it moved to, once every chunk
// up to the one its word named has been passed on; it returns that word,
// or nil while there is none or chunks are still to come.
func (s *Stream) HandOver() *messages.StreamMoved {
	m := s.moving
	if m == nil || s.seq != m.Seq {
		return nil
	}
	s.moving = nil
	s.handed[handedTo{m.To, m.ToID, m.ToIncarnation}] = true
	s.Leave(m.To)
	return m
}

// Leave has the stream hear the decode node at address to from now on, and
// drop what the node it was on still sends (a new run at an address the
// stream left is heard again).
func (s *Stream) Leave(to string) {
	s.left[s.at] = true
	delete(s.left, to)
	s.at = to
}
