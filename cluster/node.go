package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/cluster/dataplane"
	"github.com/kvwarden/kvwarden/cluster/membership"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
	"github.com/kvwarden/kvwarden/trust"
)

// ControlName is the name of every node's control actor, which answers
// StatusRequest, DrainRequest and PressureRequest.
const ControlName = "control"

// drainReplyGrace is how long a drained node waits, after sending its last
// DrainReply, before it stops.
const drainReplyGrace = 200 * time.Millisecond

// NodeConfig is one cluster node: its actors, where it serves, how it
// gossips and how it moves KV.
type NodeConfig struct {
	// Actors configures the node's actors, its Role first. Incarnation is
	// drawn here when zero.
	Actors actors.Config
	// Listen is the host:port protoactor remote serves on; port 0 picks
	// one.
	Listen string
	// DataListen is the host:port of the KV data plane, for roles that
	// hold a pool; port 0 picks one.
	DataListen string
	// Advertise is the host:port peers reach protoactor remote at, when
	// it is not the one Listen binds: a proxy in front of the node forwards
	// it to Listen. Empty means Listen's. Peers' proof of the node's
	// address holds through the proxy, which forwards the TLS handshake to
	// the node.
	Advertise string
	// DataAdvertise is the host:port peers reach the KV data plane at
	// (the one the node's metadata and transfer plans name), when it is not
	// the one DataListen binds. Empty means DataListen's. Only for roles
	// that decode, which have a data plane.
	DataAdvertise string
	// Gossip configures membership; its bind and join addresses say
	// where the node gossips and whom it joins.
	Gossip membership.Config
	// DataPlane configures the KV data plane; its batch limits and
	// incarnation are set from Actors.
	DataPlane dataplane.Config
	// MetaInterval is how often the node republishes its free pages.
	MetaInterval time.Duration
	// DrainTimeout bounds a drain: past it, the node leaves with requests
	// still in flight (they fail with "node lost").
	DrainTimeout time.Duration
	// MovesMax is the most of the node's requests it moves to other decode
	// nodes at once (a drain, node migrate), 1 to MovesMaxLimit: each
	// move pauses its request for the move's span and holds a copy of its
	// pages' bytes on the wire.
	MovesMax int
	// LeaveTimeout bounds the graceful leave of the gossip cluster.
	LeaveTimeout time.Duration
	// LostAfter is how long a member that failure detection declared dead
	// keeps its requests while its remote address does not refuse a
	// connection: a stopped or paused process (whose kernel still
	// completes the handshake) or an unreachable host. It gets no new work
	// meanwhile; if the same run comes back within LostAfter it finishes
	// them, otherwise they fail as "node lost". A member whose address
	// refuses (a crashed process) is lost at once. Below
	// Actors.RequestTimeout, the bound the requests held have anyway; zero
	// means DefaultLostAfter, or half of Actors.RequestTimeout if that is
	// less. The data plane's waits on a silent peer (DialTimeout,
	// WriteTimeout, ReadTimeout, AckTimeout) are raised to at least it.
	LostAfter time.Duration
	// Auth holds the node's credentials for every transport (remote, data
	// plane, gossip); trust.Insecure runs without. Required.
	Auth *trust.Authority
	// Model is what the node serves, shared by its workers; its config
	// must be Actors.Model. Required.
	Model *engine.Model
}

// DefaultLocalNodeConfig is a node of role on loopback with fast timers.
func DefaultLocalNodeConfig(role actors.Role) NodeConfig {
	a := actors.DefaultLocalConfig()
	a.Role = role
	return NodeConfig{
		Actors:       a,
		Listen:       "127.0.0.1:0",
		DataListen:   "127.0.0.1:0",
		Gossip:       membership.DefaultLocalConfig(),
		DataPlane:    dataplane.DefaultLocalConfig(a.Geometry(), 1),
		MetaInterval: 200 * time.Millisecond,
		DrainTimeout: 30 * time.Second,
		MovesMax:     4,
		LeaveTimeout: 2 * time.Second,
	}
}

// DefaultLostAfter is NodeConfig.LostAfter's default: pauses of a few
// seconds to tens of seconds are ridden out, while a member dead behind a
// partition delays its requests' failure by at most this long.
const DefaultLostAfter = 20 * time.Second

// lostAfter is LostAfter, or its default when zero.
func (c *NodeConfig) lostAfter() time.Duration {
	if c.LostAfter > 0 {
		return c.LostAfter
	}
	return min(DefaultLostAfter, c.Actors.RequestTimeout/2)
}

// holdsPool says whether the role keeps KV pages.
func holdsPool(r actors.Role) bool { return r != actors.RoleRouter }

// Validate reports the first field out of range, with its value.
func (c *NodeConfig) Validate() error {
	if err := c.Actors.Validate(); err != nil {
		return err
	}
	// Without Auth (which StartNode requires) the rest of the gossip
	// settings are still checked, so that a caller can validate its
	// configuration before it has loaded credentials.
	gossip := c.Gossip
	if c.Auth != nil {
		gossip = gossip.Secured(c.Auth)
	} else {
		gossip.Insecure = true
	}
	if err := gossip.Validate(); err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"MetaInterval", c.MetaInterval}, {"DrainTimeout", c.DrainTimeout}, {"LeaveTimeout", c.LeaveTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("cluster: %s (%s) must be positive", d.name, d.v)
		}
	}
	if c.MovesMax < 1 || c.MovesMax > MovesMaxLimit {
		return fmt.Errorf("cluster: MovesMax (%d) must be in [1, %d]", c.MovesMax, MovesMaxLimit)
	}
	if c.LostAfter < 0 || c.LostAfter >= c.Actors.RequestTimeout {
		return fmt.Errorf("cluster: LostAfter (%s) must be in [0, the request timeout (%s)): a request held longer would time out first",
			c.LostAfter, c.Actors.RequestTimeout)
	}
	if c.lostAfter() <= 0 {
		return fmt.Errorf("cluster: LostAfter (0) means half the request timeout (%s), which is zero: set LostAfter, or a longer request timeout",
			c.Actors.RequestTimeout)
	}
	if holdsPool(c.Actors.Role) {
		if err := c.dataPlane().Validate(); err != nil {
			return err
		}
	}
	return c.validateAdvertised()
}

// validateAdvertised checks the advertised addresses as membership will:
// no wildcard host, no port 0; a data plane only where there is one.
func (c *NodeConfig) validateAdvertised() error {
	if err := membership.CheckAddr("Advertise", c.Advertise, false); err != nil {
		return err
	}
	if err := membership.CheckAddr("DataAdvertise", c.DataAdvertise, false); err != nil {
		return err
	}
	if c.DataAdvertise != "" && !c.Actors.Role.Decodes() {
		return fmt.Errorf("cluster: DataAdvertise (%q) names a data plane, which a %s node does not have", c.DataAdvertise, c.Actors.Role)
	}
	return nil
}

// dataPlane is the data-plane configuration with the actors' batch limits
// and incarnation, so that every node of one model frames alike, and the
// node's credentials.
func (c *NodeConfig) dataPlane() dataplane.Config {
	d := c.DataPlane
	d.Auth = c.Auth
	if d.Auth == nil {
		d.Auth = trust.Insecure(nil) // validated before credentials are loaded; StartNode requires them
	}
	d.Batch = c.Actors.BatchLimits()
	// A peer silent for less than LostAfter may be stalled, not dead: no
	// wait on it gives up sooner, or a transfer would fail for a pause
	// that the requests are held through.
	lost := c.lostAfter()
	d.DialTimeout, d.WriteTimeout = max(d.DialTimeout, lost), max(d.WriteTimeout, lost)
	d.ReadTimeout, d.AckTimeout = max(d.ReadTimeout, lost), max(d.AckTimeout, lost)
	d.Incarnation = c.Actors.Incarnation
	if d.Incarnation == 0 {
		d.Incarnation = 1 // validated before the incarnation is drawn
	}
	d.Model = engine.Fingerprint{1} // validated before the model is loaded; StartNode requires it
	if c.Model != nil {
		d.Model = c.Model.Fingerprint()
	}
	return d
}

// A status names the model as engine.Model.Name does, and every message
// spells a fingerprint as engine.Fingerprint.String does.
var (
	_ [messages.NodeNameBytesMax - engine.ModelNameBytesMax]struct{}
	_ [engine.ModelNameBytesMax - messages.NodeNameBytesMax]struct{}
	_ [messages.FingerprintDigits - 2*len(engine.Fingerprint{})]struct{}
	_ [2*len(engine.Fingerprint{}) - messages.FingerprintDigits]struct{}
)

var roleOf = map[actors.Role]Role{
	actors.RolePrefill: RolePrefill, actors.RoleDecode: RoleDecode,
	actors.RoleRouter: RoleRouter, actors.RoleAll: RoleAll,
}

// Node is one member of a kvwarden cluster: its actors (workers, pools,
// admission or router), its membership, its KV data plane and its control
// actor.
type Node struct {
	cfg    NodeConfig
	log    *slog.Logger
	actors *actors.Node
	// members is set once, after the actors start (which may ask it
	// before: it is nil until then).
	members atomic.Pointer[membership.Membership]
	// holding is the members missing with their requests held, as last
	// seen alive; the watch loop sets it.
	holding atomic.Pointer[[]Member]
	data    *dataplane.Server
	// dataAddr is where peers reach the data plane: DataAdvertise, or the
	// address it listens on; "" without one.
	dataAddr string
	router   *actor.PID
	rc       *routerCounters
	held     pressureHolds // pages pool pressure holds (chaos builds only)

	mu       sync.Mutex
	metaMu   sync.Mutex
	draining bool
	stopped  chan struct{} // closed when the node has left after a drain
	stopOnce sync.Once
	downOnce sync.Once
	bg       sync.WaitGroup
	quit     chan struct{}
}

// StartNode validates cfg, allocates the node's pools, starts its actors,
// data plane and membership, and joins the cluster at cfg.Gossip.JoinAddrs.
func StartNode(cfg NodeConfig, log *slog.Logger) (*Node, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Auth == nil {
		return nil, errors.New("cluster: NodeConfig.Auth is required (trust.Insecure runs without credentials)")
	}
	if cfg.Model == nil {
		return nil, errors.New("cluster: NodeConfig.Model is required: the model the node serves (engine.BuiltinModel or engine.LoadModel)")
	}
	if err := cfg.Actors.DrawIncarnation(); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: log, rc: &routerCounters{}, stopped: make(chan struct{}), quit: make(chan struct{})}
	if err := n.start(); err != nil {
		n.shutdown()
		return nil, err
	}
	return n, nil
}

func (n *Node) start() error {
	cfg := &n.cfg
	dp := cfg.dataPlane()
	dp.Logger = n.log
	opt := actors.Options{Model: cfg.Model, Listen: cfg.Listen, Advertise: cfg.Advertise, Log: n.log, Pick: n.pickPrefill, Auth: cfg.Auth,
		Dial:        func(addr string, inc uint64) (actors.FrameSender, error) { return n.dialPlanned(dp, addr, inc) },
		DataPlaneOf: n.dataPlaneOf}
	if holdsPool(cfg.Actors.Role) && cfg.Actors.Role.Decodes() {
		// The data plane starts before the actors so that plans can name
		// it; its handler reaches the actors once they exist.
		var err error
		n.data, err = dataplane.Listen(dp, cfg.DataListen, func(b dataplane.Batch) error {
			return n.actors.AcceptFrames(b.Peer, b.Frames)
		})
		if err != nil {
			return err
		}
		n.dataAddr = n.data.Addr().String()
		if cfg.DataAdvertise != "" {
			n.dataAddr = cfg.DataAdvertise
		}
		opt.DataPlane = n.dataAddr
	}
	var err error
	if n.actors, err = actors.Start(cfg.Actors, opt); err != nil {
		return err
	}
	// Membership exists before the router and the control actor, which
	// read it from their first message on; the node joins (and so becomes
	// known) only once both serve.
	meta := membership.Meta{Role: roleOf[cfg.Actors.Role], Incarnation: cfg.Actors.Incarnation, RemoteAddr: n.actors.Address(),
		DataAddr: n.dataAddr, Model: n.actors.Model().Fingerprint()}
	meta.CapacityPages, meta.FreePages = n.pages()
	mem, err := membership.Start(cfg.Gossip.Secured(cfg.Auth), meta)
	if err != nil {
		return err
	}
	n.members.Store(mem)
	if cfg.Actors.Role == actors.RoleRouter {
		r := &routerActor{cfg: &n.cfg.Actors, model: n.actors.Model(), members: n.membersNow, draining: n.isDraining, log: n.log, counters: n.rc,
			auth: cfg.Auth, mailbox: n.actors.Mailbox(), streams: n.actors.Streams()}
		// A relay that panics is stopped, never restarted: a restart would
		// send its request to the decode node a second time.
		stop := actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive { return actor.StopDirective })
		if n.router, err = n.actors.Root().SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return r },
			actor.WithMailbox(n.actors.Mailbox()), actor.WithSupervisor(stop)), actors.AdmissionName); err != nil {
			return err
		}
	}
	if cfg.Actors.Role == actors.RolePrefill {
		// Where a client looks for admission on a prefill node, it is told
		// at once that it came to the wrong node, rather than waiting out
		// its silence bound.
		refuser := &notAdmission{role: cfg.Actors.Role, log: n.log}
		if _, err = n.actors.Root().SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return refuser },
			actor.WithMailbox(n.actors.Mailbox())), actors.AdmissionName); err != nil {
			return err
		}
	}
	ctl := &controlActor{node: n}
	if _, err = n.actors.Root().SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return ctl },
		actor.WithMailbox(n.actors.MailboxFrom(trust.RoleOperator, trust.RoleRouter))), ControlName); err != nil {
		return err
	}
	if len(cfg.Gossip.JoinAddrs) > 0 {
		if _, err := n.mem().Join(cfg.Gossip.JoinAddrs); err != nil {
			return fmt.Errorf("cluster: join %v: %w", cfg.Gossip.JoinAddrs, err)
		}
	}
	n.bg.Add(2)
	go n.watch()
	go n.publish()
	return nil
}

// mem is the node's membership; nil until it has started.
func (n *Node) mem() *membership.Membership { return n.members.Load() }

// isDraining says whether the node is draining.
func (n *Node) isDraining() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.draining
}

// cacheSummaries is how many nodes' cache summaries the node's
// router has taken.
func (n *Node) cacheSummaries() uint64 { return n.rc.summaries.Load() }

// decodeCaches is how many decode nodes the node's router knows keep a
// prefix cache.
func (n *Node) decodeCaches() int { return int(n.rc.decodeCaches.Load()) }

// membersNow is the membership as of now; the router reads it per request.
func (n *Node) membersNow() []Member { return n.mem().Members() }

// pickPrefill chooses the alive, non-draining prefill member with the most
// free pages that the request has not failed on yet.
func (n *Node) pickPrefill(exclude map[uint64]bool) (actors.PrefillPeer, bool) {
	mem := n.mem()
	if mem == nil {
		return actors.PrefillPeer{}, false
	}
	for _, m := range candidates(mem.Members(), prefills, n.actors.Model().Fingerprint()) {
		if !exclude[m.Meta.Incarnation] {
			return actors.PrefillPeer{PID: actor.NewPID(m.Meta.RemoteAddr, actors.PrefillName),
				Incarnation: m.Meta.Incarnation, Pages: int(m.Meta.CapacityPages)}, true
		}
	}
	return actors.PrefillPeer{}, false
}

// dataPlaneOf is the data plane that the alive, verified member serving
// protoactor remote at remoteAddr advertises, and who serves there: the
// only place a plan from that member may have KV sent
// (actors.Options.DataPlaneOf).
func (n *Node) dataPlaneOf(remoteAddr string) (string, trust.Identity, bool) {
	m, ok := n.verifiedMember(func(m Member) bool { return m.Meta.RemoteAddr == remoteAddr })
	if !ok {
		return "", trust.Identity{}, false
	}
	var id trust.Identity
	if !n.cfg.Auth.Insecure() {
		id = m.Identity(n.cfg.Auth.Self().Cluster) // what verification proved at both its addresses
	}
	return m.Meta.DataAddr, id, true
}

// logEvent logs a membership change an operator wants to see: a member
// joined, left or failed (and why); metadata updates only at debug. A
// return after a failure or a leave is logged by the watch loop, which
// knows how long the member was missing (carryOut, on absences'
// backMember).
func (n *Node) logEvent(ev membership.Event, returning bool) {
	m := ev.Member
	attrs := memberAttrs(m)
	switch ev.Kind {
	case membership.EventJoin:
		if !returning {
			n.log.Info("member joined", attrs...)
		}
	case membership.EventLeave:
		n.log.Info("member left", attrs...)
	case membership.EventFail:
		n.log.Warn("member failed", append(attrs, "reason", cmp.Or(ev.Reason, "failure detection"))...)
	default:
		n.log.Debug("member updated", append(attrs, "free_pages", m.Meta.FreePages, "draining", m.Meta.Draining)...)
	}
}

func memberAttrs(m Member) []any {
	return []any{"name", m.Name, "role", m.Meta.Role.String(), "incarnation", fmt.Sprintf("%016x", m.Meta.Incarnation),
		"address", m.Meta.RemoteAddr}
}

// pages is the capacity of the node's smallest pool and the fewest free
// pages of any of its pools: the bottleneck a router admits and balances
// against.
func (n *Node) pages() (capacity, free uint32) {
	if n.actors == nil {
		return 0, 0
	}
	first := true
	for _, p := range n.actors.Pools() {
		s, err := p.Status(n.actors.Root())
		if err != nil {
			continue
		}
		if first || uint32(s.Capacity) < capacity {
			capacity = uint32(s.Capacity)
		}
		if first || uint32(s.Available()) < free {
			free = uint32(s.Available())
		}
		first = false
	}
	return capacity, free
}

// watch tells the actors which peers are gone for good. A member that
// membership stops listing (failure detection declared it dead) is
// missing, and absences decides from dials of its remote address whether
// it crashed (lost at once) or stalls (its requests held for LostAfter,
// so that a member that comes back finishes them); one that left or was
// superseded is lost at once. Every event, probe result and MetaInterval
// triggers a fresh look at Members, so that an event the full channel
// dropped (membership drops rather than stall memberlist) is caught up at
// the next tick.
func (n *Node) watch() {
	defer n.bg.Done()
	t := time.NewTicker(n.cfg.MetaInterval)
	defer t.Stop()
	away := newAbsences(n.cfg.lostAfter(), reprobeEvery, lostRemembered)
	probes := make(chan probeResult)
	for {
		var effects []absenceEffect
		select {
		case <-n.quit:
			return
		case ev, ok := <-n.mem().Events():
			if !ok {
				return
			}
			n.logEvent(ev, away.Returning(ev.Member.Meta.Incarnation))
			if why := goneForCertain(ev); why != "" {
				effects = away.Gone(ev.Member.Meta.Incarnation, why, time.Now())
			}
		case p := <-probes:
			effects = away.Probed(p.incarnation, p.reach, time.Now())
		case <-t.C:
		}
		ms := n.mem().Members()
		now := time.Now()
		effects = append(append(effects, away.Alive(ms, now)...), away.Tick(now)...)
		for _, e := range effects {
			n.carryOut(e, ms, probes)
		}
		if len(effects) > 0 {
			held := away.Held()
			n.holding.Store(&held)
		}
	}
}

// reprobeEvery is how often a missing member's remote address is dialled
// again while its requests are held: a stalled process killed meanwhile
// is found lost within about this long.
const reprobeEvery = time.Second

// lostRemembered is how long a member lost for good is remembered, so
// that its return is logged as one.
const lostRemembered = time.Hour

// goneForCertain is why ev ends its member for certain, or "" when it
// does not: a leave, or a failure that failure detection did not decide
// (a later run took one of its addresses, its metadata can no longer be
// read). A member declared dead by failure detection may only stall.
func goneForCertain(ev membership.Event) string {
	switch {
	case ev.Kind == membership.EventLeave:
		return "it left the cluster"
	case ev.Kind == membership.EventFail && ev.Reason != "":
		return ev.Reason
	}
	return ""
}

// probeResult is what one dial of a missing member found.
type probeResult struct {
	incarnation uint64
	reach       reach
}

// carryOut does what absences decided; ms are the members alive now.
func (n *Node) carryOut(e absenceEffect, ms []Member, probes chan<- probeResult) {
	switch e := e.(type) {
	case probeMember:
		n.bg.Add(1)
		go func() {
			defer n.bg.Done()
			r := probeResult{incarnation: e.Incarnation, reach: dialReach(e.Addr, n.cfg.Gossip.TCPTimeout, n.quit)}
			select {
			case probes <- r:
			case <-n.quit:
			}
		}()
	case heldMember:
		n.log.Warn("member missing; its requests are held", append(memberAttrs(e.Member), "probe", e.Reach.String(),
			"lost_after", n.cfg.lostAfter(), "until", e.Until.Format(time.RFC3339Nano))...)
	case backMember:
		n.log.Info("member came back", append(memberAttrs(e.Member), "away", e.Away.Round(time.Millisecond),
			"verified", e.Member.Verified, "requests_given_up", e.WasLost)...)
	case lostMember:
		inc := e.Member.Meta.Incarnation
		n.log.Warn("member lost", append(memberAttrs(e.Member), "away", e.Away.Round(time.Millisecond), "why", e.Why)...)
		n.actors.PeerLost(inc)
		if n.router != nil {
			n.actors.Root().Send(n.router, memberLost{incarnation: inc})
		}
		if lostRouter(e, ms) {
			// Nobody will read what this node sends the lost router's
			// relays: the requests it routed are cancelled, freeing their
			// pages.
			n.actors.SenderLost(e.Member.Meta.RemoteAddr, e.Since)
		}
	}
}

// lostRouter says whether e lost a router whose requests are to be
// cancelled: one whose address no alive member serves now (a later run
// there routes requests of its own, which stay; so do those routed from
// there after e.Since, which actors.Node.SenderLost leaves). e's member
// was verified (absences tracks no other): anyone holding the gossip key
// may announce a router at any address, a tenant's for one, and let it
// die.
func lostRouter(e lostMember, ms []Member) bool {
	addr := e.Member.Meta.RemoteAddr
	return e.Member.Meta.Role == RoleRouter &&
		!slices.ContainsFunc(ms, func(m Member) bool { return m.State == StateAlive && m.Meta.RemoteAddr == addr })
}

// dialReach dials addr (a member's protoactor remote address) once,
// within timeout or until quit closes: a refusal means the process is
// gone; a completed handshake, that it holds its port (it lives, maybe
// stopped); anything else, that it cannot be told.
func dialReach(addr string, timeout time.Duration, quit <-chan struct{}) reach {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() {
		select {
		case <-quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	switch {
	case err == nil:
		conn.Close()
		return reachAnswered
	case errors.Is(err, syscall.ECONNREFUSED):
		return reachRefused
	}
	return reachSilent
}

// publish republishes the node's free pages every MetaInterval, so that
// routers balance on current figures.
func (n *Node) publish() {
	defer n.bg.Done()
	t := time.NewTicker(n.cfg.MetaInterval)
	defer t.Stop()
	for {
		select {
		case <-n.quit:
			return
		case <-t.C:
			n.updateMeta()
		}
	}
}

func (n *Node) updateMeta() {
	// One update at a time: a tick that read "not draining" must not
	// publish after the drain published "draining".
	n.metaMu.Lock()
	defer n.metaMu.Unlock()
	meta := n.mem().Meta()
	meta.CapacityPages, meta.FreePages = n.pages()
	meta.Draining = n.isDraining()
	if meta != n.mem().Meta() {
		if err := n.mem().UpdateMeta(meta); err != nil {
			n.log.Warn("metadata update failed", "err", err)
		}
	}
}

// Address is where peers reach the node's actors over protoactor remote:
// Advertise, or the address it listens on.
func (n *Node) Address() string { return n.actors.Address() }

// DataAddr is where peers reach the node's KV data plane: DataAdvertise,
// or the address it listens on; "" when the node has none.
func (n *Node) DataAddr() string { return n.dataAddr }

// GossipAddr is where the node gossips: what others join.
func (n *Node) GossipAddr() string { return n.mem().LocalAddr().String() }

// Incarnation is this run's id.
func (n *Node) Incarnation() uint64 { return n.cfg.Actors.Incarnation }

// Actors is the node's actor layer.
func (n *Node) Actors() *actors.Node { return n.actors }

// Members is the membership as this node sees it.
func (n *Node) Members() []Member { return n.mem().Members() }

// Stopped is closed when the node has drained and left.
func (n *Node) Stopped() <-chan struct{} { return n.stopped }

// Drain stops new work coming to the node (its metadata says draining,
// so routers skip it, and its admission takes only requests a router sent
// before it saw the flag), waits until what it has in flight is done or
// DrainTimeout passes, then leaves the cluster gracefully and stops. It
// returns what was still in flight when it left.
func (n *Node) Drain() (int, error) {
	left, err := n.drainWait(time.Now().Add(n.cfg.DrainTimeout))
	if err != nil {
		return left, err
	}
	return left, n.Stop()
}

// drainWait is Drain up to the leave. The node is done when it has had
// nothing in flight across drainSettle MetaIntervals: long enough for every
// router to have seen the draining flag, so that no request is on its way
// when the node leaves. An error asking the actors is retried, not taken
// for "done". Past deadline the node leaves with what it has.
func (n *Node) drainWait(deadline time.Time) (int, error) {
	n.startDraining()
	tick := time.NewTicker(n.cfg.MetaInterval)
	defer tick.Stop()
	idle := 0
	for {
		inflight, err := n.inFlight()
		switch {
		case err != nil:
			n.log.Warn("drain: asking what is in flight", "err", err)
			idle = 0
		case inflight > 0:
			idle = 0
		default:
			idle++
		}
		if idle > drainSettle {
			return 0, nil
		}
		if time.Now().After(deadline) {
			return inflight, err
		}
		select {
		case <-tick.C:
		case <-n.stopped:
			return inflight, nil
		}
	}
}

// startDraining has the node say it drains: routers send it nothing more.
func (n *Node) startDraining() {
	n.mu.Lock()
	n.draining = true
	n.mu.Unlock()
	n.updateMeta()
}

// drainSettle is how many MetaIntervals a draining node must have nothing
// in flight before it leaves.
const drainSettle = 3

// inFlight is what the node has in hand: its actors' requests and plans,
// and the requests its router is relaying.
func (n *Node) inFlight() (int, error) {
	total, err := n.actors.Drain()
	return total + int(n.rc.inFlight()), err
}

// Stop leaves the cluster gracefully and stops everything, without
// waiting for work in flight.
func (n *Node) Stop() error {
	var err error
	n.stopOnce.Do(func() {
		if n.mem() != nil {
			err = n.mem().Leave(n.cfg.LeaveTimeout)
		}
		n.shutdown()
		close(n.stopped)
	})
	return err
}

// shutdown stops everything at once, without leaving: to the others it
// looks like a crash. It runs once.
func (n *Node) shutdown() {
	n.downOnce.Do(n.down)
}

func (n *Node) down() {
	close(n.quit)
	n.bg.Wait()
	n.held.stop()
	var errs []error
	if n.mem() != nil {
		errs = append(errs, n.mem().Shutdown())
	}
	if n.data != nil {
		errs = append(errs, n.data.Close())
	}
	if n.actors != nil {
		n.actors.Stop()
	}
	if err := errors.Join(errs...); err != nil {
		n.log.Warn("shutdown", "err", err)
	}
}

// Status is what "node status" shows of the node: its counters, pools,
// model and the members it sees. It asks the node's actors, so it takes a
// few messages' time.
func (n *Node) Status() *messages.StatusReply { return n.status() }

// RuntimeLog counts protoactor's own log records (actors.Node.RuntimeLog).
func (n *Node) RuntimeLog() *messages.RuntimeLogCounts { return n.actors.RuntimeLog() }

// Metrics are the node's operational counters (actors.Node.Metrics), with
// its router's refusals by bound, retries, relayed tokens and requests
// waiting, and what its data plane's checks refused (a frame for another
// incarnation of the node, a checksum that does not match, a malformed
// frame or batch, a hello of another model) among the integrity refusals.
func (n *Node) Metrics() actors.Metrics {
	m := n.actors.Metrics()
	m.RejectedBy = messages.SumCounts(m.RejectedBy, n.rc.rejectedBy.Counts())
	m.RetriedRoutes, m.StreamsMoved = n.rc.retried.Load(), n.rc.moved.Load()
	m.RelayedTokens, m.RoutedWaiting = n.rc.latencies.Tokens(), uint32(n.rc.waiting.Load())
	if n.data != nil {
		s := n.data.Stats()
		for _, c := range []struct {
			r actors.IntegrityReason
			n uint64
		}{{actors.IntegrityStaleTag, s.RefusedWrongIncarnation}, {actors.IntegrityChecksum, s.MalformedChecksum},
			{actors.IntegrityFrame, s.MalformedOther}, {actors.IntegrityFingerprint, s.RefusedHelloModel}} {
			m.Integrity[c.r] += c.n
		}
	}
	return m
}

// Latencies are the node's request latencies: of the requests it
// admitted and, a router, relayed.
func (n *Node) Latencies() actors.LatenciesSnapshot {
	return n.actors.Latencies().Add(n.rc.latencies.Snapshot())
}

// Ready says whether the node should get work, and otherwise why: it is
// draining or stopped, or a pool of its own does not answer, or it sees no
// member of a role it needs (a router or a decode node without a prefill
// node, a router without a decode node, of its own model).
func (n *Node) Ready() error {
	select {
	case <-n.quit:
		return errors.New("cluster: the node is stopping")
	default:
	}
	if n.isDraining() {
		return errors.New("cluster: the node is draining")
	}
	for _, p := range n.actors.Pools() {
		if _, err := p.Status(n.actors.Root()); err != nil {
			return fmt.Errorf("cluster: pool %s does not answer: %w", p.PID.Id, err)
		}
	}
	role, fp := n.cfg.Actors.Role, n.actors.Model().Fingerprint()
	ms := n.mem().Members()
	if (role == actors.RoleRouter || role == actors.RoleDecode) && len(candidates(ms, prefills, fp)) == 0 {
		return fmt.Errorf("cluster: no prefill node of model %s is alive and verified", fp.Short())
	}
	if role == actors.RoleRouter && len(candidates(ms, decodes, fp)) == 0 {
		return fmt.Errorf("cluster: no decode node of model %s is alive and verified", fp.Short())
	}
	return nil
}

// tenantsStatus is status's account of the shares of p, with active
// tenants held to them now.
func tenantsStatus(p *tenancy.Policy, active int) *messages.TenantsStatus {
	return &messages.TenantsStatus{Named: uint32(len(p.Tenants)), DefaultWeight: uint32(p.Default.Weight),
		DefaultConcurrentMax: uint32(p.Default.ConcurrentMax), DefaultPagesMax: uint32(p.Default.PagesMax),
		DefaultPoolPercentMax: uint32(p.Default.PoolPercentMax), Active: uint32(active)}
}

func (n *Node) status() *messages.StatusReply {
	a, aerr := n.actors.Status()
	n.mu.Lock()
	draining := n.draining
	n.mu.Unlock()
	rep := &messages.StatusReply{Node: messages.NodeStatus{
		Name: n.mem().Name(), Role: string(n.cfg.Actors.Role), Incarnation: n.Incarnation(),
		Address: n.Address(), Draining: draining, InFlight: uint32(a.InFlight) + n.rc.inFlight(),
		Admitted: a.Admitted + n.rc.routed.Load(), Completed: a.Completed + n.rc.completed.Load(),
		Failed:          a.Failed + n.rc.failed.Load() + n.rc.lost.Load(),
		RejectedTooLong: a.RejectedTooLong + n.rc.rejectedTooLong.Load(),
		RejectedBusy:    a.RejectedBusy + n.rc.rejectedBusy.Load(),
		Model:           n.actors.Model().Name(), ModelFingerprint: n.actors.Model().Fingerprint().String(),
		FailedByCode: messages.SumCounts(a.FailedByCode, n.rc.failedBy.Counts())}}
	n.statusMetrics(&rep.Node)
	if n.cfg.Actors.Role.Decodes() && aerr == nil { // none, rather than zeros, when the admission did not answer
		p := a.Phases
		rep.Node.FirstToken = &messages.FirstTokenStatus{Requests: p.Count, QueueNs: uint64(p.Queue),
			PrefillNs: uint64(p.Prefill), TransferNs: uint64(p.Transfer), VerifyNs: uint64(p.Verify),
			Decoded: p.Decoded, FirstDecodeNs: uint64(p.FirstDecode)}
	}
	if role := n.cfg.Actors.Role; role != actors.RolePrefill {
		rep.Node.Tenants = tenantsStatus(n.cfg.Actors.Tenants.Policy(), a.Tenants+int(n.rc.tenants.Load()))
	}
	rep.Node.DataPlane = n.dataAddr
	auth := n.cfg.Auth
	rep.Node.Insecure = auth.Insecure()
	if !rep.Node.Insecure {
		rep.Node.Identity = auth.Self().URI()
	}
	refused := auth.Refused()
	rep.Node.Refused = refused[:]
	// The faults of the process the node runs in: one process, one node,
	// outside tests.
	rep.Node.Chaos = faults.Available
	if in := faults.Current(); in != nil {
		counts := in.Counts()
		rep.Node.Faults, rep.Node.FaultCounts = in.Spec().String(), counts[:]
	}
	for _, p := range n.actors.Pools() {
		if s, err := p.Status(n.actors.Root()); err == nil && len(rep.Node.Pools) < messages.PoolsMax {
			ps := messages.PoolStatus{Name: p.PID.Id, Capacity: uint32(s.Capacity), Free: uint32(s.Free),
				CrossTenantRows: s.Cross.Tenant, CrossRequestRows: s.Cross.Request}
			if c := s.Cache; c != nil {
				ps.CachePages, ps.CachePagesMax = uint32(s.Cached()), uint32(c.PagesMax)
				ps.CacheQueries, ps.CacheQueryTokens, ps.CacheHitTokens = c.Queries, c.QueryTokens, c.HitTokens
				ps.CachePublished, ps.CacheEvicted, ps.CacheGone = c.Published, c.Evicted, c.Gone
			}
			rep.Node.Pools = append(rep.Node.Pools, ps)
		}
	}
	for _, m := range n.mem().Members() {
		if len(rep.Members) == messages.MembersMax {
			break
		}
		rep.Members = append(rep.Members, messages.MemberStatus{Name: m.Name, Role: m.Meta.Role.String(),
			Incarnation: m.Meta.Incarnation, Address: m.Meta.RemoteAddr, DataPlane: m.Meta.DataAddr,
			State: m.State.String(), CapacityPages: m.Meta.CapacityPages, FreePages: m.Meta.FreePages,
			Draining: m.Meta.Draining, Verified: m.Verified, Model: m.Meta.Model.String(),
			Unverified: strings.ToValidUTF8(m.Unverified[:min(len(m.Unverified), messages.UnverifiedBytesMax)], "")})
	}
	return rep
}

// statusMetrics puts the node's operational counters (Metrics) in s: a
// transfer side only where the role has it.
func (n *Node) statusMetrics(s *messages.NodeStatus) {
	m := n.Metrics()
	s.WaitingPages, s.WaitingKV, s.Running = m.WaitingPages, m.WaitingKV, m.Running
	s.PrefillQueued, s.PrefillInFlight = m.PrefillQueued, m.PrefillInFlight
	s.RejectedBy, s.Integrity = m.RejectedBy, m.Integrity
	s.TokensOut = m.GenerationTokens + m.RelayedTokens
	s.MovedOut, s.MovedIn, s.StreamsMoved = m.MovedOut, m.MovedIn, m.StreamsMoved
	if n.cfg.Actors.Role.Prefills() {
		s.KVSent = m.Sent.Status()
	}
	if n.cfg.Actors.Role.Decodes() {
		s.KVReceived = m.Received.Status()
	}
}

// controlActor answers routers' CacheSummaryRequest with what the node's
// prefix caches hold, and operators: StatusRequest with the node's status,
// DrainRequest by draining the node (answering at once, or when done if
// asked to wait), PressureRequest by holding pages of the node's pools
// (in a chaos build; others answer with an error), ListInFlight and
// CancelInFlight through the actor that holds the node's requests in
// flight (inFlight).
type controlActor struct{ node *Node }

func (c *controlActor) Receive(ctx actor.Context) {
	var sender trust.Sender
	switch ctx.Message().(type) {
	case *messages.StatusRequest, *messages.DrainRequest, *messages.PressureRequest, *messages.ListInFlight,
		*messages.CancelInFlight, *messages.MigrateRequest:
		// Only operators (and this process) may ask: a refusal is counted
		// and not answered, so the asker learns nothing.
		if sender = c.node.cfg.Auth.Of(ctx); !sender.May(trust.RoleOperator) {
			c.node.cfg.Auth.Refuse(trust.RefusedRole, fmt.Sprintf("%T", ctx.Message()), "sender", sender.String())
			return
		}
	case *messages.CacheSummaryRequest:
		// Routers route by it; anyone else is refused, counted and not
		// answered.
		if sender = c.node.cfg.Auth.Of(ctx); !sender.May(trust.RoleRouter) {
			c.node.cfg.Auth.Refuse(trust.RefusedRole, "cache summary request", "sender", sender.String())
			return
		}
	}
	switch m := ctx.Message().(type) {
	case *messages.ListInFlight:
		c.inFlight(ctx, actors.ListRequests{Max: m.Max()}, &messages.InFlightList{Incarnation: c.node.Incarnation()})
	case *messages.CancelInFlight:
		inc := c.node.Incarnation()
		none := &messages.CancelInFlightReply{Err: handoff.Wire(&actors.NotInFlightError{Number: m.Number,
			Incarnation: m.Incarnation, Self: inc})}
		if m.Incarnation != inc {
			c.respond(ctx, none)
			return
		}
		c.inFlight(ctx, actors.CancelNumber{Number: m.Number, By: sender.String()}, none)
	case *messages.CacheSummaryRequest:
		if ctx.Sender() == nil {
			return // nobody to answer
		}
		keys, err := c.node.actors.CacheKeys(messages.CacheSummaryKeysMax)
		if err != nil {
			c.node.log.Warn("cache summary without the keys of a worker that did not answer", "err", err)
		}
		// Sent as the control actor, so that the router can tell whose
		// summary it is.
		a := c.node.cfg.Actors
		sum := &messages.CacheSummary{Incarnation: c.node.Incarnation(), Keys: keys,
			DecodeCache: a.Role.Decodes() && a.DecodeCachePercent > 0}
		if err := messages.SendFrom(ctx, ctx.Sender(), sum); err != nil {
			c.node.log.Error("cache summary refused by its own validation", "err", err)
		}
	case *messages.StatusRequest:
		if err := messages.Respond(ctx, c.node.status()); err != nil {
			c.node.log.Error("status refused by its own validation", "err", err)
		}
	case *messages.PressureRequest:
		if err := messages.Respond(ctx, c.node.pressure(m)); err != nil {
			c.node.log.Error("pressure reply refused by its own validation", "err", err)
		}
	case *messages.MigrateRequest:
		// The moves take a while: answered from a goroutine of their own.
		by, asker, root := sender.String(), ctx.Sender(), c.node.actors.Root()
		go func() {
			moved, stayed, why := 0, 1, error(&actors.NotInFlightError{Number: m.Number, Incarnation: m.Incarnation,
				Self: c.node.Incarnation()})
			if m.Incarnation == 0 || m.Incarnation == c.node.Incarnation() {
				moved, stayed, why = c.node.moveAway(m.Number, time.Now().Add(c.node.cfg.DrainTimeout))
			}
			rep := &messages.MigrateReply{Moved: uint32(moved), Stayed: uint32(stayed)}
			if why != nil && stayed > 0 {
				rep.Err = handoff.Wire(why)
			}
			c.node.log.Info("requests moved away", "moved", moved, "stayed", stayed, "why", why, "operator", by)
			if asker != nil {
				if err := messages.Send(root, asker, rep); err != nil {
					c.node.log.Error("migrate reply refused by its own validation", "err", err)
				}
			}
		}()
	case *messages.DrainRequest:
		inflight, err := c.node.actors.Drain()
		if err != nil {
			c.node.log.Error("drain", "err", err)
		}
		if !m.Wait {
			_ = messages.Respond(ctx, &messages.DrainReply{InFlight: uint32(inflight)})
		}
		sender, root := ctx.Sender(), c.node.actors.Root()
		deadline := time.Now().Add(c.node.cfg.DrainTimeout)
		go func() {
			if !m.Stay {
				// Routers hear first that the node drains; what can move
				// goes then, and the drain waits for what could not, all
				// within DrainTimeout.
				c.node.startDraining()
				moved, stayed, why := c.node.moveAway(0, deadline)
				if moved+stayed > 0 {
					c.node.log.Info("drain: requests moved away", "moved", moved, "stayed", stayed, "why", why)
				}
			}
			left, err := c.node.drainWait(deadline)
			if err != nil {
				c.node.log.Error("drain", "err", err)
			}
			if m.Wait && sender != nil {
				// Answered before the node stops, or the answer is lost
				// with the actor system.
				done := &messages.DrainReply{InFlight: uint32(left), Done: left == 0}
				if err := messages.Send(root, sender, done); err != nil {
					c.node.log.Error("drain reply refused by its own validation", "err", err)
				}
				// Remote delivery is asynchronous and protoactor has no
				// flush: give the reply a moment on the wire before the
				// remote endpoint goes down with the node.
				time.Sleep(drainReplyGrace)
			}
			if err := c.node.Stop(); err != nil {
				c.node.log.Warn("leave after drain", "err", err)
			}
		}()
	}
}

// inFlight hands an operator's question about the requests in flight to
// the actor that holds them (the router, or admission), which answers the
// operator directly: the control actor does not wait. A node that only
// prefills holds no request, and gets none as its answer.
func (c *controlActor) inFlight(ctx actor.Context, q any, none messages.Message) {
	holder := c.node.router
	if holder == nil {
		holder = c.node.actors.Admission()
	}
	if holder == nil {
		c.respond(ctx, none)
		return
	}
	ctx.RequestWithCustomSender(holder, q, ctx.Sender())
}

func (c *controlActor) respond(ctx actor.Context, m messages.Message) {
	if err := messages.Respond(ctx, m); err != nil {
		c.node.log.Error("control reply refused by its own validation", "type", m.TypeCode().String(), "err", err)
	}
}
