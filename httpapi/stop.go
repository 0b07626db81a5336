package httpapi

import "strings"

// stopText finds the first of a request's stop sequences in its generated
// text as it streams, and holds back what could still turn out to be the
// start of one, so that no part of a stop sequence is ever sent.
type stopText struct {
	stops []string
	held  string // text not yet released: a possible start of a stop sequence
	hold  int    // the longest stop sequence less one byte: the most ever held
}

func newStopText(stops []string) *stopText {
	s := &stopText{stops: stops}
	for _, st := range stops {
		s.hold = max(s.hold, len(st)-1)
	}
	return s
}

// feed takes the next text and returns what may be sent now, and whether
// a stop sequence ended the text (the returned text is then everything
// before it, and nothing more may be fed).
func (s *stopText) feed(text string) (string, bool) {
	buf := s.held + text
	if at := s.first(buf); at >= 0 {
		s.held = ""
		return buf[:at], true
	}
	// Keep the longest tail that is a prefix of a stop sequence; it is
	// shorter than hold bytes, since no whole sequence is in buf.
	keep := 0
	for n := min(s.hold, len(buf)); n > 0; n-- {
		if s.prefixOfStop(buf[len(buf)-n:]) {
			keep = n
			break
		}
	}
	s.held = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], false
}

// flush is what is held at the end of the text: no stop sequence came.
func (s *stopText) flush() string {
	out := s.held
	s.held = ""
	return out
}

// first is where the stop sequence that a text streamed through buf meets
// first begins (the one that ends first; of two that end together, the
// longer), -1 if none: the same place however the text is cut into pieces.
func (s *stopText) first(buf string) int {
	at, end := -1, 0
	for _, st := range s.stops {
		i := strings.Index(buf, st)
		if i >= 0 && (at < 0 || i+len(st) < end || (i+len(st) == end && i < at)) {
			at, end = i, i+len(st)
		}
	}
	return at
}

func (s *stopText) prefixOfStop(tail string) bool {
	for _, st := range s.stops {
		if strings.HasPrefix(st, tail) {
			return true
		}
	}
	return false
}
