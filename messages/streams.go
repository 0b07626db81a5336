package messages

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"
)

// InboxName is the actor id of every process's Inbox: where TokenBatch
// messages for the streams of that process go.
const InboxName = "streams"

// batchedPrefix starts the last element of the name of an actor whose
// process takes its answers in batches.
const batchedPrefix = "batched-"

// BatchedName is the name for an actor, secret a secret name, that asks
// with every request it sends for the answer in batches, to its
// process's Inbox.
func BatchedName(secret string) string { return batchedPrefix + secret }

// WantsBatches says whether the sender of a request asks for the answer
// in batches: its name is a BatchedName, and fits a StreamItem's To.
func WantsBatches(sender *actor.PID) bool {
	if sender == nil {
		return false
	}
	id := sender.Id
	last := id[strings.LastIndexByte(id, '/')+1:]
	return strings.HasPrefix(last, batchedPrefix) && len(id) <= StreamToBytesMax && utf8.ValidString(id)
}

// Streams sends and receives the token chunks and results of streams
// whose receivers asked for batches (BatchedName): one per process, its
// Inbox spawned as InboxName.
//
// Send queues; the first item queued after a flush asks for the next
// flush, which sends everything queued by then, in TokenBatch messages of
// one destination process each. So the tokens a decode step makes for
// the requests of one router, queued by their request actors while the
// flush waits for its turn, travel together; a lone token goes as soon as
// the flush runs, with no timer. Items keep their order per destination
// process: one queue, sent in order by one actor, on protoactor remote's
// one stream a peer.
type Streams struct {
	sys     *actor.ActorSystem
	self    *actor.PID // this process's Inbox: every batch's sender
	flusher *actor.PID // sends what is queued, when asked (flush)

	mu      sync.Mutex
	queue   []streamOut
	spare   []streamOut
	pending bool // a flush is asked for and has not taken the queue

	handlers sync.Map // actor id → StreamHandler
	// Unknown counts items for no stream here (late ones, after their
	// stream ended, or a guess), Undecodable the batches that did not
	// decode, Batches and Items what was sent.
	Unknown, Undecodable, Batches, Items atomic.Uint64
}

// StreamHandler takes one item of a TokenBatch for its stream, with the
// batch's sender (nil when it has none): it checks the item as it checks
// the TokenChunk or GenerateResult sent alone. It runs on the Inbox's
// goroutine, one item after another in the batch's order: it must not
// block.
type StreamHandler func(from *actor.PID, it *StreamItem)

// flush asks the flusher to send what is queued.
type flush struct{}

// streamOut is one queued item and the process it goes to.
type streamOut struct {
	addr string
	item StreamItem
}

// NewStreams spawns sys's Inbox, with opts, and the actor that sends
// what is queued, and returns their Streams. The sender is unnamed, so
// that no peer can address it, and its mailbox unbounded: it holds at
// most one message, the flush asked for, which must never be dropped.
func NewStreams(sys *actor.ActorSystem, opts ...actor.PropsOption) (*Streams, error) {
	s := &Streams{sys: sys}
	var err error
	if s.self, err = sys.Root.SpawnNamed(actor.PropsFromFunc(s.receive, opts...), InboxName); err != nil {
		return nil, fmt.Errorf("messages: spawning the streams inbox: %w", err)
	}
	s.flusher = sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(flush); ok {
			s.flush()
		}
	}))
	return s, nil
}

// flush sends everything queued.
func (s *Streams) flush() {
	s.mu.Lock()
	out := s.queue
	s.queue, s.pending = s.spare[:0], false
	s.mu.Unlock()
	batches(out, s.post)
	clear(out) // the queue keeps no message alive
	s.mu.Lock()
	s.spare = out[:0]
	s.mu.Unlock()
}

// Register routes the items for actor id of this process to h until
// Unregister.
func (s *Streams) Register(id string, h StreamHandler) { s.handlers.Store(id, h) }

// Unregister ends the routing of id's items; later ones count as
// Unknown.
func (s *Streams) Unregister(id string) { s.handlers.Delete(id) }

func (s *Streams) receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *TokenBatch:
		from := c.Sender()
		for i := range m.Items {
			it := &m.Items[i]
			if h, ok := s.handlers.Load(it.To); ok {
				h.(StreamHandler)(from, it)
			} else {
				s.Unknown.Add(1)
			}
		}
	case *Undecodable:
		s.Undecodable.Add(1)
	}
}

// Send queues m, a *TokenChunk or *GenerateResult, for the actor to,
// whose process asked for batches, after everything queued before it, to
// go with the next flush. It refuses an invalid m as Validate
// would.
func (s *Streams) Send(to *actor.PID, m Message) error {
	it := StreamItem{To: to.Id}
	switch m := m.(type) {
	case *TokenChunk:
		it.Chunk = m
	case *GenerateResult:
		it.Result = m
	default:
		return &InvalidFieldError{TypeTokenBatch, "items", m.TypeCode().String(), "a TokenChunk or a GenerateResult"}
	}
	if err := it.validate(TypeTokenBatch); err != nil {
		return err
	}
	s.mu.Lock()
	s.queue = append(s.queue, streamOut{addr: to.Address, item: it})
	ask := !s.pending
	s.pending = true
	s.mu.Unlock()
	if ask {
		s.sys.Root.Send(s.flusher, flush{})
	}
	return nil
}

// batches hands post, destination by destination in the order each first
// appears, out's items as TokenBatch messages, in order, each within
// StreamItemsMax and StreamBatchBytesMax. It empties out's addresses.
func batches(out []streamOut, post func(addr string, b *TokenBatch)) {
	for first := range out {
		addr := out[first].addr
		if addr == "" {
			continue // sent with an earlier batch
		}
		b := &TokenBatch{}
		bytes := 0
		for i := first; i < len(out); i++ {
			if out[i].addr != addr {
				continue
			}
			n := out[i].item.WireBytesMax()
			if len(b.Items) == StreamItemsMax || bytes+n > StreamBatchBytesMax {
				post(addr, b)
				b, bytes = &TokenBatch{}, 0
			}
			b.Items = append(b.Items, out[i].item)
			bytes += n
			out[i].addr = ""
		}
		post(addr, b)
	}
}

func (s *Streams) post(addr string, b *TokenBatch) {
	s.Batches.Add(1)
	s.Items.Add(uint64(len(b.Items)))
	s.sys.Root.RequestWithCustomSender(actor.NewPID(addr, InboxName), b, s.self)
}
