package handoff

// Each check of a Source, and of ExecPrefill, on its own: what a plan must
// agree with, who may end it, and how long it is remembered. The plans
// here passed their message's validation; the Source must hold its own
// line whatever the message layer lets through.

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// sourceAt is a plan of oneSlotSource's brought to stage: "queued",
// "running" (prefilling), "sending" or "awaiting" (decode's ack); it
// returns the source pages the plan holds from "sending" on.
func sourceAt(t *testing.T, stage string) (*Source, *messages.TransferPlan, JobKey, time.Time, []kv.Tag) {
	t.Helper()
	s, plan, key, now := oneSlotSource()
	src := []kv.Tag{{Incarnation: prefillInc, Index: 0, Generation: 1}}
	steps := []struct {
		stage string
		ev    Event
	}{
		{"queued", PlanIn{Key: key, Plan: plan}},
		{"running", Next{}},
		{"sending", Prefilled{Key: key, Sources: src, Marked: 1, Sums: []uint64{1}}},
		{"awaiting", Sent{Key: key}},
	}
	for _, st := range steps {
		if eff := s.Step(st.ev, now); len(eff) == 0 {
			t.Fatalf("%T on the way to %s: no effect", st.ev, stage)
		}
		if st.stage == stage {
			return s, plan, key, now, src
		}
	}
	t.Fatalf("no stage %q", stage)
	return nil, nil, key, now, nil
}

// TestOnlyThePlansTenantEndsIt: in every stage of a plan, an abort or an
// ack that names another tenant is without effect (the plan goes on to its
// reply, and its source pages are freed only by its own tenant's ack); the
// plan's own tenant ends it.
func TestOnlyThePlansTenantEndsIt(t *testing.T) {
	for _, stage := range []string{"queued", "running", "sending", "awaiting"} {
		for _, foreign := range []func(JobKey) Event{
			func(k JobKey) Event { return AbortIn{Key: k, Tenant: "globex"} },
			func(k JobKey) Event {
				return AckIn{Key: k, Ack: &messages.TransferAck{RequestID: k.ID, Tenant: "globex", TokenCount: 2, Pages: 1}}
			},
		} {
			s, _, key, now, src := sourceAt(t, stage)
			ev := foreign(key)
			before := s.Counts()
			if eff := s.Step(ev, now); len(eff) != 0 || s.Counts() != before {
				t.Fatalf("%s plan, %T of another tenant: effects %+v, counts %+v (were %+v)", stage, ev, eff, s.Counts(), before)
			}
			// The plan goes on as if nothing came: a prefill ends in a send,
			// a send in the reply, and only acme's ack frees the pages.
			switch stage {
			case "running":
				s.Step(Prefilled{Key: key, Sources: src, Marked: 1, Sums: []uint64{1}}, now)
				fallthrough
			case "sending":
				if _, ok := find[Reply](s.Step(Sent{Key: key}, now)); !ok {
					t.Fatalf("%s plan after %T of another tenant: not answered", stage, ev)
				}
				fallthrough
			case "awaiting":
				eff := s.Step(AckIn{Key: key, Ack: &messages.TransferAck{RequestID: key.ID, Tenant: "acme", TokenCount: 2, Pages: 1}}, now)
				if ack, ok := only[Ack](eff); !ok || fmt.Sprint(ack.Tags) != fmt.Sprint(src) {
					t.Fatalf("%s plan, its own ack after %T of another tenant: %+v", stage, ev, eff)
				}
			}
		}
	}
}

// TestAckMustRepeatThePlan: an ack whose token or page count is not the
// plan's is dropped, naming both, and frees nothing; the plan's own ack
// frees its source pages.
func TestAckMustRepeatThePlan(t *testing.T) {
	for _, tc := range []struct {
		tokens, pages uint32
		why           string
	}{
		{3, 1, "ack for 3 tokens in 1 pages, the plan has 2 in 1"},
		{2, 2, "ack for 2 tokens in 2 pages, the plan has 2 in 1"},
		{2, 0, "ack for 2 tokens in 0 pages, the plan has 2 in 1"},
	} {
		s, _, key, now, _ := sourceAt(t, "awaiting")
		ack := &messages.TransferAck{RequestID: key.ID, Tenant: "acme", TokenCount: tc.tokens, Pages: tc.pages}
		eff := s.Step(AckIn{Key: key, Ack: ack}, now)
		if d, ok := only[Dropped](eff); !ok || d.Why != tc.why || s.Counts().AwaitingAck != 1 {
			t.Fatalf("ack of %d tokens in %d pages: %+v, counts %+v; want it dropped: %s", tc.tokens, tc.pages, eff, s.Counts(), tc.why)
		}
	}
}

// TestSourceRefusesAPlanOfAnotherPageSize: a plan laid out in pages of
// another size than this pool's is refused, with both sizes, before it is
// queued.
func TestSourceRefusesAPlanOfAnotherPageSize(t *testing.T) {
	s, plan, key, now := oneSlotSource()
	plan.PageTokens = 8
	eff := s.Step(PlanIn{Key: key, Plan: plan}, now)
	var bad *BadRequestError
	if r, ok := only[RefusePlan](eff); !ok || !errors.As(r.Err, &bad) || bad.Reason != "plan pages of 8 tokens, this pool's hold 4" {
		t.Fatalf("a plan of 8-token pages to a pool of 4: %+v", eff)
	}
	if c := s.Counts(); c != (SourceCounts{}) {
		t.Fatalf("the refused plan is held: %+v", c)
	}
}

// TestSourceSendsAtMostSendsMax: with SendsMax transfers to other nodes on
// their way, no other plan for another node starts; one for this process
// does, and the next for another node once a send ends.
func TestSourceSendsAtMostSendsMax(t *testing.T) {
	s, plan, key, now, _ := sourceAt(t, "sending") // SendsMax 1
	next := *plan
	next.RequestID = 4
	nextKey := JobKey{Sender: key.Sender, ID: 4}
	s.Step(PlanIn{Key: nextKey, Plan: &next}, now)
	if s.Startable() {
		t.Fatal("a second send to another node may start with SendsMax 1 on its way")
	}
	local := next
	local.RequestID, local.DataPlane = 5, ""
	localKey := JobKey{Sender: key.Sender, ID: 5}
	s.Step(PlanIn{Key: localKey, Plan: &local}, now)
	if p, ok := only[Prefill](s.Step(Next{}, now)); !ok || p.Key != localKey {
		t.Fatalf("the plan for this process: %+v", p)
	}
	s.Step(Prefilled{Key: localKey, Err: errors.New("no pages")}, now)
	s.Step(Sent{Key: key}, now)
	if p, ok := only[Prefill](s.Step(Next{}, now)); !ok || p.Key != nextKey {
		t.Fatalf("the plan for another node once the send ended: %+v", p)
	}
}

// TestSourceForgetsPlansPastTheirReclaim: a plan whose ack has not come by
// ReclaimAfter is forgotten (its pages were reclaimed by the pool), so
// that plans whose decode node died do not pile up; an ack after that
// frees nothing.
func TestSourceForgetsPlansPastTheirReclaim(t *testing.T) {
	s, plan, key, now, _ := sourceAt(t, "awaiting") // ReclaimAfter 1s
	later := now.Add(time.Second + time.Nanosecond)
	next := *plan
	next.RequestID = 4
	nextKey := JobKey{Sender: key.Sender, ID: 4}
	s.Step(PlanIn{Key: nextKey, Plan: &next}, later)
	s.Step(Next{}, later)
	s.Step(Prefilled{Key: nextKey, Sources: []kv.Tag{{Incarnation: prefillInc, Index: 1, Generation: 1}}, Marked: 1,
		Sums: []uint64{1}}, later)
	s.Step(Sent{Key: nextKey}, later)
	if c := s.Counts(); c.AwaitingAck != 1 {
		t.Fatalf("after a send past the first plan's reclaim: %+v, want only the second awaiting", c)
	}
	ack := &messages.TransferAck{RequestID: key.ID, Tenant: "acme", TokenCount: 2, Pages: 1}
	if eff := s.Step(AckIn{Key: key, Ack: ack}, later); len(eff) != 0 {
		t.Fatalf("the forgotten plan's ack: %+v", eff)
	}
}

// TestDonePlansBounds: a plan that ended is remembered for less than its
// time to live, not at it, and the oldest of more than max is forgotten.
func TestDonePlansBounds(t *testing.T) {
	now := time.Unix(0, 0)
	d := NewDonePlans(2, time.Minute)
	a, b, c := JobKey{ID: 1}, JobKey{ID: 2}, JobKey{ID: 3}
	d.Add(a, now)
	if !d.Has(a, now.Add(time.Minute-time.Nanosecond)) || d.Has(a, now.Add(time.Minute)) {
		t.Fatal("a plan that ended not remembered for exactly its time to live")
	}
	d.Add(a, now)
	d.Add(b, now)
	d.Add(c, now)
	if d.Has(a, now) || !d.Has(b, now) || !d.Has(c, now) {
		t.Fatalf("three plans, at most two remembered: %t %t %t, want the oldest forgotten", d.Has(a, now), d.Has(b, now), d.Has(c, now))
	}
}

// TestPrefillRefusesAPlanOfOtherPages: a plan whose destination pages are
// not as many as the prompt's pages in this pool is refused before any
// frame is made, naming both counts.
func TestPrefillRefusesAPlanOfOtherPages(t *testing.T) {
	for _, dest := range []int{2, 4} {
		p := newPair(t, 16, 16)
		prompt := []uint32{engine.BOS, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'} // 3 pages of 4
		tags, err := p.decode.Reserve(kv.Owner{Request: 9, Tenant: "acme"}, 0, dest)
		if err != nil {
			t.Fatal(err)
		}
		plan := &messages.TransferPlan{RequestID: 9, Tenant: "acme", TokenCount: uint32(len(prompt)), PromptTokens: prompt,
			PageTokens: 4, DestTags: tags, Model: testModel.String()}
		local := kv.Owner{Request: 1, Tenant: "acme"}
		out, fr := ExecPrefill(p.engine, p.prefill, Prefill{Key: JobKey{ID: 9}, Plan: plan, Owner: plan.Owner(), Local: local})
		want := fmt.Sprintf("plan has %d destination pages for 3 prompt pages", dest)
		if out.Err == nil || !strings.Contains(out.Err.Error(), want) || len(fr.Frames) != 0 || len(fr.Leases) != 0 {
			t.Fatalf("a plan of %d destination pages for 3: %+v, %d frames; want %q", dest, out, len(fr.Frames), want)
		}
	}
}
