package membership

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvwarden/kvwarden/trust"
)

// Bounds on Config fields, checked by Validate.
const (
	// NamePrefixLenMax bounds Config.NamePrefix, in bytes. The member name
	// travels in every gossip message about the node.
	NamePrefixLenMax = 64
	// JoinAddrsMax bounds how many addresses one Join (or Config.JoinAddrs)
	// may name.
	JoinAddrsMax = 64
	// EventBufferLenMax bounds Config.EventBufferLen, in events.
	EventBufferLenMax = 1 << 16
	// GossipKeysMax bounds Config.Keys, as a keyring file does.
	GossipKeysMax = trust.GossipKeysMax
	// VerifyParallelMaxLimit bounds Config.VerifyParallelMax, in probes.
	VerifyParallelMaxLimit = 256
)

// Config configures a Membership. The zero value is not usable; start from
// DefaultConfig or DefaultLocalConfig. Validate runs in Start.
type Config struct {
	// NamePrefix starts the member name; the name is NamePrefix, "-" and
	// the incarnation in 16 hex digits (see NodeName), so a restarted node
	// (new incarnation) never collides with its old self. 1..64 bytes of
	// [A-Za-z0-9._-].
	NamePrefix string
	// BindAddr is the IP address the gossip UDP and TCP listeners bind to.
	// "0.0.0.0" binds every interface.
	BindAddr string
	// BindPort is the gossip port, UDP and TCP alike. 0 picks a free port
	// (see Membership.LocalAddr), which is what tests want.
	BindPort int
	// AdvertiseAddr is the IP address other members use to reach this
	// one. Empty lets memberlist choose: BindAddr when it is a specific
	// address, else a private address of this host. Never a wildcard.
	AdvertiseAddr string
	// AdvertisePort is the port other members use. 0 means the bound port.
	AdvertisePort int
	// JoinAddrs are host:port gossip addresses of existing members that
	// Start joins through. Empty starts a new cluster. At most JoinAddrsMax.
	// Start fails if none of them answers.
	JoinAddrs []string
	// ClusterLabel, when set, is stamped on every gossip packet and stream;
	// members with another label are ignored. At most
	// memberlist.LabelMaxSize (255) bytes. Empty means no label. It keeps
	// clusters apart; it authenticates no one (Keys do).
	ClusterLabel string

	// Keys is the gossip keyring: every packet and stream is sealed with
	// AES-GCM under Keys[0] (the primary key), what arrives is opened with
	// any of them, and nothing unsealed is accepted or sent
	// (memberlist's GossipVerifyIncoming and GossipVerifyOutgoing), so a
	// process without a key can neither join nor be heard. Each key is
	// 16, 24 or 32 bytes (AES-128, -192, -256); at most GossipKeysMax.
	// Required unless Insecure; Secured takes them from the node's
	// credentials (their gossip.keys file).
	//
	// Rotating the key without a moment when two members cannot read each
	// other, one member at a time at each step (a restart applies it):
	//  1. add the new key as a secondary key everywhere: [old, new];
	//  2. once every member holds it, make it primary everywhere:
	//     [new, old]; a member that already sends under new is read by one
	//     that still sends under old, since both hold both;
	//  3. once every member sends under new, remove the old key: [new].
	// Skipping step 1 splits the cluster: a member at [new, old] is not
	// understood by one that holds only [old].
	Keys [][]byte
	// Insecure gossips without verifying members (`--insecure`): every
	// member is listed Verified, and without Keys gossip is in the clear,
	// so anyone who reaches the gossip port can join and claim any
	// address. It must be chosen explicitly.
	Insecure bool
	// Auth verifies members unless Insecure: a member is Verified once
	// the node at its remote address answered the run challenge
	// (Auth.AskRun: a nonce, over mutually authenticated TLS) with the
	// member's incarnation, under a certificate of this cluster whose
	// identity has the member's role and whose name is the member's name
	// less its incarnation, and its data address (if any) served that
	// certificate; each bounded by the authority's DialTimeout.
	// NamePrefix must be Auth's own identity name, which the other members
	// check in turn. Secured sets it.
	Auth *trust.Authority
	// VerifyRetryInterval is how long after a failed verification of a
	// member the next one starts; each further failure doubles the wait up
	// to VerifyRetryIntervalMax. It is also how often the verifier looks
	// for work it may have missed. > 0.
	VerifyRetryInterval time.Duration
	// VerifyRetryIntervalMax caps the wait between two verifications of
	// one member. ≥ VerifyRetryInterval.
	VerifyRetryIntervalMax time.Duration
	// VerifyParallelMax is how many members are verified at once, so that
	// a burst of joins (or of members whose addresses do not answer) is
	// worked through at a bounded rate; a member's first probe goes ahead
	// of every retry. 1..VerifyParallelMaxLimit.
	VerifyParallelMax int

	// ProbeInterval is how often this member probes one other member
	// (memberlist ProbeInterval). Must exceed ProbeTimeout.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a direct probe waits for its ack before
	// asking IndirectChecks other members (memberlist ProbeTimeout). > 0.
	ProbeTimeout time.Duration
	// IndirectChecks is how many members probe on our behalf after a
	// direct probe fails (memberlist IndirectChecks). ≥ 0.
	IndirectChecks int
	// SuspicionMult scales how long a suspected member may refute before it
	// is declared dead: SuspicionMult × max(1, log10(members)) ×
	// ProbeInterval (memberlist SuspicionMult). ≥ 1.
	SuspicionMult int
	// SuspicionMaxTimeoutMult is the factor by which the suspicion timeout
	// may grow when few members confirm the suspicion (memberlist
	// SuspicionMaxTimeoutMult). ≥ 1.
	SuspicionMaxTimeoutMult int
	// GossipInterval is how often queued updates (joins, metadata, deaths)
	// are gossiped (memberlist GossipInterval). > 0.
	GossipInterval time.Duration
	// GossipNodes is how many members each gossip round reaches
	// (memberlist GossipNodes). ≥ 1.
	GossipNodes int
	// PushPullInterval is how often full state is exchanged with one
	// member over TCP (memberlist PushPullInterval). 0 disables it.
	PushPullInterval time.Duration
	// TCPTimeout bounds one TCP exchange (join, push/pull, fallback probe)
	// (memberlist TCPTimeout). > 0.
	TCPTimeout time.Duration
	// UpdateTimeout is how long UpdateMeta waits for memberlist to finish
	// gossiping the new metadata (it is sent a few times, to random
	// members). It does not apply when this member is alone. > 0.
	UpdateTimeout time.Duration

	// EventBufferLen is the capacity of the Events channel, in events.
	// When it is full, further events are dropped and counted (see Stats),
	// never waited for. 1..EventBufferLenMax.
	EventBufferLen int

	// Logger receives refusals (undecodable metadata, superseded members,
	// dropped events) at Warn. nil discards them.
	Logger *slog.Logger
	// MemberlistLog receives memberlist's own log lines. nil discards them.
	MemberlistLog io.Writer
	// Transport carries gossip, in place of memberlist's own UDP and TCP
	// listeners on BindAddr:BindPort (nil): the seam where tests and chaos
	// drop, delay or pause it.
	Transport memberlist.Transport
}

// DefaultConfig is for a LAN: memberlist's LAN timers (a crash is noticed
// in about 5–10 s), the standard gossip port on every interface.
func DefaultConfig() Config {
	return Config{
		NamePrefix:              "kvwarden",
		BindAddr:                "0.0.0.0",
		BindPort:                7946,
		ProbeInterval:           time.Second,
		ProbeTimeout:            500 * time.Millisecond,
		IndirectChecks:          3,
		SuspicionMult:           4,
		SuspicionMaxTimeoutMult: 6,
		GossipInterval:          200 * time.Millisecond,
		GossipNodes:             3,
		PushPullInterval:        30 * time.Second,
		TCPTimeout:              10 * time.Second,
		UpdateTimeout:           5 * time.Second,
		EventBufferLen:          1024,
		VerifyRetryInterval:     500 * time.Millisecond,
		VerifyRetryIntervalMax:  30 * time.Second,
		VerifyParallelMax:       8,
	}
}

// DefaultLocalConfig is for several members on one host (tests, a local
// cluster): loopback, a free port, and timers fast enough that a crash is
// noticed in a few seconds yet slow enough not to suspect live members on a
// loaded machine or under the race detector.
func DefaultLocalConfig() Config {
	c := DefaultConfig()
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.ProbeInterval = 400 * time.Millisecond
	c.ProbeTimeout = 200 * time.Millisecond
	c.SuspicionMult = 3
	c.SuspicionMaxTimeoutMult = 3
	c.GossipInterval = 50 * time.Millisecond
	c.PushPullInterval = 5 * time.Second
	c.TCPTimeout = 2 * time.Second
	c.UpdateTimeout = 2 * time.Second
	c.VerifyRetryInterval = 100 * time.Millisecond
	c.VerifyRetryIntervalMax = 2 * time.Second
	return c
}

// Secured is c with a's credentials: the gossip keyring of a's bundle
// (unless c has Keys), a's identity name as the NamePrefix and a to
// verify members. With an insecure authority it is c marked Insecure.
func (c Config) Secured(a *trust.Authority) Config {
	if a.Insecure() {
		c.Insecure = true
		return c
	}
	c.Auth = a
	c.NamePrefix = a.Self().Name
	if len(c.Keys) == 0 {
		c.Keys = a.Bundle().GossipKeys
	}
	return c
}

// Validate checks every field; its errors carry the offending values.
func (c Config) Validate() error {
	if err := checkNamePrefix(c.NamePrefix); err != nil {
		return err
	}
	if ip := net.ParseIP(c.BindAddr); ip == nil {
		return fmt.Errorf("cluster: BindAddr %q is not an IP address", c.BindAddr)
	}
	if c.AdvertiseAddr != "" {
		if ip := net.ParseIP(c.AdvertiseAddr); ip == nil || ip.IsUnspecified() {
			return fmt.Errorf("cluster: AdvertiseAddr %q is not a specific IP address", c.AdvertiseAddr)
		}
	}
	if err := checkConfigPort("BindPort", c.BindPort); err != nil {
		return err
	}
	if err := checkConfigPort("AdvertisePort", c.AdvertisePort); err != nil {
		return err
	}
	if err := checkJoinAddrs(c.JoinAddrs); err != nil {
		return err
	}
	if len(c.ClusterLabel) > memberlist.LabelMaxSize {
		return fmt.Errorf("cluster: ClusterLabel is %d bytes, limit %d", len(c.ClusterLabel), memberlist.LabelMaxSize)
	}
	if err := c.validateTrust(); err != nil {
		return err
	}
	return c.validateTimers()
}

// validateTrust refuses a secure configuration that could not encrypt
// gossip or verify members, naming the flag that runs without.
func (c Config) validateTrust() error {
	if len(c.Keys) > GossipKeysMax {
		return fmt.Errorf("cluster: %d gossip keys, limit %d", len(c.Keys), GossipKeysMax)
	}
	for i, k := range c.Keys {
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return fmt.Errorf("cluster: gossip key %d is %d bytes, want 16, 24 or 32", i, n)
		}
	}
	if c.Insecure {
		return nil
	}
	switch {
	case len(c.Keys) == 0:
		return errors.New("cluster: no gossip key (Keys, from the credentials' gossip.keys); " +
			"--insecure gossips in the clear")
	case c.Auth == nil || c.Auth.Insecure():
		return errors.New("cluster: no credentials to verify members with (Auth); " +
			"--insecure lists members unverified")
	case !c.Auth.Self().Role.IsNode():
		return fmt.Errorf("cluster: identity %s is not a node's (role %s)", c.Auth.Self(), c.Auth.Self().Role)
	case c.NamePrefix != c.Auth.Self().Name:
		return fmt.Errorf("cluster: NamePrefix %q must be the name of the identity %s, which members check",
			c.NamePrefix, c.Auth.Self())
	}
	return nil
}

func (c Config) validateTimers() error {
	switch {
	case c.ProbeTimeout <= 0:
		return fmt.Errorf("cluster: ProbeTimeout (%s) must be positive", c.ProbeTimeout)
	case c.ProbeInterval <= c.ProbeTimeout:
		return fmt.Errorf("cluster: ProbeInterval (%s) must exceed ProbeTimeout (%s)", c.ProbeInterval, c.ProbeTimeout)
	case c.IndirectChecks < 0:
		return fmt.Errorf("cluster: IndirectChecks (%d) cannot be negative", c.IndirectChecks)
	case c.SuspicionMult < 1:
		return fmt.Errorf("cluster: SuspicionMult (%d) must be at least 1", c.SuspicionMult)
	case c.SuspicionMaxTimeoutMult < 1:
		return fmt.Errorf("cluster: SuspicionMaxTimeoutMult (%d) must be at least 1", c.SuspicionMaxTimeoutMult)
	case c.GossipInterval <= 0:
		return fmt.Errorf("cluster: GossipInterval (%s) must be positive", c.GossipInterval)
	case c.GossipNodes < 1:
		return fmt.Errorf("cluster: GossipNodes (%d) must be at least 1", c.GossipNodes)
	case c.PushPullInterval < 0:
		return fmt.Errorf("cluster: PushPullInterval (%s) cannot be negative", c.PushPullInterval)
	case c.TCPTimeout <= 0:
		return fmt.Errorf("cluster: TCPTimeout (%s) must be positive", c.TCPTimeout)
	case c.UpdateTimeout <= 0:
		return fmt.Errorf("cluster: UpdateTimeout (%s) must be positive", c.UpdateTimeout)
	case c.EventBufferLen < 1 || c.EventBufferLen > EventBufferLenMax:
		return fmt.Errorf("cluster: EventBufferLen (%d) must be in 1..%d", c.EventBufferLen, EventBufferLenMax)
	case c.VerifyRetryInterval <= 0:
		return fmt.Errorf("cluster: VerifyRetryInterval (%s) must be positive", c.VerifyRetryInterval)
	case c.VerifyRetryIntervalMax < c.VerifyRetryInterval:
		return fmt.Errorf("cluster: VerifyRetryIntervalMax (%s) must be at least VerifyRetryInterval (%s)",
			c.VerifyRetryIntervalMax, c.VerifyRetryInterval)
	case c.VerifyParallelMax < 1 || c.VerifyParallelMax > VerifyParallelMaxLimit:
		return fmt.Errorf("cluster: VerifyParallelMax (%d) must be in 1..%d", c.VerifyParallelMax, VerifyParallelMaxLimit)
	}
	return nil
}

func checkNamePrefix(p string) error {
	if len(p) < 1 || len(p) > NamePrefixLenMax {
		return fmt.Errorf("cluster: NamePrefix %q is %d bytes, want 1..%d", p, len(p), NamePrefixLenMax)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("cluster: NamePrefix %q has byte 0x%02x at %d; allowed are [A-Za-z0-9._-]", p, c, i)
		}
	}
	return nil
}

func checkConfigPort(field string, p int) error {
	if p < 0 || p > 65535 {
		return fmt.Errorf("cluster: %s (%d) must be in 0..65535", field, p)
	}
	return nil
}

func checkJoinAddrs(addrs []string) error {
	if len(addrs) > JoinAddrsMax {
		return fmt.Errorf("cluster: %d join addresses, limit %d", len(addrs), JoinAddrsMax)
	}
	for i, a := range addrs {
		if a == "" {
			return fmt.Errorf("cluster: join address %d is empty", i)
		}
	}
	return nil
}

// NodeName is the member name of the run with this incarnation.
func NodeName(prefix string, incarnation uint64) string {
	return prefix + incarnationSuffix(incarnation)
}

// incarnationSuffix is what NodeName appends to the prefix.
func incarnationSuffix(incarnation uint64) string { return fmt.Sprintf("-%016x", incarnation) }

// nameMatches reports whether a member name was made by NodeName for this
// incarnation, whatever the prefix. A member whose metadata names another
// incarnation than its name is refused: a name is one run, never two.
func nameMatches(name string, incarnation uint64) bool {
	return strings.HasSuffix(name, incarnationSuffix(incarnation)) && len(name) > 17
}

// MemberState is what this node believes about a member.
type MemberState uint8

// Member states. Members reports alive members; dead and left ones appear
// in Events. StateSuspect is never reported yet: memberlist v0.7.0 keeps
// suspicion internal (the State field of the nodes it hands out is never
// set), so a suspect member stays alive here until it is declared dead.
const (
	StateAlive MemberState = iota + 1
	StateSuspect
	StateDead
	StateLeft
)

func (s MemberState) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Member is one node of the cluster as this node sees it.
type Member struct {
	// Name is NodeName(prefix, Meta.Incarnation); in a secure cluster the
	// prefix is the name of the member's identity.
	Name string
	// Addr is the member's gossip address.
	Addr  netip.AddrPort
	Meta  Meta
	State MemberState
	// Verified says that the member is the run it claims to be: the node
	// at its remote address answered the run challenge with its
	// incarnation, under a certificate of this cluster naming the
	// member's role and name, and its data address served that
	// certificate (see Config.Auth). Gossip alone proves nothing (every
	// node holds the key), so only verified members are routed to. Always
	// true when Config.Insecure, and for this member itself.
	Verified bool
	// Unverified says why the member is not Verified: the last probe's
	// error (a ClaimError's text), or that none has completed yet. Empty
	// when Verified.
	Unverified string
}

// EventKind says what happened to a member.
type EventKind uint8

// Event kinds.
const (
	// EventJoin: a member became known (or came back after being declared
	// dead, or its metadata became readable again).
	EventJoin EventKind = iota + 1
	// EventUpdate: a known member changed its metadata, or was verified.
	EventUpdate
	// EventLeave: a member left gracefully.
	EventLeave
	// EventFail: a member is gone without leaving: failure detection
	// declared it dead, a newer run took over one of its addresses, or its
	// metadata can no longer be read. Reason says which.
	EventFail
)

func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeave:
		return "leave"
	case EventFail:
		return "fail"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is one change of membership. For EventLeave and EventFail, Member
// is the member as last known, with State dead or left.
type Event struct {
	Kind   EventKind
	Member Member
	// Reason explains an EventFail that failure detection did not produce;
	// empty otherwise.
	Reason string
}

// MembershipStats counts what the node refused or could not deliver.
type MembershipStats struct {
	// EventsDropped counts events not delivered because Events was full.
	// After a drop, Members is the way to learn the current state.
	EventsDropped uint64
	// MetaRefused counts join and update notices whose metadata did not
	// decode or did not match the member name.
	MetaRefused uint64
	// Superseded counts members excluded because another run of a node
	// was proven (or, when Insecure, started later) at one of their
	// addresses.
	Superseded uint64
	// ClaimsRefused counts members (once per set of claims) whose
	// verification found an address of theirs served by a certificate that
	// is not theirs, or a run of another incarnation; they stay
	// unverified.
	ClaimsRefused uint64
	// ClaimsUnanswered counts probes of a member's address that found no
	// peer of this cluster there (nothing listening, no TLS, a foreign
	// certificate); each is retried.
	ClaimsUnanswered uint64
}

// ErrClosed is returned by calls made after Shutdown.
var ErrClosed = errors.New("cluster: membership is shut down")

// Membership is this node's view of the cluster and its voice in it. Its
// methods may be called from any goroutine.
type Membership struct {
	cfg  Config
	log  *slog.Logger
	name string
	list *memberlist.Memberlist // set once in Start, before it returns

	// lifeMu serializes UpdateMeta, Join, Leave and Shutdown, so that none
	// reaches memberlist after Shutdown (memberlist panics on Leave after
	// shutdown).
	lifeMu sync.Mutex
	down   bool

	// metaMu guards the local metadata that memberlist reads through the
	// NodeMeta callback.
	metaMu sync.RWMutex
	meta   Meta
	enc    []byte

	// mu guards the member table and the events channel. Memberlist
	// callbacks take it while memberlist holds its own node lock, so code
	// holding mu must never call into memberlist.
	mu      sync.Mutex
	members map[string]Member
	events  chan Event
	closed  bool
	// proofs and pending are the verifier's state, by member name (which
	// carries the incarnation, so each is per run): what was proven of a
	// run, and the next verification of an unverified one. Both are
	// guarded by mu and forgotten when memberlist reports the run gone or
	// another run is proven at its addresses; a run that comes back is
	// proven again, which takes one challenge.
	proofs   map[string]proof
	pending  map[string]*attempt
	probing  int                // probes under way, at most VerifyParallelMax
	wake     chan struct{}      // a verification is due; capacity 1
	quit     chan struct{}      // closed by Shutdown
	probeCtx context.Context    // of the probes; done at Shutdown
	stop     context.CancelFunc // ends probeCtx
	verifier sync.WaitGroup     // the verify loop and its probes

	dropped, refused, superseded    atomic.Uint64
	claimsRefused, claimsUnanswered atomic.Uint64
}

// Start validates cfg and meta, starts gossiping and, if cfg.JoinAddrs is
// set, joins through them. meta.StartedUnixMilli is set to now. On error
// nothing is left running.
func Start(cfg Config, meta Meta) (*Membership, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if meta.Leaving {
		return nil, &MetaFieldError{Field: "leaving", Reason: "set only by Leave"}
	}
	if !cfg.Insecure && meta.Role.identityRole() != cfg.Auth.Self().Role {
		self := cfg.Auth.Self()
		return nil, fmt.Errorf("cluster: start refused: role %s, but the identity %s is of role %s, which members check",
			meta.Role, self, self.Role)
	}
	meta.StartedUnixMilli = uint64(time.Now().UnixMilli())
	enc, err := EncodeMeta(nil, meta)
	if err != nil {
		return nil, fmt.Errorf("cluster: start refused: %w", err)
	}
	m := &Membership{
		cfg:     cfg,
		log:     cfg.Logger,
		name:    NodeName(cfg.NamePrefix, meta.Incarnation),
		meta:    meta,
		enc:     enc,
		members: make(map[string]Member),
		events:  make(chan Event, cfg.EventBufferLen),
		proofs:  make(map[string]proof),
		pending: make(map[string]*attempt),
		wake:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	m.probeCtx, m.stop = context.WithCancel(context.Background())
	mc, err := m.memberlistConfig()
	if err != nil {
		return nil, err
	}
	list, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("cluster: start %s on %s:%d: %w", m.name, cfg.BindAddr, cfg.BindPort, err)
	}
	m.list = list
	if !cfg.Insecure {
		m.verifier.Add(1)
		go m.verify()
	}
	if len(cfg.JoinAddrs) > 0 {
		if _, err := m.Join(cfg.JoinAddrs); err != nil {
			_ = m.Shutdown()
			return nil, err
		}
	}
	return m, nil
}

func (m *Membership) memberlistConfig() (*memberlist.Config, error) {
	c := memberlist.DefaultLANConfig()
	c.Name = m.name
	c.BindAddr, c.BindPort = m.cfg.BindAddr, m.cfg.BindPort
	c.AdvertiseAddr, c.AdvertisePort = m.cfg.AdvertiseAddr, m.cfg.AdvertisePort
	if c.AdvertisePort == 0 {
		c.AdvertisePort = c.BindPort // memberlist replaces both when BindPort is 0
	}
	c.Label = m.cfg.ClusterLabel
	c.ProbeInterval, c.ProbeTimeout = m.cfg.ProbeInterval, m.cfg.ProbeTimeout
	c.IndirectChecks = m.cfg.IndirectChecks
	c.SuspicionMult, c.SuspicionMaxTimeoutMult = m.cfg.SuspicionMult, m.cfg.SuspicionMaxTimeoutMult
	c.GossipInterval, c.GossipNodes = m.cfg.GossipInterval, m.cfg.GossipNodes
	c.PushPullInterval, c.TCPTimeout = m.cfg.PushPullInterval, m.cfg.TCPTimeout
	c.Delegate, c.Events = delegate{m}, delegate{m}
	c.Transport = m.cfg.Transport
	c.LogOutput = m.cfg.MemberlistLog
	if c.LogOutput == nil {
		c.LogOutput = io.Discard
	}
	if len(m.cfg.Keys) > 0 {
		ring, err := memberlist.NewKeyring(m.cfg.Keys[1:], m.cfg.Keys[0])
		if err != nil {
			return nil, fmt.Errorf("cluster: gossip keyring: %w", err)
		}
		c.Keyring = ring
		c.GossipVerifyIncoming, c.GossipVerifyOutgoing = true, true
	}
	return c, nil
}

// Name is this member's name.
func (m *Membership) Name() string { return m.name }

// LocalAddr is the gossip address other members reach this one on (the
// port memberlist bound when BindPort was 0).
func (m *Membership) LocalAddr() netip.AddrPort { return addrPort(m.list.LocalNode()) }

// Meta is this member's current metadata.
func (m *Membership) Meta() Meta {
	m.metaMu.RLock()
	defer m.metaMu.RUnlock()
	return m.meta
}

// Stats reports the counters.
func (m *Membership) Stats() MembershipStats {
	return MembershipStats{EventsDropped: m.dropped.Load(), MetaRefused: m.refused.Load(), Superseded: m.superseded.Load(),
		ClaimsRefused: m.claimsRefused.Load(), ClaimsUnanswered: m.claimsUnanswered.Load()}
}

// Join contacts existing members at addrs (host:port) and returns how many
// answered. It fails only when none did.
func (m *Membership) Join(addrs []string) (int, error) {
	if len(addrs) == 0 {
		return 0, fmt.Errorf("cluster: join needs at least one address")
	}
	if err := checkJoinAddrs(addrs); err != nil {
		return 0, err
	}
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.down {
		return 0, ErrClosed
	}
	n, err := m.list.Join(addrs)
	if err != nil {
		return n, fmt.Errorf("cluster: %s joined %d of %d addresses %v: %w", m.name, n, len(addrs), addrs, err)
	}
	return n, nil
}

// Members returns the live members, this one included, sorted by name: the
// members memberlist considers alive, less those whose metadata was refused
// and those superseded by another run on one of their addresses. It is
// built from the same notices as Events, so the two never disagree for
// long.
func (m *Membership) Members() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Member, 0, len(m.members))
	for _, mem := range m.members {
		out = append(out, mem)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// UpdateMeta replaces this member's metadata and waits up to
// cfg.UpdateTimeout for memberlist to send it to another member. The
// incarnation and role cannot change within a run, and Leaving is Leave's to
// set; StartedUnixMilli is kept from Start. A size or field error leaves the
// old metadata in place. On a timeout the new metadata is in place and will
// still be gossiped.
func (m *Membership) UpdateMeta(meta Meta) error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.down {
		return ErrClosed
	}
	cur := m.Meta()
	if meta.Leaving != cur.Leaving {
		return &MetaFieldError{Field: "leaving", Reason: "set only by Leave"}
	}
	if meta.Incarnation != cur.Incarnation {
		return &MetaFieldError{Field: "incarnation", Value: meta.Incarnation, Limit: cur.Incarnation,
			Reason: "cannot change within a run; restart the node instead"}
	}
	if meta.Role != cur.Role {
		return &MetaFieldError{Field: "role", Value: uint64(meta.Role), Limit: uint64(cur.Role),
			Reason: "cannot change within a run; restart the node instead"}
	}
	meta.StartedUnixMilli = cur.StartedUnixMilli
	return m.publishLocked(meta, m.cfg.UpdateTimeout)
}

// publishLocked installs meta and waits up to timeout for memberlist to
// gossip it. The caller holds lifeMu.
func (m *Membership) publishLocked(meta Meta, timeout time.Duration) error {
	enc, err := EncodeMeta(nil, meta)
	if err != nil {
		return fmt.Errorf("cluster: metadata update refused: %w", err)
	}
	m.metaMu.Lock()
	m.meta, m.enc = meta, enc
	m.metaMu.Unlock()
	if err := m.list.UpdateNode(timeout); err != nil {
		return fmt.Errorf("cluster: metadata update of %s not yet sent after %s: %w", m.name, timeout, err)
	}
	return nil
}

// Events delivers membership changes, this member's own join first. The
// channel holds cfg.EventBufferLen events; when it is full, events are
// dropped and counted in Stats rather than stalling memberlist, whose
// failure detection runs on the goroutines that produce them. It is closed
// by Shutdown.
func (m *Membership) Events() <-chan Event { return m.events }

// Leave tells the cluster this member is going, waiting up to timeout in
// all for the news to reach another member. Gossip continues until
// Shutdown, which should follow.
//
// memberlist reports a graceful leave and a failure alike to the other
// members, so Leave first gossips Meta.Leaving and then leaves; a member
// that saw the flag reports EventLeave, one that missed it (the update and
// the departure raced, or the update was lost) reports EventFail. Both mean
// the node is gone.
func (m *Membership) Leave(timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("cluster: Leave timeout (%s) must be positive", timeout)
	}
	deadline := time.Now().Add(timeout)
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.down {
		return ErrClosed
	}
	meta := m.Meta()
	if !meta.Leaving {
		meta.Leaving = true
		if err := m.publishLocked(meta, timeout); err != nil {
			// Leave anyway: the others will see a failure instead.
			m.log.Warn("cluster: leaving flag not confirmed before leave", "member", m.name, "err", err)
		}
	}
	if err := m.list.Leave(max(time.Until(deadline), time.Millisecond)); err != nil {
		return fmt.Errorf("cluster: leave of %s not confirmed within %s: %w", m.name, timeout, err)
	}
	return nil
}

// Shutdown stops gossip at once, without telling anyone (call Leave first
// for a graceful exit), and closes Events. It is idempotent.
func (m *Membership) Shutdown() error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.down {
		return nil
	}
	m.down = true
	close(m.quit)
	m.stop()
	err := m.list.Shutdown()
	m.verifier.Wait() // the probes under way end with probeCtx
	m.mu.Lock()
	m.closed = true
	close(m.events)
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cluster: shutdown of %s: %w", m.name, err)
	}
	return nil
}

// observe handles a join or update notice. It runs on a memberlist
// goroutine under memberlist's node lock.
func (m *Membership) observe(n *memberlist.Node) {
	addr := addrPort(n)
	meta, err := DecodeMeta(n.Meta)
	if err == nil && !nameMatches(n.Name, meta.Incarnation) {
		err = &MetaFieldError{Field: "incarnation", Value: meta.Incarnation,
			Reason: fmt.Sprintf("does not match member name %q", n.Name)}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.refused.Add(1)
		m.log.Warn("cluster: member metadata refused", "member", n.Name, "addr", addr, "bytes", len(n.Meta), "err", err)
		m.forgetLocked(n.Name)
		if old, known := m.members[n.Name]; known {
			delete(m.members, n.Name)
			old.State = StateDead
			m.emitLocked(Event{Kind: EventFail, Member: old, Reason: "metadata refused: " + err.Error()})
		}
		return
	}
	mem := Member{Name: n.Name, Addr: addr, Meta: meta, State: StateAlive}
	mem.Verified = m.provenLocked(mem)
	if !mem.Verified {
		mem.Unverified = m.awaitProofLocked(mem)
	}
	m.admitLocked(mem)
}

// admitLocked puts mem into the table and reports it. Without
// verification (Insecure) the later run sharing an address supersedes the
// other. With it, a member competes for nothing here: only a proof does
// (settle), so a claim nobody proved evicts no one.
func (m *Membership) admitLocked(mem Member) {
	old, known := m.members[mem.Name]
	if mem.Verified && m.cfg.Insecure {
		if by, ok := m.supersedeLocked(mem); !ok {
			m.superseded.Add(1)
			m.log.Warn("cluster: member superseded by a later run", "member", mem.Name, "by", by)
			if known {
				delete(m.members, mem.Name)
				old.State = StateDead
				m.emitLocked(Event{Kind: EventFail, Member: old, Reason: "superseded by " + by})
			}
			return
		}
	}
	m.members[mem.Name] = mem
	kind := EventJoin
	if known {
		kind = EventUpdate
	}
	m.emitLocked(Event{Kind: kind, Member: mem})
}

// supersedeLocked resolves address claims between mem and the known
// members: two runs that share a gossip, remote or data address cannot
// both be alive, so the later start (then the larger incarnation) wins and
// the other is dropped with an EventFail. It reports false, and the name of
// the winner, when mem itself loses. The local member is never dropped
// here: another run claiming our address is a misconfiguration, logged,
// and the other members will drop whichever run is older.
func (m *Membership) supersedeLocked(mem Member) (string, bool) {
	var losers []string
	for name, e := range m.members {
		if name == mem.Name || !sharesAddr(e, mem) {
			continue
		}
		later := newer(mem.Meta, e.Meta)
		switch {
		case later && name == m.name || !later && mem.Name == m.name:
			m.log.Warn("cluster: a later run claims this member's address", "member", m.name,
				"other", map[bool]string{true: mem.Name, false: name}[later])
		case later:
			losers = append(losers, name)
		default:
			return name, false
		}
	}
	for _, name := range losers {
		e := m.members[name]
		delete(m.members, name)
		m.superseded.Add(1)
		m.log.Warn("cluster: member superseded by a later run", "member", name, "by", mem.Name)
		e.State = StateDead
		m.emitLocked(Event{Kind: EventFail, Member: e, Reason: "superseded by " + mem.Name})
	}
	return "", true
}

func sharesAddr(a, b Member) bool {
	return a.Addr == b.Addr || a.Meta.RemoteAddr == b.Meta.RemoteAddr ||
		a.Meta.DataAddr != "" && a.Meta.DataAddr == b.Meta.DataAddr
}

// newer reports whether run a started after run b; equal start times fall
// back to the incarnation so that every member picks the same winner.
func newer(a, b Meta) bool {
	if a.StartedUnixMilli != b.StartedUnixMilli {
		return a.StartedUnixMilli > b.StartedUnixMilli
	}
	return a.Incarnation > b.Incarnation
}

// depart handles a leave notice, which memberlist sends for a graceful
// leave and a failure alike: the member's last metadata tells them apart.
// It runs on a memberlist goroutine under memberlist's node lock. What was
// proven of the run is forgotten: failure detection cannot tell a stalled
// process from a dead one, and a run that comes back is verified again by
// one challenge, which only the run itself can answer.
func (m *Membership) depart(n *memberlist.Node) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgetLocked(n.Name)
	mem, ok := m.members[n.Name]
	if !ok {
		return // refused or superseded: its end was already reported, or never began
	}
	delete(m.members, n.Name)
	kind, state := EventFail, StateDead
	if mem.Meta.Leaving {
		kind, state = EventLeave, StateLeft
	}
	mem.State = state
	m.emitLocked(Event{Kind: kind, Member: mem})
}

// emitLocked hands ev to the Events channel without waiting.
func (m *Membership) emitLocked(ev Event) {
	if m.closed {
		return
	}
	select {
	case m.events <- ev:
	default:
		if m.dropped.Add(1) == 1 {
			m.log.Warn("cluster: events channel full; dropping events (see Stats)", "member", m.name,
				"capacity", cap(m.events))
		}
	}
}

func addrPort(n *memberlist.Node) netip.AddrPort {
	a, _ := netip.AddrFromSlice(n.Addr)
	return netip.AddrPortFrom(a.Unmap(), n.Port)
}

// delegate receives memberlist's callbacks. It is a separate type so that
// Membership does not export them. Every method runs on a memberlist
// goroutine, some under memberlist's node lock: none may call back into
// memberlist.
type delegate struct{ m *Membership }

// NodeMeta returns the encoded local metadata. Start and UpdateMeta have
// checked it against memberlist.MetaMaxSize, so limit is never exceeded.
func (d delegate) NodeMeta(limit int) []byte {
	d.m.metaMu.RLock()
	defer d.m.metaMu.RUnlock()
	if len(d.m.enc) > limit {
		panic(fmt.Sprintf("cluster: encoded metadata (%d bytes) over memberlist's limit (%d) after validation", len(d.m.enc), limit))
	}
	return d.m.enc
}

func (delegate) NotifyMsg([]byte)                  {}
func (delegate) GetBroadcasts(int, int) [][]byte   { return nil }
func (delegate) LocalState(bool) []byte            { return nil }
func (delegate) MergeRemoteState([]byte, bool)     {}
func (d delegate) NotifyJoin(n *memberlist.Node)   { d.m.observe(n) }
func (d delegate) NotifyUpdate(n *memberlist.Node) { d.m.observe(n) }
func (d delegate) NotifyLeave(n *memberlist.Node)  { d.m.depart(n) }
