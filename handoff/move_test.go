package handoff

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

const (
	sourceInc = 0x51
	targetInc = 0x7a
)

var (
	sourceOwner = kv.Owner{Request: 5, Tenant: "acme"}
	targetOwner = kv.Owner{Request: 9, Tenant: "acme"}
)

// movePage is a page of a running sequence on its source, as a move sends
// it: its tag (for the tail, the page reserved for it), seal sum and rows.
type movePage struct {
	tag  kv.Tag
	sum  uint64
	rows []byte
}

// move carries a request that streamed k tokens on a source pool over to a
// target pool: it runs the target's Request, carrying out its effects as
// the target's actors would and playing the source's part (frames and the
// report on the plan). The decode job is stepped by the test (decode).
type move struct {
	t            *testing.T
	now          time.Time
	engine       *engine.ReferenceEngine
	target       PoolPages
	req          *Request
	m            *messages.MoveRequest
	pages        []movePage
	lastToken    int // the last token the source streamed, which its report names
	seq          *Sequence
	chunks       []*messages.TokenChunk
	finish       *Finish
	acks, aborts int
	refused      []*StrangerError
	timers       []Timer
	// onPlan, onAck and onAbort, when set, take the target's plan, ack and
	// abort to the source; without them the move plays the source itself.
	onPlan  func(*messages.MovePlan)
	onAck   func(*messages.TransferAck)
	onAbort func(*messages.TransferAbort)
}

// newMove runs a request of prompt on a source pool of its own for k
// tokens and asks the target to take it over, up to maxNew tokens.
func newMove(t *testing.T, prompt []int, k, maxNew int) *move {
	t.Helper()
	e, err := engine.NewReferenceEngine(tinyModel())
	if err != nil {
		t.Fatal(err)
	}
	g := e.Config().Geometry(4)
	src, err := kv.NewPool(kv.DefaultConfig(g, 64, sourceInc))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	at := func(first int) kv.Tag {
		tags, err := src.Reserve(sourceOwner, first, 1, now)
		if err != nil {
			t.Fatal(err)
		}
		return tags[0]
	}
	tags, err := src.Reserve(sourceOwner, 0, g.PagesFor(len(prompt)), now)
	if err != nil {
		t.Fatal(err)
	}
	pf, err := e.Prefill(src, sourceOwner, tags, prompt)
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.Decode(src, pf.Manifest, pf.First)
	if err != nil {
		t.Fatal(err)
	}
	streamed := []uint32{uint32(pf.First)}
	for len(streamed) < k {
		if first, need := s.NeedsPage(); need {
			if err := s.GrantPage(at(first)); err != nil {
				t.Fatal(err)
			}
		}
		tok, err := s.Step(src)
		if err != nil {
			t.Fatal(err)
		}
		streamed = append(streamed, uint32(tok))
	}
	var pages []movePage
	mf := s.Manifest()
	for _, mp := range mf.Pages {
		l, err := src.Lease(mp.Tag, sourceOwner)
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := src.Read(l)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, movePage{tag: mp.Tag, sum: mp.Checksum, rows: slices.Clone(b)})
	}
	if tail := s.Tail(); len(tail) > 0 {
		tag := at(mf.Tokens)
		pages = append(pages, movePage{tag: tag, rows: tail,
			sum: kv.PageChecksum(tag, sourceOwner, mf.Tokens, len(tail)/g.BytesPerToken(), tail)})
	}
	m := &messages.MoveRequest{MoveID: 3, Tenant: "acme", ClientID: 7, Receiver: "router:1", ReceiverID: "relay",
		Tokens: streamed, MaxTokens: uint32(maxNew), Seq: uint32(k), PageTokens: 4, SourceIncarnation: sourceInc,
		TargetIncarnation: targetInc, Model: testModel.String()}
	m.Prompt = u32s(prompt)
	for _, pg := range pages {
		m.Layout = append(m.Layout, uint32(len(pg.rows)/g.BytesPerToken()))
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	mv := newTarget(t, e, m)
	mv.pages = pages
	return mv
}

// newTarget is the target's side of move m, over a pool of its own.
func newTarget(t *testing.T, e *engine.ReferenceEngine, m *messages.MoveRequest) *move {
	t.Helper()
	g := e.Config().Geometry(int(m.PageTokens))
	tgt, err := kv.NewPool(kv.DefaultConfig(g, 64, targetInc))
	if err != nil {
		t.Fatal(err)
	}
	mv := &move{t: t, now: time.Unix(1_000_000, 0), engine: e, m: m, lastToken: int(m.Tokens[len(m.Tokens)-1])}
	mv.target = PoolPages{Pool: tgt, Now: func() time.Time { return mv.now }}
	cfg := RequestConfig{Geometry: g, Incarnation: targetInc, DataPlane: "target:1", RequestTimeout: time.Minute,
		PrefillTimeout: 10 * time.Second, ReserveWait: time.Second, ReserveRetry: 10 * time.Millisecond,
		RetriesMax: RetriesMax, EOS: engine.EOS, Model: testModel.String()}
	mv.req = NewMovedRequest(cfg, targetOwner, m, Peer{Address: "source:1", Incarnation: m.SourceIncarnation})
	return mv
}

func (mv *move) step(ev Event) { Run(mv.req, ev, mv.now, mv.do) }

func (mv *move) do(e Effect) Event {
	switch e := e.(type) {
	case Reserve:
		return ExecReserve(mv.target, e)
	case SendMovePlan:
		if mv.onPlan != nil {
			mv.onPlan(e.Plan)
		} else {
			mv.sendPages(e.Plan)
		}
	case Write:
		return ExecWrite(mv.target, e)
	case SealVerify:
		return ExecSealVerify(mv.target, e)
	case StartDecode:
		if !e.Resume || e.Next != mv.lastToken {
			mv.t.Fatalf("a moved request starts decode with %+v, want to resume from %d", e, mv.lastToken)
		}
		s, err := Begin(mv.engine, mv.target, e, engine.EOS)
		if err != nil {
			return DecodeEnded{Err: err}
		}
		mv.seq = s
		return Resumed{}
	case SendAck:
		mv.acks++
		if mv.onAck != nil {
			mv.onAck(e.Ack)
		}
	case SendAbort:
		mv.aborts++
		if mv.onAbort != nil {
			mv.onAbort(e.Abort)
		}
	case Release:
		ExecRelease(mv.target, e, nil)
	case Emit:
		mv.chunks = append(mv.chunks, e.Chunk)
	case Finish:
		if mv.finish != nil {
			mv.t.Fatalf("a second answer: %+v after %+v", e, mv.finish)
		}
		mv.finish = &e
	case Timer:
		mv.timers = append(mv.timers, e)
	case Refuse:
		mv.refused = append(mv.refused, e.Err)
	case CancelDecode:
		if mv.seq != nil {
			mv.closeSeq(nil)
		}
	default:
		mv.t.Fatalf("unexpected effect %T", e)
	}
	return nil
}

// sendPages plays the source on the plan: a frame of each page to the
// page the plan names, then the report.
func (mv *move) sendPages(plan *messages.MovePlan) {
	if len(plan.DestTags) != len(mv.pages) || plan.MoveID != mv.m.MoveID || plan.Owner() != targetOwner {
		mv.t.Fatalf("plan %+v for %d pages", plan, len(mv.pages))
	}
	bpt := mv.target.Geometry().BytesPerToken()
	var frames []kv.Frame
	sums := make([]uint64, len(mv.pages))
	first := 0
	for i, pg := range mv.pages {
		frames = append(frames, kv.Frame{Owner: plan.Owner(), Source: pg.tag, Dest: plan.DestTags[i], FirstToken: first,
			Tokens: len(pg.rows) / bpt, Payload: pg.rows})
		sums[i] = pg.sum
		first += len(pg.rows) / bpt
	}
	mv.step(FramesIn{Frames: frames})
	mv.step(TransferIn{FromPrefill: true, Done: &messages.TransferDone{RequestID: plan.Request, Tenant: plan.Tenant,
		First: uint32(mv.lastToken), Frames: uint32(len(frames)), Source: sourceOwner.Request, Sums: sums}})
}

// decode steps the decode job up to n times, or to its end.
func (mv *move) decode(n int) {
	for range n {
		if mv.seq == nil {
			return
		}
		tok, done, err := mv.seq.Step(mv.target)
		if err == nil {
			mv.step(TokenIn{Token: tok})
		}
		if done && mv.seq != nil {
			mv.closeSeq(err)
		}
	}
}

func (mv *move) closeSeq(err error) {
	s := mv.seq
	mv.seq = nil
	mv.step(DecodeEnded{Err: errors.Join(err, s.Close(mv.target))})
}

// busy is the target pool's pages not free once every deadline passed.
func (mv *move) busy() int {
	pool := mv.target.Pool
	pool.Tick(mv.now.Add(time.Hour))
	n := 0
	for i := range pool.Config().Pages {
		if pool.Inspect(uint32(i)).State != kv.Free {
			n++
		}
	}
	return n
}

func movePrompt() []int { return []int{1, 40, 41, 42, 43, 44, 45} } // 7 tokens: a page of 4 and 3

// TestMovedRequestGoesOn: a request moved after k tokens reserves pages at
// the source's layout, verifies them, recomputes the last token streamed
// and decodes on, withholding its chunks until the stream's receiver takes
// it, at which they go on from the source's last chunk: the whole answer is
// the reference's, nothing streamed twice, and every page goes back.
func TestMovedRequestGoesOn(t *testing.T) {
	const maxNew = 24
	prompt := movePrompt()
	want := tinyReference(t, prompt, maxNew)
	for _, k := range []int{1, 2, 5, 9, 23} {
		for _, takeAfter := range []int{0, 3, maxNew} { // decode steps before the take
			mv := newMove(t, prompt, k, maxNew)
			mv.m.CachedTokens = uint32(k % len(prompt)) // what its prefill read from a cache
			mv.req = NewMovedRequest(mv.req.cfg, targetOwner, mv.m, mv.req.Peer())
			mv.step(Start{})
			if mv.acks != 1 || mv.seq == nil {
				t.Fatalf("k=%d: %d acks, decoding %t; finish %+v", k, mv.acks, mv.seq != nil, mv.finish)
			}
			mv.decode(takeAfter)
			if len(mv.chunks) > 0 || mv.finish != nil && !mv.finish.Silent {
				t.Fatalf("k=%d: before the take %d chunks and answer %+v went out", k, len(mv.chunks), mv.finish)
			}
			mv.step(TakeIn{Take: &messages.StreamTake{RequestID: 7, Seq: uint32(k)}, FromReceiver: true})
			mv.decode(maxNew)
			if mv.finish == nil || mv.finish.Silent || mv.finish.Cause != nil {
				t.Fatalf("k=%d, take after %d steps: answer %+v", k, takeAfter, mv.finish)
			}
			got := ints(mv.finish.Result.Tokens)
			if !slices.Equal(got, want) || mv.finish.Result.CachedTokens != mv.m.CachedTokens {
				t.Fatalf("k=%d: answer %v with %d cached tokens, want %v with %d", k, got, mv.finish.Result.CachedTokens,
					want, mv.m.CachedTokens)
			}
			var streamed []int
			for i, c := range mv.chunks {
				if c.Seq != uint32(k+1+i) {
					t.Fatalf("k=%d: chunk %d has seq %d, want %d", k, i, c.Seq, k+1+i)
				}
				streamed = append(streamed, ints(c.Tokens)...)
			}
			if !slices.Equal(streamed, want[k:]) {
				t.Fatalf("k=%d: streamed %v, want %v", k, streamed, want[k:])
			}
			if n := mv.busy(); n != 0 {
				t.Fatalf("k=%d: %d target pages held after the answer", k, n)
			}
		}
	}
}

// TestMovedRequestHasWhatIsLeft: a request moved with a time left has no
// more than that on its target; moved again, it gives the next target what
// is left of it then; one whose source sent none has the target's own
// RequestTimeout.
func TestMovedRequestHasWhatIsLeft(t *testing.T) {
	deadline := func(mv *move) time.Duration {
		for _, tm := range mv.timers {
			if _, ok := tm.Event.(RequestDeadline); ok {
				return tm.After
			}
		}
		t.Fatalf("no request deadline among %+v", mv.timers)
		return 0
	}
	for _, c := range []struct {
		left uint32
		want time.Duration
	}{{0, time.Minute}, {1500, 1500 * time.Millisecond}, {120_000, time.Minute}} {
		mv := newMove(t, movePrompt(), 2, 20)
		mv.m.TimeLeftMs = c.left
		mv.step(Start{})
		if got := deadline(mv); got != c.want {
			t.Errorf("time left %d ms: deadline after %s, want %s", c.left, got, c.want)
		}
	}
	mv := newMove(t, movePrompt(), 2, 20)
	mv.m.TimeLeftMs = 1500
	mv.step(Start{})
	mv.step(TakeIn{Take: &messages.StreamTake{RequestID: 7, Seq: 2}, FromReceiver: true})
	mv.now = mv.now.Add(400 * time.Millisecond)
	var asked *messages.MoveRequest
	Run(mv.req, MoveOut{MoveID: 4, To: Peer{Address: "other:1", Incarnation: 99}, Receiver: "router:1", ReceiverID: "relay"}, mv.now,
		func(e Effect) Event {
			switch e := e.(type) {
			case PauseDecode:
				p := mv.seq.Paused()
				p.MoveID = e.MoveID
				return p
			case SendMoveRequest:
				asked = e.Move
			}
			return nil
		})
	if asked == nil || asked.TimeLeftMs != 1100 {
		t.Fatalf("moved again 400 ms after a move with 1500 ms left: %+v", asked)
	}
}

// TestMovedRequestEndsClean: a take from anyone but the receiver is
// refused and counted and changes nothing; a take at another chunk than
// the source's last fails the request to the receiver; a request never
// taken ends silently at its deadline; a report naming another last token
// than the move's, or pages whose last row that token does not give, fail
// it silently, unacknowledged, and abort the move. Every page goes back
// each time.
func TestMovedRequestEndsClean(t *testing.T) {
	prompt := movePrompt()
	const k, maxNew = 6, 16
	take := func(seq uint32) TakeIn {
		return TakeIn{Take: &messages.StreamTake{RequestID: 7, Seq: seq}, FromReceiver: true}
	}
	t.Run("a stranger's take", func(t *testing.T) {
		mv := newMove(t, prompt, k, maxNew)
		mv.step(Start{})
		mv.step(TakeIn{Take: &messages.StreamTake{RequestID: 7, Seq: k}, From: "router:2"})
		mv.decode(maxNew)
		if len(mv.refused) != 1 || len(mv.chunks) > 0 || mv.finish != nil {
			t.Fatalf("refused %v, %d chunks, answer %+v", mv.refused, len(mv.chunks), mv.finish)
		}
		mv.step(take(k))
		if mv.finish == nil || mv.finish.Cause != nil || len(mv.chunks) != maxNew-k {
			t.Fatalf("after the receiver's take: %d chunks, answer %+v", len(mv.chunks), mv.finish)
		}
	})
	t.Run("taken at another chunk", func(t *testing.T) {
		mv := newMove(t, prompt, k, maxNew)
		mv.step(Start{})
		mv.decode(2)
		mv.step(take(k - 1))
		var te *TakeError
		if mv.finish == nil || mv.finish.Silent || !errors.As(mv.finish.Cause, &te) || len(mv.chunks) > 0 {
			t.Fatalf("%d chunks, answer %+v", len(mv.chunks), mv.finish)
		}
		if n := mv.busy(); n != 0 {
			t.Fatalf("%d target pages held", n)
		}
	})
	t.Run("never taken", func(t *testing.T) {
		for _, steps := range []int{2, maxNew} { // still decoding, or answered and waiting
			mv := newMove(t, prompt, k, maxNew)
			mv.step(Start{})
			mv.decode(steps)
			mv.step(TakeDeadline{})
			var nt *NotTakenError
			if mv.finish == nil || !mv.finish.Silent || !errors.As(mv.finish.Cause, &nt) || len(mv.chunks) > 0 {
				t.Fatalf("after %d steps: %d chunks, answer %+v", steps, len(mv.chunks), mv.finish)
			}
			mv.step(take(k)) // late: nothing
			if len(mv.chunks) > 0 {
				t.Fatalf("a take after the deadline streamed %d chunks", len(mv.chunks))
			}
			if n := mv.busy(); n != 0 {
				t.Fatalf("%d target pages held", n)
			}
		}
	})
	t.Run("a last row the token does not give", func(t *testing.T) {
		// A source that sums what it sends, wrong rows and all: the seals
		// hold, and decode's recomputation of the last row refuses it
		// before anything is acknowledged.
		mv := newMove(t, prompt, k, maxNew)
		last := &mv.pages[len(mv.pages)-1]
		last.rows = slices.Clone(last.rows)
		last.rows[len(last.rows)-1] ^= 1
		first := mv.m.Positions() - len(last.rows)/mv.target.Geometry().BytesPerToken()
		last.sum = kv.PageChecksum(last.tag, sourceOwner, first, len(last.rows)/mv.target.Geometry().BytesPerToken(), last.rows)
		mv.step(Start{})
		if mv.finish == nil || !mv.finish.Silent || mv.acks != 0 || mv.aborts != 1 {
			t.Fatalf("answer %+v, %d acks, %d aborts", mv.finish, mv.acks, mv.aborts)
		}
		if n := mv.busy(); n != 0 {
			t.Fatalf("%d target pages held", n)
		}
	})
	t.Run("another last token", func(t *testing.T) {
		mv := newMove(t, prompt, k, maxNew)
		mv.lastToken ^= 1
		mv.step(Start{})
		var fe *FirstTokenError
		if mv.finish == nil || !mv.finish.Silent || !errors.As(mv.finish.Cause, &fe) || mv.aborts != 1 || mv.acks != 0 {
			t.Fatalf("answer %+v, %d aborts, %d acks", mv.finish, mv.aborts, mv.acks)
		}
		if n := mv.busy(); n != 0 {
			t.Fatalf("%d target pages held", n)
		}
	})
}

// twoNodes is a move of a request between two decode nodes, played in one
// goroutine: the source is a pair's request (its prefill the pair's), whose
// decode job the test steps like a worker; the target a move over a pool
// of its own, built from the source's MoveRequest. Messages between them
// go at once, unless the test drops the target's ack.
type twoNodes struct {
	t       *testing.T
	p       *pair
	job     *Sequence // the source's decode job, nil once it ended
	paused  bool
	tgt     *move
	dropAck bool
	dropped *messages.TransferAck // the ack dropped last
	ended   []MoveEnded
	// holdPause keeps the answer to the next pause (held) instead of
	// giving it at once.
	holdPause bool
	held      *Paused
}

func newTwoNodes(t *testing.T, prompt []int, maxNew int) *twoNodes {
	n := &twoNodes{t: t, p: newPair(t, 64, 64)}
	n.p.effect = n.source
	n.p.start(prompt, maxNew)
	if n.job == nil {
		t.Fatalf("no decode job: %+v", n.p.finish)
	}
	return n
}

// source carries out the source's effects that a pair does not: its decode
// worker's and its side of the move.
func (n *twoNodes) source(e Effect) (Event, bool) {
	p := n.p
	switch e := e.(type) {
	case StartDecode:
		s, err := Begin(p.engine, p.decode, e, engine.EOS)
		if err != nil {
			return DecodeEnded{Err: err}, true
		}
		n.job = s
		p.step(p.req, TokenIn{Token: e.Next})
	case PauseDecode:
		n.paused = true
		p := n.job.Paused()
		p.MoveID = e.MoveID
		if n.holdPause {
			n.holdPause, n.held = false, &p
			return nil, true
		}
		return p, true
	case ResumeDecode:
		n.paused = false
	case CancelDecode:
		if n.job != nil {
			if err := n.job.Close(p.decode); err != nil {
				n.t.Fatal(err)
			}
			n.job = nil
		}
	case SendMoveRequest:
		n.tgt = newTarget(n.t, p.engine, e.Move)
		n.tgt.onPlan = func(plan *messages.MovePlan) { p.step(p.req, MovePlanIn{Plan: plan, FromTarget: true}) }
		n.tgt.onAck = func(a *messages.TransferAck) {
			if n.dropAck {
				n.dropped = a
				return
			}
			p.step(p.req, MoveAckIn{Ack: a, FromTarget: true})
		}
		n.tgt.onAbort = func(a *messages.TransferAbort) { p.step(p.req, MoveAbortIn{Abort: a, FromTarget: true}) }
		n.tgt.step(Start{})
	case SendMoveFrames:
		n.tgt.step(FramesIn{Frames: n.frames(e)})
		return MoveSent{MoveID: e.MoveID}, true
	case SendMoveDone:
		n.tgt.step(TransferIn{Done: e.Done, FromPrefill: true})
	case HandOver:
		n.tgt.step(TakeIn{Take: &messages.StreamTake{RequestID: 7, Seq: e.Seq}, FromReceiver: true})
	case MoveEnded:
		n.ended = append(n.ended, e)
	default:
		return nil, false
	}
	return nil, true
}

// frames are the move's frames: each sealed page's bytes read under a
// lease of the source's, the tail's as they are.
func (n *twoNodes) frames(e SendMoveFrames) []kv.Frame {
	bpt := n.p.decode.Geometry().BytesPerToken()
	var out []kv.Frame
	first := 0
	for i, pg := range e.Pages {
		payload := e.Tail
		if i < len(e.Pages)-1 || len(e.Tail) == 0 {
			l, err := n.p.decode.Lease(pg.Tag, e.Owner)
			if err != nil {
				n.t.Fatal(err)
			}
			b, _, err := n.p.decode.Read(l)
			if err != nil {
				n.t.Fatal(err)
			}
			payload = slices.Clone(b)
			if err := n.p.decode.Unlease(l); err != nil {
				n.t.Fatal(err)
			}
		}
		out = append(out, kv.Frame{Owner: e.Plan.Owner(), Source: pg.Tag, Dest: e.Plan.DestTags[i], FirstToken: first,
			Tokens: len(payload) / bpt, Payload: payload})
		first += len(payload) / bpt
	}
	return out
}

// decode steps the source's job up to steps times while it is not paused.
func (n *twoNodes) decode(steps int) {
	for range steps {
		if n.job == nil || n.paused {
			return
		}
		tok, done, err := n.job.Step(n.p.decode)
		if err == nil {
			n.p.step(n.p.req, TokenIn{Token: tok})
		}
		if done && n.job != nil {
			s := n.job
			n.job = nil
			n.p.step(n.p.req, DecodeEnded{Err: errors.Join(err, s.Close(n.p.decode))})
		}
	}
}

func (n *twoNodes) moveOut() {
	n.p.step(n.p.req, MoveOut{MoveID: 3, To: Peer{Address: "target:1", Incarnation: targetInc}, Receiver: "router:1",
		ReceiverID: "relay"})
}

// TestMoveBetweenTwoNodes: a request moves after k tokens from the decode
// node it runs on to another, which streams the rest: the client sees the
// reference's tokens once each, the source ends moved without an answer,
// the target answers the whole, and every page of three pools goes back.
// When no ack reaches the source, it gives the move up at its deadline,
// the target ends silently, and the source answers the whole itself.
func TestMoveBetweenTwoNodes(t *testing.T) {
	prompt := movePrompt()
	const maxNew = 20
	want := tinyReference(t, prompt, maxNew)
	for _, k := range []int{1, 2, 5, 9, 17} {
		n := newTwoNodes(t, prompt, maxNew)
		n.decode(k - 1)
		if err := n.p.req.Movable(); err != nil {
			t.Fatalf("k=%d: %v", k, err)
		}
		n.moveOut()
		n.tgt.decode(maxNew)
		if f := n.p.finish; f == nil || !f.Moved || !f.Silent || !slices.Equal(n.p.tokens, want[:k]) {
			t.Fatalf("k=%d: the source streamed %v and ended %+v; want %v, moved", k, n.p.tokens, f, want[:k])
		}
		f := n.tgt.finish
		if f == nil || f.Silent || f.Cause != nil || !slices.Equal(ints(f.Result.Tokens), want) {
			t.Fatalf("k=%d: the target answered %+v, want %v", k, f, want)
		}
		var streamed []int
		for i, c := range n.tgt.chunks {
			if c.Seq != uint32(k+1+i) {
				t.Fatalf("k=%d: the target's chunk %d has seq %d", k, i, c.Seq)
			}
			streamed = append(streamed, ints(c.Tokens)...)
		}
		if !slices.Equal(slices.Concat(n.p.tokens, streamed), want) {
			t.Fatalf("k=%d: the client got %v then %v, want %v", k, n.p.tokens, streamed, want)
		}
		if busy := n.p.freeAfterDeadlines() + n.tgt.busy(); busy != 0 || n.job != nil {
			t.Fatalf("k=%d: %d pages held, the source's job open %t", k, busy, n.job != nil)
		}
	}

	t.Run("no ack", func(t *testing.T) {
		n := newTwoNodes(t, prompt, maxNew)
		n.decode(4)
		n.dropAck = true
		n.moveOut()
		n.p.step(n.p.req, MoveDeadline{MoveID: 3})
		if len(n.ended) != 1 || n.paused || n.tgt.finish == nil || !n.tgt.finish.Silent {
			t.Fatalf("move ended %+v; paused %t; the target %+v", n.ended, n.paused, n.tgt.finish)
		}
		n.decode(maxNew)
		if f := n.p.finish; f == nil || f.Moved || f.Cause != nil || !slices.Equal(n.p.tokens, want) {
			t.Fatalf("the source streamed %v and answered %+v, want %v", n.p.tokens, f, want)
		}
		if len(n.tgt.chunks) > 0 {
			t.Fatalf("the target streamed %d chunks", len(n.tgt.chunks))
		}
		if busy := n.p.freeAfterDeadlines() + n.tgt.busy(); busy != 0 {
			t.Fatalf("%d pages held", busy)
		}
	})
}

// TestMoveEndsWithItsRequest: a request cancelled, stopped or out of time
// while it moves ends as it would decoding, its paused job closed, and the
// target, which had planned, is told and ends silently; every page goes
// back. A move asked twice, or of a request that cannot move, is ignored.
func TestMoveEndsWithItsRequest(t *testing.T) {
	prompt := movePrompt()
	const maxNew = 20
	for _, tc := range []struct {
		name string
		ev   Event
		want error // nil: completed at the tokens streamed
	}{{"cancelled", Cancel{}, ErrCancelled}, {"stopped", Stop{}, nil}, {"out of time", RequestDeadline{}, ErrDeadline}} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTwoNodes(t, prompt, maxNew)
			n.decode(3)
			n.dropAck = true // the move stays under way, planned and sent
			n.moveOut()
			n.moveOut() // a second ask: ignored
			if n.tgt.acks != 1 || n.p.finish != nil {
				t.Fatalf("move not under way: %d acks, source answered %+v", n.tgt.acks, n.p.finish)
			}
			n.p.step(n.p.req, tc.ev)
			f := n.p.finish
			if f == nil || f.Moved || !errors.Is(f.Cause, tc.want) || tc.want == nil && f.Cause != nil {
				t.Fatalf("the source answered %+v, want %v", f, tc.want)
			}
			if n.job != nil || n.tgt.finish == nil || !n.tgt.finish.Silent {
				t.Fatalf("the source's job open %t; the target %+v", n.job != nil, n.tgt.finish)
			}
			if busy := n.p.freeAfterDeadlines() + n.tgt.busy(); busy != 0 {
				t.Fatalf("%d pages held", busy)
			}
		})
	}
	// With one token left to generate, a request stays where it is.
	n := newTwoNodes(t, prompt, maxNew)
	n.decode(maxNew - 2)
	var refused *MoveRefusedError
	if err := n.p.req.Movable(); !errors.As(err, &refused) {
		t.Fatalf("%d of %d tokens streamed: movable (%v)", len(n.p.tokens), maxNew, err)
	}
	n.moveOut()
	if n.paused || n.tgt != nil {
		t.Fatal("a request that cannot move paused or asked a target")
	}
}

// TestLatePauseAnswerIsNotTheNextMoves: a move whose target is lost before
// the job's pause is answered ends, and decode goes on; the pause's answer,
// late, is not taken for the next move's, and the next move carries the
// stream on whole.
func TestLatePauseAnswerIsNotTheNextMoves(t *testing.T) {
	prompt := movePrompt()
	const maxNew = 20
	want := tinyReference(t, prompt, maxNew)
	n := newTwoNodes(t, prompt, maxNew)
	n.decode(3)
	n.holdPause = true
	n.moveOut() // move 3: its pause not answered yet
	late := n.held
	n.p.step(n.p.req, PeerLost{Incarnation: targetInc})
	if len(n.ended) != 1 || n.paused || n.tgt != nil {
		t.Fatalf("move ended %+v, paused %t, target asked %t", n.ended, n.paused, n.tgt != nil)
	}
	n.decode(2) // decode goes on
	ignored := n.p.req.Counts().Ignored
	n.p.step(n.p.req, MoveOut{MoveID: 4, To: Peer{Address: "target:1", Incarnation: targetInc}, Receiver: "router:1",
		ReceiverID: "relay"})
	if n.tgt == nil {
		t.Fatal("the next move did not start")
	}
	n.p.step(n.p.req, *late) // move 3's answer, late
	if got := n.p.req.Counts().Ignored; got != ignored+1 {
		t.Fatalf("the late pause answer was taken (%d ignored, want %d)", got, ignored+1)
	}
	n.tgt.decode(maxNew)
	var streamed []int
	for _, c := range n.tgt.chunks {
		streamed = append(streamed, ints(c.Tokens)...)
	}
	if got := slices.Concat(n.p.tokens, streamed); !slices.Equal(got, want) || n.p.finish == nil || !n.p.finish.Moved {
		t.Fatalf("the client got %v, want %v; the source ended %+v", got, want, n.p.finish)
	}
}

// tinyReference is the tiny model's reference answer to prompt.
func tinyReference(t *testing.T, prompt []int, maxNew int) []int {
	t.Helper()
	e, err := engine.NewReferenceEngine(tinyModel())
	if err != nil {
		t.Fatal(err)
	}
	want, err := e.Reference(prompt, maxNew)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// TestMoveAckPastItsDeadline: an ack the source takes once its move's
// deadline has passed (its timer not yet stepped: a paused process) ends
// the move as the deadline would, the request decoding on at the source,
// since the target waits for the stream no longer than that from its ack.
func TestMoveAckPastItsDeadline(t *testing.T) {
	prompt := movePrompt()
	const maxNew = 20
	want := tinyReference(t, prompt, maxNew)
	n := newTwoNodes(t, prompt, maxNew)
	n.decode(3)
	n.dropAck = true
	n.moveOut()
	if n.dropped == nil {
		t.Fatal("the target did not acknowledge the move")
	}
	n.p.now = n.p.now.Add(n.p.req.cfg.PrefillTimeout)
	n.p.step(n.p.req, MoveAckIn{Ack: n.dropped, FromTarget: true})
	if len(n.ended) != 1 || n.ended[0].Err == nil || n.paused || n.p.finish != nil {
		t.Fatalf("a late ack: moves ended %+v, paused %t, finish %+v", n.ended, n.paused, n.p.finish)
	}
	n.decode(maxNew)
	if n.p.finish == nil || n.p.finish.Cause != nil || !slices.Equal(ints(n.p.finish.Result.Tokens), want) {
		t.Fatalf("the source's answer after a late ack: %+v, want %v", n.p.finish, want)
	}
}
