package actors

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// route is where a request runs: its prefill peer (a dispatcher, here or
// in another node) and its decode worker in this node.
type route struct {
	prefill, decode *actor.PID
	decodePool      *Pool
}

// requestActor is the shell of one handoff.Request: it turns messages and
// timers into the request's events and carries its effects out (pages
// through the decode pool's page actors, the handshake as wire messages to
// the prefill peer, tokens and the result to the client). It adds one rule
// of its own, which needs the transport: frames and reports must come from
// the planned peer.
type requestActor struct {
	cfg      *Config
	log      *slog.Logger
	counters *nodeCounters
	core     *handoff.Request
	client   *actor.PID // where TokenChunk and GenerateResult go
	// streams sends them in batches, when the client asked for batches;
	// nil otherwise.
	streams *messages.Streams
	// tok is the model's tokenizer and last the prompt's last token,
	// after which the generated text starts; text joins streamed pieces
	// into UTF-8.
	tok   engine.Tokenizer
	last  int
	text  *engine.TextDecoder
	times Stream // the request's token times, into the node's Latencies
	route route
	// pick chooses another prefill peer when a transfer fails before any
	// token was streamed.
	pick PrefillPicker
	// registry maps request ids to this actor for the data plane; the
	// actor keeps its own entry, which changes with each attempt.
	registry *sync.Map
	auth     *trust.Authority
	kv       *pageClient
	seen     handoff.RequestCounts // already added to the node's counters
	cause    error                 // why the request ended, or frames were refused, in the step in hand
	live     *liveRequest          // what operators see of the request, set after every step
	stage    stage                 // the node's gauge the request is counted in
	rx       receiving             // the current attempt's transfer
	mv       moving                // the request's move to another decode node, asked for
}

// MoveJob asks a request actor to move its request to the decode node To
// (its admission's remote address and run), as move MoveID; the actor
// answers ReplyTo MoveDone when the move is over. Only a request a router
// relays moves: the router follows the stream.
type MoveJob struct {
	MoveID  uint64
	To      handoff.Peer
	ReplyTo *actor.PID
}

// MoveDone is how a move went: Err nil when the request moved.
type MoveDone struct {
	MoveID uint64
	Err    error
}

// moving is a request actor's move under way: who asked, where to, and
// the target's request, once it planned.
type moving struct {
	id      uint64
	to      handoff.Peer
	asker   *actor.PID
	planner *actor.PID
}

// done tells whoever asked for the move how it went.
func (m *moving) done(c actor.Context, err error) {
	if m.asker != nil {
		c.Send(m.asker, MoveDone{MoveID: m.id, Err: err})
	}
	*m = moving{}
}

// timerFired is a handoff.Timer's event, due now.
type timerFired struct{ ev handoff.Event }

func (r *requestActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		r.kv = newPageClient(r.route.decodePool, c)
		r.registry.Store(r.core.Owner().Request, c.Self())
		r.run(c, handoff.Start{})
	case *actor.Stopping:
		r.registry.Delete(r.core.Owner().Request)
		r.stage.move(nil)
	case timerFired:
		r.run(c, m.ev)
	case FrameBatch:
		frames, _, err := kv.DecodeBatch(m.Data, r.cfg.BatchLimits())
		if err != nil {
			r.run(c, handoff.Failed{Err: err})
			return
		}
		r.run(c, handoff.FramesIn{Frames: frames}) // from this node's own worker
	case FramesIn:
		// A stranger's frames are refused (the data plane closes its
		// connection) and counted, but do not end the request: request
		// ids are no secret, and anyone could otherwise fail anyone's
		// request.
		from, ok := r.fromPeer(c, m.Peer)
		r.run(c, handoff.FramesIn{Frames: m.Frames, Stranger: !ok, From: from})
		c.Respond(FramesInReply{Err: r.cause})
	case *messages.TransferDone:
		r.run(c, handoff.TransferIn{Done: m, FromPrefill: r.fromPrefill(c), From: r.auth.Of(c).String()})
	case PeerLost:
		r.run(c, handoff.PeerLost{Incarnation: m.Incarnation})
	case TokenOut:
		if m.Owner == r.core.Owner() {
			r.run(c, handoff.TokenIn{Token: m.Token})
		}
	case DecodeDone:
		if m.Owner == r.core.Owner() {
			r.run(c, handoff.DecodeEnded{Err: m.Err})
		}
	case CancelJob:
		r.run(c, handoff.Cancel{})
	case StopJob:
		r.run(c, handoff.Stop{})
	case MoveJob:
		r.moveJob(c, m)
	case JobPaused:
		if m.Owner == r.core.Owner() {
			r.run(c, m.Paused)
		}
	case *messages.MovePlan:
		// The target's request that sent the plan is the one heard from
		// then on: pinned once the plan is taken.
		from, planned := c.Sender(), r.core.MovePlanned()
		r.run(c, handoff.MovePlanIn{Plan: m, FromTarget: r.fromMoveTarget(from), From: r.auth.Of(c).String()})
		if !planned && r.core.MovePlanned() {
			r.mv.planner = from
		}
	case *messages.TransferAck:
		r.run(c, handoff.MoveAckIn{Ack: m, FromTarget: samePID(r.mv.planner, c.Sender()), From: r.auth.Of(c).String()})
	case *messages.TransferAbort:
		r.run(c, handoff.MoveAbortIn{Abort: m, FromTarget: r.fromMoveTarget(c.Sender())})
	case MoveFramesSent:
		if m.Owner == r.core.Owner() {
			r.run(c, handoff.MoveSent{MoveID: m.MoveID, Err: m.Err})
		}
	case JobResumed:
		if m.Owner == r.core.Owner() {
			r.run(c, handoff.Resumed{})
		}
	case *messages.StreamTake:
		taken := r.core.Taken()
		r.run(c, handoff.TakeIn{Take: m, FromReceiver: samePID(c.Sender(), r.client), From: r.auth.Of(c).String()})
		if !taken && r.core.Taken() {
			r.counters.movedIn.Add(1)
		}
	}
}

// fromMoveTarget says whether from is at the address of the node the move
// under way goes to (the remote boundary proved the sender's address).
func (r *requestActor) fromMoveTarget(from *actor.PID) bool {
	return from != nil && r.mv.id != 0 && from.Address == r.mv.to.Address
}

// samePID says a and b name the same actor.
func samePID(a, b *actor.PID) bool {
	return a != nil && b != nil && a.Address == b.Address && a.Id == b.Id
}

// moveJob starts the move an operator or the node asked for, if the
// request may move; the asker hears at once when it may not.
func (r *requestActor) moveJob(c actor.Context, m MoveJob) {
	err := r.core.Movable() // a move under way among its reasons
	if err == nil && r.live.router == "" {
		err = &handoff.MoveRefusedError{Why: "its client sent it here, not through a router"}
	}
	if err != nil {
		if m.ReplyTo != nil {
			c.Send(m.ReplyTo, MoveDone{MoveID: m.MoveID, Err: err})
		}
		return
	}
	r.mv = moving{id: m.MoveID, to: m.To, asker: m.ReplyTo}
	r.run(c, handoff.MoveOut{MoveID: m.MoveID, To: m.To, Receiver: r.client.Address, ReceiverID: r.client.Id})
}

// run steps the request and carries its effects out, then adds its
// tallies to the node's counters.
func (r *requestActor) run(c actor.Context, ev handoff.Event) {
	r.cause = nil
	handoff.RunClock(r.core, ev, time.Now, func(e handoff.Effect) handoff.Event { return r.do(c, e) })
	r.live.set(r.core.Progress())
	n := r.core.Counts()
	r.counters.ignored.Add(n.Ignored - r.seen.Ignored)
	r.counters.framesAccepted.Add(n.FramesAccepted - r.seen.FramesAccepted)
	r.counters.framesRefused.Add(n.FramesRefused - r.seen.FramesRefused)
	r.seen = n
}

func (r *requestActor) do(c actor.Context, e handoff.Effect) handoff.Event {
	switch e := e.(type) {
	case handoff.Reserve:
		r.stage.move(&r.counters.metrics.waitingPages)
		if r.cfg.DecodeCachePercent > 0 {
			return handoff.ExecReserveHeld(r.kv, workerCache{r: c, worker: r.route.decode, timeout: r.cfg.CallTimeout}, e)
		}
		return handoff.ExecReserve(r.kv, e)
	case handoff.Keep:
		c.Send(r.route.decode, keepPages{Keep: e})
	case handoff.Unhold:
		for _, p := range e.Pages {
			c.Send(r.route.decode, heldForget{Hit: p})
		}
	case handoff.Release:
		handoff.ExecRelease(r.kv, e, func(t kv.Tag, err error) {
			r.log.Warn("release of decode page refused", "tag", t.String(), "err", err)
		})
	case handoff.SendPlan:
		r.stage.move(&r.counters.metrics.waitingKV)
		r.rx = receiving{on: true}
		if err := messages.SendFrom(c, r.route.prefill, e.Plan); err != nil {
			return handoff.Failed{Err: err}
		}
	case handoff.SendAbort:
		if err := messages.SendFrom(c, r.route.prefill, e.Abort); err != nil {
			r.log.Error("transfer abort refused by its own validation", "err", err)
		}
	case handoff.SendAck:
		if faults.Current().DropAck() {
			return nil // a chaos build's fault point: the ack is lost on the way
		}
		if err := messages.SendFrom(c, r.route.prefill, e.Ack); err != nil {
			return handoff.Failed{Err: err}
		}
	case handoff.Write:
		w := handoff.ExecWrite(r.kv, e)
		r.rx.written(e.Frames[:w.N], time.Now())
		return w
	case handoff.SealVerify:
		r.rx.end = time.Now()
		return handoff.ExecSealVerify(r.kv, e)
	case handoff.StartDecode:
		r.stage.move(&r.counters.metrics.running)
		r.rx.done(&r.counters.metrics.received)
		c.Send(r.route.decode, DecodeJob{StartDecode: e, ReplyTo: c.Self()})
	case handoff.CancelDecode:
		c.Send(r.route.decode, CancelJob{Owner: e.Owner})
	case handoff.Emit:
		// Tokens and the result name this actor as their sender, so that
		// the client can tell them from anyone else's.
		now := time.Now()
		for _, t := range e.Chunk.Tokens {
			e.Chunk.Text += r.text.Push(int(t))
			r.times.Token(&r.counters.latencies, now)
		}
		if err := r.toClient(c, e.Chunk); err != nil {
			r.log.Error("token chunk refused", "err", err)
		}
	case handoff.Finish:
		r.finish(c, e)
	case handoff.SendMovePlan:
		if err := messages.SendFrom(c, r.route.prefill, e.Plan); err != nil {
			return handoff.Failed{Err: err}
		}
	case handoff.PauseDecode:
		c.Send(r.route.decode, PauseJob{Owner: e.Owner, MoveID: e.MoveID})
	case handoff.ResumeDecode:
		c.Send(r.route.decode, ResumeJob{Owner: e.Owner})
	case handoff.SendMoveRequest:
		if err := messages.SendFrom(c, actor.NewPID(e.To.Address, AdmissionName), e.Move); err != nil {
			return handoff.MoveSent{MoveID: e.Move.MoveID, Err: err}
		}
	case handoff.SendMoveFrames:
		c.Send(r.route.decode, moveFrames{SendMoveFrames: e, To: r.mv.to.Address, ReplyTo: c.Self()})
	case handoff.SendMoveDone:
		if err := messages.SendFrom(c, r.mv.planner, e.Done); err != nil {
			return handoff.MoveSent{MoveID: r.mv.id, Err: err}
		}
	case handoff.HandOver:
		m := &messages.StreamMoved{RequestID: r.live.client, Seq: e.Seq, To: r.mv.planner.Address, ToID: r.mv.planner.Id,
			ToIncarnation: e.To.Incarnation}
		if err := messages.SendFrom(c, r.client, m); err != nil {
			r.log.Error("stream moved refused by its own validation", "err", err)
		}
	case handoff.MoveEnded:
		r.log.Info("request did not move", "owner", r.core.Owner().String(), "move", e.MoveID, "to",
			fmt.Sprintf("%x", r.mv.to.Incarnation), "cause", e.Err)
		r.mv.done(c, e.Err)
	case handoff.Timer:
		self, sys, ev := c.Self(), c.ActorSystem(), e.Event
		time.AfterFunc(e.After, func() { sys.Root.Send(self, timerFired{ev: ev}) })
	case handoff.Pick:
		peer, ok := r.pick(e.Exclude)
		if !ok {
			return handoff.Picked{}
		}
		return handoff.Picked{Peer: handoff.Peer{Address: peer.PID.Address, Incarnation: peer.Incarnation},
			Attempt: r.counters.requestIDs.Add(1), OK: true}
	case handoff.Retry:
		r.log.Info("retrying transfer with another prefill node", "owner", r.core.Owner().String(), "attempt", e.Old,
			"new_attempt", e.New, "cause", e.Cause,
			"from", fmt.Sprintf("%x", e.From.Incarnation), "to", fmt.Sprintf("%x", e.To.Incarnation))
		// A new attempt is a new request id: whatever the abandoned
		// attempt still sends names the old one and is dropped.
		r.registry.Delete(e.Old)
		r.registry.Store(e.New, c.Self())
		r.route.prefill = actor.NewPID(e.To.Address, PrefillName) // every node's dispatcher
		r.counters.retried.Add(1)
		r.rx.failed(&r.counters.metrics.received, e.Cause)
	case handoff.Refuse:
		r.cause = e.Err
		r.auth.Refuse(trust.RefusedStranger, e.Err.What, "request", r.core.Owner().Request, "from", e.Err.From,
			"planned", e.Err.Planned)
	}
	return nil
}

// finish answers the client and stops the actor. A request that fails an
// integrity check here counts the refusal by its reason.
func (r *requestActor) finish(c actor.Context, e handoff.Finish) {
	r.cause = e.Cause
	r.stage.move(nil)
	r.rx.failed(&r.counters.metrics.received, e.Cause)
	res := e.Result
	owner := r.core.Owner()
	attrs := []any{"id", res.RequestID, "owner", owner.String(), "tenant", owner.Tenant, "tokens", len(e.Tokens),
		"prefill", r.route.prefill.Address}
	if e.Moved {
		r.counters.moved.Add(1)
		r.log.Info("request moved", append(attrs, "to", r.mv.planner.Address, "move", r.mv.id)...)
		r.mv.done(c, nil)
		c.Stop(c.Self())
		return
	}
	if r.mv.id != 0 {
		// It ended while it moved (its job ended, it was cancelled): the
		// move's asker hears so now rather than at its timeout.
		r.mv.done(c, &NotInFlightError{Number: r.live.number, Incarnation: r.cfg.Incarnation, Self: r.cfg.Incarnation})
	}
	if e.Silent {
		// A request moved here that ends before its receiver took it: the
		// stream is still its source's, or nobody's.
		r.counters.failed.Add(1)
		r.counters.failedBy.Add(handoff.Wire(e.Cause).Code)
		r.log.Info("moved request ended untaken", append(attrs, "err", e.Cause)...)
		c.Stop(c.Self())
		return
	}
	if e.Cause != nil {
		code := handoff.Wire(e.Cause).Code
		r.counters.failed.Add(1)
		r.counters.failedBy.Add(code)
		if code == messages.CodeIntegrity || code == messages.CodeModelMismatch {
			r.counters.metrics.integrity.Count(e.Cause)
		}
		r.log.Info("request ended", append(attrs, "outcome", "failed", "code", code.String(), "err", e.Cause)...)
	} else {
		res.Text = engine.DecodeText(r.tok, r.last, e.Tokens)
		r.counters.completed.Add(1)
		r.times.End(&r.counters.latencies, time.Now())
		if ph := e.Phases; ph != nil {
			r.counters.phases.add(*ph)
			attrs = append(attrs, "ttft", ph.Queue+ph.Prefill+ph.Transfer+ph.Verify)
		}
		r.log.Info("request ended", append(attrs, "outcome", "completed", "finish", res.FinishReason.String())...)
	}
	if err := r.toClient(c, res); err != nil {
		r.log.Error("result refused by its own validation", "err", err)
		_ = r.toClient(c, &messages.GenerateResult{RequestID: res.RequestID, FinishReason: messages.FinishError,
			Err: &messages.WireError{Code: messages.CodeInternal, Message: "result failed validation"}})
	}
	c.Stop(c.Self())
}

// toClient sends a token chunk or the result to the client: in a batch
// when it asked for batches, alone otherwise, named as from this actor
// either way (a batch's sender is this node's Inbox, at this address).
func (r *requestActor) toClient(c actor.Context, m messages.Message) error {
	if r.streams != nil {
		return r.streams.Send(r.client, m)
	}
	return messages.SendFrom(c, r.client, m)
}

// fromPrefill says whether the message in hand came from the prefill peer
// of the current attempt: from its address, which the remote boundary
// proved the sender holds, or, for a plan with this node, from inside this
// process (no sender).
func (r *requestActor) fromPrefill(c actor.Context) bool {
	from := c.Self().Address
	if s := c.Sender(); s != nil {
		from = s.Address
	}
	return from == r.route.prefill.Address
}

// fromPeer says whether frames the data plane received came from the
// identity proven to serve at the planned prefill peer's address, and who
// sent them. A peer without an identity passes only on an insecure node,
// where nobody has one, or for a plan with this node.
func (r *requestActor) fromPeer(c actor.Context, peer trust.Identity) (from string, ok bool) {
	from = peer.String()
	if peer.IsZero() {
		from = "an unauthenticated peer"
	}
	switch {
	case r.auth.Insecure():
		return from, true
	case r.route.prefill.Address == c.Self().Address:
		return from, peer.IsZero()
	}
	want, known := r.auth.Peers().At(r.route.prefill.Address)
	return from, known && !peer.IsZero() && peer == want
}
