package actors

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// NewMailbox makes the mailbox of every kvwarden actor that may hear from
// outside its node. protoactor's actor.Bounded waits for room when full by
// spinning on runtime.Gosched, and protoactor remote's endpoint reader
// pushes straight into mailboxes: one full mailbox would stall every
// message from that peer and burn a core. This mailbox never waits.
//
// At most max messages wait in it. When it is full, a message that may
// come from outside the process (a wire message, an undecodable one, or
// anything from a sender in another process) is dropped and counted in
// drops; one that expects an answer (GenerateRequest, RoutedRequest,
// TransferPlan) is answered "busy" at once, so that its sender neither
// waits for a timeout nor retries into the same queue. A message of the
// node's own internal types from inside the process is taken even when
// full: each is an answer, a step or a page operation of work the node
// already holds, bounded by the node's own limits (QueueMax, page counts,
// BatchMax), and dropping one would strand a page or a request.
//
// protoactor system messages (Started, Stop, Watch…) have a queue of their
// own, as in protoactor's mailboxes.
func NewMailbox(sys *actor.ActorSystem, max int, drops *atomic.Uint64) actor.MailboxProducer {
	return func() actor.Mailbox { return &mailbox{sys: sys, max: max, drops: drops} }
}

// MailboxFrom is Mailbox for an actor that takes messages from outside the
// process only from the given roles (the prefill dispatcher and workers:
// nodes that decode; a node's control actor: operators): a remote message
// from anyone else is dropped before it takes a place, and counted as a
// role refusal, so that a peer allowed to reach the port but not the actor
// cannot fill its queue and crowd out the messages it must take.
func (n *Node) MailboxFrom(roles ...trust.Role) actor.MailboxProducer {
	auth := n.auth
	from := func(sender *actor.PID, msg any) bool {
		if sender.Address == n.sys.Address() {
			return true
		}
		if s := auth.SenderOf(nil, sender); !s.May(roles...) {
			auth.Refuse(trust.RefusedRole, fmt.Sprintf("%T", msg), "sender", s.String())
			return false
		}
		return true
	}
	return func() actor.Mailbox { return &mailbox{sys: n.sys, max: n.cfg.MailboxMax, drops: &n.drops, from: from} }
}

// MailboxDrops is how many messages the node's mailboxes dropped because
// they were full.
func (n *Node) MailboxDrops() uint64 { return n.drops.Load() }

// mailbox schedules itself on its dispatcher like protoactor's default
// mailbox: one run at a time, system messages first, user messages while
// not suspended, yielding every Throughput messages.
type mailbox struct {
	sys   *actor.ActorSystem
	max   int
	drops *atomic.Uint64
	from  func(sender *actor.PID, msg any) bool // nil: from anyone; else whether a remote sender may send msg

	mu     sync.Mutex
	user   fifo
	system fifo

	running    atomic.Bool
	suspended  atomic.Bool
	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
}

func (b *mailbox) PostUserMessage(m any) {
	if b.from != nil {
		if _, msg, sender := actor.UnwrapEnvelope(m); sender != nil && !b.from(sender, msg) {
			b.answer(m, handoff.Wire(&ForbiddenError{Sender: sender.Address, Reason: fmt.Sprintf("%T is not taken from this sender", msg)}))
			return
		}
	}
	b.mu.Lock()
	if b.user.n >= b.max && b.refusable(m) {
		b.mu.Unlock()
		b.refuse(m)
		return
	}
	b.user.push(m)
	b.mu.Unlock()
	b.schedule()
}

func (b *mailbox) PostSystemMessage(m any) {
	b.mu.Lock()
	b.system.push(m)
	b.mu.Unlock()
	b.schedule()
}

func (b *mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	b.invoker, b.dispatcher = invoker, dispatcher
}

func (b *mailbox) Start() {}

func (b *mailbox) UserMessageCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.user.n
}

// refusable says whether m may be dropped when the mailbox is full: it
// may have come from outside the process.
func (b *mailbox) refusable(m any) bool {
	_, msg, sender := actor.UnwrapEnvelope(m)
	switch msg.(type) {
	case messages.Message, *messages.Undecodable:
		return true
	}
	return sender != nil && sender.Address != b.sys.Address()
}

// refuse counts a dropped message and answers "busy" to a sender that
// waits for an answer. It runs on the sender's goroutine (for a remote
// peer, its endpoint reader's), and only sends.
func (b *mailbox) refuse(m any) {
	b.drops.Add(1)
	b.answer(m, handoff.Wire(&BusyError{Where: "mailbox", Have: b.max, Limit: b.max}))
}

// answer tells the sender of a message that expects an answer
// (GenerateRequest, RoutedRequest, TransferPlan) that it failed with err,
// so that it does not wait for a timeout. It only sends.
func (b *mailbox) answer(m any, err *messages.WireError) {
	_, msg, sender := actor.UnwrapEnvelope(m)
	if sender == nil {
		return
	}
	var answer messages.Message
	switch m := msg.(type) {
	case *messages.GenerateRequest:
		answer = &messages.GenerateResult{RequestID: m.RequestID, FinishReason: messages.FinishError, Err: err}
	case *messages.RoutedRequest:
		answer = &messages.GenerateResult{RequestID: m.RequestID, FinishReason: messages.FinishError, Err: err}
	case *messages.TransferPlan:
		answer = &messages.TransferDone{RequestID: m.RequestID, Tenant: m.Tenant, Err: err}
	default:
		return
	}
	// A message that failed its own validation was never sent; its
	// sender times out as it would without an answer.
	_ = messages.Send(b.sys.Root, sender, answer)
}

func (b *mailbox) schedule() {
	if b.running.CompareAndSwap(false, true) {
		b.dispatcher.Schedule(b.process)
	}
}

// process runs the mailbox until it is empty, and again if a message came
// in between the last look and going idle.
func (b *mailbox) process() {
	for {
		b.run()
		b.running.Store(false)
		if !b.pending() || !b.running.CompareAndSwap(false, true) {
			return
		}
	}
}

func (b *mailbox) pending() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.system.n > 0 || (!b.suspended.Load() && b.user.n > 0)
}

func (b *mailbox) pop(q *fifo) (any, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return q.pop()
}

func (b *mailbox) run() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			b.invoker.EscalateFailure(r, msg)
		}
	}()
	i, throughput := 0, b.dispatcher.Throughput()
	for {
		if i > throughput {
			i = 0
			runtime.Gosched()
		}
		i++
		if m, ok := b.pop(&b.system); ok {
			msg = m
			switch m.(type) {
			case *actor.SuspendMailbox:
				b.suspended.Store(true)
			case *actor.ResumeMailbox:
				b.suspended.Store(false)
			default:
				b.invoker.InvokeSystemMessage(m)
			}
			continue
		}
		if b.suspended.Load() {
			return
		}
		m, ok := b.pop(&b.user)
		if !ok {
			return
		}
		msg = m
		b.invoker.InvokeUserMessage(m)
	}
}

// fifo is a ring that grows by doubling; the mailbox bounds what it lets
// in.
type fifo struct {
	buf     []any
	head, n int
}

func (q *fifo) push(m any) {
	if q.n == len(q.buf) {
		grown := make([]any, max(2*len(q.buf), 16))
		for i := range q.n {
			grown[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = grown, 0
	}
	q.buf[(q.head+q.n)%len(q.buf)] = m
	q.n++
}

func (q *fifo) pop() (any, bool) {
	if q.n == 0 {
		return nil, false
	}
	m := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return m, true
}

// mailbox is the mailbox of the node's actors (NewMailbox, MailboxMax).
// Mailbox is the mailbox of the node's actors, counting into MailboxDrops;
// the cluster layer gives it to the router and its relays too.
func (n *Node) Mailbox() actor.MailboxProducer { return NewMailbox(n.sys, n.cfg.MailboxMax, &n.drops) }
