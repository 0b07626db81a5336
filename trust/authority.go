package trust

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/internal/ratelog"
)

// Config bounds what an Authority keeps and waits for.
type Config struct {
	// PeersMax is the most addresses the address book remembers; the one
	// seen longest ago is forgotten (and dialed again when needed).
	PeersMax int
	// DialTimeout bounds the TLS handshake that checks who serves at an
	// address.
	DialTimeout time.Duration
	// StreamsPerConnMax bounds the concurrent gRPC streams one connection
	// may open (protoactor uses one per peer).
	StreamsPerConnMax uint32
	// ClaimProbesMax bounds the TLS handshakes that check peers' claimed
	// addresses at once; a claim waits at most ClaimProbeWait for one it
	// may start, then is refused.
	ClaimProbesMax int
	// ClaimProbeWait bounds how long a claim waits for a probe it may
	// start. Shorter than DialTimeout, so that a peer whose probes are
	// held for DialTimeout each has its other claims refused before they
	// end, rather than take the next probe.
	ClaimProbeWait time.Duration
	// ClaimProbesReserved is the share of ClaimProbesMax only the
	// cluster's own identities (nodes, operators) may take: tenants
	// together have at most ClaimProbesMax - ClaimProbesReserved under way.
	ClaimProbesReserved int
	// ClaimProbesPerIdentityMax and ClaimProbesPerAddrMax bound the probes
	// under way for the claims of one identity and of one claimant IP
	// address, so that one peer cannot take them all: a peer that claims
	// addresses that accept TCP and never answer holds its few probes for
	// DialTimeout each, and its other claims wait or are refused.
	ClaimProbesPerIdentityMax int
	ClaimProbesPerAddrMax     int
	// ClaimFailureTTL is how long a claim (a certificate at an address)
	// whose probe failed is refused again without a probe; ClaimFailuresMax
	// bounds the claims remembered, the oldest forgotten first. A claim
	// that succeeded is remembered by the address book (PeersMax).
	ClaimFailureTTL  time.Duration
	ClaimFailuresMax int
	// RemoteHandshakesMax bounds the protoactor remote connections held
	// before their TLS handshake (each for at most DialTimeout);
	// RemoteHandshakesPerAddrMax those of one IP address that is not the
	// cluster's own, and RemoteHandshakesReserved is the share only the
	// cluster's own addresses (ProvenAddrTTL) may take. One more is closed
	// at once.
	RemoteHandshakesMax        int
	RemoteHandshakesPerAddrMax int
	RemoteHandshakesReserved   int
	// ProvenAddrTTL is how long an IP address from which a node or an
	// operator completed a TLS handshake counts as the cluster's own, for
	// the reserved shares of this process's listeners; ProvenAddrsMax
	// bounds the addresses remembered, the oldest forgotten first.
	ProvenAddrTTL  time.Duration
	ProvenAddrsMax int
	// RefusalLinesPerSecond bounds the log lines each kind of refusal
	// writes, per second; every refusal is counted (Refused) whatever is
	// logged, and the next line written says how many were not.
	RefusalLinesPerSecond int
}

// DefaultConfig fits a cluster of a few hundred nodes and clients.
func DefaultConfig() Config {
	return Config{PeersMax: 4096, DialTimeout: 2 * time.Second, StreamsPerConnMax: 4,
		ClaimProbesMax: 16, ClaimProbeWait: time.Second, ClaimProbesReserved: 4, ClaimProbesPerIdentityMax: 2, ClaimProbesPerAddrMax: 4,
		ClaimFailureTTL: 10 * time.Second, ClaimFailuresMax: 1024,
		RemoteHandshakesMax: 256, RemoteHandshakesPerAddrMax: 32, RemoteHandshakesReserved: 64,
		ProvenAddrTTL: 10 * time.Minute, ProvenAddrsMax: 1024,
		RefusalLinesPerSecond: 5}
}

// Validate reports the first field out of range, with its value.
func (c Config) Validate() error {
	switch {
	case c.PeersMax < 1:
		return fmt.Errorf("trust: PeersMax (%d) must be at least 1", c.PeersMax)
	case c.DialTimeout <= 0:
		return fmt.Errorf("trust: DialTimeout (%s) must be positive", c.DialTimeout)
	case c.StreamsPerConnMax < 1:
		return fmt.Errorf("trust: StreamsPerConnMax (%d) must be at least 1", c.StreamsPerConnMax)
	case c.ClaimProbesMax < 1:
		return fmt.Errorf("trust: ClaimProbesMax (%d) must be at least 1", c.ClaimProbesMax)
	case c.ClaimProbeWait <= 0:
		return fmt.Errorf("trust: ClaimProbeWait (%s) must be positive", c.ClaimProbeWait)
	case c.ClaimProbesReserved < 0 || c.ClaimProbesReserved >= c.ClaimProbesMax:
		return fmt.Errorf("trust: ClaimProbesReserved (%d) must be in [0, ClaimProbesMax (%d)), so that tenants may probe",
			c.ClaimProbesReserved, c.ClaimProbesMax)
	case c.ClaimProbesPerIdentityMax < 1 || c.ClaimProbesPerIdentityMax > c.ClaimProbesMax:
		return fmt.Errorf("trust: ClaimProbesPerIdentityMax (%d) must be in [1, ClaimProbesMax (%d)]",
			c.ClaimProbesPerIdentityMax, c.ClaimProbesMax)
	case c.ClaimProbesPerAddrMax < 1 || c.ClaimProbesPerAddrMax > c.ClaimProbesMax:
		return fmt.Errorf("trust: ClaimProbesPerAddrMax (%d) must be in [1, ClaimProbesMax (%d)]",
			c.ClaimProbesPerAddrMax, c.ClaimProbesMax)
	case c.ClaimFailureTTL <= 0:
		return fmt.Errorf("trust: ClaimFailureTTL (%s) must be positive", c.ClaimFailureTTL)
	case c.ClaimFailuresMax < 1:
		return fmt.Errorf("trust: ClaimFailuresMax (%d) must be at least 1", c.ClaimFailuresMax)
	case c.RemoteHandshakesMax < 1:
		return fmt.Errorf("trust: RemoteHandshakesMax (%d) must be at least 1", c.RemoteHandshakesMax)
	case c.RemoteHandshakesReserved < 0 || c.RemoteHandshakesReserved >= c.RemoteHandshakesMax:
		return fmt.Errorf("trust: RemoteHandshakesReserved (%d) must be in [0, RemoteHandshakesMax (%d))",
			c.RemoteHandshakesReserved, c.RemoteHandshakesMax)
	case c.RemoteHandshakesPerAddrMax < 1 || c.RemoteHandshakesPerAddrMax > c.RemoteHandshakesMax-c.RemoteHandshakesReserved:
		return fmt.Errorf("trust: RemoteHandshakesPerAddrMax (%d) must be in [1, RemoteHandshakesMax (%d) - RemoteHandshakesReserved (%d)]",
			c.RemoteHandshakesPerAddrMax, c.RemoteHandshakesMax, c.RemoteHandshakesReserved)
	case c.ProvenAddrTTL <= 0:
		return fmt.Errorf("trust: ProvenAddrTTL (%s) must be positive", c.ProvenAddrTTL)
	case c.ProvenAddrsMax < 1:
		return fmt.Errorf("trust: ProvenAddrsMax (%d) must be at least 1", c.ProvenAddrsMax)
	case c.RefusalLinesPerSecond < 1:
		return fmt.Errorf("trust: RefusalLinesPerSecond (%d) must be at least 1", c.RefusalLinesPerSecond)
	}
	return nil
}

// Authority is one process's side of the trust model: its credentials,
// its address book and the count of everything it refused. A nil bundle
// makes an insecure authority: nothing is authenticated and every sender
// may do everything, which the node says loudly.
type Authority struct {
	cfg     Config
	bundle  *Bundle
	peers   *Peers
	log     *slog.Logger
	refused [refusalKinds]atomic.Uint64
	lines   *ratelog.Limiter // of refusals' log lines

	provenMu    sync.Mutex
	proven      provenAddrs
	strangersMu sync.Mutex
	strangers   *Strangers // remote connections before their TLS handshake
}

func newAuthority(b *Bundle, cfg Config, log *slog.Logger) *Authority {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Authority{cfg: cfg, bundle: b, log: log, lines: ratelog.New(cfg.RefusalLinesPerSecond),
		proven: provenAddrs{max: cfg.ProvenAddrsMax, ttl: cfg.ProvenAddrTTL, m: map[string]time.Time{}},
		strangers: NewStrangers(StrangerLimits{Max: cfg.RemoteHandshakesMax, PerAddrMax: cfg.RemoteHandshakesPerAddrMax,
			Reserved: cfg.RemoteHandshakesReserved})}
	if b != nil {
		a.peers = newPeers(b, cfg)
	}
	return a
}

// New is the authority of a process holding b.
func New(b *Bundle, cfg Config, log *slog.Logger) (*Authority, error) {
	if b == nil {
		return nil, fmt.Errorf("trust: no credentials (use Insecure to run without)")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newAuthority(b, cfg, log), nil
}

// Insecure is an authority that authenticates nobody.
func Insecure(log *slog.Logger) *Authority { return newAuthority(nil, DefaultConfig(), log) }

// Insecure says whether the authority authenticates nobody.
func (a *Authority) Insecure() bool { return a.bundle == nil }

// Bundle is the process's credentials; nil when insecure.
func (a *Authority) Bundle() *Bundle { return a.bundle }

// Self is the process's own identity; zero when insecure.
func (a *Authority) Self() Identity {
	if a.bundle == nil {
		return Identity{}
	}
	return a.bundle.Self
}

// Peers is the address book; nil when insecure.
func (a *Authority) Peers() *Peers { return a.peers }

// Sender is who sent a message, as far as it was authenticated.
type Sender struct {
	// Identity is the sender's, proven by its certificate and by the
	// address it sent from; zero when unknown.
	Identity Identity
	// Local is a message from inside this process.
	Local bool
	// Insecure is a message to a node that authenticates nobody.
	Insecure bool
}

// May says whether the sender may send what only the given roles may:
// local and insecure senders may send anything.
func (s Sender) May(roles ...Role) bool {
	if s.Local || s.Insecure {
		return true
	}
	for _, r := range roles {
		if s.Identity.Role == r && r != "" {
			return true
		}
	}
	return false
}

func (s Sender) String() string {
	switch {
	case s.Local:
		return "local"
	case s.Insecure:
		return "unauthenticated (insecure)"
	case s.Identity.IsZero():
		return "unknown"
	}
	return s.Identity.String()
}

// SenderOf says who sent a message from sender to self: no sender is
// local (the remote boundary gives every envelope from outside one, see
// AnonymousSender), an address of this process is local, any other is
// whoever proved to serve there.
func (a *Authority) SenderOf(self, sender *actor.PID) Sender {
	switch {
	case sender == nil || (self != nil && sender.Address == self.Address):
		return Sender{Local: true}
	case a.bundle == nil:
		return Sender{Insecure: true}
	}
	id, _ := a.peers.At(sender.Address)
	return Sender{Identity: id}
}

// Of is SenderOf for the message an actor is handling.
func (a *Authority) Of(ctx actor.Context) Sender { return a.SenderOf(ctx.Self(), ctx.Sender()) }
