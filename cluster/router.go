package cluster

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// routerCounters are read by status.
type routerCounters struct {
	routed, completed, failed, lost            atomic.Uint64
	failedBy                                   messages.CodeCounts // failed and lost, by the code told to the client
	latencies                                  actors.Latencies    // of the requests relayed, as their clients saw them
	rejectedTooLong, rejectedBusy, rejectedBad atomic.Uint64
	rejectedBy                                 actors.RejectCounts // every refusal above, by bound
	strangers                                  atomic.Uint64       // relayed messages refused: wrong sender, id or sequence
}

// inFlight is the routed requests not yet answered.
func (c *routerCounters) inFlight() uint32 {
	return uint32(c.routed.Load() - c.completed.Load() - c.failed.Load() - c.lost.Load())
}

// routerActor admits client requests for a cluster: it refuses, before any
// page exists anywhere, a request that does not fit the context window or
// the smallest pool on the path it would take, and sends the rest to the
// alive, non-draining decode node with the most free pages, with the
// prefill node with the most free pages chosen for it. Each routed request
// gets a relay actor (a child) that the decode node answers: the relay
// passes tokens and the result on to the client, sees the request end, and
// tells the client "node lost" if its decode node goes.
type routerActor struct {
	cfg      *actors.Config
	model    *engine.Model // its tokenizer counts prompts; routes go to members of its fingerprint
	members  func() []Member
	draining func() bool
	log      *slog.Logger
	auth     *trust.Authority
	mailbox  actor.MailboxProducer // never waits when full (actors.Node.Mailbox)
	counters *routerCounters
	relays   map[string]*relay // by relay PID id
	byClient map[string]*actor.PID
}

// memberLost is sent to the router when a member fails or leaves.
type memberLost struct{ incarnation uint64 }

func clientKey(client *actor.PID, id uint64) string { return fmt.Sprintf("%s#%d", client, id) }

func (r *routerActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		r.relays = map[string]*relay{}
		r.byClient = map[string]*actor.PID{}
	case *messages.GenerateRequest:
		if c.Sender() == nil {
			// Nobody to answer: routing it would generate for no one.
			r.counters.rejectedBad.Add(1)
			r.counters.rejectedBy.AddBound(actors.RejectBadRequest)
			r.log.Warn("request without a sender dropped", "id", m.RequestID)
			return
		}
		tenant, err := actors.TenantOf(r.auth, r.auth.Of(c), m.Tenant)
		if err != nil {
			r.counters.rejectedBad.Add(1)
			r.counters.rejectedBy.Add(err)
			if err := actors.Reject(c, m.RequestID, err); err != nil {
				r.log.Error("rejection refused by its own validation", "err", err)
			}
			return
		}
		r.route(c, m, tenant)
	case *messages.CancelRequest:
		if pid := r.byClient[clientKey(c.Sender(), m.RequestID)]; pid != nil {
			c.Send(pid, m)
		}
	case actors.ListRequests:
		now := time.Now()
		all := make([]messages.InFlight, 0, len(r.relays))
		for _, rl := range r.relays {
			all = append(all, rl.entry(now))
		}
		if err := messages.Respond(c, actors.InFlightList(r.cfg.Incarnation, all, m.Max)); err != nil {
			r.log.Error("in-flight list refused by its own validation", "err", err)
		}
	case actors.CancelNumber:
		r.cancelNumber(c, m)
	case memberLost:
		for id, rl := range r.relays {
			if rl.decode == m.incarnation {
				c.Send(actor.NewPID(c.Self().Address, id), m)
			}
		}
	case *actor.Terminated:
		if rl, ok := r.relays[m.Who.Id]; ok {
			delete(r.relays, m.Who.Id)
			delete(r.byClient, clientKey(rl.client, rl.id))
		}
	case *messages.Undecodable:
		r.counters.rejectedBad.Add(1)
		r.counters.rejectedBy.AddBound(actors.RejectBadRequest)
	}
}

// notAdmission answers every request sent to a prefill node's admission
// name: not an admission endpoint, with the node's role.
type notAdmission struct {
	role actors.Role
	log  *slog.Logger
}

func (a *notAdmission) Receive(c actor.Context) {
	if m, ok := c.Message().(*messages.GenerateRequest); ok && c.Sender() != nil {
		err := &actors.BadRequestError{Reason: fmt.Sprintf("not an admission endpoint (role %s): send requests to a router or a node of role decode or all", a.role)}
		if err := actors.Reject(c, m.RequestID, err); err != nil {
			a.log.Error("rejection refused by its own validation", "err", err)
		}
	}
}

// candidates are the alive, verified, non-draining members whose role
// does kind and who serve the model of fingerprint model, most free pages
// first.
func candidates(ms []Member, kind func(Role) bool, model engine.Fingerprint) []Member {
	var out []Member
	for _, m := range ms {
		if m.State == StateAlive && m.Verified && !m.Meta.Draining && kind(m.Meta.Role) && m.Meta.Model == model {
			out = append(out, m)
		}
	}
	slices.SortStableFunc(out, func(a, b Member) int { return cmp.Compare(b.Meta.FreePages, a.Meta.FreePages) })
	return out
}

// otherModels counts the members that serve another model than model.
func otherModels(ms []Member, model engine.Fingerprint) int {
	n := 0
	for _, m := range ms {
		if m.Meta.Model != model {
			n++
		}
	}
	return n
}

func prefills(r Role) bool { return r == RolePrefill || r == RoleAll }
func decodes(r Role) bool  { return r == RoleDecode || r == RoleAll }

func (r *routerActor) route(c actor.Context, m *messages.GenerateRequest, tenant string) {
	answer := func(err error, counter *atomic.Uint64) {
		counter.Add(1)
		if err := actors.Reject(c, m.RequestID, err); err != nil {
			r.log.Error("rejection refused by its own validation", "err", err)
		}
	}
	reject := func(err error, counter *atomic.Uint64) {
		r.counters.rejectedBy.Add(err)
		answer(err, counter)
	}
	if r.draining() {
		reject(&actors.BusyError{Where: "draining router", Have: len(r.relays), Limit: 0}, &r.counters.rejectedBusy)
		return
	}
	ms := r.members()
	fp := r.model.Fingerprint()
	ds, ps := candidates(ms, decodes, fp), candidates(ms, prefills, fp)
	if len(ds) == 0 || len(ps) == 0 {
		where := fmt.Sprintf("cluster (%d decode, %d prefill nodes available)", len(ds), len(ps))
		if other := otherModels(ms, fp); other > 0 {
			where = fmt.Sprintf("cluster (%d decode, %d prefill nodes of model %s available; %d members serve other models)",
				len(ds), len(ps), fp.Short(), other)
		}
		reject(&actors.BusyError{Where: where}, &r.counters.rejectedBusy)
		return
	}
	d, p := ds[0], ps[0]
	prompt, err := handoff.Encode(r.cfg.Limits(), r.model.Tokenizer(), m.Prompt)
	if err == nil {
		err = handoff.Admit(r.cfg.Limits(), len(prompt), int(m.MaxTokens), int(p.Meta.CapacityPages), int(d.Meta.CapacityPages))
	}
	if err != nil {
		if _, ok := err.(*actors.PromptTooLongError); ok {
			reject(err, &r.counters.rejectedTooLong)
		} else {
			reject(err, &r.counters.rejectedBad)
		}
		return
	}
	if len(r.relays) >= r.cfg.QueueMax {
		reject(&actors.BusyError{Where: "router", Have: len(r.relays), Limit: r.cfg.QueueMax}, &r.counters.rejectedBusy)
		return
	}
	key := clientKey(c.Sender(), m.RequestID)
	if r.byClient[key] != nil {
		reject(&actors.BadRequestError{Reason: fmt.Sprintf("request id %d is already in flight", m.RequestID)},
			&r.counters.rejectedBad)
		return
	}
	fwd := &messages.RoutedRequest{RequestID: m.RequestID, Tenant: tenant, Prompt: m.Prompt, MaxTokens: m.MaxTokens,
		Prefill: p.Meta.RemoteAddr, PrefillIncarnation: p.Meta.Incarnation, DecodeIncarnation: d.Meta.Incarnation}
	if err := fwd.Validate(); err != nil {
		reject(err, &r.counters.rejectedBad)
		return
	}
	// Counted before the relay exists, so that in-flight never counts below
	// zero; the count numbers the request for operators.
	number := r.counters.routed.Add(1)
	rl := &relay{number: number, client: c.Sender(), id: m.RequestID, decode: d.Meta.Incarnation,
		admission: actor.NewPID(d.Meta.RemoteAddr, actors.AdmissionName), request: fwd,
		timeout: r.cfg.RequestTimeout + relayMargin, counters: r.counters, log: r.log, auth: r.auth,
		times: actors.Stream{Start: time.Now()}}
	// A secret name: the decode node is told it (as the request's sender),
	// no one else.
	pid, err := c.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return rl },
		actor.WithMailbox(r.mailbox)), trust.SecretName())
	if err != nil {
		// Counted as routed above: it ends here, failed.
		r.counters.failedBy.Add(messages.CodeInternal)
		answer(fmt.Errorf("cluster: spawning the relay: %w", err), &r.counters.failed)
		return
	}
	r.relays[pid.Id] = rl
	r.byClient[key] = pid
}

// relay carries one routed request: it sends the request to the decode
// node as itself, passes every token and the result to the client, and
// ends with the result, with "node lost" if the decode node goes, or after
// the request timeout with no answer.
type relay struct {
	number    uint64 // the router's own, for operators
	client    *actor.PID
	id        uint64
	decode    uint64 // the decode node's incarnation
	admission *actor.PID
	request   *messages.RoutedRequest
	timeout   time.Duration
	counters  *routerCounters
	log       *slog.Logger
	auth      *trust.Authority
	deadline  *time.Timer
	seq       uint32        // the last token chunk's sequence number passed on
	tokens    atomic.Uint32 // passed on, read by the router for operators
	times     actors.Stream
}

type relayTimeout struct{}

// relayMargin is how much longer a relay waits than the decode node's own
// RequestTimeout, so that a request that timed out there is reported as
// the decode node reports it, not as a lost node.
const relayMargin = 5 * time.Second

func (rl *relay) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		c.Request(rl.admission, rl.request)
		self, sys := c.Self(), c.ActorSystem()
		rl.deadline = time.AfterFunc(rl.timeout, func() { sys.Root.Send(self, relayTimeout{}) })
	case *actor.Stopping:
		rl.deadline.Stop()
	case *messages.TokenChunk:
		if !rl.fromDecode(c, m.RequestID) {
			return
		}
		if m.Seq != rl.seq+1 {
			rl.refuse(c, fmt.Sprintf("token chunk %d after %d", m.Seq, rl.seq))
			return
		}
		rl.seq = m.Seq
		rl.tokens.Add(uint32(len(m.Tokens)))
		now := time.Now()
		for range m.Tokens {
			rl.times.Token(&rl.counters.latencies, now)
		}
		rl.pass(c, m)
	case *messages.GenerateResult:
		if !rl.fromDecode(c, m.RequestID) {
			return
		}
		if m.Err != nil {
			rl.counters.failed.Add(1)
			rl.counters.failedBy.Add(m.Err.Code)
		} else {
			rl.counters.completed.Add(1)
			rl.times.End(&rl.counters.latencies, time.Now())
		}
		rl.pass(c, m)
		c.Stop(c.Self())
	case *messages.CancelRequest:
		c.Request(rl.admission, m)
	case memberLost:
		rl.end(c, fmt.Sprintf("decode node %x was lost", rl.decode))
	case relayTimeout:
		rl.end(c, fmt.Sprintf("no answer from decode node %x within %s", rl.decode, rl.timeout))
	case *messages.Undecodable:
		rl.log.Warn("undecodable message from a decode node", "err", m.Err)
	}
}

// entry is the request as operators see it on the router, at now: routed
// until a token comes back, then decoding.
func (rl *relay) entry(now time.Time) messages.InFlight {
	phase, tokens := messages.PhaseRouted, rl.tokens.Load()
	if tokens > 0 {
		phase = messages.PhaseDecode
	}
	return messages.InFlight{Number: rl.number, ClientID: rl.id, Tenant: rl.request.Tenant, Phase: phase,
		Prefill: rl.request.Prefill, Decode: rl.admission.Address, AgeMs: actors.AgeMs(now.Sub(rl.times.Start)), Tokens: tokens}
}

// cancelNumber cancels the relayed request of that number, if it is in
// flight, as its client's CancelRequest would: the decode node answers it
// "cancelled", through the relay.
func (r *routerActor) cancelNumber(c actor.Context, m actors.CancelNumber) {
	rep := &messages.CancelInFlightReply{}
	for id, rl := range r.relays {
		if rl.number == m.Number {
			e := rl.entry(time.Now())
			rep.Request = &e
			c.Send(actor.NewPID(c.Self().Address, id), &messages.CancelRequest{RequestID: rl.id, Tenant: rl.request.Tenant})
			r.log.Info("request cancelled by an operator", "number", m.Number, "id", rl.id, "tenant", rl.request.Tenant,
				"decode", rl.admission.Address, "operator", m.By)
		}
	}
	if rep.Request == nil {
		rep.Err = handoff.Wire(&actors.NotInFlightError{Number: m.Number, Incarnation: r.cfg.Incarnation, Self: r.cfg.Incarnation})
	}
	if err := messages.Respond(c, rep); err != nil {
		r.log.Error("cancel reply refused by its own validation", "err", err)
	}
}

// fromDecode says whether a token chunk or result for request id came from
// the decode node the request was routed to (the remote boundary proved
// the sender's address) and is for this request; anything else is refused
// and counted, and never reaches the client.
func (rl *relay) fromDecode(c actor.Context, id uint64) bool {
	switch s := c.Sender(); {
	case s == nil || s.Address != rl.admission.Address:
		rl.refuse(c, fmt.Sprintf("from %s, the request went to %s", s, rl.admission.Address))
		return false
	case id != rl.id:
		rl.refuse(c, fmt.Sprintf("for request %d, this is %d", id, rl.id))
		return false
	}
	return true
}

func (rl *relay) refuse(c actor.Context, why string) {
	rl.counters.strangers.Add(1)
	rl.auth.Refuse(trust.RefusedStranger, "relayed message", "why", why, "sender", rl.auth.Of(c).String())
}

func (rl *relay) pass(c actor.Context, m messages.Message) {
	if err := messages.Send(c, rl.client, m); err != nil {
		rl.log.Error("relayed message refused by its own validation", "err", err)
	}
}

// end answers the client "node lost", withdraws the request from the
// decode node in case it is alive after all (a false failure detection, a
// partition), and stops.
func (rl *relay) end(c actor.Context, why string) {
	rl.counters.lost.Add(1)
	rl.counters.failedBy.Add(messages.CodeNodeLost)
	c.Request(rl.admission, &messages.CancelRequest{RequestID: rl.id, Tenant: rl.request.Tenant})
	rl.pass(c, &messages.GenerateResult{RequestID: rl.id, FinishReason: messages.FinishError,
		Err: &messages.WireError{Code: messages.CodeNodeLost, Message: why, Where: rl.admission.Address}})
	c.Stop(c.Self())
}
