package cluster

import (
	"cmp"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/cluster/membership"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
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
	retried                                    atomic.Uint64       // requests sent again to another decode node (RouteRetriesMax)
	waiting                                    atomic.Int32        // requests routed with no token back yet (routed.waiting)
	tenants                                    atomic.Int32        // tenants with requests relayed (the ledger's)
	summaries                                  atomic.Uint64       // nodes' cache summaries taken
	moved                                      atomic.Uint64       // streams handed over to another decode node
	decodeCaches                               atomic.Int32        // decode nodes known to keep a cache (routerActor.decodeCaches)
}

// inFlight is the routed requests not yet answered.
func (c *routerCounters) inFlight() uint32 {
	return uint32(c.routed.Load() - c.completed.Load() - c.failed.Load() - c.lost.Load())
}

// RouteRetriesMax bounds how many other decode nodes a router sends a
// request to after a decode node answered it busy (its pool stayed full for
// its ReserveWait, or its admission queue is full) or node lost (routed to
// an earlier run of the node, or the node failed), before any token reached
// the client: at most 1 + RouteRetriesMax decode nodes per request, never
// one twice. Each attempt has the relay's whole timeout. The client hears
// only the last answer.
const RouteRetriesMax = 2

// routerActor admits client requests for a cluster: it refuses, before any
// page exists anywhere, a request that does not fit the context window or
// the smallest pool on the path it would take, and sends the rest to an
// alive, non-draining decode node and prefill node that Routing picks (by
// gossiped free pages less what this router has outstanding there). Each
// routed request gets a relay actor (a child) that the decode node
// answers: the relay passes tokens and the result on to the client, sees
// the request end, and tells the client "node lost" if its decode node
// goes. A busy or node-lost answer before any token is sent again to
// another decode node (RouteRetriesMax) by the same relay.
type routerActor struct {
	cfg      *actors.Config
	model    *engine.Model // its tokenizer counts prompts; routes go to members of its fingerprint
	members  func() []Member
	draining func() bool
	log      *slog.Logger
	auth     *trust.Authority
	mailbox  actor.MailboxProducer // never waits when full (actors.Node.Mailbox)
	streams  *messages.Streams     // the node's: relays take decode nodes' answers in batches, and pass them on so
	counters *routerCounters
	routing  *Routing
	// affinity and decodeAffinity are which prefill and decode nodes
	// hold which prompt pages, as its routing left them and as they say;
	// decodeCaches the decode nodes whose summaries say they keep a cache
	// (a decode node is remembered as a holder only then).
	affinity, decodeAffinity *handoff.PrefixAffinity
	decodeCaches             map[uint64]bool
	poll                     *time.Timer        // the next pollCaches
	relays                   map[string]*routed // by relay PID id
	byClient                 map[string]*actor.PID
	ledger                   *tenancy.Ledger // every request relayed, by tenant, held to its share (cfg.Tenants)
}

// routed is what the router keeps of a request it relays: where it is
// counted in Routing, which moves when the request is sent again. The
// relay keeps its own copy of the route; the two change together, by
// message.
type routed struct {
	rl                        *relay                  // read here only for what never changes, and its token count
	request                   *messages.RoutedRequest // as last sent
	decode, prefill           Member
	promptTokens              int
	keys                      []kv.PrefixKey // the prompt's cacheable pages in its scope (PrefixAffinity)
	decodePages, prefillPages int
	prefillOut                bool            // counted on the prefill node: no token has come back yet
	tried                     map[uint64]bool // decode incarnations that answered busy or lost
	// waiting: counted among the router's requests waiting, from its
	// routing until its first token comes back or it ends, whatever decode
	// nodes it is sent to meanwhile.
	waiting bool
}

// pollCaches is the router's timer: time to ask the prefilling members
// what their prefix caches hold.
type pollCaches struct{}

// relayRetry asks the router for another decode node for the relay's
// request, which its decode node answered with cause before any token.
type relayRetry struct{ cause *messages.WireError }

// relayTokens tells the router that the relay's first token came: its
// prefill node holds the request's pages no more.
type relayTokens struct{}

// relayMoved tells the router that the relay's stream moved to the decode
// node of that run at that remote address: its pages are counted there,
// and its loss reaches the relay.
type relayMoved struct {
	addr        string
	incarnation uint64
}

// reroute is the router's answer to a relayRetry: the request sent to
// another decode node, at remote address at and of run decode, or none
// (at "") when no other can take it.
type reroute struct {
	at      string
	request *messages.RoutedRequest
	decode  uint64
}

// memberLost is sent to the router when a member fails or leaves.
type memberLost struct{ incarnation uint64 }

func clientKey(client *actor.PID, id uint64) string { return fmt.Sprintf("%s#%d", client, id) }

func (r *routerActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		r.relays = map[string]*routed{}
		if r.routing == nil {
			r.routing = NewRouting(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		}
		r.affinity, r.decodeAffinity = handoff.NewPrefixAffinity(), handoff.NewPrefixAffinity()
		r.decodeCaches = map[uint64]bool{}
		r.byClient = map[string]*actor.PID{}
		r.ledger = tenancy.NewLedger()
		if r.cfg.PrefixRouting {
			self, sys := c.Self(), c.ActorSystem()
			r.poll = time.AfterFunc(r.cfg.CacheSummaryEvery, func() { sys.Root.Send(self, pollCaches{}) })
		}
	case *actor.Stopping:
		if r.poll != nil {
			r.poll.Stop()
		}
	case pollCaches:
		r.pollCaches(c)
		r.poll.Reset(r.cfg.CacheSummaryEvery)
	case *messages.CacheSummary:
		r.cacheSummary(c, m)
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
		for _, rt := range r.relays {
			all = append(all, rt.entry(now))
		}
		if err := messages.Respond(c, actors.InFlightList(r.cfg.Incarnation, all, m.Max)); err != nil {
			r.log.Error("in-flight list refused by its own validation", "err", err)
		}
	case actors.CancelNumber:
		r.cancelNumber(c, m)
	case memberLost:
		r.affinity.Forget(m.incarnation)
		r.decodeAffinity.Forget(m.incarnation)
		r.decodeCaching(m.incarnation, false)
		for id, rt := range r.relays {
			if rt.decode.Meta.Incarnation == m.incarnation {
				c.Send(actor.NewPID(c.Self().Address, id), m)
			}
		}
	case relayMoved:
		if rt := r.relays[c.Sender().Id]; rt != nil {
			r.routing.Done(rt.decode.Meta.Incarnation, rt.decodePages)
			rt.decode = Member{Meta: membership.Meta{RemoteAddr: m.addr, Incarnation: m.incarnation}}
			for _, mb := range r.members() {
				if mb.Meta.Incarnation == m.incarnation {
					rt.decode = mb
				}
			}
			r.routing.Sent(m.incarnation, rt.decodePages)
		}
	case relayTokens:
		if rt := r.relays[c.Sender().Id]; rt != nil {
			r.started(rt)
			if rt.prefillOut {
				rt.prefillOut = false
				r.routing.Done(rt.prefill.Meta.Incarnation, rt.prefillPages)
			}
		}
	case relayRetry:
		r.retry(c, c.Sender(), m)
	case *actor.Terminated:
		if rt, ok := r.relays[m.Who.Id]; ok {
			delete(r.relays, m.Who.Id)
			delete(r.byClient, clientKey(rt.rl.client, rt.rl.id))
			r.ledger.Give(rt.request.Tenant, rt.decodePages)
			r.counters.tenants.Store(int32(r.ledger.Tenants()))
			r.release(rt)
			r.started(rt)
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

// unavailable is the refusal of a request that found ds decode and ps
// prefill nodes of model in sight among ms, one of them none.
func unavailable(ms []Member, model engine.Fingerprint, ds, ps int) *actors.UnavailableError {
	seen := fmt.Sprintf("%d decode and %d prefill nodes of model %s alive, verified and not draining in %d members",
		ds, ps, model.Short(), len(ms))
	if other := otherModels(ms, model); other > 0 {
		seen += fmt.Sprintf("; %d members serve other models", other)
	}
	return handoff.NoNodes(ds, ps, seen)
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
	// counter is nil for a refusal counted by its bound only.
	answer := func(err error, counter *atomic.Uint64) {
		if counter != nil {
			counter.Add(1)
		}
		if err := actors.Reject(c, m.RequestID, err); err != nil {
			r.log.Error("rejection refused by its own validation", "err", err)
		}
	}
	reject := func(err error, counter *atomic.Uint64) {
		r.counters.rejectedBy.Add(err)
		answer(err, counter)
	}
	if r.draining() {
		reject(&actors.BusyError{Where: messages.WhereDrainingRouter, Have: len(r.relays), Limit: 0}, &r.counters.rejectedBusy)
		return
	}
	// A tenant at its bound is refused before its prompt costs anything.
	if err := r.ledger.Room(r.cfg.Tenants.Policy(), tenant); err != nil {
		reject(err, &r.counters.rejectedBusy)
		return
	}
	ms := r.members()
	fp := r.model.Fingerprint()
	ds, ps := candidates(ms, decodes, fp), candidates(ms, prefills, fp)
	// Only this node's own API may send a prompt of tokens (a chat in the
	// model's template); a tenant's prompt is text.
	prompt, err := handoff.Encode(r.cfg.Limits(), r.model.Tokenizer(), m.Prompt, r.auth.Of(c).Local)
	if err != nil {
		counter := &r.counters.rejectedTooLong
		if _, long := err.(*actors.PromptTooLongError); !long {
			counter = &r.counters.rejectedBad // a token prompt of no token of the model
		}
		reject(err, counter)
		return
	}
	if len(ds) == 0 || len(ps) == 0 {
		reject(unavailable(ms, fp, len(ds), len(ps)), nil)
		return
	}
	// Routing picks one of candidates that are there, excluding none.
	prefillPages, decodePages := handoff.RequestPages(r.cfg.Geometry(), len(prompt), int(m.MaxTokens))
	keys := r.prefixKeys(tenant, m.CacheSalt, prompt)
	d, _ := r.pickAffine(ds, decodePages, nil, keys, r.decodeAffinity)
	p, _ := r.pickAffine(ps, prefillPages, nil, keys, r.affinity)
	if err := handoff.Admit(r.cfg.Limits(), len(prompt), int(m.MaxTokens), int(p.Meta.CapacityPages),
		int(d.Meta.CapacityPages)); err != nil {
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
	fwd := routedRequest(m.RequestID, tenant, m.Prompt, m.MaxTokens, m.CacheSalt, d, p)
	if err := fwd.Validate(); err != nil {
		reject(err, &r.counters.rejectedBad)
		return
	}
	if err := r.ledger.Take(r.cfg.Tenants.Policy(), tenant, decodePages); err != nil {
		reject(err, &r.counters.rejectedBusy)
		return
	}
	r.counters.tenants.Store(int32(r.ledger.Tenants()))
	// Counted before the relay exists, so that in-flight never counts below
	// zero; the count numbers the request for operators.
	number := r.counters.routed.Add(1)
	rl := &relay{number: number, client: c.Sender(), id: m.RequestID, decode: d.Meta.Incarnation,
		request: fwd, stream: handoff.NewStream(m.RequestID, d.Meta.RemoteAddr),
		timeout: r.cfg.RequestTimeout + relayMargin, counters: r.counters, log: r.log, auth: r.auth,
		times: actors.Stream{Start: time.Now()}, streams: r.streams, batched: messages.WantsBatches(c.Sender())}
	// A secret name: the decode node is told it (as the request's sender),
	// no one else; it asks for the answer in batches.
	pid, err := c.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return rl },
		actor.WithMailbox(r.mailbox)), messages.BatchedName(trust.SecretName()))
	if err != nil {
		// Counted as routed above: it ends here, failed.
		r.ledger.Give(tenant, decodePages)
		r.counters.tenants.Store(int32(r.ledger.Tenants()))
		r.counters.failedBy.Add(messages.CodeInternal)
		answer(fmt.Errorf("cluster: spawning the relay: %w", err), &r.counters.failed)
		return
	}
	rt := &routed{rl: rl, request: fwd, decode: d, prefill: p, promptTokens: len(prompt), keys: keys, decodePages: decodePages,
		prefillPages: prefillPages, tried: map[uint64]bool{}, waiting: true}
	r.routedTo(keys, d, p)
	r.counters.waiting.Add(1)
	r.count(rt)
	r.relays[pid.Id] = rt
	r.byClient[key] = pid
}

// routedRequest is the request a decode node d is sent, with prefill node p.
func routedRequest(id uint64, tenant, prompt string, maxTokens uint32, salt string, d, p Member) *messages.RoutedRequest {
	return &messages.RoutedRequest{RequestID: id, Tenant: tenant, Prompt: prompt, MaxTokens: maxTokens, CacheSalt: salt,
		Prefill: p.Meta.RemoteAddr, PrefillIncarnation: p.Meta.Incarnation, DecodeIncarnation: d.Meta.Incarnation}
}

// routedTo remembers the prompt pages of keys as held where they went:
// on the prefill node once decode has them, and on the decode node, if
// it keeps a cache, once the request is answered.
func (r *routerActor) routedTo(keys []kv.PrefixKey, d, p Member) {
	r.affinity.Routed(keys, p.Meta.Incarnation)
	if r.decodeCaches[d.Meta.Incarnation] {
		r.decodeAffinity.Routed(keys, d.Meta.Incarnation)
	}
}

// decodeCaching records whether decode node inc keeps a cache.
func (r *routerActor) decodeCaching(inc uint64, caches bool) {
	if caches {
		r.decodeCaches[inc] = true
	} else {
		delete(r.decodeCaches, inc)
	}
	r.counters.decodeCaches.Store(int32(len(r.decodeCaches)))
}

// caches says whether a member of role r keeps prefix caches: every node
// that prefills or decodes.
func caches(r Role) bool { return prefills(r) || decodes(r) }

// pollCaches asks each member of the router's model that keeps prefix
// caches for its cache summary; each answers the router as a
// *messages.CacheSummary.
func (r *routerActor) pollCaches(c actor.Context) {
	for _, m := range candidates(r.members(), caches, r.model.Fingerprint()) {
		if err := messages.SendFrom(c, actor.NewPID(m.Meta.RemoteAddr, ControlName), &messages.CacheSummaryRequest{}); err != nil {
			r.log.Error("cache summary request refused by its own validation", "err", err)
		}
	}
}

// cacheSummary takes a member's summary of its caches: only from a node
// that prefills or decodes, for the run that member is now at the
// sender's address (an older run's is of caches gone with it).
func (r *routerActor) cacheSummary(c actor.Context, m *messages.CacheSummary) {
	if s := r.auth.Of(c); !s.May(trust.RolePrefill, trust.RoleDecode, trust.RoleAll) {
		r.auth.Refuse(trust.RefusedRole, "cache summary", "sender", s.String())
		return
	}
	for _, mb := range candidates(r.members(), caches, r.model.Fingerprint()) {
		if mb.Meta.Incarnation == m.Incarnation && c.Sender() != nil && mb.Meta.RemoteAddr == c.Sender().Address {
			// A node of role all sends one summary of both its caches.
			if prefills(mb.Meta.Role) {
				r.affinity.Published(m.Incarnation, m.Keys)
			}
			if decodes(mb.Meta.Role) && m.DecodeCache {
				r.decodeAffinity.Published(m.Incarnation, m.Keys)
			}
			r.decodeCaching(m.Incarnation, decodes(mb.Meta.Role) && m.DecodeCache)
			r.counters.summaries.Add(1)
			return
		}
	}
}

// prefixKeys are the keys of prompt's cacheable pages in the prefix cache
// scope of tenant (the one its credential names) narrowed by salt, as a
// prefill node of the router's model and geometry keys them; none when
// the scope cannot key (an invalid geometry is refused at start-up), and
// none without PrefixRouting: the router then picks by load alone.
func (r *routerActor) prefixKeys(tenant, salt string, prompt []int) []kv.PrefixKey {
	if !r.cfg.PrefixRouting {
		return nil
	}
	keys, err := handoff.PromptKeys(r.cfg.Tenants.Policy().CacheScope(tenant, salt), r.model.Fingerprint().String(),
		r.cfg.Geometry(), prompt)
	if err != nil {
		return nil
	}
	return keys
}

// pickAffine is the node of ms (prefill or decode nodes, whose holders
// aff remembers) for a request holding pages there whose prompt's
// cacheable pages are keys, skipping the incarnations in exclude: the one
// thought to hold most of them, unless load says otherwise (PickAffine).
func (r *routerActor) pickAffine(ms []Member, pages int, exclude map[uint64]bool, keys []kv.PrefixKey,
	aff *handoff.PrefixAffinity) (Member, bool) {
	cs, hits := make([]Candidate, len(ms)), make([]int, len(ms))
	for i, m := range ms {
		cs[i] = Candidate{Incarnation: m.Meta.Incarnation, CapacityPages: int(m.Meta.CapacityPages),
			FreePages: int(m.Meta.FreePages)}
		hits[i] = aff.Hits(keys, m.Meta.Incarnation)
	}
	i, ok := r.routing.PickAffine(cs, pages, exclude, hits)
	if !ok {
		return Member{}, false
	}
	return ms[i], true
}

// count has Routing count rt's request on its nodes, the prefill node's
// until the first token.
func (r *routerActor) count(rt *routed) {
	r.routing.Sent(rt.decode.Meta.Incarnation, rt.decodePages)
	r.routing.Sent(rt.prefill.Meta.Incarnation, rt.prefillPages)
	rt.prefillOut = true
}

// started counts rt's request among those waiting no longer: a token
// came back, or it ended.
func (r *routerActor) started(rt *routed) {
	if rt.waiting {
		rt.waiting = false
		r.counters.waiting.Add(-1)
	}
}

// release has Routing count rt's request on its nodes no longer.
func (r *routerActor) release(rt *routed) {
	r.routing.Done(rt.decode.Meta.Incarnation, rt.decodePages)
	if rt.prefillOut {
		rt.prefillOut = false
		r.routing.Done(rt.prefill.Meta.Incarnation, rt.prefillPages)
	}
}

// retry sends the relay's request to another decode node, one that has not
// answered it busy or lost, with a prefill node picked afresh; when
// RouteRetriesMax is spent or no node admission would take it on is left,
// it tells the relay to answer the client what its last decode node said.
func (r *routerActor) retry(c actor.Context, relayPID *actor.PID, m relayRetry) {
	rt := r.relays[relayPID.Id]
	if rt == nil {
		return
	}
	from := rt.decode
	rt.tried[from.Meta.Incarnation] = true
	d, p, ok := r.next(rt)
	if !ok {
		c.Send(relayPID, reroute{})
		return
	}
	r.release(rt)
	rt.decode, rt.prefill = d, p
	r.count(rt)
	r.routedTo(rt.keys, d, p)
	req := rt.request
	rt.request = routedRequest(req.RequestID, req.Tenant, req.Prompt, req.MaxTokens, req.CacheSalt, d, p)
	r.counters.retried.Add(1)
	r.log.Info("request sent to another decode node", "number", rt.rl.number, "id", req.RequestID, "tenant", req.Tenant,
		"from", from.Meta.RemoteAddr, "to", d.Meta.RemoteAddr, "prefill", p.Meta.RemoteAddr,
		"cause", m.cause.Code.String(), "err", m.cause.Message, "attempt", len(rt.tried)+1)
	c.Send(relayPID, reroute{at: d.Meta.RemoteAddr, request: rt.request, decode: d.Meta.Incarnation})
}

// next is where rt's request goes next, if RouteRetriesMax allows: a
// decode node it has not tried and a prefill node, both of whose pools
// admission takes it on.
func (r *routerActor) next(rt *routed) (d, p Member, ok bool) {
	if len(rt.tried) > RouteRetriesMax {
		return d, p, false
	}
	ms, fp := r.members(), r.model.Fingerprint()
	d, dok := r.pickAffine(candidates(ms, decodes, fp), rt.decodePages, rt.tried, rt.keys, r.decodeAffinity)
	p, pok := r.pickAffine(candidates(ms, prefills, fp), rt.prefillPages, nil, rt.keys, r.affinity)
	ok = dok && pok && handoff.Admit(r.cfg.Limits(), rt.promptTokens, int(rt.request.MaxTokens), int(p.Meta.CapacityPages),
		int(d.Meta.CapacityPages)) == nil
	return d, p, ok
}

// relay carries one routed request: it sends the request to the decode
// node as itself, passes every token and the result to the client, and
// ends with the result, with "node lost" if the decode node goes, after
// the request timeout with no answer, or if it is stopped before the
// request ends (a panic, its router stopping). An answer busy or node
// lost before any token is held while the router looks for another decode
// node (relayRetry); the relay sends the request there, under its own
// name, or, when there is none, passes the held answer on.
type relay struct {
	number   uint64 // the router's own, for operators
	client   *actor.PID
	id       uint64
	decode   uint64 // the decode node's incarnation
	request  *messages.RoutedRequest
	timeout  time.Duration // of each attempt
	counters *routerCounters
	log      *slog.Logger
	auth     *trust.Authority
	deadline *time.Timer
	attempt  int // numbers the attempts, so that an earlier attempt's timer is told apart
	// stream is which decode node the relay hears, the chunks passed on
	// and a move's hand-over.
	stream *handoff.Stream
	tokens atomic.Uint32 // passed on, read by the router for operators
	times  actors.Stream
	// held is the answer of the last decode node while the router looks
	// for another, lost whether it is a node lost the relay concluded
	// itself, cancelled whether the client cancelled meanwhile.
	held            *messages.GenerateResult
	lost, cancelled bool
	answered        bool // the client has been passed the request's result
	// cancel is the client's cancel passed on, if any: a stream that moves
	// after it carries it to the node it moves to.
	cancel *messages.CancelRequest
	// streams takes the decode nodes' answers in batches (the relay asks
	// for them) and, when the client asked for batches (batched), passes
	// them on so.
	streams *messages.Streams
	batched bool
	// mu orders the relay's messages and the chunks its router's Inbox
	// hands it, on the Inbox's goroutine: a chunk costs no actor hop.
	// self, parent and root are what the relay sends with there.
	mu           sync.Mutex
	self, parent *actor.PID
	root         *actor.RootContext
}

// streamed is a result that came in a TokenBatch, and the batch's
// sender: the Inbox hands it over, and the relay checks it as it checks
// a GenerateResult sent to it alone.
type streamed struct {
	from   *actor.PID
	result *messages.GenerateResult
}

// streamed takes an item of a TokenBatch for the relay, on the Inbox's
// goroutine: a chunk is passed on here, in order with the relay's own
// messages (mu); the result goes through the relay's mailbox, after
// every chunk before it, since ending the relay needs its context.
func (rl *relay) streamed(from *actor.PID, it *messages.StreamItem) {
	if it.Result != nil {
		rl.root.Send(rl.self, streamed{from: from, result: it.Result})
		return
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	rl.chunk(from, it.Chunk)
}

type relayTimeout struct{ attempt int }

// relayMargin is how much longer a relay waits than the decode node's own
// RequestTimeout, so that a request that timed out there is reported as
// the decode node reports it, not as a lost node.
const relayMargin = 5 * time.Second

func (rl *relay) Receive(c actor.Context) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	switch m := c.Message().(type) {
	case *actor.Started:
		rl.self, rl.parent, rl.root = c.Self(), c.Parent(), c.ActorSystem().Root
		rl.streams.Register(rl.self.Id, rl.streamed)
		rl.send(c)
	case *actor.Stopping:
		rl.streams.Unregister(rl.self.Id)
		rl.deadline.Stop()
		if !rl.answered {
			// Stopped before its request ended (a panic, its router
			// stopping): unanswered, the client would wait for its own
			// silence bound and the decode node would generate for no one.
			rl.end(c, "the router stopped relaying the request", false)
		}
	case *messages.TokenChunk:
		rl.chunk(c.Sender(), m)
	case *messages.GenerateResult:
		rl.result(c, c.Sender(), m)
	case *messages.StreamMoved:
		rl.streamMoved(c.Sender(), m)
	case streamed:
		rl.result(c, m.from, m.result)
	case reroute:
		rl.rerouted(c, m)
	case *messages.CancelRequest:
		if rl.held != nil {
			rl.cancelled = true // the request goes nowhere else
			return
		}
		rl.cancel = m
		c.Request(rl.admission(), m)
	case memberLost:
		if rl.held == nil && m.incarnation == rl.decode {
			rl.end(c, fmt.Sprintf("decode node %x was lost", rl.decode), rl.stream.Seq() == 0)
		}
	case relayTimeout:
		if rl.held == nil && m.attempt == rl.attempt {
			// The attempt had the whole request's time: another would
			// start the wait over, past what the client was promised.
			rl.end(c, fmt.Sprintf("no answer from decode node %x within %s", rl.decode, rl.timeout), false)
		}
	case *messages.Undecodable:
		rl.log.Warn("undecodable message from a decode node", "err", m.Err)
	}
}

// chunk passes on a token chunk from the decode node (from: its sender).
func (rl *relay) chunk(from *actor.PID, m *messages.TokenChunk) {
	if !rl.fromDecode(from, m.RequestID) {
		return
	}
	if why := rl.stream.Chunk(m.Seq); why != "" {
		rl.refuse(from, why)
		return
	}
	if m.Seq == 1 {
		rl.tell(relayTokens{})
	}
	rl.tokens.Add(uint32(len(m.Tokens)))
	now := time.Now()
	for range m.Tokens {
		rl.times.Token(&rl.counters.latencies, now)
	}
	rl.pass(m)
	rl.handOver()
}

// streamMoved takes the decode node's word that the stream moved to
// another (from: its sender): only from the node the stream is on, for
// this request, at a chunk not behind the last passed on. The stream is
// handed over once every chunk up to that one has been.
func (rl *relay) streamMoved(from *actor.PID, m *messages.StreamMoved) {
	if !rl.fromDecode(from, m.RequestID) {
		return
	}
	if why := rl.stream.Moved(m); why != "" {
		rl.refuse(from, why)
		return
	}
	rl.handOver()
}

// handOver moves the stream to the node the decode node named, once every
// chunk it sent has been passed on: from then on only that node is heard
// (the one left is dropped, like a node the request left for another),
// cancels go to its admission, and the request there is told to stream.
func (rl *relay) handOver() {
	from := rl.stream.At()
	m := rl.stream.HandOver()
	if m == nil {
		return
	}
	rl.log.Info("stream moved", "id", rl.id, "tenant", rl.request.Tenant, "from", from, "to", m.To, "after", m.Seq)
	rl.decode = m.ToIncarnation
	rl.counters.moved.Add(1)
	rl.tell(relayMoved{addr: m.To, incarnation: m.ToIncarnation})
	take := &messages.StreamTake{RequestID: rl.id, Seq: m.Seq}
	if err := take.Validate(); err != nil {
		rl.log.Error("stream take refused by its own validation", "err", err)
		return
	}
	rl.root.RequestWithCustomSender(actor.NewPID(m.To, m.ToID), take, rl.self)
	if rl.cancel != nil {
		// Cancelled while the stream moved: the node it left may have
		// ended the request as moved before the cancel came.
		rl.root.RequestWithCustomSender(rl.admission(), rl.cancel, rl.self)
	}
}

// result takes the decode node's result (from: its sender): passed on,
// or held while the router looks for another decode node.
func (rl *relay) result(c actor.Context, from *actor.PID, m *messages.GenerateResult) {
	if !rl.fromDecode(from, m.RequestID) {
		return
	}
	if e := m.Err; e != nil && rl.stream.Seq() == 0 && (e.Code == messages.CodeBusy || e.Code == messages.CodeNodeLost) {
		rl.hold(c, m, false)
		return
	}
	rl.answer(c, m, false)
}

// entry is the request as operators see it on the router, at now: routed
// until a token comes back, then decoding.
func (rt *routed) entry(now time.Time) messages.InFlight {
	rl := rt.rl
	phase, tokens := messages.PhaseRouted, rl.tokens.Load()
	if tokens > 0 {
		phase = messages.PhaseDecode
	}
	return messages.InFlight{Number: rl.number, ClientID: rl.id, Tenant: rt.request.Tenant, Phase: phase,
		Prefill: rt.request.Prefill, Decode: rt.decode.Meta.RemoteAddr, AgeMs: actors.AgeMs(now.Sub(rl.times.Start)),
		Tokens: tokens}
}

// cancelNumber cancels the relayed request of that number, if it is in
// flight, as its client's CancelRequest would: the decode node answers it
// "cancelled", through the relay.
func (r *routerActor) cancelNumber(c actor.Context, m actors.CancelNumber) {
	rep := &messages.CancelInFlightReply{}
	for id, rt := range r.relays {
		if rt.rl.number == m.Number {
			e := rt.entry(time.Now())
			rep.Request = &e
			c.Send(actor.NewPID(c.Self().Address, id), &messages.CancelRequest{RequestID: rt.rl.id, Tenant: rt.request.Tenant})
			r.log.Info("request cancelled by an operator", "number", m.Number, "id", rt.rl.id, "tenant", rt.request.Tenant,
				"decode", rt.decode.Meta.RemoteAddr, "operator", m.By)
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
// the sender's address), is for this request and comes while that node's
// attempt is under way. A stranger's is refused and counted; a late one
// (from a node the request left, or after the attempt answered) is
// dropped; neither reaches the client.
func (rl *relay) fromDecode(s *actor.PID, id uint64) bool {
	if s == nil {
		rl.refuse(s, "from no sender")
		return false
	}
	if ok, why := rl.stream.From(s.Address, id); !ok {
		if why != "" {
			rl.refuse(s, why)
		}
		return false
	}
	switch {
	case rl.answered:
		// The Inbox may hand the relay a chunk after its result was
		// passed on (it looked the relay up just before it stopped):
		// late, like one for a stopped relay.
		return false
	case rl.held != nil:
		// The attempt has answered and the router is finding the request
		// another decode node: what comes after (a duplicated answer) is
		// late. Taken, a second answer would ask the router again, and the
		// router would follow the request to a node it never went to.
		return false
	}
	return true
}

func (rl *relay) refuse(from *actor.PID, why string) {
	rl.counters.strangers.Add(1)
	rl.auth.Refuse(trust.RefusedStranger, "relayed message", "why", why, "sender", rl.auth.SenderOf(rl.self, from).String())
}

// pass sends m, a token chunk or the result, to the client: in a batch
// when it asked for batches.
func (rl *relay) pass(m messages.Message) {
	send := func() error { return messages.Send(rl.root, rl.client, m) }
	if rl.batched {
		send = func() error { return rl.streams.Send(rl.client, m) }
	}
	if err := send(); err != nil {
		rl.log.Error("relayed message refused by its own validation", "err", err)
	}
}

// send sends the request to its decode node, for one attempt of the
// relay's timeout.
func (rl *relay) send(c actor.Context) {
	c.Request(rl.admission(), rl.request)
	rl.attempt++
	self, sys, attempt := c.Self(), c.ActorSystem(), rl.attempt
	rl.deadline = time.AfterFunc(rl.timeout, func() { sys.Root.Send(self, relayTimeout{attempt: attempt}) })
}

// hold keeps the decode node's answer res (lost: one the relay concluded
// itself) from the client and asks the router for another decode node.
func (rl *relay) hold(c actor.Context, res *messages.GenerateResult, lost bool) {
	rl.deadline.Stop()
	rl.held, rl.lost = res, lost
	if !rl.tell(relayRetry{cause: res.Err}) {
		rl.rerouted(c, reroute{})
	}
}

// tell sends m to the router, as the relay; a relay spawned alone (as
// tests do) has no router, and tell reports false.
func (rl *relay) tell(m any) bool {
	if rl.parent == nil {
		return false
	}
	rl.root.RequestWithCustomSender(rl.parent, m, rl.self)
	return true
}

// rerouted sends the request to the decode node the router found, or, when
// it found none (or the client cancelled meanwhile), answers the client
// what the last decode node said.
func (rl *relay) rerouted(c actor.Context, m reroute) {
	res := rl.held
	if res == nil {
		return
	}
	if m.at == "" || rl.cancelled {
		rl.answer(c, res, rl.lost)
		return
	}
	rl.leave(m.at, m.decode)
	rl.request, rl.held, rl.lost = m.request, nil, false
	rl.send(c)
}

// leave has the relay hear the decode node of run decode at remote address
// at from now on, and drop what the node it leaves sends.
func (rl *relay) leave(at string, decode uint64) {
	rl.stream.Leave(at)
	rl.decode = decode
}

// admission is the admission of the decode node the stream is on.
func (rl *relay) admission() *actor.PID { return actor.NewPID(rl.stream.At(), actors.AdmissionName) }

// answer passes the request's result on and stops: counted as lost (a node
// lost the relay concluded), failed or completed.
func (rl *relay) answer(c actor.Context, m *messages.GenerateResult, lost bool) {
	rl.answered = true
	switch {
	case lost:
		rl.counters.lost.Add(1)
		rl.counters.failedBy.Add(messages.CodeNodeLost)
	case m.Err != nil:
		rl.counters.failed.Add(1)
		rl.counters.failedBy.Add(m.Err.Code)
	default:
		rl.counters.completed.Add(1)
		rl.times.End(&rl.counters.latencies, time.Now())
	}
	rl.pass(m)
	c.Stop(c.Self())
}

// end withdraws the request from the decode node in case it is alive after
// all (a false failure detection, a partition) and answers the client
// "node lost", after trying another decode node if retry (no token came).
func (rl *relay) end(c actor.Context, why string, retry bool) {
	c.Request(rl.admission(), &messages.CancelRequest{RequestID: rl.id, Tenant: rl.request.Tenant})
	res := &messages.GenerateResult{RequestID: rl.id, FinishReason: messages.FinishError,
		Err: &messages.WireError{Code: messages.CodeNodeLost, Message: why, Where: rl.stream.At()}}
	if retry {
		rl.hold(c, res, true)
		return
	}
	rl.answer(c, res, true)
}
