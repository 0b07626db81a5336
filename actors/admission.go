package actors

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// nodeCounters are the node's request counters, read by status and tests.
type nodeCounters struct {
	admitted, rejectedTooLong, rejectedBusy, rejectedBad atomic.Uint64
	completed, failed                                    atomic.Uint64
	framesAccepted, framesRefused                        atomic.Uint64
}

// AdmissionStatus asks the admission actor for an AdmissionStatusReply.
type AdmissionStatus struct{}

// AdmissionStatusReply is the node's request accounting.
type AdmissionStatusReply struct {
	InFlight, QueueMax                           int
	Admitted, RejectedTooLong, RejectedBusy      uint64
	RejectedBad, Completed, Failed               uint64
	FramesAccepted, FramesRefused                uint64
	PrefillInFlight, DecodeInFlight              []int
}

// clientKey names a request as its client does: the client's actor and its
// request id.
type clientKey struct {
	client string
	id     uint64
}

// admissionActor is where every request enters. It refuses, before any page
// is reserved or any frame sent, a request whose prompt (with the tokens it
// asks for) exceeds the context window or the smallest pool on its path,
// and answers "busy" when QueueMax requests are in flight. It never
// replaces a prompt with anything else. An admitted request gets its own
// request actor, a child, on the pair of workers with the fewest requests.
type admissionActor struct {
	cfg      *Config
	log      *slog.Logger
	counters *nodeCounters
	prefill  []*actor.PID
	decode   []*actor.PID
	pPools   []*Pool
	dPools   []*Pool

	nextID   uint64
	inflight map[string]admitted // by child PID id
	byClient map[clientKey]*actor.PID
	pLoad    []int
	dLoad    []int
}

type admitted struct {
	key   clientKey
	route route
}

func (a *admissionActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		a.inflight = map[string]admitted{}
		a.byClient = map[clientKey]*actor.PID{}
		a.pLoad = make([]int, len(a.prefill))
		a.dLoad = make([]int, len(a.decode))
	case *messages.GenerateRequest:
		a.admit(c, m)
	case *messages.CancelRequest:
		if pid := a.byClient[clientKey{client: senderKey(c), id: m.RequestID}]; pid != nil {
			c.Send(pid, CancelJob{})
		}
	case *messages.Undecodable:
		a.counters.rejectedBad.Add(1)
		a.log.Warn("undecodable message", "err", m.Err)
	case *actor.Terminated:
		if ad, ok := a.inflight[m.Who.Id]; ok {
			delete(a.inflight, m.Who.Id)
			delete(a.byClient, ad.key)
			a.pLoad[ad.route.prefillIndex]--
			a.dLoad[ad.route.decodeIndex]--
		}
	case AdmissionStatus:
		c.Respond(AdmissionStatusReply{InFlight: len(a.inflight), QueueMax: a.cfg.QueueMax,
			Admitted: a.counters.admitted.Load(), RejectedTooLong: a.counters.rejectedTooLong.Load(),
			RejectedBusy: a.counters.rejectedBusy.Load(), RejectedBad: a.counters.rejectedBad.Load(),
			Completed: a.counters.completed.Load(), Failed: a.counters.failed.Load(),
			FramesAccepted: a.counters.framesAccepted.Load(), FramesRefused: a.counters.framesRefused.Load(),
			PrefillInFlight: append([]int(nil), a.pLoad...), DecodeInFlight: append([]int(nil), a.dLoad...)})
	}
}

func senderKey(c actor.Context) string {
	if s := c.Sender(); s != nil {
		return s.String()
	}
	return ""
}

// Check is admission's rule, a pure function of the configuration: the
// tokens a request needs must fit the context window and the smallest pool
// on its path, prefill's (the prompt) and decode's (the prompt and every
// token it may generate).
func (c *Config) Check(promptTokens, maxTokens int) error {
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
	case g.PagesFor(promptTokens) > c.PrefillPages:
		return &PromptTooLongError{Tokens: promptTokens, Limit: c.PrefillPages * g.PageTokens, Where: "prefill pool"}
	}
	if need := g.PagesFor(promptTokens) + g.PagesFor(maxTokens-1); need > c.DecodePages {
		return &PromptTooLongError{Tokens: promptTokens + maxTokens, Limit: c.DecodePages * g.PageTokens, Where: "decode pool"}
	}
	return nil
}

func (a *admissionActor) admit(c actor.Context, m *messages.GenerateRequest) {
	reject := func(err error) {
		res := &messages.GenerateResult{RequestID: m.RequestID, FinishReason: messages.FinishError, Err: wireError(err)}
		if err := messages.Respond(c, res); err != nil {
			a.log.Error("rejection refused by its own validation", "err", err)
		}
	}
	prompt := gpu.ByteTokenizer{}.Encode(m.Prompt)
	err := a.cfg.Check(len(prompt), int(m.MaxTokens))
	switch err.(type) {
	case nil:
	case *PromptTooLongError:
		a.counters.rejectedTooLong.Add(1)
		reject(err)
		return
	default:
		a.counters.rejectedBad.Add(1)
		reject(err)
		return
	}
	if len(a.inflight) >= a.cfg.QueueMax {
		a.counters.rejectedBusy.Add(1)
		reject(&BusyError{Where: "admission queue", Have: len(a.inflight), Limit: a.cfg.QueueMax})
		return
	}
	key := clientKey{client: senderKey(c), id: m.RequestID}
	if a.byClient[key] != nil {
		a.counters.rejectedBad.Add(1)
		reject(&BadRequestError{Reason: fmt.Sprintf("request id %d is already in flight", m.RequestID)})
		return
	}
	a.nextID++
	rt := a.pick()
	req := &requestActor{cfg: a.cfg, log: a.log, counters: a.counters, client: c.Sender(), clientID: m.RequestID,
		owner: kv.Owner{Request: a.nextID, Tenant: m.Tenant}, prompt: prompt, maxNew: int(m.MaxTokens), route: rt}
	pid := c.Spawn(actor.PropsFromProducer(func() actor.Actor { return req },
		actor.WithMailbox(actor.Bounded(a.cfg.MailboxMax))))
	a.inflight[pid.Id] = admitted{key: key, route: rt}
	a.byClient[key] = pid
	a.pLoad[rt.prefillIndex]++
	a.dLoad[rt.decodeIndex]++
	a.counters.admitted.Add(1)
}

// pick is the pair of workers with the fewest requests in flight.
func (a *admissionActor) pick() route {
	p, d := argmin(a.pLoad), argmin(a.dLoad)
	return route{prefill: a.prefill[p], decode: a.decode[d], prefillPool: a.pPools[p], decodePool: a.dPools[d],
		prefillIndex: p, decodeIndex: d}
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
