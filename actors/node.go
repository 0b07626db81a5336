package actors

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// AdmissionName is the name of every node's admission actor: a client
// reaches a node at actor.NewPID(address, AdmissionName).
const AdmissionName = "admission"

// Node is one kvwarden node serving generation disaggregated across its
// own prefill and decode workers: an actor system with one pool (page
// actors and a pool actor) and one GPU-worker actor per worker, and the
// admission actor, optionally reachable through protoactor remote.
type Node struct {
	cfg        Config
	model      *engine.Model
	runtimeLog *messages.RuntimeLogCounts
	log        *slog.Logger
	sys        *actor.ActorSystem
	root       *actor.RootContext
	remote     *remote.Remote
	auth       *trust.Authority
	admission  *actor.PID // nil unless the role decodes
	dispatcher *actor.PID // nil unless the role prefills
	prefill    []*actor.PID
	decode     []*actor.PID
	pools      []*Pool
	counters   *nodeCounters
	registry   sync.Map // request id → request actor, for AcceptFrames
	streams    *messages.Streams
	// dispatchers run the workers' mailboxes, each on a goroutine of its
	// own, until the node stops.
	dispatchers []*ownDispatcher
	fatal       chan *InvariantError
	drops       atomic.Uint64 // messages full mailboxes dropped (NewMailbox)
}

// Options are what a node takes besides its Config.
type Options struct {
	// Model is what every worker computes and admission tokenizes with;
	// required, and its config must be Config.Model. One Model is shared
	// by every worker: its weights are read, never copied.
	Model *engine.Model
	// Listen is the host:port protoactor remote serves on ("127.0.0.1:0"
	// picks a port); empty means no remote: in-process clients only.
	Listen string
	// Advertise is the host:port peers reach that remote at, when it is
	// not Listen's (a proxy forwards it there); empty means Listen's.
	Advertise string
	// Log receives the node's and protoactor's logs; nil discards them.
	Log *slog.Logger
	// Fatal is called once when an actor breaks an invariant; the node has
	// stopped that actor and must not serve on. Nil means the caller reads
	// Node.Fatal.
	Fatal func(*InvariantError)
	// Pick chooses prefill peers in other nodes, for a node whose role
	// decodes but does not prefill. A node that prefills plans with itself.
	Pick PrefillPicker
	// DataPlane is the address of this node's KV data plane, which plans
	// to prefill peers in other nodes name; Dial opens one to theirs.
	DataPlane string
	Dial      Dialer
	// Auth authenticates remote peers and says who sent each message. It
	// is required with Listen; without Listen every sender is local and
	// nil is taken as trust.Insecure.
	Auth *trust.Authority
	// DataPlaneOf gives, from membership, the data plane of the node at
	// a plan sender's address: a prefill worker sends a plan's KV only
	// there. Nil takes plans only from this node.
	DataPlaneOf DataPlaneOf
}

// RuntimeLog counts protoactor's own log records, which the node's log
// shows at debug only.
func (n *Node) RuntimeLog() *messages.RuntimeLogCounts { return n.runtimeLog }

// Model is what the node serves.
func (n *Node) Model() *engine.Model { return n.model }

// DrawIncarnation gives the configuration an incarnation if it has none:
// a random non-zero value, so a restarted node is never taken for its old
// self. Start calls it; a caller that needs the incarnation before Start
// (to configure a data plane with it) calls it first.
func (c *Config) DrawIncarnation() error {
	if c.Incarnation != 0 {
		return nil
	}
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return fmt.Errorf("actors: drawing an incarnation: %w", err)
	}
	c.Incarnation = binary.LittleEndian.Uint64(b[:]) | 1
	return nil
}

// Start validates cfg, allocates every pool once and starts the actors.
func Start(cfg Config, opt Options) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.DrawIncarnation(); err != nil {
		return nil, err
	}
	log := opt.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opt.Model == nil {
		return nil, errors.New("actors: Options.Model is required: the model the node serves")
	}
	if got := opt.Model.Config(); got != cfg.Model {
		return nil, fmt.Errorf("actors: Options.Model computes %+v, not Config.Model %+v", got, cfg.Model)
	}
	// An answer's text must fit its message: each token is at most
	// PieceBytesMax bytes, each of which may decode to U+FFFD's three.
	if most := int64(cfg.MaxTokensMax) * 3 * int64(opt.Model.Tokenizer().PieceBytesMax()); most > messages.TextBytesMax {
		return nil, fmt.Errorf("actors: MaxTokensMax (%d) tokens of up to %d bytes each may decode to %d bytes of text, more than a result carries (%d)",
			cfg.MaxTokensMax, opt.Model.Tokenizer().PieceBytesMax(), most, messages.TextBytesMax)
	}
	n := &Node{cfg: cfg, model: opt.Model, log: log, counters: &nodeCounters{}, fatal: make(chan *InvariantError, 1)}
	// protoactor's own records (endpoint chatter, dead letters) are
	// counted and logged at debug only: the node's log is the node's.
	runtime := messages.NewRuntimeLog(log)
	n.runtimeLog = runtime.Counts()
	n.sys = messages.NewActorSystem(runtime.Logger())
	sup := &stopOnPanic{log: log, fatal: func(e *InvariantError) {
		select {
		case n.fatal <- e:
		default:
		}
		if opt.Fatal != nil {
			opt.Fatal(e)
		}
	}}
	n.root = n.sys.Root.WithGuardian(sup)
	n.auth = opt.Auth
	if n.auth == nil && opt.Listen == "" {
		n.auth = trust.Insecure(log)
	}
	if opt.Listen != "" {
		var err error
		if n.remote, err = messages.StartRemoteAdvertised(n.sys, opt.Listen, opt.Advertise, cfg.Incarnation, n.auth); err != nil {
			n.sys.Shutdown()
			return nil, fmt.Errorf("actors: %w", err)
		}
	}
	var err error
	// Batches come from nodes that decode, to a router (a client's
	// process has an Inbox of its own).
	if n.streams, err = messages.NewStreams(n.sys, actor.WithMailbox(n.MailboxFrom(trust.RoleDecode, trust.RoleAll))); err == nil {
		err = n.spawn(opt.Model, sup, opt)
	}
	if err != nil {
		n.Stop()
		return nil, err
	}
	return n, nil
}

// Streams are the node's streams in batches: what it sends to clients
// and routers that asked for batches, and its Inbox.
func (n *Node) Streams() *messages.Streams { return n.streams }

func (n *Node) spawn(model *engine.Model, sup actor.SupervisorStrategy, opt Options) error {
	cfg := &n.cfg
	workers := func(role string, count, pages int, out *[]*actor.PID) ([]*Pool, error) {
		var pools []*Pool
		for i := range count {
			name := fmt.Sprintf("%s-%d", role, i)
			pool, err := spawnPool(n.root, name+"/pool", cfg.pool(pages, cfg.Incarnation), n.Mailbox(),
				cfg.CallTimeout, time.Now, cfg.fairness(), n.log)
			if err != nil {
				return nil, err
			}
			w := newWorker(role, model, pool, cfg, n.log.With("worker", name), planPolicy{auth: n.auth, dataPlaneOf: opt.DataPlaneOf})
			w.dial, w.metrics = opt.Dial, &n.counters.metrics
			mb := n.Mailbox()
			if role == "prefill" {
				mb = n.MailboxFrom(trust.RoleDecode, trust.RoleAll) // plans, acks and aborts
			}
			d := newOwnDispatcher(300)
			n.dispatchers = append(n.dispatchers, d)
			pid, err := n.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return w }, actor.WithMailbox(mb), actor.WithDispatcher(d)), name)
			if err != nil {
				return nil, err
			}
			*out = append(*out, pid)
			pools = append(pools, pool)
		}
		return pools, nil
	}
	pick := opt.Pick
	if cfg.Role.Prefills() {
		pPools, err := workers("prefill", cfg.PrefillWorkers, cfg.PrefillPages, &n.prefill)
		if err != nil {
			return err
		}
		n.pools = append(n.pools, pPools...)
		d := &dispatchActor{workers: n.prefill, forget: 2 * cfg.ReclaimAfter, log: n.log,
			policy: planPolicy{auth: n.auth, dataPlaneOf: opt.DataPlaneOf},
			ended:  handoff.NewDonePlans(cfg.DonePlansMax, cfg.PrefillTimeout)}
		if cfg.PrefixCachePercent > 0 && cfg.PrefixRouting && len(n.prefill) > 1 {
			fp, g, tenants := model.Fingerprint().String(), cfg.Geometry(), cfg.Tenants
			d.keysOf = func(m *messages.TransferPlan) []kv.PrefixKey {
				prompt := make([]int, len(m.PromptTokens))
				for i, t := range m.PromptTokens {
					prompt[i] = int(t)
				}
				keys, err := handoff.PromptKeys(tenants.Policy().CacheScope(m.Tenant, m.CacheSalt), fp, g, prompt)
				if err != nil {
					return nil // a plan whose scope cannot key: load decides
				}
				return keys
			}
		}
		if n.dispatcher, err = n.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return d },
			actor.WithMailbox(n.MailboxFrom(trust.RoleDecode, trust.RoleAll))), PrefillName); err != nil {
			return err
		}
		self := PrefillPeer{PID: n.dispatcher, Incarnation: cfg.Incarnation, Pages: cfg.PrefillPages}
		pick = func(exclude map[uint64]bool) (PrefillPeer, bool) { return self, !exclude[self.Incarnation] }
	}
	if !cfg.Role.Decodes() {
		return nil
	}
	if pick == nil {
		return fmt.Errorf("actors: a %s node needs a prefill picker (Options.Pick)", cfg.Role)
	}
	dPools, err := workers("decode", cfg.DecodeWorkers, cfg.DecodePages, &n.decode)
	if err != nil {
		return err
	}
	n.pools = append(n.pools, dPools...)
	adm := &admissionActor{cfg: cfg, model: model, log: n.log, counters: n.counters, decode: n.decode, dPools: dPools,
		pick: pick, dataPlane: opt.DataPlane, registry: &n.registry, auth: n.auth, mailbox: n.Mailbox(), streams: n.streams}
	n.admission, err = n.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return adm },
		actor.WithMailbox(n.Mailbox()), actor.WithSupervisor(sup)), AdmissionName)
	return err
}

// AcceptFrames hands a copy of frames the KV data plane received from
// peer (the identity its TLS proved; zero when insecure) to the request
// actor they belong to and waits until it has written them, or refused
// them: it takes frames only from the prefill node it planned with. All
// frames must belong to one request.
func (n *Node) AcceptFrames(peer trust.Identity, frames []kv.Frame) error {
	if len(frames) == 0 {
		return nil
	}
	owner := frames[0].Owner
	for i := range frames {
		if frames[i].Owner != owner {
			err := &kv.WrongOwnerError{Page: frames[i].Dest, Owner: owner.Request, Have: frames[i].Owner.Request}
			n.counters.metrics.integrity.Count(err)
			return err
		}
	}
	pid, ok := n.registry.Load(owner.Request)
	if !ok {
		// No request of that id (any more): late frames of an attempt
		// abandoned for a retry, or forged ones.
		err := &kv.StaleTagError{Page: frames[0].Dest.Index, Have: frames[0].Dest}
		n.counters.metrics.integrity.Count(err)
		return err
	}
	// The payloads alias the data plane's buffer, which is reused once this
	// returns, and this may return (on timeout) before the request actor has
	// read them: the message gets its own copy.
	owned := make([]kv.Frame, len(frames))
	size := 0
	for i := range frames {
		size += len(frames[i].Payload)
	}
	buf := make([]byte, 0, size)
	for i, f := range frames {
		buf = append(buf, f.Payload...)
		f.Payload = buf[len(buf)-len(f.Payload):]
		owned[i] = f
	}
	rep, err := ask[FramesInReply](n.root, pid.(*actor.PID), FramesIn{Peer: peer, Frames: owned}, n.cfg.CallTimeout)
	if err != nil {
		return err
	}
	return rep.Err
}

// PeerLost tells the node that the node run with incarnation inc left or
// died: transfers planned with it retry elsewhere or fail.
func (n *Node) PeerLost(inc uint64) {
	if n.admission != nil {
		n.root.Send(n.admission, PeerLost{Incarnation: inc})
	}
}

// SenderLost tells the node that the router serving protoactor remote at
// addr, last seen alive at since, is gone for good: every request it
// routed here before since is cancelled, as its client's cancel would be,
// so that its pages are freed at once rather than generating for nobody.
// Requests clients sent here themselves, and those routed from addr after
// since (a later run there), stay.
func (n *Node) SenderLost(addr string, since time.Time) {
	if n.admission != nil {
		n.root.Send(n.admission, SenderLost{Address: addr, Since: since})
	}
}

// PagesInUse is how many pages of the node's pools are not free. Every
// worker is asked for its status first: that flushes its mailbox, so every
// ack, cancel and release sent to it before the call has been carried out,
// and every free it caused is queued at its pool ahead of the pool's status
// request. After quiescence it must be zero: a page still in use is leaked.
func (n *Node) PagesInUse() (int, error) {
	for _, w := range n.Workers() {
		if _, err := ask[WorkerStatusReply](n.root, w, WorkerStatus{}, n.cfg.CallTimeout); err != nil {
			return 0, err
		}
	}
	inUse := 0
	for _, p := range n.pools {
		s, err := p.Status(n.root)
		if err != nil {
			return 0, err
		}
		inUse += s.Capacity - s.Available()
	}
	return inUse, nil
}

// Drain stops the node taking new requests and returns what is still in
// flight (see InFlight).
func (n *Node) Drain() (int, error) {
	if n.admission != nil {
		if _, err := ask[AdmissionStatusReply](n.root, n.admission, Drain{}, n.cfg.CallTimeout); err != nil {
			return 0, err
		}
	}
	return n.InFlight()
}

// InFlight is the work the node has in hand: requests admitted here and
// not finished, and transfer plans handed out by its prefill dispatcher and
// not yet acknowledged.
func (n *Node) InFlight() (int, error) {
	total := 0
	if n.admission != nil {
		s, err := n.Status()
		if err != nil {
			return 0, err
		}
		total += s.InFlight
	}
	if n.dispatcher != nil {
		s, err := ask[DispatchStatusReply](n.root, n.dispatcher, DispatchStatus{}, n.cfg.CallTimeout)
		if err != nil {
			return 0, err
		}
		total += s.Outstanding
	}
	return total, nil
}

// Auth is the node's trust authority.
func (n *Node) Auth() *trust.Authority { return n.auth }

// Admission is the PID clients send GenerateRequest to.
func (n *Node) Admission() *actor.PID { return n.admission }

// Address is where protoactor remote serves, or "nonhost" without remote.
func (n *Node) Address() string { return n.sys.Address() }

// Root is the node's root context, for in-process clients and tests.
func (n *Node) Root() *actor.RootContext { return n.root }

// Config is the validated configuration the node runs with (with its
// incarnation drawn).
func (n *Node) Config() Config { return n.cfg }

// Fatal delivers the first invariant failure, if any.
func (n *Node) Fatal() <-chan *InvariantError { return n.fatal }

// Pools are the node's pools, prefill workers' first.
func (n *Node) Pools() []*Pool { return n.pools }

// CacheKeys are the keys of at most max pages its workers' prefix caches
// hold (prefill and decode workers'), the most recently used of each
// worker first, the workers' taken in turn. A worker that does not answer
// in time (a decode worker deep in a step, say) is left out, and named in
// the error, which comes with the others' keys: a summary without its
// keys costs misses, none without any would cost all of them.
func (n *Node) CacheKeys(max int) ([]kv.PrefixKey, error) {
	var each [][]kv.PrefixKey
	var errs error
	for _, w := range slices.Concat(n.prefill, n.decode) {
		keys, err := ask[[]kv.PrefixKey](n.root, w, CacheKeys{Max: max}, n.cfg.CallTimeout)
		errs = errors.Join(errs, err)
		each = append(each, keys)
	}
	var out []kv.PrefixKey
	for i := 0; len(out) < max; i++ {
		taken := false
		for _, keys := range each {
			if i < len(keys) && len(out) < max {
				out, taken = append(out, keys[i]), true
			}
		}
		if !taken {
			break
		}
	}
	return out, errs
}

// Workers are the node's GPU-worker actors, prefill first.
func (n *Node) Workers() []*actor.PID {
	return append(append([]*actor.PID(nil), n.prefill...), n.decode...)
}

// Move moves the request of that number (as operators list it) to the
// decode node to, and returns once the move is over (nil: the request
// moved, and the other node streams the rest) or timeout passed.
func (n *Node) Move(number uint64, to handoff.Peer, timeout time.Duration) error {
	if n.admission == nil {
		return &NotInFlightError{Number: number, Incarnation: n.cfg.Incarnation, Self: n.cfg.Incarnation}
	}
	id := n.counters.requestIDs.Add(1) // a move is named as an attempt is: unique in this run
	res, err := n.root.RequestFuture(n.admission, MoveNumber{Number: number, MoveID: id, To: to}, timeout).Result()
	switch rep := res.(type) {
	case MoveDone:
		return rep.Err
	case *actor.DeadLetterResponse:
		// Admission is gone: the node stops, and its requests with it.
		return &NotInFlightError{Number: number, Incarnation: n.cfg.Incarnation, Self: n.cfg.Incarnation}
	case nil:
		return &NoAnswerError{Call: "MoveNumber to admission", Timeout: timeout, Cause: err}
	}
	return fmt.Errorf("actors: MoveNumber answered %T", res)
}

// Status asks the admission actor for the node's request accounting; a
// node that does not decode has none.
func (n *Node) Status() (AdmissionStatusReply, error) {
	if n.admission == nil {
		return AdmissionStatusReply{}, nil
	}
	return ask[AdmissionStatusReply](n.root, n.admission, AdmissionStatus{}, n.cfg.CallTimeout)
}

// Latencies are the request latencies of the requests this node admitted.
func (n *Node) Latencies() LatenciesSnapshot { return n.counters.latencies.Snapshot() }

// Stop shuts remote (if any) and the actor system down.
func (n *Node) Stop() {
	if n.remote != nil {
		messages.ShutdownRemote(n.sys, n.remote)
	}
	// Only now, with the remote down: page asks that end early make their
	// callers fail and answer peers, which must not start endpoint writers
	// while the remote shuts down (see messages.ShutdownRemote).
	for _, p := range n.pools {
		p.stop()
	}
	n.sys.Shutdown()
	for _, d := range n.dispatchers {
		d.close()
	}
}
