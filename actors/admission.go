package actors

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
	"github.com/kvwarden/kvwarden/trust"
)

// nodeCounters are the node's request counters, read by status and tests.
type nodeCounters struct {
	// requestIDs hands out request ids, one per transfer attempt: unique
	// in this node run, so that anything of an abandoned attempt is told
	// apart from the current one.
	requestIDs                                           atomic.Uint64
	ignored                                              atomic.Uint64 // late messages of abandoned attempts
	admitted, rejectedTooLong, rejectedBusy, rejectedBad atomic.Uint64
	completed, failed, retried                           atomic.Uint64
	moved, movedIn                                       atomic.Uint64       // requests moved to another decode node, and taken over from one
	failedBy                                             messages.CodeCounts // failed, by the code told to the client
	latencies                                            Latencies
	framesAccepted, framesRefused                        atomic.Uint64
	phases                                               phaseSums
	metrics                                              metricCounters
	tenants                                              atomic.Int32 // tenants with requests its clients sent here (the ledger's)
}

// Phases splits the time to first token of requests that completed, summed
// over Count requests: Queue from admission to the plan leaving (decode
// pages reserved), Prefill from the plan to the first frame (prefill
// compute), Transfer from the first frame to prefill's TransferDone, Verify
// from there to the first token leaving (seal, manifest check, ack, and
// decode's recomputation of the first token).
// FirstDecode is the decode worker's first step, from the first token to the
// second, summed over the Decoded requests of Count that had a second.
type Phases struct {
	Count, Decoded                                uint64
	Queue, Prefill, Transfer, Verify, FirstDecode time.Duration
}

type phaseSums struct {
	count, decoded, queue, prefill, transfer, verify, firstDecode atomic.Int64
}

func (p *phaseSums) add(ph handoff.Phases) {
	p.count.Add(1)
	if ph.FirstDecode > 0 {
		p.decoded.Add(1)
	}
	p.queue.Add(int64(ph.Queue))
	p.prefill.Add(int64(ph.Prefill))
	p.transfer.Add(int64(ph.Transfer))
	p.verify.Add(int64(ph.Verify))
	p.firstDecode.Add(int64(ph.FirstDecode))
}

func (p *phaseSums) snapshot() Phases {
	return Phases{Count: uint64(p.count.Load()), Decoded: uint64(p.decoded.Load()), Queue: time.Duration(p.queue.Load()),
		Prefill: time.Duration(p.prefill.Load()), Transfer: time.Duration(p.transfer.Load()),
		Verify: time.Duration(p.verify.Load()), FirstDecode: time.Duration(p.firstDecode.Load())}
}

// AdmissionStatus asks the admission actor for an AdmissionStatusReply.
type AdmissionStatus struct{}

// AdmissionStatusReply is the node's request accounting.
type AdmissionStatusReply struct {
	InFlight, QueueMax                      int
	Draining                                bool
	Admitted, RejectedTooLong, RejectedBusy uint64
	RejectedBad, Completed, Failed, Retried uint64
	// FailedByCode is Failed by code (messages.CodeCounts.Counts).
	FailedByCode                  []uint64
	FramesAccepted, FramesRefused uint64
	DecodeInFlight                []int
	Phases                        Phases
	// Tenants have requests in flight that their clients sent here,
	// held to their shares (Config.Tenants).
	Tenants int
}

// PrefillPeer is a prefill node (or this node's own dispatcher) that a
// request can plan its transfer with.
type PrefillPeer struct {
	// PID is the peer's prefill dispatcher.
	PID *actor.PID
	// Incarnation is the peer node's run; tags and frames are checked
	// against it.
	Incarnation uint64
	// Pages is the capacity of the peer's smallest prefill pool.
	Pages int
}

// PrefillPicker chooses a prefill peer, avoiding the incarnations in
// exclude (peers a request already failed on). It reports false when none
// is available.
type PrefillPicker func(exclude map[uint64]bool) (PrefillPeer, bool)

// PeerLost tells admission that a node left or died; requests planning
// with it retry elsewhere or fail.
type PeerLost struct{ Incarnation uint64 }

// SenderLost tells admission that the router serving protoactor remote at
// Address is gone for good, and was last seen alive at Since: the requests
// it routed here before then are cancelled. A request its client sent
// here itself, and one routed after Since (by a later run, or another
// node, at the same address), is not its.
type SenderLost struct {
	Address string
	Since   time.Time
}

// Drain stops admission taking new requests; DrainStatus asks how many
// are still in flight (answered with an AdmissionStatusReply).
type Drain struct{}

// admissionActor is where every request enters a node that decodes. It
// refuses, before any page is reserved or any frame sent, a request whose
// prompt (with the tokens it asks for) exceeds the context window or the
// smallest pool on its path, and answers "busy" when QueueMax requests are
// in flight or, to clients that come directly, when the node drains. It never replaces a prompt with anything
// else. An admitted request gets its own request actor, a child, on the
// decode worker with the fewest requests.
type admissionActor struct {
	cfg       *Config
	model     *engine.Model
	log       *slog.Logger
	counters  *nodeCounters
	decode    []*actor.PID
	dPools    []*Pool
	pick      PrefillPicker
	dataPlane string
	registry  *sync.Map // owner.Request → request actor PID, for the data plane; kept by the request actors
	auth      *trust.Authority
	mailbox   actor.MailboxProducer // of the request actors
	streams   *messages.Streams     // sends the answers of requests that asked for batches
	core      *handoff.Admission
	live      map[string]*liveRequest // by the request actor's name, what operators list
	ledger    *tenancy.Ledger         // the tenants' requests its clients sent here
	moves     map[uint64]moveAsked    // by move id, the moves asked of request actors and not yet answered
}

func (a *admissionActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		a.core = handoff.NewAdmission(a.cfg.Limits(), a.cfg.QueueMax, len(a.decode), a.cfg.DecodePages)
		a.live = map[string]*liveRequest{}
		a.ledger = tenancy.NewLedger()
		a.moves = map[uint64]moveAsked{}
	case *messages.GenerateRequest:
		tenant, err := TenantOf(a.auth, a.auth.Of(c), m.Tenant)
		if err != nil {
			a.counters.rejectedBad.Add(1)
			a.reject(c, m.RequestID, err)
			return
		}
		a.admit(c, m.RequestID, tenant, m.Prompt, int(m.MaxTokens), m.CacheSalt, nil, a.auth.Of(c).Local)
	case *messages.RoutedRequest:
		if s := a.auth.Of(c); !s.May(trust.RoleRouter) {
			a.auth.Refuse(trust.RefusedRole, "routed request", "sender", s.String())
			a.counters.rejectedBad.Add(1)
			a.reject(c, m.RequestID, &ForbiddenError{Sender: s.String(), Reason: "only routers route requests"})
			return
		}
		if m.DecodeIncarnation != a.cfg.Incarnation {
			// Routed to an earlier run of this node, at the same address:
			// for the client, the node it was sent to is lost (and the
			// router learns of the new run from membership).
			a.counters.rejectedBad.Add(1)
			a.reject(c, m.RequestID, &messages.WireError{Code: messages.CodeNodeLost, Where: "decode node",
				Message: fmt.Sprintf("routed to decode node incarnation %x, this is %x", m.DecodeIncarnation, a.cfg.Incarnation)})
			return
		}
		peer := PrefillPeer{PID: actor.NewPID(m.Prefill, PrefillName), Incarnation: m.PrefillIncarnation}
		a.admit(c, m.RequestID, m.Tenant, m.Prompt, int(m.MaxTokens), m.CacheSalt, &peer, true)
	case *messages.MoveRequest:
		a.moveIn(c, m)
	case *messages.CancelRequest:
		if name, ok := a.core.Lookup(handoff.ClientKey{Client: senderKey(c), ID: m.RequestID}); ok {
			var job any = CancelJob{}
			if m.Reason == messages.CancelStop {
				job = StopJob{}
			}
			c.Send(actor.NewPID(c.Self().Address, name), job)
		}
	case PeerLost:
		// Every request hears of it: a retry may have moved a request to a
		// peer other than the one admission chose.
		for _, name := range a.core.InFlight() {
			c.Send(actor.NewPID(c.Self().Address, name), m)
		}
	case SenderLost:
		a.senderLost(c, m)
	case Drain:
		a.core.Drain()
		c.Respond(a.status())
	case *messages.Undecodable:
		a.counters.rejectedBad.Add(1)
		a.counters.metrics.rejectedBy.AddBound(RejectBadRequest)
		a.log.Warn("undecodable message", "err", m.Err)
	case *actor.Terminated:
		a.core.Ended(m.Who.Id)
		if l := a.live[m.Who.Id]; l != nil && l.counted {
			a.ledger.Give(l.tenant, l.pages)
			a.counters.tenants.Store(int32(a.ledger.Tenants()))
		}
		if l := a.live[m.Who.Id]; l != nil {
			// After what the actor sent before it stopped (Terminated
			// comes first, as a system message).
			c.Send(c.Self(), requestGone{name: m.Who.Id, number: l.number})
		}
		delete(a.live, m.Who.Id)
	case ListRequests:
		a.listRequests(c, m)
	case CancelNumber:
		a.cancelNumber(c, m)
	case MoveNumber:
		a.moveNumber(c, m)
	case requestGone:
		a.movesEnded(c, m)
	case MoveDone:
		if asked, ok := a.moves[m.MoveID]; ok {
			delete(a.moves, m.MoveID)
			c.Send(asked.asker, m)
		}
	case AdmissionStatus:
		c.Respond(a.status())
	}
}

// senderLost cancels every request in flight that the lost router routed.
func (a *admissionActor) senderLost(c actor.Context, m SenderLost) {
	n := 0
	for name, l := range a.live {
		if l.router == m.Address && l.since.Before(m.Since) {
			c.Send(actor.NewPID(c.Self().Address, name), CancelJob{})
			n++
		}
	}
	if n > 0 {
		a.log.Info("requests of a lost sender cancelled", "sender", m.Address, "requests", n)
	}
}

func (a *admissionActor) status() AdmissionStatusReply {
	return AdmissionStatusReply{InFlight: len(a.core.InFlight()), QueueMax: a.cfg.QueueMax, Draining: a.core.Draining(),
		Admitted: a.counters.admitted.Load(), RejectedTooLong: a.counters.rejectedTooLong.Load(),
		RejectedBusy: a.counters.rejectedBusy.Load(), RejectedBad: a.counters.rejectedBad.Load(),
		Completed: a.counters.completed.Load(), Failed: a.counters.failed.Load(), Retried: a.counters.retried.Load(),
		FailedByCode:   a.counters.failedBy.Counts(),
		FramesAccepted: a.counters.framesAccepted.Load(), FramesRefused: a.counters.framesRefused.Load(),
		DecodeInFlight: a.core.Load(), Phases: a.counters.phases.snapshot(), Tenants: int(a.counters.tenants.Load())}
}

// reject answers a request that will not run, counting it by the bound
// that refused it.
func (a *admissionActor) reject(c actor.Context, id uint64, err error) {
	a.counters.metrics.rejectedBy.Add(err)
	if err := Reject(c, id, err); err != nil {
		a.log.Error("rejection refused by its own validation", "err", err)
	}
}

// TenantOf is the tenant a request from s runs as: the one its credential
// names. claimed (what the request says) must be that tenant; only a local
// sender, or any sender of an insecure node, is taken at its word. Every
// other role is forbidden to generate. Router and admission both call it.
func TenantOf(auth *trust.Authority, s trust.Sender, claimed string) (string, error) {
	switch {
	case s.Local || s.Insecure:
		return claimed, nil
	case s.Identity.Role != trust.RoleTenant:
		auth.Refuse(trust.RefusedRole, "generate request", "sender", s.String())
		return "", &ForbiddenError{Sender: s.String(), Reason: "only a tenant's credential may generate"}
	case claimed != s.Identity.Name:
		auth.Refuse(trust.RefusedTenant, "generate request", "sender", s.String(), "claimed", claimed)
		return "", &ForbiddenError{Sender: s.String(),
			Reason: fmt.Sprintf("tenant %q, the credential names %q", claimed, s.Identity.Name)}
	}
	return claimed, nil
}

func senderKey(c actor.Context) string {
	if s := c.Sender(); s != nil {
		return s.String()
	}
	return ""
}

// Limits are what admission checks every request against
// (handoff.Admit).
func (c *Config) Limits() handoff.Limits {
	return handoff.Limits{ContextTokens: c.ContextTokens, MaxTokensMax: c.MaxTokensMax, Geometry: c.Geometry()}
}

// Reject answers a request that will not run, with the stable code of err.
func Reject(c actor.Context, id uint64, err error) error {
	return messages.Respond(c, &messages.GenerateResult{RequestID: id, FinishReason: messages.FinishError, Err: handoff.Wire(err)})
}

// admit runs admission's rule (handoff.Admission) and, if the request
// passes, spawns its request actor on the decode worker admission chose.
// peer is the prefill node a router chose; nil means choose here. tokens
// says the sender may send a prompt of tokens (handoff.Encode): this
// node's own API, or a router.
func (a *admissionActor) admit(c actor.Context, id uint64, tenant, text string, maxTokens int, salt string, peer *PrefillPeer, tokens bool) {
	prompt, err := handoff.Encode(a.cfg.Limits(), a.model.Tokenizer(), text, tokens)
	if err != nil {
		if _, long := err.(*PromptTooLongError); long {
			a.counters.rejectedTooLong.Add(1)
		} else {
			a.counters.rejectedBad.Add(1) // a token prompt of no token of the model
		}
		a.reject(c, id, err)
		return
	}
	ask := handoff.Ask{Key: handoff.ClientKey{Client: senderKey(c), ID: id}, PromptTokens: len(prompt), MaxTokens: maxTokens,
		Routed: peer != nil}
	// A request its client sent here is held to its tenant's share here;
	// the router that routed one holds it to the share there.
	pages := -1
	if peer == nil {
		p, ok := a.pick(nil)
		ask.NoPrefill, ask.PrefillPages = !ok, p.Pages
		peer = &p
		_, pages = handoff.RequestPages(a.cfg.Geometry(), len(prompt), maxTokens)
	}
	d, err := a.core.Admit(ask)
	if err == nil && pages >= 0 {
		err = a.ledger.Take(a.cfg.Tenants.Policy(), tenant, pages)
	}
	if err == nil {
		if err = a.spawn(c, ask, d, tenant, prompt, maxTokens, salt, *peer, pages); err != nil && pages >= 0 {
			a.ledger.Give(tenant, pages)
		}
		a.counters.tenants.Store(int32(a.ledger.Tenants()))
	}
	if err == nil {
		a.counters.admitted.Add(1)
		return
	}
	switch err.(type) {
	case *PromptTooLongError:
		a.counters.rejectedTooLong.Add(1)
	case *BusyError, *tenancy.LimitError:
		a.counters.rejectedBusy.Add(1)
	case *UnavailableError:
		// Counted by its bound only (RejectNoPeer), in reject.
	default:
		a.counters.rejectedBad.Add(1)
	}
	a.reject(c, id, err)
}

// spawn starts an admitted request's actor, a child of admission under a
// secret name; pages are what the tenants' ledger counts of it, -1 for
// none.
func (a *admissionActor) spawn(c actor.Context, ask handoff.Ask, d int, tenant string, prompt []int, maxTokens int,
	salt string, peer PrefillPeer, pages int) error {
	owner := kv.Owner{Request: a.counters.requestIDs.Add(1), Tenant: tenant}
	core := handoff.NewRequest(a.cfg.requestConfig(a.dataPlane, a.model), owner, ask.Key.ID, prompt, maxTokens,
		handoff.Peer{Address: peer.PID.Address, Incarnation: peer.Incarnation})
	core.NarrowCache(salt)
	router := ""
	if s := c.Sender(); s != nil && ask.Routed {
		router = s.Address
	}
	return a.start(c, ask.Key, d, core, c.Sender(), peer.PID, router, pages, nil)
}

// start spawns the actor of request core, whose answer goes to client and
// whose transfer comes from peer; router is the address of the router
// that relays it ("" for none), pages what the tenants' ledger counts of
// it (-1 for none), and streamed the tokens the client has already (those
// of a request moved here).
func (a *admissionActor) start(c actor.Context, key handoff.ClientKey, d int, core *handoff.Request, client, peer *actor.PID,
	router string, pages int, streamed []uint32) error {
	owner := core.Owner()
	tok, last := a.model.Tokenizer(), core.LastPromptToken()
	now := time.Now()
	// The first attempt's id numbers the request for operators: unique in
	// this run, and kept through retries, which take new ids.
	live := &liveRequest{number: owner.Request, client: key.ID, tenant: owner.Tenant, since: now, progress: core.Progress(),
		pages: pages, counted: pages >= 0, router: router}
	req := &requestActor{cfg: a.cfg, log: a.log, counters: a.counters, core: core, client: client,
		tok: tok, last: last, text: engine.NewTextDecoder(tok, last), times: Stream{Start: now},
		route: route{prefill: peer, decode: a.decode[d], decodePool: a.dPools[d]}, pick: a.pick,
		registry: a.registry, auth: a.auth, live: live}
	for _, t := range streamed {
		req.text.Push(int(t)) // the text the client has: what follows continues it
	}
	if messages.WantsBatches(client) {
		req.streams = a.streams
	}
	pid, err := c.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return req },
		actor.WithMailbox(a.mailbox)), trust.SecretName())
	if err != nil {
		return fmt.Errorf("actors: spawning the request actor: %w", err)
	}
	a.core.Started(pid.Id, key, d)
	a.live[pid.Id] = live
	return nil
}

// moveIn admits a running request another decode node moves here: only
// from a node that decodes, for this run of this node, of this node's
// model and page size, within admission's bounds as any routed request.
// A refusal is answered (a TransferAbort naming the move), so that the
// source decodes on at once.
func (a *admissionActor) moveIn(c actor.Context, m *messages.MoveRequest) {
	refuse := func(err error) {
		a.counters.metrics.rejectedBy.Add(err)
		if err := messages.SendFrom(c, c.Sender(), &messages.TransferAbort{RequestID: m.MoveID, Tenant: m.Tenant,
			Reason: *handoff.Wire(err)}); err != nil {
			a.log.Error("move refusal refused by its own validation", "err", err)
		}
	}
	s := a.auth.Of(c)
	switch {
	case !s.May(trust.RoleDecode, trust.RoleAll) || c.Sender() == nil:
		a.auth.Refuse(trust.RefusedRole, "move request", "sender", s.String())
		refuse(&ForbiddenError{Sender: s.String(), Reason: "only nodes that decode move requests"})
		return
	case m.TargetIncarnation != a.cfg.Incarnation:
		refuse(&messages.WireError{Code: messages.CodeNodeLost, Where: "decode node",
			Message: fmt.Sprintf("moved to decode node incarnation %x, this is %x", m.TargetIncarnation, a.cfg.Incarnation)})
		return
	case a.core.Draining():
		refuse(&messages.WireError{Code: messages.CodeUnavailable, Where: "decode node",
			Message: "the decode node drains: it takes no request moved from another"})
		return
	case m.Model != a.model.Fingerprint().String():
		refuse(&messages.WireError{Code: messages.CodeModelMismatch, Where: "model fingerprint",
			Message: fmt.Sprintf("a move of model %s, this node computes %s", m.Model, a.model.Fingerprint())})
		return
	case int(m.PageTokens) != a.cfg.PageTokens:
		refuse(&messages.WireError{Code: messages.CodeBadRequest, Where: "page size",
			Message: fmt.Sprintf("a move in pages of %d tokens, this node's hold %d", m.PageTokens, a.cfg.PageTokens)})
		return
	}
	client := actor.NewPID(m.Receiver, m.ReceiverID)
	ask := handoff.Ask{Key: handoff.ClientKey{Client: client.String(), ID: m.ClientID}, PromptTokens: len(m.Prompt),
		MaxTokens: int(m.MaxTokens), Routed: true}
	d, err := a.core.Admit(ask)
	if err == nil {
		owner := kv.Owner{Request: a.counters.requestIDs.Add(1), Tenant: m.Tenant}
		core := handoff.NewMovedRequest(a.cfg.requestConfig(a.dataPlane, a.model), owner, m,
			handoff.Peer{Address: c.Sender().Address, Incarnation: m.SourceIncarnation})
		err = a.start(c, ask.Key, d, core, client, c.Sender(), m.Receiver, -1, m.Tokens)
	}
	if err != nil {
		refuse(err)
		return
	}
	a.counters.admitted.Add(1)
	a.log.Info("request moving here", "owner", fmt.Sprintf("request %d of tenant %q", m.MoveID, m.Tenant), "from",
		c.Sender().Address, "tokens", len(m.Tokens))
}

// requestConfig is what every request of the node shares.
func (c *Config) requestConfig(dataPlane string, model *engine.Model) handoff.RequestConfig {
	return handoff.RequestConfig{Geometry: c.Geometry(), Incarnation: c.Incarnation, DataPlane: dataPlane,
		RequestTimeout: c.RequestTimeout, PrefillTimeout: c.PrefillTimeout, ReserveWait: c.ReserveWait,
		ReserveRetry: c.ReserveRetry, RetriesMax: handoff.RetriesMax, EOS: model.Tokenizer().Stop(),
		Model: model.Fingerprint().String(), Keep: c.DecodeCachePercent > 0}
}
