package sim

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// dreq is one request on its decode run: the core, its client, and the
// decode worker admission chose for it.
type dreq struct {
	n        *node
	r        *handoff.Request
	c        *client
	name     string
	attempts []uint64 // every attempt's request id, the current last
	worker   int
	decoding bool // handed to its decode worker
	// mv is the move away under way, asked the move being asked now;
	// movesLeft the moves still to ask of it (the Move fault).
	mv, asked *moving
	movesLeft int
}

// worker is one decode worker: jobs waiting to begin, sequences that
// step in turn, one token each DecodeStep, and answered requests' Keeps
// for its next turn.
type worker struct {
	queued, active, paused []*djob
	keeps                  []handoff.Keep
	turn                   int
	armed                  bool
}

type djob struct {
	dr    *dreq
	start handoff.StartDecode
	seq   *handoff.Sequence
}

// admit takes a routed request on this run.
func (n *node) admit(c *client) {
	key := handoff.ClientKey{Client: c.tenant, ID: c.id}
	wk, err := n.adm.Admit(handoff.Ask{Key: key, PromptTokens: len(c.prompt), MaxTokens: c.maxNew, Routed: true})
	if err != nil {
		c.refused(handoff.Wire(err))
		return
	}
	n.nextID++
	dr := &dreq{n: n, c: c, name: strconv.FormatUint(n.nextID, 10), attempts: []uint64{n.nextID}, worker: wk}
	dr.r = handoff.NewRequest(n.cfg, kv.Owner{Request: n.nextID, Tenant: c.tenant}, c.id, c.prompt, c.maxNew, c.peer)
	dr.r.NarrowCache(c.salt)
	n.w.byAttempt[handoff.JobKey{Sender: senderKey(n.addr, n.inc), ID: n.nextID}] = c
	n.adm.Started(dr.name, key, wk)
	n.reqs[n.nextID] = dr
	n.live = append(n.live, dr)
	n.w.all = append(n.w.all, dr)
	c.dr, c.origin, c.originInc = dr, dr, n.inc
	c.deadline = n.w.now.Add(n.w.opt.Timing.RequestTimeout + relayMargin(n.w.opt.Timing))
	dr.run(handoff.Start{})
	n.askMoves(dr)
}

func (dr *dreq) run(ev handoff.Event) {
	n := dr.n
	who := fmt.Sprintf("%s request %s (client %d)", n.addr, dr.name, dr.c.id)
	var m handoff.Machine = traced{m: moveChecked{Machine: dr.r, dr: dr}, t: &n.w.trace, who: who}
	if late := dr.late(ev); late != "" {
		m = &quiet{Machine: m, dr: dr, what: late}
	}
	handoff.Run(m, ev, n.w.now, dr.do)
}

// late says what ev is when it is a message of an attempt the request
// abandoned: frames or a TransferDone naming an earlier attempt's id.
func (dr *dreq) late(ev handoff.Event) string {
	earlier := func(id uint64) bool {
		return id != dr.r.Owner().Request && slices.Contains(dr.attempts, id)
	}
	switch e := ev.(type) {
	case handoff.TransferIn:
		if earlier(e.Done.RequestID) {
			return fmt.Sprintf("the TransferDone of abandoned attempt %d", e.Done.RequestID)
		}
	case handoff.FramesIn:
		for _, f := range e.Frames {
			if !earlier(f.Owner.Request) || f.Owner.Tenant != dr.r.Owner().Tenant {
				return ""
			}
		}
		return fmt.Sprintf("%d frames of an abandoned attempt", len(e.Frames))
	}
	return ""
}

// quiet is the check that a late message changes nothing: a request steps
// it without any effect.
type quiet struct {
	handoff.Machine
	dr    *dreq
	what  string
	after bool
}

func (q *quiet) Step(ev handoff.Event, now time.Time) []handoff.Effect {
	effects := q.Machine.Step(ev, now)
	if !q.after && len(effects) > 0 {
		q.dr.n.w.fail("late messages ignored", "request %s (client %d) on attempt %d took %s: its first effect is %s",
			q.dr.name, q.dr.c.id, q.dr.r.Owner().Request, q.what, describe(effects[0]))
	}
	q.after = true
	return effects
}

func (dr *dreq) do(e handoff.Effect) handoff.Event {
	n, w := dr.n, dr.n.w
	switch e := e.(type) {
	case handoff.Reserve:
		if n.cache != nil {
			return n.reserveHeld(dr, e)
		}
		return handoff.ExecReserve(n.pages, e)
	case handoff.Keep:
		n.keep(dr, e)
	case handoff.Unhold:
		n.unhold(dr, e)
	case handoff.Release:
		handoff.ExecRelease(n.pages, e, nil)
	case handoff.SendPlan:
		dr.checkHeld(e.Plan)
		return dr.send(e.To, e.Plan)
	case handoff.SendAbort:
		if ev := dr.send(e.To, e.Abort); ev != nil {
			w.fail("messages", "%s request %s built an invalid abort: %v", n.addr, dr.name, ev.(handoff.Failed).Err)
		}
	case handoff.SendAck:
		return dr.send(e.To, e.Ack)
	case handoff.Write:
		return handoff.ExecWrite(n.pages, e)
	case handoff.SealVerify:
		return handoff.ExecSealVerify(n.pages, e)
	case handoff.StartDecode:
		dr.decoding = true
		wk := n.workers[dr.worker]
		wk.queued = append(wk.queued, &djob{dr: dr, start: e})
		n.armWorker(dr.worker)
	case handoff.CancelDecode:
		n.cancelDecode(e.Owner)
	case handoff.Emit:
		dr.c.chunk(n.addr, e.Chunk)
		n.askMove(dr)
		if w.chance(Misdirect) {
			w.forge(n)
		}
	case handoff.Finish:
		if attempt := (handoff.JobKey{Sender: senderKey(n.addr, n.inc), ID: dr.r.Owner().Request}); e.Cause == nil && w.forged[attempt] {
			w.fail("held pages", "%s request %s was answered on attempt %d, whose prefill reported other rows for a page decode held",
				n.addr, dr.name, attempt.ID)
		}
		n.adm.Ended(dr.name)
		n.live = slices.DeleteFunc(n.live, func(x *dreq) bool { return x == dr })
		if errors.Is(e.Cause, handoff.ErrCancelled) {
			if dr.decoding {
				w.count[CancelMidDecode]++
			} else {
				w.count[CancelBeforeDecode]++
			}
		}
		switch {
		case e.Moved:
		case e.Silent && dr.r.Taken():
			w.fail("moves", "%s request %s ended silently after its stream's relay took it", n.addr, dr.name)
		case e.Silent:
			w.count[MoveUntaken]++
			w.trace.line(fmt.Sprintf("  %s request %s ended untaken: %v", n.addr, dr.name, e.Cause))
		default:
			dr.c.finish(n.addr, e)
		}
	case handoff.PauseDecode:
		dr.mv, dr.asked = dr.asked, nil
		n.pause(dr, e)
	case handoff.ResumeDecode:
		n.resume(e.Owner)
	case handoff.SendMoveRequest:
		return dr.moveSendFailed(dr.send(e.To, e.Move))
	case handoff.SendMoveFrames:
		if dr.mv != nil {
			dr.mv.plan = e.Plan // the core took it
		}
		n.sendMove(dr, e)
	case handoff.SendMoveDone:
		if dr.mv == nil {
			w.fail("moves", "%s request %s reported a move it is not making", n.addr, dr.name)
			return nil
		}
		return dr.moveSendFailed(dr.send(dr.mv.to, e.Done))
	case handoff.HandOver:
		dr.c.movedStream(dr, e)
	case handoff.MoveEnded:
		dr.mv = nil
		w.count[MoveGaveUp]++
	case handoff.SendMovePlan:
		return dr.send(e.To, e.Plan)
	case handoff.Timer:
		n.at(e.After, "timer "+describe(e.Event)+" of request "+dr.name, func() { dr.timer(e.Event) })
	case handoff.Pick:
		return n.pick(dr, e)
	case handoff.Retry:
		w.count[RetryOtherPeer]++
	case handoff.Refuse:
		w.count[StrangerRefused]++
	default:
		w.fail("effects", "%s request %s asked for %T, which is not a request effect", n.addr, dr.name, e)
	}
	return nil
}

// timer steps a timer the request armed, counting the fault paths it
// stands for.
func (dr *dreq) timer(ev handoff.Event) {
	if !dr.r.Done() {
		switch e := ev.(type) {
		case handoff.PrefillDeadline:
			if e.Attempt == dr.r.Owner().Request {
				dr.n.w.count[PrefillDeadline]++
			}
		case handoff.RetryReserve:
			dr.n.w.count[ReserveRetried]++
		}
	}
	dr.run(ev)
}

// send sends a control message to the prefill peer's run; a message that
// fails its own validation fails the request.
func (dr *dreq) send(to handoff.Peer, m messages.Message) handoff.Event {
	n, err := dr.n.w.node(to.Address)
	if err == nil {
		err = dr.n.sendMessage(n, to.Incarnation, m)
	}
	if err != nil {
		return handoff.Failed{Err: err}
	}
	return nil
}

// pick chooses another prefill peer for a retry: one membership reports
// up, not excluded, and whose pool holds the prompt (the one admission
// rule, checked by the oracle like the router's choice).
func (n *node) pick(dr *dreq, e handoff.Pick) handoff.Event {
	c := dr.c
	var ok []*node
	for _, p := range alive(n.w.prefill) {
		if !e.Exclude[p.known] && handoff.Admit(n.w.limits, len(c.prompt), c.maxNew, p.pagesN, n.pagesN) == nil {
			ok = append(ok, p)
		}
	}
	if len(ok) == 0 {
		return handoff.Picked{}
	}
	p := ok[n.w.rng.IntN(len(ok))]
	n.w.checkPath(c, p, n, nil)
	n.nextID++
	n.reqs[n.nextID] = dr
	n.w.byAttempt[handoff.JobKey{Sender: senderKey(n.addr, n.inc), ID: n.nextID}] = c
	dr.attempts = append(dr.attempts, n.nextID)
	return handoff.Picked{Peer: p.peer(), Attempt: n.nextID, OK: true}
}

// requestFor is the request a message for attempt id reaches: its own, or
// another live one when the message was misdirected.
func (n *node) requestFor(other bool, id uint64) *dreq {
	if other {
		others := slices.DeleteFunc(slices.Clone(n.live), func(x *dreq) bool { return n.reqs[id] == x })
		if len(others) > 0 {
			return others[n.w.rng.IntN(len(others))]
		}
	}
	dr := n.reqs[id]
	if dr == nil {
		n.w.trace.line(fmt.Sprintf("  %s: no request %d", n.addr, id))
	}
	return dr
}

// framesIn hands each request its frames, labelled for the oracle, saying
// whether they came from the planned peer: from the identity that serves
// its address, as the data plane proved it.
func (n *node) framesIn(frames []kv.Frame, shadow []label, from handoff.Peer) {
	for i, f := range frames {
		if i < len(shadow) && len(f.Payload) > 0 {
			n.pages.shadow[&f.Payload[0]] = shadow[i]
		}
	}
	for len(frames) > 0 {
		id := frames[0].Owner.Request
		end := 1
		for end < len(frames) && frames[end].Owner.Request == id {
			end++
		}
		group := frames[:end:end]
		frames = frames[end:]
		if dr := n.requestFor(false, id); dr != nil {
			dr.run(handoff.FramesIn{Frames: group, Stranger: from.Address != dr.r.Peer().Address, From: from.Address})
		}
	}
}

// requestIn takes a control message for a request.
func (n *node) requestIn(d *delivery, m messages.Message) {
	done, ok := m.(*messages.TransferDone)
	if !ok {
		n.w.fail("messages", "%s got a %T, which no node sends to decode", n.addr, m)
		return
	}
	// As the actors' shell does, a report is the planned peer's when it
	// comes from the planned address, whose identity the remote boundary
	// proved.
	if dr := n.requestFor(d.other, done.RequestID); dr != nil {
		dr.run(handoff.TransferIn{Done: done, FromPrefill: d.from.addr == dr.r.Peer().Address, From: d.from.addr})
	}
}

// peerLost is membership's word that a run died, for every request of
// this run planning with it.
func (n *node) peerLost(inc uint64) {
	if n.inc == 0 {
		return
	}
	for _, dr := range slices.Clone(n.live) {
		if dr.r.Peer().Incarnation == inc || dr.mv != nil && dr.mv.to.Incarnation == inc {
			n.w.count[PeerLost]++
			dr.run(handoff.PeerLost{Incarnation: inc})
		}
	}
}

func (n *node) armWorker(i int) {
	wk := n.workers[i]
	if wk.armed || len(wk.queued)+len(wk.active)+len(wk.keeps) == 0 {
		return
	}
	wk.armed = true
	n.at(n.w.opt.Timing.DecodeStep, fmt.Sprintf("decode worker %d", i), func() {
		wk.armed = false
		n.work(wk)
		n.armWorker(i)
	})
}

// work carries out the Keeps waiting, then begins the first job waiting,
// or else steps the next sequence by one token.
func (n *node) work(wk *worker) {
	n.keepsDue(wk)
	if len(wk.queued) > 0 {
		j := wk.queued[0]
		wk.queued = wk.queued[1:]
		seq, err := handoff.Begin(n.w.engine, n.pages, j.start, engine.EOS)
		if err != nil {
			j.dr.run(handoff.DecodeEnded{Err: err})
			return
		}
		j.seq = seq
		wk.active = append(wk.active, j)
		if j.start.Resume { // a moved job's first token streamed where it was
			j.dr.run(handoff.Resumed{})
		} else {
			j.dr.run(handoff.TokenIn{Token: j.start.Next})
		}
		if seq.Ended() {
			n.endJob(wk, j, nil)
		}
		return
	}
	if len(wk.active) == 0 {
		return
	}
	wk.turn = (wk.turn + 1) % len(wk.active)
	j := wk.active[wk.turn]
	tok, done, err := j.seq.Step(n.pages)
	if err == nil {
		j.dr.run(handoff.TokenIn{Token: tok})
	}
	if done {
		n.endJob(wk, j, err)
	}
}

// endJob closes a sequence that ended and tells its request.
func (n *node) endJob(wk *worker, j *djob, err error) {
	i := slices.Index(wk.active, j)
	if i < 0 {
		return // withdrawn by its request meanwhile
	}
	wk.active = slices.Delete(wk.active, i, i+1)
	j.dr.run(handoff.DecodeEnded{Err: errors.Join(err, j.seq.Close(n.pages))})
}

// cancelDecode withdraws owner's job from its worker, giving back its
// leases.
func (n *node) cancelDecode(owner kv.Owner) {
	for _, wk := range n.workers {
		mine := func(j *djob) bool { return j.start.Manifest.Owner == owner }
		wk.queued = slices.DeleteFunc(wk.queued, mine)
		for _, jobs := range []*[]*djob{&wk.active, &wk.paused} {
			if i := slices.IndexFunc(*jobs, mine); i >= 0 {
				j := (*jobs)[i]
				*jobs = slices.Delete(*jobs, i, i+1)
				if err := j.seq.Close(n.pages); err != nil {
					n.w.trace.line("  leases given back with " + err.Error())
				}
			}
		}
	}
}

// messageIn routes a control message to the node's role.
func (n *node) messageIn(d *delivery, m messages.Message) {
	switch {
	case n.role == rolePrefill:
		n.sourceIn(d, m)
	case !n.messageMoved(d, m):
		n.requestIn(d, m)
	}
}

// moveSendFailed is a move's message that could not be sent, as the
// request's actor reports one: the move's send failed.
func (dr *dreq) moveSendFailed(ev handoff.Event) handoff.Event {
	if f, ok := ev.(handoff.Failed); ok && dr.mv != nil {
		return handoff.MoveSent{MoveID: dr.mv.id, Err: f.Err}
	}
	return ev
}

// moveChecked is the oracle of a request's move away: while a move is
// under way, the request gives pages back only as it ends (moved, on its
// target's ack, or ended otherwise), never before; and it ends moved only
// on the target's ack.
type moveChecked struct {
	handoff.Machine
	dr *dreq
}

func (m moveChecked) Step(ev handoff.Event, now time.Time) []handoff.Effect {
	effects := m.Machine.Step(ev, now)
	dr := m.dr
	if dr.mv == nil {
		return effects
	}
	var releases, ends, moved bool
	for _, e := range effects {
		switch e := e.(type) {
		case handoff.Release:
			releases = releases || len(e.Tags) > 0
		case handoff.Finish:
			ends, moved = true, e.Moved
		}
	}
	switch {
	case releases && !ends:
		dr.n.w.fail("release after ack", "%s request %s gave pages back during move %d, before its target acknowledged them (at %T)",
			dr.n.addr, dr.name, dr.mv.id, ev)
	case moved && !dr.mv.acking:
		dr.n.w.fail("release after ack", "%s request %s ended moved at %T, not on its target's ack", dr.n.addr, dr.name, ev)
	}
	dr.mv.acking = false
	return effects
}
