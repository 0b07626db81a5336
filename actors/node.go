package actors

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/messages"
)

// AdmissionName is the name of every node's admission actor: a client
// reaches a node at actor.NewPID(address, AdmissionName).
const AdmissionName = "admission"

// Node is one kvwarden node serving generation disaggregated across its
// own prefill and decode workers: an actor system with one pool (page
// actors and a pool actor) and one GPU-worker actor per worker, and the
// admission actor, optionally reachable through protoactor remote.
type Node struct {
	cfg       Config
	log       *slog.Logger
	sys       *actor.ActorSystem
	root      *actor.RootContext
	remote    *remote.Remote
	admission *actor.PID
	prefill   []*actor.PID
	decode    []*actor.PID
	pools     []*Pool
	counters  *nodeCounters
	fatal     chan *InvariantError
}

// Options are what a node takes besides its Config.
type Options struct {
	// Listen is the host:port protoactor remote serves on ("127.0.0.1:0"
	// picks a port); empty means no remote: in-process clients only.
	Listen string
	// Log receives the node's and protoactor's logs; nil discards them.
	Log *slog.Logger
	// Fatal is called once when an actor breaks an invariant; the node has
	// stopped that actor and must not serve on. Nil means the caller reads
	// Node.Fatal.
	Fatal func(*InvariantError)
}

// Start validates cfg, allocates every pool once and starts the actors.
func Start(cfg Config, opt Options) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Incarnation == 0 {
		var b [8]byte
		if _, err := crand.Read(b[:]); err != nil {
			return nil, err
		}
		cfg.Incarnation = binary.LittleEndian.Uint64(b[:]) | 1
	}
	log := opt.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	engine, err := gpu.NewReferenceEngine(cfg.Model)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: log, counters: &nodeCounters{}, fatal: make(chan *InvariantError, 1)}
	n.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return log }))
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
	if opt.Listen != "" {
		if err := n.startRemote(opt.Listen); err != nil {
			n.sys.Shutdown()
			return nil, err
		}
	}
	if err := n.spawn(engine, sup); err != nil {
		n.Stop()
		return nil, err
	}
	return n, nil
}

// startRemote serves protoactor remote on listen. Remote.Start panics when
// it cannot listen, so the address is tried first.
func (n *Node) startRemote(listen string) error {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("actors: listen address %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return fmt.Errorf("actors: listen port %q must be 0 to 65535", portStr)
	}
	probe, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("actors: cannot listen on %s: %w", listen, err)
	}
	if port == 0 {
		port = probe.Addr().(*net.TCPAddr).Port
	}
	probe.Close()
	n.remote = remote.NewRemote(n.sys, remote.Configure(host, port, messages.RemoteOptions()...))
	n.remote.Start()
	return nil
}

func (n *Node) spawn(engine gpu.Engine, sup actor.SupervisorStrategy) error {
	cfg := &n.cfg
	workers := func(role string, count, pages int, out *[]*actor.PID) ([]*Pool, error) {
		var pools []*Pool
		for i := range count {
			name := fmt.Sprintf("%s-%d", role, i)
			pool, err := spawnPool(n.root, name+"/pool", cfg.pool(pages, cfg.Incarnation), cfg.MailboxMax,
				cfg.CallTimeout, time.Now, n.log)
			if err != nil {
				return nil, err
			}
			w := &workerActor{role: role, engine: engine, pool: pool, limits: cfg.BatchLimits(), batchMax: cfg.BatchMax,
				queueMax: cfg.QueueMax, log: n.log.With("worker", name), stats: &workerCounters{}}
			pid, err := n.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return w },
				actor.WithMailbox(actor.Bounded(cfg.MailboxMax))), name)
			if err != nil {
				return nil, err
			}
			*out = append(*out, pid)
			pools = append(pools, pool)
		}
		return pools, nil
	}
	pPools, err := workers("prefill", cfg.PrefillWorkers, cfg.PrefillPages, &n.prefill)
	if err != nil {
		return err
	}
	dPools, err := workers("decode", cfg.DecodeWorkers, cfg.DecodePages, &n.decode)
	if err != nil {
		return err
	}
	n.pools = append(pPools, dPools...)
	adm := &admissionActor{cfg: cfg, log: n.log, counters: n.counters, prefill: n.prefill, decode: n.decode,
		pPools: pPools, dPools: dPools}
	n.admission, err = n.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return adm },
		actor.WithMailbox(actor.Bounded(cfg.MailboxMax)), actor.WithSupervisor(sup)), AdmissionName)
	return err
}

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

// Workers are the node's GPU-worker actors, prefill first.
func (n *Node) Workers() []*actor.PID { return append(append([]*actor.PID(nil), n.prefill...), n.decode...) }

// Status asks the admission actor for the node's request accounting.
func (n *Node) Status() (AdmissionStatusReply, error) {
	return ask[AdmissionStatusReply](n.root, n.admission, AdmissionStatus{}, n.cfg.CallTimeout)
}

// Stop shuts remote (if any) and the actor system down.
func (n *Node) Stop() {
	if n.remote != nil {
		messages.ShutdownRemote(n.remote)
	}
	n.sys.Shutdown()
}
