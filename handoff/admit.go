package handoff

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/mutant"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// Limits are what every request is admitted against: the node's
// advertised context window, the most tokens a request may ask for, and the
// page geometry its pools share.
type Limits struct {
	ContextTokens int
	MaxTokensMax  int
	Geometry      kv.Geometry
}

// Admit is admission's rule, the one function router and decode admission
// both call, before anything exists for a request: the tokens it needs must
// fit the context window and the smallest pool on its path, prefill's (the
// prompt) and decode's (the prompt and every token it may generate). Pools
// are in pages of l's geometry. A request that does not fit is refused as
// it is: nothing ever replaces a prompt with something that fits.
func Admit(l Limits, promptTokens, maxTokens, prefillPages, decodePages int) error {
	g := l.Geometry
	switch {
	case promptTokens < 1:
		return &BadRequestError{Reason: "empty prompt"}
	case maxTokens < 1 || maxTokens > l.MaxTokensMax:
		return &BadRequestError{Reason: fmt.Sprintf("max_tokens %d, want 1 to %d", maxTokens, l.MaxTokensMax)}
	case promptTokens > l.ContextTokens:
		return &PromptTooLongError{Tokens: promptTokens, Limit: l.ContextTokens, Where: "context window"}
	case promptTokens+maxTokens > l.ContextTokens:
		return &PromptTooLongError{Tokens: promptTokens + maxTokens, Limit: l.ContextTokens,
			Where: "context window (prompt + max_tokens)"}
	case g.PagesFor(promptTokens) > prefillPages && !mutant.Is(mutant.AdmitIgnoresSmallestPool) && !mutant.Is(mutant.Incident):
		return &PromptTooLongError{Tokens: promptTokens, Limit: prefillPages * g.PageTokens, Where: "prefill pool"}
	}
	if _, need := RequestPages(g, promptTokens, maxTokens); need > decodePages {
		return &PromptTooLongError{Tokens: promptTokens + maxTokens, Limit: decodePages * g.PageTokens, Where: "decode pool"}
	}
	return nil
}

// RequestPages are the pages of g's geometry a request of promptTokens and
// maxTokens holds at most: on its prefill node, the prompt's KV; on its
// decode node, the prompt's and that of every token but the last it may
// generate (the last is never fed back). Admit refuses a request whose
// pages exceed a pool; routers count them against the nodes they route
// to.
func RequestPages(g kv.Geometry, promptTokens, maxTokens int) (prefill, decode int) {
	prefill = g.PagesFor(promptTokens)
	return prefill, prefill + g.PagesFor(maxTokens-1)
}

// Encode is the prompt text in the model's tokens; a text that certainly
// exceeds the context window is refused by its length alone, unencoded
// (engine.EncodeWithin), so that a stranger's megabyte prompt costs no
// tokenizer work in an actor that serves everyone. A prompt TokenPrompt
// wrote is its tokens, each checked against the vocabulary, BOS first,
// when tokens says its sender may send tokens (the node's own API, which
// renders chats in the model's template, or a router passing on what it
// took); from any other sender it is refused: a tenant's prompt is text,
// and text never becomes a control token.
func Encode(l Limits, tok engine.Tokenizer, text string, tokens bool) (prompt []int, err error) {
	if IsTokenPrompt(text) {
		if !tokens {
			return nil, &TokenPromptError{Index: -1, Vocab: tok.Vocab(), BOS: tok.BOS()}
		}
		return decodeTokenPrompt(l, tok, text)
	}
	prompt, n := engine.EncodeWithin(tok, text, l.ContextTokens)
	if prompt == nil {
		return nil, &PromptTooLongError{Tokens: n, Limit: l.ContextTokens, Where: "context window", AtLeast: true}
	}
	return prompt, nil
}

// ClientKey names a request as its client does: the client and its request
// id.
type ClientKey struct {
	Client string
	ID     uint64
}

// Ask is one request arriving at a decode node's admission.
type Ask struct {
	Key                     ClientKey
	PromptTokens, MaxTokens int
	// Routed: a router chose the prefill peer (and checked the prompt
	// against its pool, which this node does not know).
	Routed bool
	// PrefillPages is the chosen prefill peer's smallest pool; 0 with
	// Routed. NoPrefill: no prefill peer is available.
	PrefillPages int
	NoPrefill    bool
}

// Admission is one decode node's admission bookkeeping: the requests in
// flight (at most QueueMax), each by its request's name and its client's
// key, the requests per decode worker, and whether the node drains.
type Admission struct {
	limits      Limits
	queueMax    int
	decodePages int
	draining    bool
	inflight    map[string]admitted // by the request's name
	byClient    map[ClientKey]string
	load        []int
}

type admitted struct {
	key    ClientKey
	decode int
}

// NewAdmission is the admission of a node with decodeWorkers workers of
// decodePages pages each.
func NewAdmission(l Limits, queueMax, decodeWorkers, decodePages int) *Admission {
	return &Admission{limits: l, queueMax: queueMax, decodePages: decodePages,
		inflight: map[string]admitted{}, byClient: map[ClientKey]string{}, load: make([]int, decodeWorkers)}
}

// Admit decides whether a request runs, and on which decode worker (the
// one with the fewest requests). A draining node refuses clients that come
// to it directly, but still takes a request a router sent before it saw
// the draining flag: the drain waits for it like any other, and refusing it
// would abort it. Admit records nothing: Started does, once the request
// exists.
func (a *Admission) Admit(q Ask) (decode int, err error) {
	switch {
	case a.draining && !q.Routed:
		return 0, &BusyError{Where: "draining node", Have: len(a.inflight), Limit: 0}
	case q.NoPrefill:
		return 0, &UnavailableError{Roles: []string{"prefill"}}
	}
	pages := q.PrefillPages
	if q.Routed || pages == 0 {
		pages = a.limits.Geometry.PagesFor(q.PromptTokens)
	}
	if err := Admit(a.limits, q.PromptTokens, q.MaxTokens, pages, a.decodePages); err != nil {
		return 0, err
	}
	if len(a.inflight) >= a.queueMax {
		return 0, &BusyError{Where: "admission queue", Have: len(a.inflight), Limit: a.queueMax}
	}
	if _, dup := a.byClient[q.Key]; dup {
		return 0, &BadRequestError{Reason: fmt.Sprintf("request id %d is already in flight", q.Key.ID)}
	}
	return slices.Index(a.load, slices.Min(a.load)), nil
}

// Started records an admitted request under its name.
func (a *Admission) Started(name string, key ClientKey, decode int) {
	a.inflight[name] = admitted{key: key, decode: decode}
	a.byClient[key] = name
	a.load[decode]++
}

// Ended forgets a request that ended; an unknown name is ignored.
func (a *Admission) Ended(name string) {
	if ad, ok := a.inflight[name]; ok {
		delete(a.inflight, name)
		delete(a.byClient, ad.key)
		a.load[ad.decode]--
	}
}

// Drain makes the node refuse requests that come directly from clients.
func (a *Admission) Drain() { a.draining = true }

// Draining reports whether the node drains.
func (a *Admission) Draining() bool { return a.draining }

// Lookup is the name of the client's request in flight, if any.
func (a *Admission) Lookup(key ClientKey) (string, bool) {
	name, ok := a.byClient[key]
	return name, ok
}

// InFlight lists the names of the requests in flight.
func (a *Admission) InFlight() []string {
	names := make([]string, 0, len(a.inflight))
	for n := range a.inflight {
		names = append(names, n)
	}
	return names
}

// Load is the number of requests in flight per decode worker.
func (a *Admission) Load() []int { return append([]int(nil), a.load...) }

// Wire is what a client is told of err, with its stable code, cut to the
// wire's bounds. Refusals by the pool (stale tag, wrong owner or tenant,
// checksum, token range) are integrity failures: the answer is withheld
// rather than risked.
func Wire(err error) *messages.WireError { return wire(err).Bounded() }

func wire(err error) *messages.WireError {
	var w interface{ Wire() *messages.WireError }
	var ex *kv.PoolExhaustedError
	var fp *engine.FingerprintError
	switch {
	case errors.As(err, &w):
		return w.Wire()
	case errors.Is(err, ErrCancelled):
		return &messages.WireError{Code: messages.CodeCancelled, Message: err.Error()}
	case errors.Is(err, ErrDeadline):
		return &messages.WireError{Code: messages.CodeCancelled, Message: err.Error(), Where: "request timeout"}
	case errors.As(err, &ex):
		return &messages.WireError{Code: messages.CodeBusy, Message: err.Error(),
			Have: uint64(ex.Need), Limit: uint64(ex.Free), Where: "kv pool"}
	case errors.Is(err, kv.ErrRefused):
		return &messages.WireError{Code: messages.CodeIntegrity, Message: err.Error()}
	case errors.As(err, &fp):
		return &messages.WireError{Code: messages.CodeModelMismatch, Message: err.Error(), Where: "model fingerprint"}
	}
	return messages.ToWireError(err)
}
