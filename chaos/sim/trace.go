package sim

import (
	"fmt"
	"hash"
	"io"
	"strings"
	"time"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// tracer hashes every line of a run's trace and writes it out when asked
// to. A line names only values the seed fixes (ids, tags, counts, the
// simulated time), never a pointer, so two runs of a seed hash the same.
type tracer struct {
	out   io.Writer
	hash  hash.Hash64
	start time.Time
}

func (t *tracer) line(s string) {
	io.WriteString(t.hash, s)
	if t.out != nil {
		fmt.Fprintln(t.out, s)
	}
}

func (t *tracer) step(n int, now time.Time, what string) {
	t.line(fmt.Sprintf("step %d +%s %s", n, now.Sub(t.start), what))
}

// machine traces one Step of a core: the event and the effects it gave.
func (t *tracer) machine(who string, ev handoff.Event, effects []handoff.Effect) {
	t.line("  " + who + " <- " + describe(ev))
	for _, e := range effects {
		t.line("    -> " + describe(e))
	}
}

// traced is a core whose every Step is traced.
type traced struct {
	m   handoff.Machine
	t   *tracer
	who string
}

func (m traced) Step(ev handoff.Event, now time.Time) []handoff.Effect {
	effects := m.m.Step(ev, now)
	m.t.machine(m.who, ev, effects)
	return effects
}

func tags(ts []kv.Tag) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = t.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

func wireErr(e *messages.WireError) string {
	if e == nil {
		return "nil"
	}
	return e.Code.String()
}

func errName(err error) string {
	if err == nil {
		return "nil"
	}
	return fmt.Sprintf("%q", err.Error())
}

func frames(fs []kv.Frame) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = fmt.Sprintf("%d:%s<-%s@%d+%d", f.Owner.Request, f.Dest, f.Source, f.FirstToken, f.Tokens)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// describe is one event or effect of a core, in a line.
func describe(x any) string {
	switch x := x.(type) {
	case handoff.Reserved:
		return fmt.Sprintf("Reserved dest=%s spare=%s err=%s", tags(x.Dest), tags(x.Spare), errName(x.Err))
	case handoff.PrefillDeadline:
		return fmt.Sprintf("PrefillDeadline attempt=%d", x.Attempt)
	case handoff.FramesIn:
		return fmt.Sprintf("FramesIn stranger=%t from=%s %s", x.Stranger, x.From, frames(x.Frames))
	case handoff.Written:
		return fmt.Sprintf("Written n=%d err=%s", x.N, errName(x.Err))
	case handoff.TransferIn:
		d := x.Done
		return fmt.Sprintf("TransferIn id=%d frames=%d source=%d sums=%d err=%s fromPrefill=%t from=%s",
			d.RequestID, d.Frames, d.Source, len(d.Sums), wireErr(d.Err), x.FromPrefill, x.From)
	case handoff.Verified:
		return "Verified err=" + errName(x.Err)
	case handoff.Picked:
		return fmt.Sprintf("Picked peer=%s/%x attempt=%d ok=%t", x.Peer.Address, x.Peer.Incarnation, x.Attempt, x.OK)
	case handoff.PeerLost:
		return fmt.Sprintf("PeerLost %x", x.Incarnation)
	case handoff.TokenIn:
		return fmt.Sprintf("TokenIn %d", x.Token)
	case handoff.DecodeEnded:
		return "DecodeEnded err=" + errName(x.Err)
	case handoff.Failed:
		return "Failed err=" + errName(x.Err)
	case handoff.Reserve:
		return fmt.Sprintf("Reserve owner=%d/%s prompt=%d spare=%d@%d", x.Owner.Request, x.Owner.Tenant, x.Prompt, x.Spare, x.SpareFirst)
	case handoff.Release:
		return fmt.Sprintf("Release owner=%d/%s %s", x.Owner.Request, x.Owner.Tenant, tags(x.Tags))
	case handoff.SendPlan:
		return fmt.Sprintf("SendPlan to=%s/%x id=%d tokens=%d dest=%s", x.To.Address, x.To.Incarnation, x.Plan.RequestID, x.Plan.TokenCount, tags(x.Plan.DestTags))
	case handoff.SendAbort:
		return fmt.Sprintf("SendAbort to=%s/%x id=%d reason=%s", x.To.Address, x.To.Incarnation, x.Abort.RequestID, x.Abort.Reason.Code)
	case handoff.SendAck:
		return fmt.Sprintf("SendAck to=%s/%x id=%d pages=%d", x.To.Address, x.To.Incarnation, x.Ack.RequestID, x.Ack.Pages)
	case handoff.Write:
		return "Write " + frames(x.Frames)
	case handoff.SealVerify:
		return fmt.Sprintf("SealVerify pages=%d", len(x.Manifest.Pages))
	case handoff.StartDecode:
		return fmt.Sprintf("StartDecode owner=%d next=%d maxNew=%d spare=%s", x.Manifest.Owner.Request, x.Next, x.MaxNew, tags(x.Spare))
	case handoff.CancelDecode:
		return fmt.Sprintf("CancelDecode owner=%d", x.Owner.Request)
	case handoff.Emit:
		return fmt.Sprintf("Emit client=%d seq=%d tokens=%v", x.Chunk.RequestID, x.Chunk.Seq, x.Chunk.Tokens)
	case handoff.Finish:
		return fmt.Sprintf("Finish client=%d reason=%s err=%s tokens=%v", x.Result.RequestID, x.Result.FinishReason, wireErr(x.Result.Err), x.Tokens)
	case handoff.Timer:
		return fmt.Sprintf("Timer after=%s %s", x.After, describe(x.Event))
	case handoff.Pick:
		return fmt.Sprintf("Pick exclude=%d", len(x.Exclude))
	case handoff.Retry:
		return fmt.Sprintf("Retry %d->%d from=%x to=%x cause=%s", x.Old, x.New, x.From.Incarnation, x.To.Incarnation, errName(x.Cause))
	case handoff.Refuse:
		return "Refuse " + errName(x.Err)
	case handoff.PlanIn:
		return fmt.Sprintf("PlanIn key=%s/%d tokens=%d dest=%s", x.Key.Sender, x.Key.ID, x.Plan.TokenCount, tags(x.Plan.DestTags))
	case handoff.Prefilled:
		return fmt.Sprintf("Prefilled key=%s/%d sources=%s marked=%d first=%d cached=%d chain=%d err=%s",
			x.Key.Sender, x.Key.ID, tags(x.Sources), x.Marked, x.First, x.Cached, len(x.Chain), errName(x.Err))
	case handoff.Sent:
		return fmt.Sprintf("Sent key=%s/%d err=%s", x.Key.Sender, x.Key.ID, errName(x.Err))
	case handoff.AckIn:
		return fmt.Sprintf("AckIn key=%s/%d pages=%d", x.Key.Sender, x.Key.ID, x.Ack.Pages)
	case handoff.AbortIn:
		return fmt.Sprintf("AbortIn key=%s/%d tenant=%s", x.Key.Sender, x.Key.ID, x.Tenant)
	case handoff.RefusePlan:
		return fmt.Sprintf("RefusePlan id=%d err=%s", x.Plan.RequestID, errName(x.Err))
	case handoff.Dropped:
		return fmt.Sprintf("Dropped key=%s/%d why=%q", x.Key.Sender, x.Key.ID, x.Why)
	case handoff.Prefill:
		return fmt.Sprintf("Prefill key=%s/%d owner=%d local=%d", x.Key.Sender, x.Key.ID, x.Owner.Request, x.Local.Request)
	case handoff.SendFrames:
		return fmt.Sprintf("SendFrames key=%s/%d", x.Key.Sender, x.Key.ID)
	case handoff.CancelSend:
		return fmt.Sprintf("CancelSend key=%s/%d", x.Key.Sender, x.Key.ID)
	case handoff.Ack:
		return fmt.Sprintf("Ack owner=%d %s cached=%d chain=%d", x.Owner.Request, tags(x.Tags), x.Cached, len(x.Chain))
	case handoff.Reply:
		return fmt.Sprintf("Reply key=%s/%d frames=%d cached=%d err=%s", x.Key.Sender, x.Key.ID, x.Done.Frames, x.Done.Cached, wireErr(x.Done.Err))
	}
	return describeMove(x)
}

// describeMove describes a move's events and effects.
func describeMove(x any) string {
	switch x := x.(type) {
	case handoff.MoveOut:
		return fmt.Sprintf("MoveOut id=%d to=%s/%x", x.MoveID, x.To.Address, x.To.Incarnation)
	case handoff.Paused:
		return fmt.Sprintf("Paused id=%d pages=%d tail=%d err=%s", x.MoveID, len(x.Pages), len(x.Tail), errName(x.Err))
	case handoff.MovePlanIn:
		return fmt.Sprintf("MovePlanIn id=%d request=%d dest=%s fromTarget=%t", x.Plan.MoveID, x.Plan.Request, tags(x.Plan.DestTags), x.FromTarget)
	case handoff.MoveSent:
		return fmt.Sprintf("MoveSent id=%d err=%s", x.MoveID, errName(x.Err))
	case handoff.MoveAckIn:
		return fmt.Sprintf("MoveAckIn id=%d tokens=%d fromTarget=%t", x.Ack.RequestID, x.Ack.TokenCount, x.FromTarget)
	case handoff.MoveAbortIn:
		return fmt.Sprintf("MoveAbortIn id=%d reason=%s fromTarget=%t", x.Abort.RequestID, x.Abort.Reason.Code, x.FromTarget)
	case handoff.MoveDeadline:
		return fmt.Sprintf("MoveDeadline id=%d", x.MoveID)
	case handoff.TakeIn:
		return fmt.Sprintf("TakeIn seq=%d fromReceiver=%t", x.Take.Seq, x.FromReceiver)
	case handoff.PauseDecode:
		return fmt.Sprintf("PauseDecode owner=%d id=%d", x.Owner.Request, x.MoveID)
	case handoff.SendMoveRequest:
		return fmt.Sprintf("SendMoveRequest to=%s/%x id=%d tokens=%d layout=%v", x.To.Address, x.To.Incarnation, x.Move.MoveID,
			len(x.Move.Tokens), x.Move.Layout)
	case handoff.SendMovePlan:
		return fmt.Sprintf("SendMovePlan to=%s/%x id=%d dest=%s", x.To.Address, x.To.Incarnation, x.Plan.MoveID, tags(x.Plan.DestTags))
	case handoff.SendMoveFrames:
		return fmt.Sprintf("SendMoveFrames id=%d pages=%d tail=%d", x.MoveID, len(x.Pages), len(x.Tail))
	case handoff.SendMoveDone:
		return fmt.Sprintf("SendMoveDone id=%d frames=%d err=%s", x.Done.RequestID, x.Done.Frames, wireErr(x.Done.Err))
	case handoff.HandOver:
		return fmt.Sprintf("HandOver to=%s/%x seq=%d", x.To.Address, x.To.Incarnation, x.Seq)
	case handoff.MoveEnded:
		return fmt.Sprintf("MoveEnded id=%d err=%s", x.MoveID, errName(x.Err))
	}
	return fmt.Sprintf("%T", x) // events without fields: Start, Cancel, Next, RetryReserve, RequestDeadline
}
