package handoff

import (
	"fmt"
	"time"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// NewMovedRequest is the target's side of a running request's move: m is
// the MoveRequest of the decode node src the request runs on. Admitted as
// owner, the request reserves pages at m's layout and those of the tokens
// left to generate, plans the move with src (SendMovePlan), and takes
// src's frames and TransferDone as a request takes its prefill peer's,
// except that its report's first token must be the last one m streamed. Once
// every page is sealed against its source, the manifest verified and
// decode has recomputed that token (StartDecode.Resume), it acknowledges
// and decodes on. Its chunks, which go on from m.Seq, and its answer wait
// until the stream's receiver takes the stream (TakeIn); a request ending
// in error before that ends silently, since the stream is still its
// source's, and one the receiver never takes ends so at TakeDeadline.
func NewMovedRequest(cfg RequestConfig, owner kv.Owner, m *messages.MoveRequest, src Peer) *Request {
	r := NewRequest(cfg, owner, m.ClientID, ints(m.Prompt), int(m.MaxTokens), src)
	r.move, r.tokens, r.seq, r.salt = m, ints(m.Tokens), m.Seq, m.CacheSalt
	return r
}

func ints(v []uint32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// NotTakenError: a request moved here decoded for After without the
// stream's receiver taking it.
type NotTakenError struct{ After time.Duration }

func (e *NotTakenError) Error() string {
	return fmt.Sprintf("handoff: the stream's receiver did not take the moved request within %s", e.After)
}

// TakeError: the stream's receiver took a moved request at another chunk
// than the one its source streamed last.
type TakeError struct{ Moved, Taken uint32 }

func (e *TakeError) Error() string {
	return fmt.Sprintf("handoff: the stream's receiver passed on %d chunks, its source streamed %d", e.Taken, e.Moved)
}

// withhold keeps, until the stream's receiver takes a request moved here,
// the chunks and the answer of out, and returns the rest.
func (r *Request) withhold(out []Effect) []Effect {
	if r.move == nil || r.taken {
		return out
	}
	keep := out[:0:0]
	for _, e := range out {
		switch e := e.(type) {
		case Emit:
			r.withheld = append(r.withheld, e)
		case Finish:
			if !e.Silent {
				r.withheld = append(r.withheld, e)
				continue
			}
			r.withheld = nil // never to go out
			keep = append(keep, e)
		default:
			keep = append(keep, e)
		}
	}
	return keep
}

// takeIn takes the stream: from the receiver the move named, at the chunk
// its source streamed last, the chunks and answer withheld go out. Taken
// at another chunk, the stream cannot go on whole, and the request fails.
// A request that ended silently has nothing to give.
func (r *Request) takeIn(e TakeIn) []Effect {
	switch {
	case r.move == nil || e.Take.RequestID != r.client, r.phase == phaseDone && len(r.withheld) == 0:
		r.counts.Ignored++
		return nil
	case !e.FromReceiver:
		return []Effect{Refuse{Err: &StrangerError{What: "stream take", From: e.From,
			Planned: "the stream's receiver at " + r.move.Receiver}}}
	case r.taken:
		r.counts.Ignored++ // a duplicate
		return nil
	}
	r.taken = true
	var cause error
	if e.Take.Seq != r.move.Seq {
		cause = &TakeError{Moved: r.move.Seq, Taken: e.Take.Seq}
	}
	switch {
	case cause == nil:
		out := r.withheld
		r.withheld = nil
		return out
	case r.phase != phaseDone:
		return r.finish(cause)
	}
	return r.answerAfter(cause, false)
}

// notTaken ends a request moved here that the receiver did not take in
// time: silently, its chunks and answer dropped.
func (r *Request) notTaken() []Effect {
	if r.move == nil || r.taken {
		return nil
	}
	cause := &NotTakenError{After: r.cfg.PrefillTimeout}
	if r.phase == phaseDone {
		return r.answerAfter(cause, true)
	}
	return r.finish(cause)
}

// answerAfter answers, with the error cause, a request moved here that has
// ended already (its pages are given back): silent, or to the receiver that
// took it. Whatever was withheld is dropped.
func (r *Request) answerAfter(cause error, silent bool) []Effect {
	r.withheld = nil
	return []Effect{Finish{Result: &messages.GenerateResult{RequestID: r.client, FinishReason: messages.FinishError,
		Err: Wire(cause)}, Cause: cause, Silent: silent}}
}
