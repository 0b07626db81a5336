package actors

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
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
	framesAccepted, framesRefused                        atomic.Uint64
	phases                                               phaseSums
}

// Phases splits the time to first token of requests that completed, summed
// over Count requests: Queue from admission to the plan leaving (decode
// pages reserved), Prefill from the plan to the first frame (prefill
// compute), Transfer from the first frame to prefill's TransferDone, Verify
// from there to the first token leaving (seal, manifest check, ack, and
// decode's recomputation of the first token).
// FirstDecode is the decode worker's first step: from the first token to the
// second.
type Phases struct {
	Count                                         uint64
	Queue, Prefill, Transfer, Verify, FirstDecode time.Duration
}

type phaseSums struct {
	count, queue, prefill, transfer, verify, firstDecode atomic.Int64
}

func (p *phaseSums) snapshot() Phases {
	return Phases{Count: uint64(p.count.Load()), Queue: time.Duration(p.queue.Load()),
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
	FramesAccepted, FramesRefused           uint64
	DecodeInFlight                          []int
	Phases                                  Phases
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

// Drain stops admission taking new requests; DrainStatus asks how many
// are still in flight (answered with an AdmissionStatusReply).
type Drain struct{}

// clientKey names a request as its client does: the client's actor and its
// request id.
type clientKey struct {
	client string
	id     uint64
}

// admissionActor is where every request enters a node that decodes. It
// refuses, before any page is reserved or any frame sent, a request whose
// prompt (with the tokens it asks for) exceeds the context window or the
// smallest pool on its path, and answers "busy" when QueueMax requests are
// in flight or, to clients that come directly, when the node drains. It never replaces a prompt with anything
// else. An admitted request gets its own request actor, a child, on the
// decode worker with the fewest requests.
type admissionActor struct {
	cfg       *Config
	log       *slog.Logger
	counters  *nodeCounters
	decode    []*actor.PID
	dPools    []*Pool
	pick      PrefillPicker
	dataPlane string
	registry  *sync.Map // owner.Request → request actor PID, for the data plane; kept by the request actors
	auth      *trust.Authority
	mailbox   actor.MailboxProducer // of the request actors
	draining  bool
	inflight  map[string]admitted // by child PID id
	byClient  map[clientKey]*actor.PID
	dLoad     []int
}

type admitted struct {
	key    clientKey
	decode int // index of its decode worker, for the load count
}

func (a *admissionActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		a.inflight = map[string]admitted{}
		a.byClient = map[clientKey]*actor.PID{}
		a.dLoad = make([]int, len(a.decode))
	case *messages.GenerateRequest:
		tenant, err := TenantOf(a.auth, a.auth.Of(c), m.Tenant)
		if err != nil {
			a.counters.rejectedBad.Add(1)
			a.reject(c, m.RequestID, err)
			return
		}
		a.admit(c, m.RequestID, tenant, m.Prompt, int(m.MaxTokens), nil)
	case *messages.RoutedRequest:
		if s := a.auth.Of(c); !s.May(trust.RoleRouter) {
			a.auth.Refuse(trust.RefusedRole, "routed request", "sender", s.String())
			a.counters.rejectedBad.Add(1)
			a.reject(c, m.RequestID, &ForbiddenError{Sender: s.String(), Reason: "only routers route requests"})
			return
		}
		if m.DecodeIncarnation != a.cfg.Incarnation {
			// Routed to an earlier run of this node, at the same address:
			// the router's relay for it is answering "node lost" already.
			a.counters.rejectedBad.Add(1)
			a.reject(c, m.RequestID, &BadRequestError{Reason: fmt.Sprintf("routed to decode node incarnation %x, this is %x",
				m.DecodeIncarnation, a.cfg.Incarnation)})
			return
		}
		peer := PrefillPeer{PID: actor.NewPID(m.Prefill, PrefillName), Incarnation: m.PrefillIncarnation}
		a.admit(c, m.RequestID, m.Tenant, m.Prompt, int(m.MaxTokens), &peer)
	case *messages.CancelRequest:
		if pid := a.byClient[clientKey{client: senderKey(c), id: m.RequestID}]; pid != nil {
			c.Send(pid, CancelJob{})
		}
	case PeerLost:
		// Every request hears of it: a retry may have moved a request to a
		// peer other than the one admission chose.
		for id := range a.inflight {
			c.Send(actor.NewPID(c.Self().Address, id), m)
		}
	case Drain:
		a.draining = true
		c.Respond(a.status())
	case *messages.Undecodable:
		a.counters.rejectedBad.Add(1)
		a.log.Warn("undecodable message", "err", m.Err)
	case *actor.Terminated:
		if ad, ok := a.inflight[m.Who.Id]; ok {
			delete(a.inflight, m.Who.Id)
			delete(a.byClient, ad.key)
			a.dLoad[ad.decode]--
		}
	case AdmissionStatus:
		c.Respond(a.status())
	}
}

func (a *admissionActor) status() AdmissionStatusReply {
	return AdmissionStatusReply{InFlight: len(a.inflight), QueueMax: a.cfg.QueueMax, Draining: a.draining,
		Admitted: a.counters.admitted.Load(), RejectedTooLong: a.counters.rejectedTooLong.Load(),
		RejectedBusy: a.counters.rejectedBusy.Load(), RejectedBad: a.counters.rejectedBad.Load(),
		Completed: a.counters.completed.Load(), Failed: a.counters.failed.Load(), Retried: a.counters.retried.Load(),
		FramesAccepted: a.counters.framesAccepted.Load(), FramesRefused: a.counters.framesRefused.Load(),
		DecodeInFlight: append([]int(nil), a.dLoad...), Phases: a.counters.phases.snapshot()}
}

// reject answers a request that will not run.
func (a *admissionActor) reject(c actor.Context, id uint64, err error) {
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

// Check is admission's rule, a pure function of the configuration and the
// pools on the request's path: the tokens a request needs must fit the
// context window and the smallest pool on its path, prefill's (the prompt)
// and decode's (the prompt and every token it may generate). Pools are in
// pages of c's geometry.
func (c *Config) Check(promptTokens, maxTokens, prefillPages, decodePages int) error {
	g := c.Geometry()
	switch {
	case promptTokens < 1:
		return &BadRequestError{Reason: "empty prompt"}
	case maxTokens < 1 || maxTokens > c.MaxTokensMax:
		return &BadRequestError{Reason: fmt.Sprintf("max_tokens %d, want 1 to %d", maxTokens, c.MaxTokensMax)}
	case promptTokens > c.ContextTokens:
		return &PromptTooLongError{Tokens: promptTokens, Limit: c.ContextTokens, Where: "context window"}
	case promptTokens+maxTokens > c.ContextTokens:
		return &PromptTooLongError{Tokens: promptTokens + maxTokens, Limit: c.ContextTokens,
			Where: "context window (prompt + max_tokens)"}
	case g.PagesFor(promptTokens) > prefillPages:
		return &PromptTooLongError{Tokens: promptTokens, Limit: prefillPages * g.PageTokens, Where: "prefill pool"}
	}
	if need := g.PagesFor(promptTokens) + g.PagesFor(maxTokens-1); need > decodePages {
		return &PromptTooLongError{Tokens: promptTokens + maxTokens, Limit: decodePages * g.PageTokens, Where: "decode pool"}
	}
	return nil
}

// Reject answers a request that will not run, with the stable code of err.
func Reject(c actor.Context, id uint64, err error) error {
	return messages.Respond(c, &messages.GenerateResult{RequestID: id, FinishReason: messages.FinishError, Err: wireError(err)})
}

// admit runs admission's rule and, if the request passes, spawns its
// request actor. peer is the prefill node a router chose; nil means choose
// here.
func (a *admissionActor) admit(c actor.Context, id uint64, tenant, text string, maxTokens int, peer *PrefillPeer) {
	reject := func(err error) {
		switch err.(type) {
		case *PromptTooLongError:
			a.counters.rejectedTooLong.Add(1)
		case *BusyError:
			a.counters.rejectedBusy.Add(1)
		default:
			a.counters.rejectedBad.Add(1)
		}
		if err := Reject(c, id, err); err != nil {
			a.log.Error("rejection refused by its own validation", "err", err)
		}
	}
	// A draining node refuses clients that come to it directly, but still
	// takes a request a router sent before it saw the draining flag: the
	// drain waits for it like any other, and refusing it would abort it.
	if a.draining && peer == nil {
		reject(&BusyError{Where: "draining node", Have: len(a.inflight), Limit: 0})
		return
	}
	if peer == nil {
		p, ok := a.pick(nil)
		if !ok {
			reject(&BusyError{Where: "prefill nodes", Have: 0, Limit: 0})
			return
		}
		peer = &p
	}
	prompt := gpu.ByteTokenizer{}.Encode(text)
	d := argmin(a.dLoad)
	pages := peer.Pages
	if pages == 0 {
		// A router's choice: the router checked the prompt against that
		// peer's pool, which this node does not know.
		pages = a.cfg.Geometry().PagesFor(len(prompt))
	}
	if err := a.cfg.Check(len(prompt), maxTokens, pages, a.cfg.DecodePages); err != nil {
		reject(err)
		return
	}
	if len(a.inflight) >= a.cfg.QueueMax {
		reject(&BusyError{Where: "admission queue", Have: len(a.inflight), Limit: a.cfg.QueueMax})
		return
	}
	key := clientKey{client: senderKey(c), id: id}
	if a.byClient[key] != nil {
		reject(&BadRequestError{Reason: fmt.Sprintf("request id %d is already in flight", id)})
		return
	}
	rt := route{prefill: peer.PID, prefillIncarnation: peer.Incarnation, decode: a.decode[d], decodePool: a.dPools[d],
		decodeIndex: d}
	owner := kv.Owner{Request: a.counters.requestIDs.Add(1), Tenant: tenant}
	req := &requestActor{cfg: a.cfg, log: a.log, counters: a.counters, client: c.Sender(), clientID: id,
		owner: owner, prompt: prompt, maxNew: maxTokens, route: rt, dataPlane: a.dataPlane,
		pick: a.pick, tried: map[uint64]bool{}, registry: a.registry, auth: a.auth}
	pid, err := c.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return req },
		actor.WithMailbox(a.mailbox)), trust.SecretName())
	if err != nil {
		reject(fmt.Errorf("actors: spawning the request actor: %w", err))
		return
	}
	a.inflight[pid.Id] = admitted{key: key, decode: d}
	a.byClient[key] = pid
	a.dLoad[d]++
	a.counters.admitted.Add(1)
}

func argmin(xs []int) int {
	best := 0
	for i, x := range xs {
		if x < xs[best] {
			best = i
		}
	}
	return best
}
