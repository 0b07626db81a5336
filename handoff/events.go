package handoff

import (
	"fmt"
	"time"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// Event is what Step takes: a message that arrived, a timer that fired,
// or the outcome of an effect.
type Event interface{ event() }

// Effect is what Step asks its caller to carry out.
type Effect interface{ effect() }

// Peer is a prefill node a request plans its transfer with: its remote
// address and its run.
type Peer struct {
	Address     string
	Incarnation uint64
}

func (p Peer) String() string { return fmt.Sprintf("%s (incarnation %x)", p.Address, p.Incarnation) }

// Events of a Request.
type (
	// Start begins the request's life.
	Start struct{}
	// Reserved answers Reserve: the pages, or why there are none (a
	// *kv.PoolExhaustedError when the pool is short).
	Reserved struct {
		Dest, Spare []kv.Tag
		Err         error
		// Held are the cached pages the first len(Held) Dest pages were
		// written from, not yet sealed (ExecReserveHeld): prefill sends
		// only the pages after them. Scope is the one the decode pool's
		// cache gave the request (zero when it did not answer): its
		// answered prompt's pages are kept there.
		Held  []kv.CachedPage
		Scope kv.Scope
	}
	// RetryReserve is the timer after an exhausted pool.
	RetryReserve struct{}
	// PrefillDeadline: the transfer attempt Attempt has not finished in
	// PrefillTimeout.
	PrefillDeadline struct{ Attempt uint64 }
	// RequestDeadline: the request ran past RequestTimeout.
	RequestDeadline struct{}
	// FramesIn are frames for the request; Stranger says they did not
	// come from the planned prefill peer (as the transport proved it),
	// From who sent them.
	FramesIn struct {
		Frames   []kv.Frame
		Stranger bool
		From     string
	}
	// Written answers Write: the first N frames went into their pages,
	// and Err is why the next did not.
	Written struct {
		N   int
		Err error
	}
	// TransferIn is prefill's TransferDone; FromPrefill says whether it
	// came from the planned peer, From who sent it.
	TransferIn struct {
		Done        *messages.TransferDone
		FromPrefill bool
		From        string
	}
	// Verified answers SealVerify.
	Verified struct{ Err error }
	// Picked answers Pick: another prefill peer and the new attempt's
	// request id, or OK false when there is none.
	Picked struct {
		Peer    Peer
		Attempt uint64
		OK      bool
	}
	// PeerLost: membership says the node of that run is gone.
	PeerLost struct{ Incarnation uint64 }
	// TokenIn is a token the decode worker generated for the request.
	TokenIn struct{ Token int }
	// DecodeEnded: the decode worker holds no lease of the request any
	// more; Err is nil when it generated every token or met EOS.
	DecodeEnded struct{ Err error }
	// Cancel: the client withdrew the request.
	Cancel struct{}
	// Stop: the client has what it wants of the answer (a stop sequence
	// of its own came): the request ends as completed at the tokens it
	// has (messages.CancelStop).
	Stop struct{}
	// Failed: an effect could not be carried out (a message that failed
	// its own validation).
	Failed struct{ Err error }
	// TakeIn is the stream's receiver's StreamTake for a request moved
	// here; FromReceiver says whether it came from the receiver the move
	// named (as the transport proved it), From who sent it.
	TakeIn struct {
		Take         *messages.StreamTake
		FromReceiver bool
		From         string
	}
	// TakeDeadline: a request moved here, verified and decoding, has not
	// been taken by the stream's receiver within PrefillTimeout.
	TakeDeadline struct{}
	// MoveOut asks a decoding request to move to the decode node To, as
	// move MoveID: its stream's receiver is the actor ReceiverID at
	// Receiver (see Request.Movable).
	MoveOut struct {
		MoveID               uint64
		To                   Peer
		Receiver, ReceiverID string
	}
	// Paused answers PauseDecode: the decode job holds still, and Pages
	// are its sealed pages in order, then, when its tail holds rows, the
	// page reserved for them (never written) with Tail's checksum as that
	// page would be sealed with Tail (kv.PageChecksum). Err: the job
	// cannot give its pages, and steps on. A job that ended meanwhile does
	// not answer: its DecodeEnded ends the request, and the move.
	Paused struct {
		MoveID uint64
		Pages  []kv.ManifestPage
		Tail   []byte
		Err    error
	}
	// MovePlanIn is the target's MovePlan; FromTarget says whether it came
	// from the move's target, From who sent it.
	MovePlanIn struct {
		Plan       *messages.MovePlan
		FromTarget bool
		From       string
	}
	// MoveSent answers SendMoveFrames, and a SendMoveRequest or
	// SendMoveDone that could not be sent (Err), of move MoveID.
	MoveSent struct {
		MoveID uint64
		Err    error
	}
	// Resumed: the decode job of a request moved here began, its last
	// token recomputed from the pages received (a failure ends it with
	// DecodeEnded instead).
	Resumed struct{}
	// MoveAckIn and MoveAbortIn are the target's TransferAck and
	// TransferAbort of the move.
	MoveAckIn struct {
		Ack        *messages.TransferAck
		FromTarget bool
		From       string
	}
	MoveAbortIn struct {
		Abort      *messages.TransferAbort
		FromTarget bool
	}
	// MoveDeadline: move MoveID was not acknowledged within
	// PrefillTimeout.
	MoveDeadline struct{ MoveID uint64 }
)

// Effects of a Request.
type (
	// Reserve asks for Prompt pages from position 0 and Spare pages from
	// position SpareFirst, all or nothing (ExecReserve); answered by
	// Reserved. With a Layout (a moved request's), the first pages are one
	// for each of its entries instead, each holding that many positions
	// after the one before.
	Reserve struct {
		Owner                     kv.Owner
		Prompt, SpareFirst, Spare int
		Layout                    []int
		// Tokens and Salt are the prompt and the client's cache salt, for
		// a pool with a prefix cache to find the pages it holds already
		// (ExecReserveHeld).
		Tokens []int
		Salt   string
	}
	// Release gives the pages back.
	Release struct {
		Owner kv.Owner
		Tags  []kv.Tag
	}
	// Keep hands an answered request's prompt pages (Tags, in order) to
	// its decode pool's prefix cache, which keeps the full pages of
	// Tokens it does not hold yet under Scope, the one the cache gave the
	// request when it reserved, and releases the others (ExecKeep).
	Keep struct {
		Owner  kv.Owner
		Tags   []kv.Tag
		Tokens []int
		Scope  kv.Scope
	}
	// Unhold gives up the decode pool's cached pages a request copied
	// whose rows prefill did not confirm (TransferDone.HeldSums): which
	// of the two is wrong cannot be told, and the cache keeps neither's
	// (HeldCache.Forget).
	Unhold struct{ Pages []kv.CachedPage }
	// SendPlan, SendAbort and SendAck go to the prefill peer; a plan or
	// an ack that cannot be sent is answered with Failed, an abort is
	// never answered.
	SendPlan struct {
		To   Peer
		Plan *messages.TransferPlan
	}
	SendAbort struct {
		To    Peer
		Abort *messages.TransferAbort
	}
	SendAck struct {
		To  Peer
		Ack *messages.TransferAck
	}
	// Write writes frames into their destination pages, in order, as the
	// request's owner (ExecWrite); answered by Written.
	Write struct{ Frames []kv.Frame }
	// SealVerify seals every page of Manifest only if its bytes are those
	// its origin sealed, records the checksums in Manifest and verifies it
	// (ExecSealVerify); answered by Verified.
	SealVerify struct {
		Manifest *kv.Manifest
		Origins  []kv.Origin
	}
	// StartDecode hands the verified manifest to a decode worker: Next is
	// prefill's first token, which the worker recomputes from Last (the
	// token at the manifest's last position) and the pages before it
	// streams it; MaxNew is the most tokens to generate after Next; Spare
	// the pages for generated KV. Resume: the request moved here and Next
	// is the last token it streamed where it was, recomputed and not
	// streamed again.
	StartDecode struct {
		Manifest   *kv.Manifest
		Next, Last int
		MaxNew     int
		Spare      []kv.Tag
		Resume     bool
	}
	// CancelDecode withdraws the request from its decode worker.
	CancelDecode struct{ Owner kv.Owner }
	// Emit streams a token to the client.
	Emit struct{ Chunk *messages.TokenChunk }
	// Finish answers the client: Result (its Text left for the caller's
	// tokenizer), Cause the error when it failed, Phases when it
	// completed. The request is done. Silent: the stream is not the
	// request's to answer (a move here that the receiver never took, its
	// source still streaming or gone): nothing goes to the client.
	Finish struct {
		Result *messages.GenerateResult
		Tokens []int
		Cause  error
		Phases *Phases
		Silent bool
		// Moved: the request moved to another decode node, which answers
		// the client (Silent); Tokens are those streamed before.
		Moved bool
	}
	// SendMovePlan goes to the source of a move; one that cannot be sent
	// is answered with Failed.
	SendMovePlan struct {
		To   Peer
		Plan *messages.MovePlan
	}
	// PauseDecode holds the request's decode job still after the step in
	// hand, every token of earlier steps streamed, for move MoveID;
	// answered by Paused. ResumeDecode has it step again (a job not paused
	// goes on as it was).
	PauseDecode struct {
		Owner  kv.Owner
		MoveID uint64
	}
	ResumeDecode struct{ Owner kv.Owner }
	// SendMoveRequest goes to the target of a move.
	SendMoveRequest struct {
		To   Peer
		Move *messages.MoveRequest
	}
	// SendMoveFrames sends the frames of Pages, the paused job's, to the
	// pages and data plane of Plan, as the job's Owner: the sealed pages'
	// bytes read under leases, Tail's as they are (the last page, when
	// Tail holds rows); answered by MoveSent.
	SendMoveFrames struct {
		MoveID uint64
		Plan   *messages.MovePlan
		Owner  kv.Owner
		Pages  []kv.ManifestPage
		Tail   []byte
	}
	// SendMoveDone goes to the request of the target that sent the plan:
	// the move's report, or its failure (Done.Err); a report that cannot
	// be sent is answered with MoveSent.
	SendMoveDone struct{ Done *messages.TransferDone }
	// HandOver tells the stream's receiver, after the request's last
	// chunk (Seq), that the stream goes on from the request the target To
	// planned with (messages.StreamMoved).
	HandOver struct {
		To  Peer
		Seq uint32
	}
	// MoveEnded: move MoveID ended without the request moving, because of
	// Err; the request decodes on here.
	MoveEnded struct {
		MoveID uint64
		Err    error
	}
	// Timer asks for Event to be stepped After from now.
	Timer struct {
		After time.Duration
		Event Event
	}
	// Pick asks for another prefill peer, none of Exclude; answered by
	// Picked.
	Pick struct{ Exclude map[uint64]bool }
	// Retry: the request moved to another attempt (request id Old to New,
	// prefill peer From to To) because of Cause.
	Retry struct {
		Old, New uint64
		From, To Peer
		Cause    error
	}
	// Refuse counts frames or a report from a stranger; the request goes
	// on, since a stranger must not be able to end it.
	Refuse struct{ Err *StrangerError }
)

// Phases splits a completed request's time to first token: Queue from
// its start to the plan leaving (decode pages reserved), Prefill from the
// plan to the first frame, Transfer from the first frame to prefill's
// TransferDone, Verify from there to the first token; FirstDecode is the
// first decode step, from the first token to the second (zero for a
// request of one token).
type Phases struct {
	Queue, Prefill, Transfer, Verify, FirstDecode time.Duration
}

func (Start) event()           {}
func (Reserved) event()        {}
func (RetryReserve) event()    {}
func (PrefillDeadline) event() {}
func (RequestDeadline) event() {}
func (FramesIn) event()        {}
func (Written) event()         {}
func (TransferIn) event()      {}
func (Verified) event()        {}
func (Picked) event()          {}
func (PeerLost) event()        {}
func (TokenIn) event()         {}
func (DecodeEnded) event()     {}
func (Cancel) event()          {}
func (Stop) event()            {}
func (Failed) event()          {}
func (TakeIn) event()          {}
func (TakeDeadline) event()    {}
func (MoveOut) event()         {}
func (Paused) event()          {}
func (MovePlanIn) event()      {}
func (MoveSent) event()        {}
func (MoveAckIn) event()       {}
func (MoveAbortIn) event()     {}
func (MoveDeadline) event()    {}
func (Resumed) event()         {}

func (Reserve) effect()         {}
func (Release) effect()         {}
func (Keep) effect()            {}
func (Unhold) effect()          {}
func (SendPlan) effect()        {}
func (SendAbort) effect()       {}
func (SendAck) effect()         {}
func (Write) effect()           {}
func (SealVerify) effect()      {}
func (StartDecode) effect()     {}
func (CancelDecode) effect()    {}
func (Emit) effect()            {}
func (Finish) effect()          {}
func (Timer) effect()           {}
func (Pick) effect()            {}
func (Retry) effect()           {}
func (Refuse) effect()          {}
func (SendMovePlan) effect()    {}
func (PauseDecode) effect()     {}
func (ResumeDecode) effect()    {}
func (SendMoveRequest) effect() {}
func (SendMoveFrames) effect()  {}
func (SendMoveDone) effect()    {}
func (HandOver) effect()        {}
func (MoveEnded) effect()       {}

// Machine is a state machine of this package.
type Machine interface {
	Step(ev Event, now time.Time) []Effect
}

// Run steps m with ev at now and carries out every effect, in order, with
// do; an effect that do answers with an event (non-nil) has that event
// stepped at once, its effects carried out before the rest. Every effect
// that is answered is the last of its step, so the order is the one the
// machine gave.
func Run(m Machine, ev Event, now time.Time, do func(Effect) Event) {
	RunClock(m, ev, func() time.Time { return now }, do)
}

// RunClock is Run with a clock read at every step, so that an event that
// answers an effect is stepped at the time it came.
func RunClock(m Machine, ev Event, clock func() time.Time, do func(Effect) Event) {
	queue := m.Step(ev, clock())
	for len(queue) > 0 {
		e := queue[0]
		queue = queue[1:]
		if next := do(e); next != nil {
			queue = append(m.Step(next, clock()), queue...)
		}
	}
}
