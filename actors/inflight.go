package actors

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
)

// Operators' view of the requests in flight: the node's control actor,
// once it has checked that an operator asks, sends admission (or a
// router) ListRequests or CancelNumber with the operator as the sender,
// and admission answers the operator directly.

// ListRequests asks for the requests in flight, oldest first, at most Max
// of them (0, or more than a list carries: messages.InFlightListMax);
// answered with a *messages.InFlightList.
type ListRequests struct{ Max int }

// CancelNumber asks to cancel the request in flight of that number (its
// messages.InFlight.Number), for the operator By names; answered with a
// *messages.CancelInFlightReply. The request's client is answered
// "cancelled" and its pages are released, as for a client's own cancel.
type CancelNumber struct {
	Number uint64
	By     string
}

// NotInFlightError is a cancel of a request that is not in flight on the
// node: it ended, it never existed, or its number names a request of
// another run of the node (Incarnation, when it is not the node's own:
// Self).
type NotInFlightError struct {
	Number            uint64
	Incarnation, Self uint64
}

func (e *NotInFlightError) Error() string {
	if e.Incarnation != e.Self {
		return fmt.Sprintf("request %d of incarnation %016x: this node is incarnation %016x (it restarted since, or the request was listed by another node)",
			e.Number, e.Incarnation, e.Self)
	}
	return fmt.Sprintf("request %d of incarnation %016x is not in flight on this node", e.Number, e.Self)
}

// Wire is the error as an operator is told it: a bad request, naming the
// number.
func (e *NotInFlightError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBadRequest, Message: e.Error(), Have: e.Number}
}

// liveRequest is what a request actor shows of itself while in flight: set
// when admission spawns it, and its progress, which the actor sets after
// every step and admission reads when an operator asks.
type liveRequest struct {
	number, client uint64
	tenant         string
	since          time.Time
	router         string // the address of the router that relayed the request; "" for one its client sent here
	// pages are what the tenants' ledger counts of a request its client
	// sent here (a router counts those it routes); counted says it does.
	pages   int
	counted bool

	mu       sync.Mutex
	progress handoff.Progress
}

func (l *liveRequest) set(p handoff.Progress) {
	l.mu.Lock()
	l.progress = p
	l.mu.Unlock()
}

// entry is the request as an InFlight of the decode node at decode, at
// now; false once it has answered its client.
func (l *liveRequest) entry(decode string, now time.Time) (messages.InFlight, bool) {
	l.mu.Lock()
	p := l.progress
	l.mu.Unlock()
	if p.Stage == handoff.StageDone {
		return messages.InFlight{}, false
	}
	return messages.InFlight{Number: l.number, ClientID: l.client, Tenant: l.tenant, Phase: p.Stage.String(),
		Prefill: p.Peer.Address, Decode: decode, AgeMs: AgeMs(now.Sub(l.since)), Tokens: uint32(p.Tokens)}, true
}

// AgeMs is d in whole milliseconds, as messages.InFlight carries an age;
// 0 for a clock that went back.
func AgeMs(d time.Duration) uint64 { return uint64(max(d.Milliseconds(), 0)) }

// InFlightList is the answer to ListRequests of a node of incarnation inc
// with requests in flight: the oldest limit of them (as ListRequests.Max
// bounds them), and how many more there are.
func InFlightList(inc uint64, requests []messages.InFlight, limit int) *messages.InFlightList {
	if limit <= 0 || limit > messages.InFlightListMax {
		limit = messages.InFlightListMax
	}
	slices.SortFunc(requests, func(a, b messages.InFlight) int {
		return cmp.Or(cmp.Compare(b.AgeMs, a.AgeMs), cmp.Compare(a.Number, b.Number))
	})
	shown := min(len(requests), limit)
	return &messages.InFlightList{Incarnation: inc, Requests: requests[:shown], Omitted: uint32(len(requests) - shown)}
}

// listRequests answers ListRequests from the requests admission holds.
func (a *admissionActor) listRequests(c actor.Context, m ListRequests) {
	now := time.Now()
	var all []messages.InFlight
	for _, l := range a.live {
		if e, ok := l.entry(c.Self().Address, now); ok {
			all = append(all, e)
		}
	}
	if err := messages.Respond(c, InFlightList(a.cfg.Incarnation, all, m.Max)); err != nil {
		a.log.Error("in-flight list refused by its own validation", "err", err)
	}
}

// cancelNumber cancels the request of that number, if it is in flight,
// as a client's CancelRequest would.
// MoveNumber asks admission to move the request of that number (its
// first attempt's id, as operators list it) to the decode node To, as move
// MoveID; the request actor answers MoveDone to the asker.
type MoveNumber struct {
	Number, MoveID uint64
	To             handoff.Peer
}

// moveAsked is a move admission asked of a request actor for asker.
type moveAsked struct {
	asker   *actor.PID
	request string // the request actor's name
}

// moveNumber hands a MoveNumber to its request's actor, which answers
// admission, which answers the asker; or it answers that no such request
// is in flight.
func (a *admissionActor) moveNumber(c actor.Context, m MoveNumber) {
	for name, l := range a.live {
		if l.number == m.Number {
			if c.Sender() != nil { // asked with nobody to answer: the move goes on unanswered
				a.moves[m.MoveID] = moveAsked{asker: c.Sender(), request: name}
			}
			c.Send(actor.NewPID(c.Self().Address, name), MoveJob{MoveID: m.MoveID, To: m.To, ReplyTo: c.Self()})
			return
		}
	}
	c.Respond(MoveDone{MoveID: m.MoveID, Err: a.notInFlight(m.Number)})
}

// requestGone is admission's note to itself that a request actor
// stopped: handled after every message the actor sent before it stopped.
type requestGone struct {
	name   string
	number uint64
}

// movesEnded answers, as not in flight, the moves asked of a request actor
// that stopped without answering them: one that ended as the move was
// asked drops the MoveJob waiting in its mailbox.
func (a *admissionActor) movesEnded(c actor.Context, g requestGone) {
	for id, asked := range a.moves {
		if asked.request == g.name {
			delete(a.moves, id)
			c.Send(asked.asker, MoveDone{MoveID: id, Err: a.notInFlight(g.number)})
		}
	}
}

func (a *admissionActor) notInFlight(number uint64) error {
	return &NotInFlightError{Number: number, Incarnation: a.cfg.Incarnation, Self: a.cfg.Incarnation}
}

func (a *admissionActor) cancelNumber(c actor.Context, m CancelNumber) {
	rep := &messages.CancelInFlightReply{}
	for name, l := range a.live {
		if l.number != m.Number {
			continue
		}
		if e, ok := l.entry(c.Self().Address, time.Now()); ok {
			rep.Request = &e
			c.Send(actor.NewPID(c.Self().Address, name), CancelJob{})
			a.log.Info("request cancelled by an operator", "number", m.Number, "id", l.client, "tenant", l.tenant,
				"phase", e.Phase, "operator", m.By)
		}
	}
	if rep.Request == nil {
		rep.Err = handoff.Wire(&NotInFlightError{Number: m.Number, Incarnation: a.cfg.Incarnation, Self: a.cfg.Incarnation})
	}
	if err := messages.Respond(c, rep); err != nil {
		a.log.Error("cancel reply refused by its own validation", "err", err)
	}
}
