package trust

import (
	"fmt"
	"log/slog"
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
	// addresses at once; a claim beyond it is refused.
	ClaimProbesMax int
	// RefusalLinesPerSecond bounds the log lines each kind of refusal
	// writes, per second; every refusal is counted (Refused) whatever is
	// logged, and the next line written says how many were not.
	RefusalLinesPerSecond int
}

// DefaultConfig fits a cluster of a few hundred nodes and clients.
func DefaultConfig() Config {
	return Config{PeersMax: 4096, DialTimeout: 2 * time.Second, StreamsPerConnMax: 4, ClaimProbesMax: 16,
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
}

// New is the authority of a process holding b.
func New(b *Bundle, cfg Config, log *slog.Logger) (*Authority, error) {
	if b == nil {
		return nil, fmt.Errorf("trust: no credentials (use Insecure to run without)")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Authority{cfg: cfg, bundle: b, peers: newPeers(b, cfg.PeersMax, cfg.ClaimProbesMax, cfg.DialTimeout), log: log,
		lines: ratelog.New(cfg.RefusalLinesPerSecond)}, nil
}

// Insecure is an authority that authenticates nobody.
func Insecure(log *slog.Logger) *Authority {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg := DefaultConfig()
	return &Authority{cfg: cfg, log: log, lines: ratelog.New(cfg.RefusalLinesPerSecond)}
}

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
