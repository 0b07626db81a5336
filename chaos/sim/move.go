package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// A running request's move between decode nodes, as package actors and
// cluster carry it out around the same cores: an ask (an operator's node
// migrate, or a drain's, for every request of a node) has the request's
// core pause its decode job, send the target a MoveRequest, send the KV
// over the data plane to the pages the target's MovePlan names, report
// them, and, on the target's acknowledgement, tell the stream's relay that
// the stream moved and end, moved. The target admits the request as
// admission's moveIn does, runs a handoff.NewMovedRequest, resumes decode
// once every page is verified and the last token recomputed, and streams
// once the relay takes the stream. The relay is the client's
// handoff.Stream.

// moving is a move of a request away from its decode node, as the
// simulator carries it out: the move's id and target, the target's plan
// once the core took it, and whether the core is taking the target's ack
// now (the one step that may give the request's pages back mid-move).
type moving struct {
	id     uint64
	to     handoff.Peer
	plan   *messages.MovePlan
	acking bool
}

// moveIDBase keeps moves' ids apart from requests' ids on a node run: a
// target's refusal names the move, its abort its own request.
const moveIDBase = 1 << 40

// routerAddr is the address of the router whose relays carry the streams.
const routerAddr = "router:7000"

// relayMargin is how much longer than RequestTimeout a relay waits for its
// stream's answer, as package cluster's relay waits a margin (5 s against
// minutes there; the simulated timeouts are shorter).
func relayMargin(t Timing) time.Duration { return t.PrefillTimeout }

// askMoves draws the moves the Move fault asks of a request admitted on
// this node: up to three, each after a token it streams (askMove).
func (n *node) askMoves(dr *dreq) {
	if n.w.chance(Move) {
		dr.movesLeft = 1 + n.w.rng.IntN(3)
	}
}

// askMove asks, now and then after a token the request streamed (after
// each, once it moved here), one of the moves left to it, a decode step or
// two later.
func (n *node) askMove(dr *dreq) {
	w := n.w
	if dr.movesLeft == 0 || !dr.r.Taken() && w.rng.IntN(3) != 0 {
		return
	}
	dr.movesLeft--
	n.at(w.between(0, 2*w.opt.Timing.DecodeStep), fmt.Sprintf("operator moves request %s", dr.name), func() { n.moveAway(dr) })
}

// drain is the Move fault's drain: every request of one decode node asked
// to move at once.
func (w *world) drain() {
	n := w.decode[w.rng.IntN(len(w.decode))]
	if n.inc == 0 {
		return
	}
	w.trace.line(fmt.Sprintf("  DRAIN %s: %d requests asked to move", n.addr, len(n.live)))
	for _, dr := range slices.Clone(n.live) {
		n.moveAway(dr)
	}
}

// moveAway asks dr's core to move it to another decode node membership
// reports up, if there is one and the core is willing (handoff.Movable).
func (n *node) moveAway(dr *dreq) {
	w := n.w
	if dr.r.Done() || dr.r.Movable() != nil {
		return
	}
	targets := slices.DeleteFunc(alive(w.decode), func(t *node) bool { return t == n })
	if len(targets) == 0 {
		return
	}
	to := targets[w.rng.IntN(len(targets))].peer()
	n.nextID++
	dr.asked = &moving{id: moveIDBase + n.nextID, to: to}
	w.count[MoveAsked]++
	if dr.r.Taken() {
		w.count[MovedTwice]++
	}
	dr.run(handoff.MoveOut{MoveID: dr.asked.id, To: to, Receiver: routerAddr, ReceiverID: fmt.Sprint(dr.c.id)})
	dr.asked = nil
}

// pause is the decode worker's answer to a PauseDecode, after a mailbox's
// hop: the job stops stepping and gives its pages and tail, or, gone (it
// ended meanwhile), says nothing; its end ends the move.
func (n *node) pause(dr *dreq, e handoff.PauseDecode) {
	n.at(n.w.opt.Timing.Latency, "pause request "+dr.name, func() {
		for _, wk := range n.workers {
			i := slices.IndexFunc(wk.active, func(j *djob) bool { return j.dr == dr })
			if i < 0 {
				continue
			}
			j := wk.active[i]
			p := j.seq.Paused()
			p.MoveID = e.MoveID
			if p.Err == nil {
				wk.active = slices.Delete(wk.active, i, i+1)
				wk.paused = append(wk.paused, j)
			}
			dr.run(p)
			return
		}
	})
}

// resume has a paused job step again.
func (n *node) resume(owner kv.Owner) {
	for i, wk := range n.workers {
		if k := slices.IndexFunc(wk.paused, func(j *djob) bool { return j.dr.r.Owner() == owner }); k >= 0 {
			wk.active = append(wk.active, wk.paused[k])
			wk.paused = slices.Delete(wk.paused, k, k+1)
			n.armWorker(i)
			return
		}
	}
}

// sendMove sends a paused job's pages to the pages of the target's plan,
// as a decode worker does: each sealed page read under a lease of the
// request's, the tail's rows as they are; the leases are given back and
// the request told when the send ends.
func (n *node) sendMove(dr *dreq, e handoff.SendMoveFrames) {
	w := n.w
	to, err := w.node(e.Plan.DataPlane)
	var leases []kv.Lease
	var frames []kv.Frame
	first := 0
	for i, p := range e.Pages {
		if err != nil {
			break
		}
		payload := e.Tail
		if i < len(e.Pages)-1 || len(e.Tail) == 0 {
			var l kv.Lease
			if l, err = n.pages.Lease(p.Tag, e.Owner); err != nil {
				break
			}
			leases = append(leases, l)
			if payload, _, err = n.pages.Read(l); err != nil {
				break
			}
		}
		frames = append(frames, kv.Frame{Owner: e.Plan.Owner(), Source: p.Tag, Dest: e.Plan.DestTags[i], FirstToken: first,
			Tokens: p.Tokens, Payload: payload})
		first += p.Tokens
	}
	end := func(err error) {
		for _, l := range leases {
			if uerr := n.pages.Unlease(l); uerr != nil {
				w.trace.line("  unlease of a moved page: " + uerr.Error())
			}
		}
		dr.run(handoff.MoveSent{MoveID: e.MoveID, Err: err})
	}
	if err != nil {
		end(err)
		return
	}
	target := label{inc: e.Plan.DestTags[0].Incarnation, owner: e.Plan.Owner()}
	tail := len(e.Tail) > 0
	s := &send{frames: frames, to: to, toInc: e.Plan.DestTags[0].Incarnation, end: end,
		label: func(f kv.Frame) label {
			if tail && f.FirstToken+f.Tokens == first {
				return target // the tail's rows: the sequence computed them for the request
			}
			return n.moveLabel(dr, f, target)
		}}
	n.startBatches(s)
}

// moveLabel is the label of a moved page's rows on the target: computed
// for the request there if every row was the request's here (its own, or
// a held copy's of its scope), else the first row's that was not.
func (n *node) moveLabel(dr *dreq, f kv.Frame, target label) label {
	p := n.pages
	want := label{inc: n.inc, owner: dr.r.Owner()}
	_, scope, _ := n.promptScope(dr.r.Owner())
	base := int(f.Source.Index) * p.pt
	for r := range f.Tokens {
		got := p.rows[base+r]
		if got == want {
			continue
		}
		if writer, ok := p.writerScope(got); ok && p.copied[f.Source] && writer == scope {
			continue
		}
		return got
	}
	return target
}

// moveIn is the target's admission of a move, as admission's moveIn: for
// this run, of the world's model and page size, within admission's
// bounds; a refusal is a TransferAbort naming the move.
func (n *node) moveIn(d *delivery, m *messages.MoveRequest) {
	w := n.w
	refuse := func(err error) {
		if e := n.sendMessage(d.from, d.inc, &messages.TransferAbort{RequestID: m.MoveID, Tenant: m.Tenant,
			Reason: *handoff.Wire(err)}); e != nil {
			w.fail("messages", "%s built an invalid move refusal: %v", n.addr, e)
		}
	}
	if m.TargetIncarnation != n.inc {
		refuse(&messages.WireError{Code: messages.CodeNodeLost, Where: "decode node",
			Message: fmt.Sprintf("moved to decode node incarnation %x, this is %x", m.TargetIncarnation, n.inc)})
		return
	}
	i := int(m.ClientID) - 1
	if i < 0 || i >= len(w.clients) || w.clients[i].tenant != m.Tenant || m.Model != simModel.String() ||
		int(m.PageTokens) != w.opt.PageTokens {
		w.fail("moves", "%s was asked to take a move no request of the world is: client %d of %q, model %s, pages of %d",
			n.addr, m.ClientID, m.Tenant, m.Model, m.PageTokens)
		return
	}
	c := w.clients[i]
	key := handoff.ClientKey{Client: c.tenant, ID: c.id}
	wk, err := n.adm.Admit(handoff.Ask{Key: key, PromptTokens: len(m.Prompt), MaxTokens: int(m.MaxTokens), Routed: true})
	if err != nil {
		refuse(err)
		return
	}
	n.nextID++
	dr := &dreq{n: n, c: c, name: fmt.Sprintf("%d (moved in)", n.nextID), attempts: []uint64{n.nextID}, worker: wk}
	dr.r = handoff.NewMovedRequest(n.cfg, kv.Owner{Request: n.nextID, Tenant: m.Tenant}, m,
		handoff.Peer{Address: d.from.addr, Incarnation: m.SourceIncarnation})
	w.byAttempt[handoff.JobKey{Sender: senderKey(n.addr, n.inc), ID: n.nextID}] = c
	n.adm.Started(dr.name, key, wk)
	n.reqs[n.nextID] = dr
	n.live = append(n.live, dr)
	w.all = append(w.all, dr)
	dr.run(handoff.Start{})
	dr.movesLeft = 1 // moved once, it may be moved again, as a drain's moves may land on a node that drains next
}

// moveReply hands a target's MovePlan, TransferAck or TransferAbort to the
// request moving there, found by the move's id or the target's request
// the plan named (or, misdirected, to another request), saying whether it
// came from the move's target.
func (n *node) moveReply(d *delivery, id uint64, ev func(dr *dreq, fromTarget bool) handoff.Event) {
	var dr *dreq
	if d.other && len(n.live) > 0 {
		dr = n.live[n.w.rng.IntN(len(n.live))]
	}
	for _, x := range n.live {
		if dr == nil && x.mv != nil && d.from.addr == x.mv.to.Address &&
			(x.mv.id == id || x.mv.plan != nil && x.mv.plan.Request == id) {
			dr = x
		}
	}
	if dr == nil {
		n.w.trace.line(fmt.Sprintf("  %s: no move %d", n.addr, id))
		return
	}
	from := dr.mv != nil && d.from.addr == dr.mv.to.Address
	dr.run(ev(dr, from))
}

// messageMoved routes a message of a move to its side on this decode run.
func (n *node) messageMoved(d *delivery, m messages.Message) bool {
	switch m := m.(type) {
	case *messages.MoveRequest:
		n.moveIn(d, m)
	case *messages.MovePlan:
		n.moveReply(d, m.MoveID, func(dr *dreq, from bool) handoff.Event {
			return handoff.MovePlanIn{Plan: m, FromTarget: from, From: d.from.addr}
		})
	case *messages.TransferAck:
		n.moveReply(d, m.RequestID, func(dr *dreq, from bool) handoff.Event {
			if dr.mv != nil { // the ack of its own move, from its target
				dr.mv.acking = from && dr.mv.plan != nil && m.RequestID == dr.mv.plan.Request
			}
			return handoff.MoveAckIn{Ack: m, FromTarget: from, From: d.from.addr}
		})
	case *messages.TransferAbort:
		n.moveReply(d, m.RequestID, func(dr *dreq, from bool) handoff.Event {
			return handoff.MoveAbortIn{Abort: m, FromTarget: from}
		})
	default:
		return false
	}
	return true
}

// movedStream is the relay's taking of a decode node's word that the
// stream moved: from the stream's node only, and handed over once every
// chunk before it passed (package cluster's relay, on the same core). The
// stream is then the target's, which the relay asks to stream
// (StreamTake), and whose run's end is the stream's.
func (c *client) movedStream(from *dreq, e handoff.HandOver) {
	w := c.w
	if !c.heard(from.n.addr, c.id) {
		return
	}
	m := &messages.StreamMoved{RequestID: c.id, Seq: e.Seq, To: e.To.Address, ToID: fmt.Sprint(c.id), ToIncarnation: e.To.Incarnation}
	if why := c.stream.Moved(m); why != "" {
		w.fail("moves", "the relay of client %d refused its own node's hand-over: %s", c.id, why)
		return
	}
	if c.stream.HandOver() == nil {
		w.fail("moves", "the relay of client %d holds a hand-over at chunk %d with every chunk passed on", c.id, e.Seq)
		return
	}
	w.count[MoveHandedOver]++
	to, err := w.node(e.To.Address)
	if err != nil || from.mv == nil || from.mv.plan == nil {
		w.fail("moves", "client %d handed over to %s with no plan: %v", c.id, e.To.Address, err)
		return
	}
	var target *dreq
	if to.inc == e.To.Incarnation {
		target = to.reqs[from.mv.plan.Request]
	}
	c.node, c.inc, c.dr = to, e.To.Incarnation, target
	if target == nil {
		c.nodeLost(fmt.Sprintf("decode node %s run %x, which the stream moved to, is gone", e.To.Address, e.To.Incarnation))
		return
	}
	take := &messages.StreamTake{RequestID: c.id, Seq: e.Seq}
	copies := 1
	switch {
	case w.chance(Drop):
		w.count[ControlDropped]++
		w.trace.line("  net: StreamTake dropped")
		copies = 0
	case w.chance(Duplicate):
		w.count[Duplicated]++
		copies = 2
	}
	for range copies {
		to.at(w.latency("StreamTake"), fmt.Sprintf("client %d's relay asks request %s to stream", c.id, target.name), func() {
			target.run(handoff.TakeIn{Take: take, FromReceiver: true, From: routerAddr})
		})
	}
	w.after(c.deadline.Sub(w.now), fmt.Sprintf("relay deadline of client %d", c.id), func() {
		switch {
		case c.done || c.dr != target:
		case to.inc == c.inc && target.r.Taken():
			// It answers by the request's own deadline, before this one.
			w.fail("moves", "client %d: the decode node %s took the stream and did not answer by the relay's deadline", c.id, to.addr)
		default:
			c.nodeLost(fmt.Sprintf("no answer from decode node %s within %s", to.addr, w.opt.Timing.RequestTimeout+relayMargin(w.opt.Timing)))
		}
	})
}

// forge is the Misdirect fault on the stream of another client than the
// one node n streams to: n sends its relay the next chunk, with a token
// not its reference's, as a decode node the stream was never handed to
// would; the relay must refuse it.
func (w *world) forge(n *node) {
	var others []*client
	for _, c := range w.clients {
		if !c.done && c.stream.At() != "" && c.stream.At() != n.addr {
			others = append(others, c)
		}
	}
	if len(others) == 0 {
		return
	}
	c := others[w.rng.IntN(len(others))]
	tok := uint32(1)
	if at := len(c.emitted); at < len(c.want) {
		tok = uint32(c.want[at]) + 1
	}
	w.count[ChunkForged]++
	w.trace.line(fmt.Sprintf("  FORGE %s sends client %d's relay chunk %d", n.addr, c.id, c.stream.Seq()+1))
	c.chunk(n.addr, &messages.TokenChunk{RequestID: c.id, Seq: c.stream.Seq() + 1, Tokens: []uint32{tok}})
}
