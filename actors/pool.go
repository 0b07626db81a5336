package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
)

// poolCounters are shared by a pool actor and its page actors, which run on
// different goroutines.
type poolCounters struct {
	log       *slog.Logger
	reclaimed [len(kv.Reclaims{})]atomic.Uint64 // by kv.State
	mu        sync.Mutex
	refusals  kv.Refusals
	cross     func() kv.CrossRows // the pages' cross reads (kv.CrossRowsOf), safe from any goroutine
}

func (s *poolCounters) reclaims() kv.Reclaims {
	var r kv.Reclaims
	for i := range r {
		r[i] = s.reclaimed[i].Load()
	}
	return r
}

func (s *poolCounters) refused(err error) {
	s.mu.Lock()
	s.refusals.Count(err)
	s.mu.Unlock()
}

func (s *poolCounters) snapshot() kv.Refusals {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusals
}

// Pool is the handle of one device's pool: the pool actor that reserves,
// and one page actor per physical page. It is an immutable value, safe to
// share.
type Pool struct {
	PID      *actor.PID
	Pages    []*actor.PID
	Geometry kv.Geometry
	// Timeout bounds every call a Pool method makes.
	Timeout time.Duration
	// gens mirrors each page's current generation, written by its page
	// actor after every message: a reader in another goroutine checks a
	// lease against it on every read without a message, and so never reads
	// a page that was reclaimed and reallocated under it.
	gens []atomic.Uint64
	// nonces tell reservations apart, so a timed-out one can be undone.
	nonces *atomic.Uint64
	// cache is the prefix cache's counts of the prefill worker that owns
	// the pool, as of their last change; nil without a cache.
	cache *atomic.Pointer[handoff.PrefixStats]
	// stopped is closed when the node stops: a page ask then ends at
	// once, as a future's would with a dead letter, instead of waiting
	// out Timeout on a page actor that is gone.
	stopped  chan struct{}
	stopOnce *sync.Once
}

// stop ends the page asks waiting now and to come.
func (p *Pool) stop() { p.stopOnce.Do(func() { close(p.stopped) }) }

// poolFairness is what a pool actor shares its pages among tenants by
// (tenancy.PoolShares): the tenants' weights, and how often a request
// waiting for pages tries again.
type poolFairness struct {
	tenants *tenancy.Shares
	retry   time.Duration
}

// fairness is the pools' of c.
func (c *Config) fairness() poolFairness {
	return poolFairness{tenants: c.Tenants, retry: c.ReserveRetry}
}

// spawnPool allocates cfg's arena once, spawns one page actor a page named
// name/page-i, and the pool actor named name.
func spawnPool(root *actor.RootContext, name string, cfg kv.Config, mailbox actor.MailboxProducer, timeout time.Duration,
	clock func() time.Time, fair poolFairness, log *slog.Logger) (*Pool, error) {
	pages, err := kv.NewPages(cfg)
	if err != nil {
		return nil, err
	}
	stats := &poolCounters{log: log, cross: func() kv.CrossRows { return kv.CrossRowsOf(pages) }}
	pool := &Pool{PID: actor.NewPID(root.ActorSystem().Address(), name), Pages: make([]*actor.PID, len(pages)),
		Geometry: cfg.Geometry, Timeout: timeout, gens: make([]atomic.Uint64, len(pages)), nonces: new(atomic.Uint64),
		cache: new(atomic.Pointer[handoff.PrefixStats]), stopped: make(chan struct{}), stopOnce: new(sync.Once)}
	for i := range pages {
		pg := &pages[i]
		pool.gens[i].Store(pg.Tag().Generation)
		props := actor.PropsFromProducer(func() actor.Actor {
			return &pageActor{page: pg, pool: pool.PID, gen: &pool.gens[i], clock: clock, stats: stats}
		}, actor.WithMailbox(mailbox))
		if pool.Pages[i], err = root.SpawnNamed(props, fmt.Sprintf("%s/page-%d", name, i)); err != nil {
			return nil, fmt.Errorf("actors: spawn of page %d of %d: %w", i, len(pages), err)
		}
	}
	// The pool actor's mailbox is not bounded by MailboxMax: page actors
	// send it every free while it sends them assignments, and two bounded
	// mailboxes sending to each other can both fill and wait forever. What
	// it holds is bounded anyway: one free per page, one reserve per
	// request in flight.
	props := actor.PropsFromProducer(func() actor.Actor {
		return &poolActor{cfg: cfg, pids: pool.Pages, free: kv.NewFreeList(kv.FirstTags(pages)), stats: stats,
			granted: map[uint64][]kv.Tag{}, tenants: fair.tenants, fair: tenancy.NewPoolShares(len(pages), fair.retry),
			ownerOf: make([]kv.Owner, len(pages)), clock: clock}
	})
	pid, err := root.SpawnNamed(props, name)
	if err != nil {
		return nil, fmt.Errorf("actors: spawn of pool %s: %w", name, err)
	}
	if !pid.Equal(pool.PID) {
		panic(fmt.Sprintf("actors: pool %s spawned as %s", pool.PID, pid))
	}
	return pool, nil
}

// Requester is what can send to an actor and make a request and wait for
// the answer: an actor.Context or an actor.RootContext.
type Requester interface {
	Send(pid *actor.PID, message any)
	RequestFuture(pid *actor.PID, message any, timeout time.Duration) *actor.Future
}

// ErrNoAnswer matches (errors.Is) a call to an actor that got no answer:
// it timed out, or the actor is gone (the cause is then
// actor.ErrDeadLetter).
var ErrNoAnswer = errors.New("actors: no answer")

// NoAnswerError says which call got no answer, how long it could wait,
// and why it stopped waiting.
type NoAnswerError struct {
	Call    string
	Timeout time.Duration
	Cause   error
}

func (e *NoAnswerError) Error() string {
	return fmt.Sprintf("actors: %s: no answer (waited up to %s): %v", e.Call, e.Timeout, e.Cause)
}

func (e *NoAnswerError) Is(target error) bool { return target == ErrNoAnswer }

func (e *NoAnswerError) Unwrap() error { return e.Cause }

// Wire is what a client is told of e: busy. An actor of a live node that
// does not answer within its bound is behind a queue the node cannot work
// off in time (a loaded or stalled process), so the request may succeed
// elsewhere or later; a broken invariant, which also leaves calls
// unanswered, stops the node and is reported as such.
func (e *NoAnswerError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBusy, Message: e.Error(), Where: "node overloaded"}
}

// ask sends msg to pid and waits for an answer of type T.
func ask[T any](r Requester, pid *actor.PID, msg any, timeout time.Duration) (T, error) {
	var zero T
	res, err := r.RequestFuture(pid, msg, timeout).Result()
	if err != nil {
		return zero, &NoAnswerError{Call: fmt.Sprintf("%T to %s", msg, pid.Id), Timeout: timeout, Cause: err}
	}
	v, ok := res.(T)
	if !ok {
		return zero, fmt.Errorf("actors: %T to %s answered %T, want %T", msg, pid.Id, res, zero)
	}
	return v, nil
}

// Reserve asks the pool actor for n pages, all or nothing. When the
// answer does not come in time, the reservation is undone: the pool actor,
// which handles messages in order, releases whatever it granted it, so a
// slow pool never strands pages with an owner that gave up on them.
func (p *Pool) Reserve(r Requester, owner kv.Owner, first, n int) ([]kv.Tag, error) {
	nonce := p.nonces.Add(1)
	rep, err := ask[ReserveReply](r, p.PID, Reserve{Owner: owner, First: first, N: n, Nonce: nonce}, p.Timeout)
	if err != nil {
		r.Send(p.PID, undoReserve{Owner: owner, Nonce: nonce})
		return nil, err
	}
	return rep.Tags, rep.Err
}

// Status asks the pool actor for its accounting, and adds the prefix
// cache's counts.
func (p *Pool) Status(r Requester) (PoolStatusReply, error) {
	s, err := ask[PoolStatusReply](r, p.PID, PoolStatus{}, p.Timeout)
	s.Cache = p.cache.Load()
	return s, err
}

// Page sends msg to the page actor of tag and waits for its reply, at most
// Timeout, or until the node stops. A tag of another pool is refused here,
// as the page itself would.
func (p *Pool) Page(r Requester, tag kv.Tag, msg any) PageReply {
	if int64(tag.Index) >= int64(len(p.Pages)) {
		return PageReply{Err: &kv.StaleTagError{Page: tag.Index, Have: tag}}
	}
	pid := p.Pages[tag.Index]
	reply := make(chan PageReply, 1)
	r.Send(pid, pageAsk{Msg: msg, Reply: reply})
	t := time.NewTimer(p.Timeout)
	defer t.Stop()
	cause := actor.ErrTimeout
	select {
	case rep := <-reply:
		return rep
	case <-t.C:
	case <-p.stopped:
		cause = actor.ErrDeadLetter
	}
	return PageReply{Err: &NoAnswerError{Call: fmt.Sprintf("%T to %s", msg, pid.Id), Timeout: p.Timeout, Cause: cause}}
}

// Inspect asks page idx for its kv.PageInfo.
func (p *Pool) Inspect(r Requester, idx int) (kv.PageInfo, error) {
	return ask[kv.PageInfo](r, p.Pages[idx], PageInspect{}, p.Timeout)
}
