package handoff

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// pair is one decode pool and one prefill pool in different runs, with
// the reference engine, and a clock: the smallest world a handoff runs in.
type pair struct {
	t                 *testing.T
	now               time.Time
	engine            *engine.ReferenceEngine
	decode, prefill   PoolPages
	req               *Request
	src               *Source
	frames            map[JobKey]Frames
	tokens            []int
	finish            *Finish
	timers            []Timer
	acks, aborts      int
	dropFrames        bool // the frames of the next send are lost
	sendFails         error
	corruptFirstFrame bool
	observe           func(Effect) // called before each effect is carried out, if set
	// effect, if set, carries out the effects it takes (it says so) in
	// place of do: a test's own decode worker, say.
	effect func(Effect) (Event, bool)
	// held is the decode pool's prefix cache, over heldPages (the decode
	// pool), when the test gives it one (withDecodeCache).
	held      *PrefixCache
	heldPages *lossyPages
	// prefixCache is the prefill pool's, over prefixPages, when the test
	// gives it one (withPrefillCache).
	prefixCache *PrefixCache
	prefixPages *lossyPages
	// keeps wait for the decode job's end, as a Keep sent to a worker
	// waits for the step that closed the sequence (flushKeeps).
	keeps []Keep
}

// testModel stands for the fingerprint of the model every node of a test
// computes.
var testModel = engine.Fingerprint{0x6b, 0x76}

const (
	decodeInc  = 0xd1
	prefillInc = 0xa1
)

func tinyModel() engine.ModelConfig {
	c := engine.DefaultModelConfig()
	c.Dim, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.HiddenDim, c.ContextTokens = 32, 1, 2, 1, 16, 64, 256
	return c
}

func newPair(t *testing.T, decodePages, prefillPages int) *pair {
	t.Helper()
	p := &pair{t: t, now: time.Unix(1_000_000, 0), frames: map[JobKey]Frames{}}
	e, err := engine.NewReferenceEngine(tinyModel())
	if err != nil {
		t.Fatal(err)
	}
	p.engine = e
	g := e.Config().Geometry(4)
	clock := func() time.Time { return p.now }
	for _, x := range []struct {
		pages *PoolPages
		n     int
		inc   uint64
	}{{&p.decode, decodePages, decodeInc}, {&p.prefill, prefillPages, prefillInc}} {
		pool, err := kv.NewPool(kv.DefaultConfig(g, x.n, x.inc))
		if err != nil {
			t.Fatal(err)
		}
		*x.pages = PoolPages{Pool: pool, Now: clock}
	}
	p.src = NewSource(SourceConfig{Role: "prefill", PageTokens: 4, QueueMax: 4, SendsMax: 2,
		ReclaimAfter: 30 * time.Second, DonePlansMax: 16, DoneFor: time.Minute, Model: testModel})
	return p
}

func (p *pair) start(prompt []int, maxNew int) {
	p.req = NewRequest(p.config(), kv.Owner{Request: 1, Tenant: "acme"}, 7, prompt, maxNew, Peer{Address: "prefill:1", Incarnation: prefillInc})
	p.step(p.req, Start{})
}

// config is what the pair's requests share.
func (p *pair) config() RequestConfig {
	return RequestConfig{Geometry: p.decode.Geometry(), Incarnation: decodeInc, DataPlane: "decode:1",
		RequestTimeout: time.Minute, PrefillTimeout: 10 * time.Second, ReserveWait: time.Second,
		ReserveRetry: 10 * time.Millisecond, RetriesMax: RetriesMax, EOS: engine.EOS, Model: testModel.String(),
		Keep: p.held != nil}
}

// step runs one event through m and every effect across both sides, as a
// node's actors would, but in one goroutine and with no network.
func (p *pair) step(m Machine, ev Event) {
	Run(m, ev, p.now, p.do)
}

func (p *pair) do(e Effect) Event {
	if p.observe != nil {
		p.observe(e)
	}
	if p.effect != nil {
		if ev, ok := p.effect(e); ok {
			return ev
		}
	}
	key := JobKey{Sender: "decode:1/req", ID: p.req.Owner().Request}
	switch e := e.(type) {
	case Reserve:
		if p.held != nil {
			return ExecReserveHeld(p.heldPages, LocalCache{Pages: p.heldPages, Cache: p.held}, e)
		}
		return ExecReserve(p.decode, e)
	case Keep:
		p.keeps = append(p.keeps, e)
	case Unhold:
		for _, c := range e.Pages {
			LocalCache{Pages: p.heldPages, Cache: p.held}.Forget(c)
		}
	case Release:
		if len(e.Tags) > 0 && e.Tags[0].Incarnation == decodeInc {
			ExecRelease(p.decode, e, nil)
		} else {
			ExecRelease(p.prefill, e, nil)
		}
	case SendPlan:
		p.step(p.src, PlanIn{Key: key, Plan: e.Plan})
		p.step(p.src, Next{})
	case Prefill:
		var out Prefilled
		var fr Frames
		if p.prefixCache != nil {
			out, fr = ExecPrefillCached(p.engine, p.prefixPages, p.prefixCache, e)
		} else {
			out, fr = ExecPrefill(p.engine, p.prefill, e)
		}
		p.frames[e.Key] = fr
		return out
	case SendFrames:
		fr := p.frames[e.Key]
		delete(p.frames, e.Key)
		frames := slices.Clone(fr.Frames)
		if p.corruptFirstFrame {
			frames[0].Payload = slices.Clone(frames[0].Payload)
			frames[0].Payload[0] ^= 1
		}
		if !p.dropFrames {
			p.step(p.req, FramesIn{Frames: frames})
		}
		return Sent{Key: e.Key, Err: errors.Join(p.sendFails, fr.Unlease(p.prefill))}
	case Reply:
		p.step(p.req, TransferIn{Done: e.Done, FromPrefill: true})
	case Write:
		return ExecWrite(p.decode, e)
	case SealVerify:
		return ExecSealVerify(p.decode, e)
	case SendAck:
		p.acks++
		p.step(p.src, AckIn{Key: key, Ack: e.Ack})
	case SendAbort:
		p.aborts++
		p.step(p.src, AbortIn{Key: key, Tenant: e.Abort.Tenant})
	case Ack:
		if p.prefixCache != nil {
			ExecAckKeep(p.prefixPages, p.prefixCache, e, nil)
		} else {
			ExecAck(p.prefill, e, nil)
		}
	case StartDecode:
		p.decodeAll(e, p.step)
	case Emit:
		p.tokens = append(p.tokens, int(e.Chunk.Tokens[0]))
	case Finish:
		p.finish = &e
	case Timer:
		p.timers = append(p.timers, e)
	case Pick:
		return Picked{} // one prefill peer only
	case CancelDecode, Refuse, Retry, RefusePlan, Queued, Dropped, CancelSend:
	default:
		p.t.Fatalf("unexpected effect %T", e)
	}
	return nil
}

// decodeAll runs a decode job to its end, as a worker would, stepping the
// request with step.
func (p *pair) decodeAll(e StartDecode, step func(Machine, Event)) {
	s, err := Begin(p.engine, p.decode, e, engine.EOS)
	if err != nil {
		step(p.req, DecodeEnded{Err: err})
		return
	}
	step(p.req, TokenIn{Token: e.Next})
	for done := s.Ended(); !done; {
		var tok int
		tok, done, err = s.Step(p.decode)
		if err == nil {
			step(p.req, TokenIn{Token: tok})
		}
	}
	step(p.req, DecodeEnded{Err: errors.Join(err, s.Close(p.decode))})
}

// freeAfterDeadlines advances the clock past every deadline and reports
// the pages of both pools that are not free.
func (p *pair) freeAfterDeadlines() (busy int) {
	p.now = p.now.Add(time.Hour)
	for _, pool := range []*kv.Pool{p.decode.Pool, p.prefill.Pool} {
		pool.Tick(p.now)
		for i := 0; i < pool.Config().Pages; i++ {
			if pool.Inspect(uint32(i)).State != kv.Free {
				busy++
			}
		}
	}
	return busy
}

func TestHandoffAnswersTheReference(t *testing.T) {
	p := newPair(t, 16, 16)
	prompt := []int{engine.BOS, 'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}
	p.start(prompt, 6)
	want, err := p.engine.Reference(prompt, 6)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(want, engine.EOS); i >= 0 {
		want = want[:i+1]
	}
	if p.finish == nil || p.finish.Cause != nil {
		t.Fatalf("finish = %+v, want an answer", p.finish)
	}
	if !slices.Equal(p.tokens, want) || !slices.Equal(p.finish.Tokens, want) {
		t.Fatalf("tokens %v (result %v), the reference gives %v", p.tokens, p.finish.Tokens, want)
	}
	if p.acks != 1 || p.aborts != 0 {
		t.Fatalf("%d acks, %d aborts; want 1 and 0", p.acks, p.aborts)
	}
	if c := p.src.Counts(); c != (SourceCounts{}) {
		t.Fatalf("source still holds %+v after the ack", c)
	}
	// Nothing waits on a deadline: every page is free at once.
	for _, pool := range []*kv.Pool{p.decode.Pool, p.prefill.Pool} {
		if s := pool.Stats(); s.Free != pool.Config().Pages {
			t.Fatalf("pool of run %x: %d of %d pages free", pool.Config().Incarnation, s.Free, pool.Config().Pages)
		}
	}
}

// TestStopCompletesAtTheTokensSoFar: a stop that comes while decode
// generates ends the request as completed, with FinishStopSequence and the
// tokens streamed until then, withdraws the decode worker and frees every
// page of both pools at once; a stop before the first token is a cancel.
func TestStopCompletesAtTheTokensSoFar(t *testing.T) {
	prompt := []int{engine.BOS, 'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}
	p := newPair(t, 16, 16)
	want, err := p.engine.Reference(prompt, 6)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(want, engine.EOS); i >= 0 && i < 3 {
		t.Fatalf("the reference %v ends before its third token: no stop can come while it decodes", want)
	}
	var withdrawn, released int
	p.observe = func(e Effect) {
		switch e := e.(type) {
		case Emit:
			if e.Chunk.Seq == 2 {
				p.step(p.req, Stop{})
			}
		case CancelDecode:
			withdrawn++
		case Release:
			if p.finish == nil && len(e.Tags) > 0 && e.Tags[0].Incarnation == decodeInc {
				released += len(e.Tags)
			}
		}
	}
	p.start(prompt, 6)
	switch {
	case p.finish == nil || p.finish.Cause != nil:
		t.Fatalf("finish = %+v, want the request completed", p.finish)
	case p.finish.Result.FinishReason != messages.FinishStopSequence || p.finish.Result.Err != nil:
		t.Fatalf("result %+v, want finish stop_sequence", p.finish.Result)
	case !slices.Equal(p.finish.Tokens, want[:2]) || len(p.finish.Result.Tokens) != 2:
		t.Fatalf("result tokens %v, want the first two of the reference %v", p.finish.Tokens, want)
	case p.finish.Phases == nil:
		t.Fatal("a stopped request has no phases: it is not counted as completed")
	case withdrawn != 1:
		t.Fatalf("the decode worker was withdrawn %d times, want once", withdrawn)
	case released == 0:
		t.Fatal("the stop released no decode page")
	case p.acks != 1 || p.aborts != 0:
		t.Fatalf("%d acks, %d aborts; want the transfer acknowledged and nothing aborted", p.acks, p.aborts)
	}
	for _, pool := range []*kv.Pool{p.decode.Pool, p.prefill.Pool} {
		if s := pool.Stats(); s.Free != pool.Config().Pages {
			t.Fatalf("pool of run %x: %d of %d pages free after the stop", pool.Config().Incarnation, s.Free, pool.Config().Pages)
		}
	}
	p.step(p.req, Stop{})
	if p.finish.Result.FinishReason != messages.FinishStopSequence || p.req.Counts().Ignored == 0 {
		t.Fatalf("a second stop after the end changed the answer or was not ignored: %+v", p.finish.Result)
	}

	before := newPair(t, 16, 16)
	before.dropFrames = true
	before.observe = func(e Effect) {
		if _, ok := e.(SendPlan); ok {
			before.step(before.req, Stop{})
		}
	}
	before.start(prompt, 6)
	if before.finish == nil || !errors.Is(before.finish.Cause, ErrCancelled) ||
		before.finish.Result.Err.Code != messages.CodeCancelled {
		t.Fatalf("a stop before the first token: %+v, want cancelled", before.finish)
	}
	if busy := before.freeAfterDeadlines(); busy != 0 {
		t.Fatalf("%d pages not free after a stop before the first token", busy)
	}
}

func TestHandoffFailsCleanly(t *testing.T) {
	prompt := []int{engine.BOS, 'a', 'b', 'c', 'd', 'e', 'f', 'g'}
	for _, tc := range []struct {
		name  string
		setup func(p *pair)
		code  messages.ErrorCode
	}{
		{"corrupted frame", func(p *pair) { p.corruptFirstFrame = true }, messages.CodeIntegrity},
		{"frames lost", func(p *pair) { p.dropFrames = true }, messages.CodeIntegrity},
		{"send failed", func(p *pair) { p.sendFails = errors.New("connection reset") }, messages.CodeInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, 16, 16)
			tc.setup(p)
			p.start(prompt, 4)
			if p.finish == nil || p.finish.Cause == nil {
				t.Fatalf("finish = %+v, want a failure", p.finish)
			}
			if got := p.finish.Result.Err.Code; got != tc.code {
				t.Fatalf("code %s (%v), want %s", got, p.finish.Cause, tc.code)
			}
			if len(p.tokens) != 0 {
				t.Fatalf("streamed %v before failing", p.tokens)
			}
			if busy := p.freeAfterDeadlines(); busy != 0 {
				t.Fatalf("%d pages not free after every deadline", busy)
			}
		})
	}
}

func TestHandoffRetriesAReservationUntilReserveWait(t *testing.T) {
	p := newPair(t, 2, 16) // the prompt needs 2 pages and decoding 1 more
	p.start([]int{engine.BOS, 'a', 'b', 'c', 'd', 'e'}, 3)
	if p.finish != nil || len(p.timers) != 2 {
		t.Fatalf("finish %+v, timers %+v: want a retry armed", p.finish, p.timers)
	}
	for p.finish == nil {
		tm := p.timers[len(p.timers)-1]
		if _, ok := tm.Event.(RetryReserve); !ok {
			t.Fatalf("last timer %+v, want a reservation retry", tm)
		}
		p.now = p.now.Add(tm.After)
		p.step(p.req, tm.Event)
	}
	var busy *BusyError
	if !errors.As(p.finish.Cause, &busy) || busy.Where != "decode pool" || busy.Have != 1 || busy.Limit != 0 {
		t.Fatalf("cause %v, want busy: the decode pool has 0 of the 1 spare page needed", p.finish.Cause)
	}
}

// TestSourceRefusesAnotherModel: a plan from a decode node computing
// another model is refused with both fingerprints, before any work.
func TestSourceRefusesAnotherModel(t *testing.T) {
	s := NewSource(SourceConfig{Role: "prefill", PageTokens: 4, QueueMax: 1, SendsMax: 1,
		ReclaimAfter: time.Second, DonePlansMax: 4, DoneFor: time.Minute, Model: testModel})
	other := engine.Fingerprint{0xee}
	plan := &messages.TransferPlan{RequestID: 3, Tenant: "acme", TokenCount: 2, PromptTokens: []uint32{1, 2},
		PageTokens: 4, DestTags: []kv.Tag{{Incarnation: decodeInc, Index: 0, Generation: 1}}, DataPlane: "d:1", Model: other.String()}
	eff := s.Step(PlanIn{Key: JobKey{Sender: "d", ID: 3}, Plan: plan}, time.Unix(0, 0))
	var fp *engine.FingerprintError
	if len(eff) != 1 || !errors.As(eff[0].(RefusePlan).Err, &fp) || fp.Ours != testModel || fp.Theirs != other {
		t.Fatalf("a plan for model %s, to a worker of %s: %+v", other, testModel, eff)
	}
	if w := Wire(fp); w.Code != messages.CodeModelMismatch || !strings.Contains(w.Message, other.String()) ||
		!strings.Contains(w.Message, testModel.String()) {
		t.Fatalf("on the wire: %+v", w)
	}
	if c := s.Counts(); c.Queued != 0 {
		t.Fatalf("the refused plan was queued: %+v", c)
	}
}

func TestSourceDropsDuplicatesAndForeignAcks(t *testing.T) {
	s := NewSource(SourceConfig{Role: "prefill", PageTokens: 4, QueueMax: 1, SendsMax: 1,
		ReclaimAfter: time.Second, DonePlansMax: 4, DoneFor: time.Minute, Model: testModel})
	now := time.Unix(0, 0)
	plan := &messages.TransferPlan{RequestID: 3, Tenant: "acme", TokenCount: 2, PromptTokens: []uint32{1, 2},
		PageTokens: 4, DestTags: []kv.Tag{{Incarnation: decodeInc, Index: 0, Generation: 1}}, DataPlane: "d:1", Model: testModel.String()}
	key := JobKey{Sender: "d", ID: 3}
	if eff := s.Step(PlanIn{Key: key, Plan: plan}, now); len(eff) != 1 || eff[0] != (Queued{Key: key}) {
		t.Fatalf("first plan: %+v", eff)
	}
	if eff := s.Step(PlanIn{Key: key, Plan: plan}, now); len(eff) != 1 || eff[0].(Dropped).Why != "duplicate transfer plan" {
		t.Fatalf("duplicate plan: %+v", eff)
	}
	other := JobKey{Sender: "d", ID: 4}
	if eff := s.Step(PlanIn{Key: other, Plan: plan}, now); len(eff) != 1 {
		t.Fatalf("plan past QueueMax: %+v", eff)
	} else if _, busy := eff[0].(RefusePlan).Err.(*BusyError); !busy {
		t.Fatalf("plan past QueueMax refused with %v", eff[0].(RefusePlan).Err)
	}
	// Another tenant's abort does not withdraw the plan; its own does, and
	// the plan is then remembered as ended.
	s.Step(AbortIn{Key: key, Tenant: "evil"}, now)
	if s.Counts().Queued != 1 {
		t.Fatalf("a foreign abort withdrew the plan: %+v", s.Counts())
	}
	s.Step(AbortIn{Key: key, Tenant: "acme"}, now)
	if s.Counts().Queued != 0 {
		t.Fatalf("the tenant's abort left %+v", s.Counts())
	}
	if eff := s.Step(PlanIn{Key: key, Plan: plan}, now); len(eff) != 1 || eff[0].(Dropped).Why != "duplicate transfer plan" {
		t.Fatalf("plan after its abort: %+v", eff)
	}
}

// TestEncodeRefusesUnencoded: a prompt longer than the context window can
// hold, at the most bytes a token stands for, is refused by its length
// with the count it needs at least; one that may fit is encoded.
func TestEncodeRefusesUnencoded(t *testing.T) {
	l := Limits{ContextTokens: 64}
	if p, err := Encode(l, engine.ByteTokenizer{}, strings.Repeat("x", 63), false); err != nil || len(p) != 64 {
		t.Fatalf("63 bytes and BOS in a 64-token window: %d tokens, %v", len(p), err)
	}
	p, err := Encode(l, engine.ByteTokenizer{}, strings.Repeat("x", 1<<20), false)
	var long *PromptTooLongError
	if p != nil || !errors.As(err, &long) || !long.AtLeast || long.Tokens != 1<<20+1 || long.Limit != 64 ||
		!strings.Contains(err.Error(), "needs at least 1048577 tokens, context window holds 64") {
		t.Fatalf("a 1 MiB prompt: %d tokens, %v", len(p), err)
	}
	if w := Wire(err); w.Code != messages.CodePromptTooLong || w.Have != 1<<20+1 {
		t.Fatalf("on the wire: %+v", w)
	}
}

func TestAdmitNamesTheSmallestPool(t *testing.T) {
	l := Limits{ContextTokens: 64, MaxTokensMax: 16, Geometry: tinyModel().Geometry(4)}
	for _, tc := range []struct {
		prompt, max, prefill, decode int
		where                        string
	}{
		{prompt: 0, max: 1, prefill: 8, decode: 8, where: "bad"},
		{prompt: 4, max: 17, prefill: 8, decode: 8, where: "bad"},
		{prompt: 65, max: 1, prefill: 64, decode: 64, where: "context window"},
		{prompt: 60, max: 8, prefill: 64, decode: 64, where: "context window (prompt + max_tokens)"},
		{prompt: 33, max: 1, prefill: 8, decode: 64, where: "prefill pool"},
		{prompt: 32, max: 5, prefill: 8, decode: 8, where: "decode pool"},
		{prompt: 32, max: 1, prefill: 8, decode: 8, where: ""},
	} {
		err := Admit(l, tc.prompt, tc.max, tc.prefill, tc.decode)
		var long *PromptTooLongError
		var bad *BadRequestError
		switch {
		case tc.where == "" && err != nil, tc.where == "bad" && !errors.As(err, &bad):
			t.Errorf("%+v: %v", tc, err)
		case tc.where != "" && tc.where != "bad" && (!errors.As(err, &long) || long.Where != tc.where):
			t.Errorf("%+v: %v, want too long for %s", tc, err, tc.where)
		}
	}
}

// failingAwait is a pool whose AwaitAck refuses from the second call on.
type failingAwait struct {
	PoolPages
	calls int
}

func (f *failingAwait) AwaitAck(tag kv.Tag, owner kv.Owner) error {
	if f.calls++; f.calls > 1 {
		return &kv.StateError{Page: tag, Op: "await ack", State: kv.Sealed}
	}
	return f.PoolPages.AwaitAck(tag, owner)
}

func TestPrefillThatFailsLeavesNoLease(t *testing.T) {
	p := newPair(t, 16, 16)
	pool := &failingAwait{PoolPages: p.prefill}
	prompt := []uint32{engine.BOS, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'} // 3 pages of 4 tokens
	dest, err := p.decode.Reserve(kv.Owner{Request: 9, Tenant: "acme"}, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	plan := &messages.TransferPlan{RequestID: 9, Tenant: "acme", TokenCount: uint32(len(prompt)), PromptTokens: prompt,
		PageTokens: 4, DestTags: dest, Model: testModel.String()}
	local := kv.Owner{Request: 1, Tenant: "acme"}
	out, fr := ExecPrefill(p.engine, pool, Prefill{Key: JobKey{ID: 9}, Plan: plan, Owner: plan.Owner(), Local: local})
	if out.Err == nil || len(fr.Frames) != 0 || len(fr.Leases) != 0 || out.Marked != 1 || len(out.Sources) != 3 {
		t.Fatalf("prefill that failed at the second page: %+v, %d frames, %d leases", out, len(fr.Frames), len(fr.Leases))
	}
	for i := range 3 {
		if info := p.prefill.Inspect(uint32(out.Sources[i].Index)); info.Readers != 0 {
			t.Fatalf("source page %d still has %d readers", i, info.Readers)
		}
	}
	// What the Source does with a failed prefill frees every page.
	ExecAck(p.prefill, Ack{Owner: local, Tags: out.Sources[:out.Marked]}, nil)
	ExecRelease(p.prefill, Release{Owner: local, Tags: out.Sources}, func(tag kv.Tag, err error) { t.Errorf("release %s: %v", tag, err) })
	if s := p.prefill.Stats(); s.Free != 16 {
		t.Fatalf("%d of 16 prefill pages free after the failed prefill was released", s.Free)
	}
}
