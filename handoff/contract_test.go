package handoff

// Tests of the machines' contracts with their shells: Run's order (an
// answered effect is the last of its step), every plan's end named to the
// shell, admission of a peer whose pool is unknown. They reuse pair
// (handoff_test.go) for the pools and the engine, but drive both machines
// with their own do, so that every nested step goes through it.

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// driver runs a Request and a Source over a pair, recording the order of
// every effect; hook, if set, carries an effect out instead (handled true).
type driver struct {
	*pair
	order []string
	hook  func(Effect) (ev Event, handled bool)
}

func newDriver(t *testing.T, decodePages int) *driver {
	return &driver{pair: newPair(t, decodePages, 16)}
}

func (d *driver) step(m Machine, ev Event) { Run(m, ev, d.now, d.do) }

func (d *driver) start(prompt []int, maxNew int) {
	cfg := RequestConfig{Geometry: d.decode.Geometry(), Incarnation: decodeInc, DataPlane: "decode:1",
		RequestTimeout: time.Minute, PrefillTimeout: 10 * time.Second, ReserveWait: time.Second,
		ReserveRetry: 10 * time.Millisecond, RetriesMax: RetriesMax, EOS: engine.EOS, Model: testModel.String()}
	d.req = NewRequest(cfg, kv.Owner{Request: 1, Tenant: "acme"}, 7, prompt, maxNew, Peer{Address: "prefill:1", Incarnation: prefillInc})
	d.step(d.req, Start{})
}

func (d *driver) do(e Effect) Event {
	d.order = append(d.order, fmt.Sprintf("%T", e))
	if d.hook != nil {
		if ev, ok := d.hook(e); ok {
			return ev
		}
	}
	key := func(id uint64) JobKey { return JobKey{Sender: "decode:1/req", ID: id} }
	switch e := e.(type) {
	case SendPlan:
		d.step(d.src, PlanIn{Key: key(e.Plan.RequestID), Plan: e.Plan})
		d.step(d.src, Next{})
		return nil
	case SendFrames:
		fr := d.frames[e.Key]
		delete(d.frames, e.Key)
		d.step(d.req, FramesIn{Frames: slices.Clone(fr.Frames)})
		return Sent{Key: e.Key, Err: fr.Unlease(d.prefill)}
	case Reply:
		d.step(d.req, TransferIn{Done: e.Done, FromPrefill: true})
		return nil
	case SendAck:
		d.step(d.src, AckIn{Key: key(e.Ack.RequestID), Ack: e.Ack})
		return nil
	case SendAbort:
		d.step(d.src, AbortIn{Key: key(e.Abort.RequestID), Tenant: e.Abort.Tenant})
		return nil
	case StartDecode:
		d.decodeAll(e, d.step)
		return nil
	}
	return d.pair.do(e) // page effects, Prefill, Emit, Finish, Timer, Pick, ...
}

// after lists the effects carried out after the first Finish.
func (d *driver) after() []string {
	i := slices.Index(d.order, "handoff.Finish")
	if i < 0 {
		return nil
	}
	return d.order[i+1:]
}

var prompt8 = []int{engine.BOS, 'a', 'b', 'c', 'd', 'e', 'f', 'g'}

// Run's contract: an effect that is answered is the last of its step. Both
// shells answer SendAck with Failed (a message that failed its own
// validation); Verified's step puts StartDecode after it, so the decode job
// goes out after the request answered, cancelled its decode and released
// its pages.
func TestFailedAckIsNotFollowedByStartDecode(t *testing.T) {
	d := newDriver(t, 16)
	d.hook = func(e Effect) (Event, bool) {
		switch e.(type) {
		case SendAck:
			return Failed{Err: errors.New("ack failed its own validation")}, true
		case StartDecode:
			return nil, true // recorded, not run
		}
		return nil, false
	}
	d.start(prompt8, 4)
	if d.finish == nil || d.finish.Cause == nil {
		t.Fatalf("finish %+v, want the ack's failure", d.finish)
	}
	if rest := d.after(); len(rest) != 0 {
		t.Fatalf("effects carried out after the request finished: %v (whole order %v)", rest, d.order)
	}
}

// The same contract for SendAbort, which the simulator answers with Failed:
// in picked's step the abort comes before the new attempt's Reserve, so a
// failed abort finishes the request and the Reserve that follows takes
// pages nothing will release (Reserved is ignored once done).
func TestFailedAbortOnRetryReservesNothing(t *testing.T) {
	d := newDriver(t, 16)
	d.hook = func(e Effect) (Event, bool) {
		switch e.(type) {
		case SendPlan:
			return nil, true // lost: the attempt ends at its deadline
		case Pick:
			return Picked{Peer: Peer{Address: "prefill:2", Incarnation: prefillInc + 1}, Attempt: 2, OK: true}, true
		case SendAbort:
			return Failed{Err: errors.New("abort failed its own validation")}, true
		}
		return nil, false
	}
	d.start(prompt8, 4)
	d.step(d.req, PrefillDeadline{Attempt: 1})
	if !d.req.Done() {
		t.Fatalf("request not done; effects %v", d.order)
	}
	if s := d.decode.Stats(); s.Free != 16 {
		t.Fatalf("%d of 16 decode pages free after the request answered; effects after its Finish: %v", s.Free, d.after())
	}
}

// oneSlotSource is a Source sending one transfer at a time, and a plan of
// one page for another node.
func oneSlotSource() (*Source, *messages.TransferPlan, JobKey, time.Time) {
	s := NewSource(SourceConfig{Role: "prefill", PageTokens: 4, QueueMax: 4, SendsMax: 1,
		ReclaimAfter: time.Second, DonePlansMax: 4, DoneFor: time.Minute, Model: testModel})
	plan := &messages.TransferPlan{RequestID: 3, Tenant: "acme", TokenCount: 2, PromptTokens: []uint32{1, 2},
		PageTokens: 4, DestTags: []kv.Tag{{Incarnation: decodeInc, Index: 0, Generation: 1}}, DataPlane: "d:1", Model: testModel.String()}
	return s, plan, JobKey{Sender: "d", ID: 3}, time.Unix(0, 0)
}

// A plan withdrawn from the queue by its abort (or one aborted while its
// frames were on their way, whose send then succeeds) leaves the Source
// without any effect naming it: a shell that keeps per-plan state until the
// plan's Reply (actors.workerActor.jobs) is never told to drop it.
func TestSourceTellsTheShellWhenAPlanEndsWithoutReply(t *testing.T) {
	s, plan, key, now := oneSlotSource()
	if eff := s.Step(PlanIn{Key: key, Plan: plan}, now); len(eff) != 1 || eff[0] != (Queued{Key: key}) {
		t.Fatalf("plan: %+v", eff)
	}
	eff := s.Step(AbortIn{Key: key, Tenant: "acme"}, now)
	if s.Counts().Queued != 0 {
		t.Fatalf("abort left %+v", s.Counts())
	}
	if len(eff) == 0 {
		t.Fatalf("the queued plan %+v ended by its abort with no effect: its shell keeps it forever", key)
	}
}

// The other way out without a Reply: aborted while its frames are on their
// way, and the send then succeeds (its outcome was already in the worker's
// mailbox when the abort came).
func TestSourceTellsTheShellWhenASentPlanWasAborted(t *testing.T) {
	s, plan, key, now := oneSlotSource()
	src := []kv.Tag{{Incarnation: prefillInc, Index: 0, Generation: 1}}
	s.Step(PlanIn{Key: key, Plan: plan}, now)
	s.Step(Next{}, now)
	if eff := s.Step(Prefilled{Key: key, Sources: src, Marked: 1, Sums: []uint64{1}}, now); len(eff) != 1 {
		t.Fatalf("prefilled: %+v", eff)
	}
	if eff := s.Step(AbortIn{Key: key, Tenant: "acme"}, now); len(eff) != 1 || eff[0] != (CancelSend{Key: key}) {
		t.Fatalf("abort while sending: %+v", eff)
	}
	eff := s.Step(Sent{Key: key}, now)
	if s.Counts() != (SourceCounts{}) {
		t.Fatalf("source holds %+v", s.Counts())
	}
	for _, e := range eff {
		switch e.(type) {
		case Reply:
			return
		case Ack, Release:
		default:
			return // some effect that names the plan's end
		}
	}
	t.Fatalf("the plan %+v ended with %+v: nothing tells the shell it is gone", key, eff)
}

// A peer a node picked itself with Pages 0 has a pool nobody knows yet
// (its status was not in): like a router's choice, the prompt is admitted
// on the node's own bounds, not refused as too long for 0 pages.
func TestPickedPeerWithUnknownPoolIsAdmitted(t *testing.T) {
	g := tinyModel().Geometry(4)
	a := NewAdmission(Limits{ContextTokens: 64, MaxTokensMax: 16, Geometry: g}, 4, 1, 64)
	if _, err := a.Admit(Ask{Key: ClientKey{Client: "c", ID: 1}, PromptTokens: 8, MaxTokens: 4, PrefillPages: 0}); err != nil {
		t.Fatalf("8-token prompt, picked peer of unknown pool: %v", err)
	}
}

// A failure however long (here a send that joined many refusals) is told
// within the wire's bounds, so the TransferDone carrying it goes out.
func TestWireIsBounded(t *testing.T) {
	var err error
	for i := range 200 {
		err = errors.Join(err, &kv.StaleTagError{Page: uint32(i), Have: kv.Tag{Incarnation: prefillInc, Index: uint32(i)}})
	}
	w := Wire(err)
	if len(w.Message) > messages.ErrorMessageBytesMax || len(err.Error()) <= messages.ErrorMessageBytesMax {
		t.Fatalf("message of %d bytes for an error of %d, bound %d", len(w.Message), len(err.Error()), messages.ErrorMessageBytesMax)
	}
	done := &messages.TransferDone{RequestID: 1, Tenant: "acme", Err: w}
	if verr := done.Validate(); verr != nil {
		t.Fatalf("a transfer done telling of it fails its own validation: %v", verr)
	}
}

// A TransferDone of another tenant's request that carries this request's
// id (a report misdirected between decode nodes) changes nothing.
func TestRequestIgnoresAnotherTenantsTransferDone(t *testing.T) {
	d := newDriver(t, 16)
	d.hook = func(e Effect) (Event, bool) {
		_, plan := e.(SendPlan)
		return nil, plan // the plan is lost: the request waits for its peer
	}
	d.start(prompt8, 4)
	before := len(d.order)
	d.step(d.req, TransferIn{Done: &messages.TransferDone{RequestID: 1, Tenant: "other", Err: &messages.WireError{
		Code: messages.CodeIntegrity, Message: "its own failure"}}, FromPrefill: true})
	if d.req.Done() || len(d.order) != before || d.req.Counts().Ignored != 1 {
		t.Fatalf("another tenant's report: done %t, effects %v, counts %+v", d.req.Done(), d.order[before:], d.req.Counts())
	}
}

// A plan aborted while its frames were on their way, whose send then
// fails (cut short by the abort), is not answered: nobody waits for it.
func TestSourceAnswersNoAbortedPlan(t *testing.T) {
	s, plan, key, now := oneSlotSource()
	src := []kv.Tag{{Incarnation: prefillInc, Index: 0, Generation: 1}}
	s.Step(PlanIn{Key: key, Plan: plan}, now)
	s.Step(Next{}, now)
	s.Step(Prefilled{Key: key, Sources: src, Marked: 1, Sums: []uint64{1}}, now)
	s.Step(AbortIn{Key: key, Tenant: "acme"}, now)
	eff := s.Step(Sent{Key: key, Err: errors.New("send cancelled")}, now)
	want := []Effect{Ack{Owner: kv.Owner{Request: 1, Tenant: "acme"}, Tags: src},
		Release{Owner: kv.Owner{Request: 1, Tenant: "acme"}, Tags: src}, Ended{Key: key}}
	if fmt.Sprint(eff) != fmt.Sprint(want) {
		t.Fatalf("effects %+v, want %+v", eff, want)
	}
}
