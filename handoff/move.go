package handoff

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvwarden/kvwarden/internal/mutant"
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
	r.move, r.tokens, r.seq, r.salt, r.cached = m, ints(m.Tokens), m.Seq, m.CacheSalt, int(m.CachedTokens)
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
		if mutant.Is(mutant.MoveReplay) {
			out = replayed(out, r.move.Tokens)
		}
		return out
	case r.phase != phaseDone:
		return r.finish(cause)
	}
	return r.answerAfter(cause, false)
}

// replayed is the planted bug of mutant.MoveReplay: the first chunk of out
// streams the source's tokens again before its own.
func replayed(out []Effect, tokens []uint32) []Effect {
	for i, e := range out {
		if em, ok := e.(Emit); ok {
			c := *em.Chunk
			c.Tokens = append(slices.Clone(tokens), c.Tokens...)
			em.Chunk = &c
			out[i] = em
			break
		}
	}
	return out
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

// moveOut is a request's move away from this node, under way.
type moveOut struct {
	id                   uint64
	to                   Peer
	receiver, receiverID string
	paused               bool
	pages                []kv.ManifestPage // the sequence's, its tail last
	tail                 []byte
	plan                 *messages.MovePlan
	sent                 bool
	deadline             time.Time // MoveDeadline's: an ack past it is too late
}

// MoveRefusedError: a request cannot move now.
type MoveRefusedError struct{ Why string }

func (e *MoveRefusedError) Error() string { return "handoff: the request cannot move: " + e.Why }

// Wire is the refusal as an operator is told it: a bad request, as a move
// of a request not in flight is.
func (e *MoveRefusedError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBadRequest, Message: e.Error(), Where: "move"}
}

// Movable says why the request cannot move to another decode node now,
// nil if it can: it must be decoding, with a token streamed and two left to
// generate (one is sooner generated than moved), and not moving already.
func (r *Request) Movable() error {
	switch {
	case r.phase != phaseDecoding:
		return &MoveRefusedError{Why: "it is not decoding"}
	case r.out != nil:
		return &MoveRefusedError{Why: fmt.Sprintf("move %d is under way", r.out.id)}
	case r.move != nil && !r.taken:
		return &MoveRefusedError{Why: "it moved here and its stream has not been taken yet"}
	case len(r.tokens) == 0:
		return &MoveRefusedError{Why: "no token streamed yet"}
	case len(r.tokens) >= r.maxNew-1:
		return &MoveRefusedError{Why: fmt.Sprintf("%d of its %d tokens are streamed", len(r.tokens), r.maxNew)}
	}
	return nil
}

// Taken says the request moved here and the stream's receiver took it.
func (r *Request) Taken() bool { return r.move != nil && r.taken }

// MovePlanned says the request's move under way has its target's plan.
func (r *Request) MovePlanned() bool { return r.out != nil && r.out.plan != nil }

// moveOutStart pauses the decode job for the move e asks for.
func (r *Request) moveOutStart(e MoveOut, now time.Time) []Effect {
	if r.Movable() != nil {
		r.counts.Ignored++
		return nil
	}
	r.out = &moveOut{id: e.MoveID, to: e.To, receiver: e.Receiver, receiverID: e.ReceiverID,
		deadline: now.Add(r.cfg.PrefillTimeout)}
	return []Effect{PauseDecode{Owner: r.owner, MoveID: e.MoveID}, Timer{After: r.cfg.PrefillTimeout, Event: MoveDeadline{MoveID: e.MoveID}}}
}

// paused asks the target to take the request over, once the decode job
// holds still with every position but the last token's in its pages.
func (r *Request) paused(e Paused, now time.Time) []Effect {
	o := r.out
	if o == nil || o.paused || e.MoveID != o.id {
		r.counts.Ignored++ // an earlier move's pause, answered late
		return nil
	}
	if e.Err != nil {
		// The job cannot give its pages: it decodes on.
		r.out = nil
		return []Effect{MoveEnded{MoveID: o.id, Err: e.Err}}
	}
	o.paused, o.pages, o.tail = true, e.Pages, e.Tail
	m := &messages.MoveRequest{MoveID: o.id, Tenant: r.owner.Tenant, ClientID: r.client, Receiver: o.receiver,
		ReceiverID: o.receiverID, Prompt: u32s(r.prompt), Tokens: u32s(r.tokens), MaxTokens: uint32(r.maxNew), Seq: r.seq,
		PageTokens: uint32(r.cfg.Geometry.PageTokens), SourceIncarnation: r.cfg.Incarnation,
		TargetIncarnation: o.to.Incarnation, Model: r.cfg.Model, CacheSalt: r.salt,
		TimeLeftMs: uint32(max(r.deadline.Sub(now).Milliseconds(), 1)), CachedTokens: uint32(r.cached)}
	for _, p := range e.Pages {
		m.Layout = append(m.Layout, uint32(p.Tokens))
	}
	if err := m.Validate(); err != nil {
		return r.moveFailed(fmt.Errorf("handoff: the move of the paused request: %w", err))
	}
	return []Effect{SendMoveRequest{To: o.to, Move: m}}
}

func u32s(v []int) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = uint32(x)
	}
	return out
}

// movePlanIn sends the pages to the target's, once its plan names a page
// for each.
func (r *Request) movePlanIn(e MovePlanIn) []Effect {
	o, p := r.out, e.Plan
	switch {
	case o == nil || p.MoveID != o.id || p.Tenant != r.owner.Tenant || !o.paused || o.plan != nil:
		r.counts.Ignored++ // another move's, or late, or a duplicate
		return nil
	case !e.FromTarget:
		return []Effect{Refuse{Err: &StrangerError{What: "move plan", From: e.From, Planned: o.to.String()}}}
	case len(p.DestTags) != len(o.pages):
		return r.moveFailed(&kv.ManifestError{Field: "move plan pages", Page: -1, Want: len(o.pages), Have: len(p.DestTags)})
	}
	o.plan = p
	return []Effect{SendMoveFrames{MoveID: o.id, Plan: p, Owner: r.owner, Pages: o.pages, Tail: o.tail}}
}

// moveSent reports the move's pages to the target once its frames left.
func (r *Request) moveSent(e MoveSent) []Effect {
	o := r.out
	switch {
	case o == nil || e.MoveID != o.id:
		r.counts.Ignored++
		return nil
	case e.Err != nil:
		return r.moveFailed(e.Err)
	case o.sent || o.plan == nil:
		r.counts.Ignored++
		return nil
	}
	o.sent = true
	var early []Effect
	if mutant.Is(mutant.MoveEarlyRelease) {
		// The planted bug: the pages go back with their frames sent.
		early = []Effect{Release{Owner: r.owner, Tags: r.dest}, Release{Owner: r.owner, Tags: r.spare}}
	}
	sums := make([]uint64, len(o.pages))
	for i, p := range o.pages {
		sums[i] = p.Checksum
	}
	return append(early, SendMoveDone{Done: &messages.TransferDone{RequestID: o.plan.Request, Tenant: r.owner.Tenant,
		First: uint32(r.tokens[len(r.tokens)-1]), Frames: uint32(len(o.pages)), Source: r.owner.Request, Sums: sums}})
}

// moveLate is why a move's deadline ended it.
func (r *Request) moveLate() error {
	return &messages.WireError{Code: messages.CodeNodeLost,
		Message: fmt.Sprintf("move %d to %x not acknowledged within %s", r.out.id, r.out.to.Incarnation, r.cfg.PrefillTimeout)}
}

// moveAckIn hands the stream over once the target has verified every page
// and the last token: the request ends here, moved, and gives its pages
// back. An ack taken past the move's deadline (its timer not yet stepped)
// ends the move as the deadline does: the target, which waits for the
// stream no longer than that from its ack, may have given up.
func (r *Request) moveAckIn(e MoveAckIn, now time.Time) []Effect {
	o, a, positions := r.out, e.Ack, len(r.prompt)+len(r.tokens)-1
	switch {
	case o == nil || o.plan == nil || !o.sent || a.RequestID != o.plan.Request || a.Tenant != r.owner.Tenant:
		r.counts.Ignored++
		return nil
	case !e.FromTarget:
		return []Effect{Refuse{Err: &StrangerError{What: "move ack", From: e.From, Planned: o.to.String()}}}
	case int(a.TokenCount) != positions || int(a.Pages) != len(o.pages):
		return r.moveFailed(&kv.ManifestError{Field: "move ack tokens", Page: -1, Want: positions, Have: int(a.TokenCount)})
	case !now.Before(o.deadline):
		return r.moveFailed(r.moveLate())
	}
	r.phase = phaseDone
	return []Effect{HandOver{To: o.to, Seq: r.seq}, CancelDecode{Owner: r.owner}, Release{Owner: r.owner, Tags: r.dest},
		Release{Owner: r.owner, Tags: r.spare},
		Finish{Result: &messages.GenerateResult{RequestID: r.client, FinishReason: messages.FinishLength},
			Tokens: slices.Clone(r.tokens), Silent: true, Moved: true}}
}

// moveFailed ends the move under way and has decode go on here (a job
// not paused yet goes on as it was); the target, if it planned, is told.
func (r *Request) moveFailed(cause error) []Effect {
	id := r.out.id
	return append(r.endMove(cause), ResumeDecode{Owner: r.owner}, MoveEnded{MoveID: id, Err: cause})
}

// endMove forgets the move under way, if any, and tells its target, if it
// planned, that it ended with cause (a TransferDone that failed, as a
// prefill peer reports a failed transfer).
func (r *Request) endMove(cause error) []Effect {
	o := r.out
	if o == nil {
		return nil
	}
	r.out = nil
	if o.plan == nil {
		return nil
	}
	return []Effect{SendMoveDone{Done: &messages.TransferDone{RequestID: o.plan.Request, Tenant: r.owner.Tenant,
		Err: Wire(cause)}}}
}

// errEndedMoving is what a move's target is told when the request ends
// while moving, completed.
var errEndedMoving = errors.New("handoff: the request ended while it moved")
