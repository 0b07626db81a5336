package membership

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/kvwarden/kvwarden/trust"
)

// Verification of members. Gossip is sealed with a key every node holds,
// so a member's metadata is only what some node says: any holder of the
// key could announce a member with a real node's address, or a prefill
// node with 2^30 free pages. A member is therefore verified before it is
// routed to or holds an address against another run: this node dials
// each address the member claims, completes a TLS handshake there (which
// only the holder of the certificate's key can), and requires the
// identity found to be the one the member's name and role say. A liar can
// only name addresses served by the very identity it claims to be, so
// whatever is sent to it reaches that node, which checks incarnations
// itself; and as long as the real run lives, it holds those addresses.
//
// Memberlist's callbacks only record what is due (they run under its
// lock and must not wait); one goroutine per Membership works through it,
// VerifyParallelMax probes at a time, retrying failures with a doubling
// wait.

// claim is what verification proves of a run: that its role's
// certificate, under its name, serves at its addresses.
type claim struct {
	role         Role
	remote, data string
}

func claimOf(mem Member) claim { return claim{mem.Meta.Role, mem.Meta.RemoteAddr, mem.Meta.DataAddr} }

// attempt is the verification of one unverified run's claim.
type attempt struct {
	claim   claim
	next    time.Time     // the next probe starts no earlier
	wait    time.Duration // the wait after the next failure
	busy    bool          // a probe is running
	failed  int           // failed probes of this claim
	refused bool          // ClaimsRefused counted this claim
}

// ClaimError is a member's claim found untrue at one of its addresses:
// nothing of this cluster answered there (Err says why), or the
// certificate that did names Found, not Want.
type ClaimError struct {
	Member string
	Field  string // "remote address" or "data address"
	Addr   string
	Want   trust.Identity
	Found  trust.Identity
	Err    error
}

func (e *ClaimError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("cluster: member %s claims %s %s, where no peer of this cluster answers: %v",
			e.Member, e.Field, e.Addr, e.Err)
	}
	return fmt.Sprintf("cluster: member %s claims %s %s, which is served by %s, not %s",
		e.Member, e.Field, e.Addr, e.Found, e.Want)
}

func (e *ClaimError) Unwrap() error { return e.Err }

// provenLocked says whether mem's current claim is proven.
func (m *Membership) provenLocked(mem Member) bool {
	if m.cfg.Insecure || mem.Name == m.name {
		return true
	}
	p, ok := m.proofs[mem.Name]
	return ok && p == claimOf(mem)
}

// awaitProofLocked schedules the verification of mem's claim at once,
// unless that claim is already scheduled.
func (m *Membership) awaitProofLocked(mem Member) {
	c := claimOf(mem)
	if a := m.pending[mem.Name]; a != nil && a.claim == c {
		return
	}
	m.pending[mem.Name] = &attempt{claim: c, next: time.Now(), wait: m.cfg.VerifyRetryInterval}
	m.signal()
}

func (m *Membership) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// verify runs the verifications due until Shutdown, woken by new claims
// and every VerifyRetryInterval for retries.
func (m *Membership) verify() {
	defer m.verifier.Done()
	t := time.NewTicker(m.cfg.VerifyRetryInterval)
	defer t.Stop()
	for {
		select {
		case <-m.quit:
			return
		case <-m.wake:
		case <-t.C:
		}
		m.proveDue(time.Now())
	}
}

// proveDue probes up to VerifyParallelMax due members at once and waits
// for them; if more were due, it wakes the loop again.
func (m *Membership) proveDue(now time.Time) {
	due, more := m.takeDue(now)
	var wg sync.WaitGroup
	for _, mem := range due {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.settle(mem, m.prove(mem))
		}()
	}
	wg.Wait()
	if more {
		m.signal()
	}
}

// takeDue marks busy, and returns, the unverified members whose next
// probe is due, at most VerifyParallelMax; more says some are left.
func (m *Membership) takeDue(now time.Time) (due []Member, more bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, mem := range m.members {
		a := m.pending[name] // nil for every verified member
		if a == nil || a.busy || now.Before(a.next) {
			continue
		}
		if len(due) == m.cfg.VerifyParallelMax {
			return due, true
		}
		a.busy = true
		due = append(due, mem)
	}
	return due, false
}

// Identity is who a member of cluster says it is: the certificate its
// name and role name, which verification finds at its addresses.
func (mem Member) Identity(cluster string) trust.Identity {
	return trust.Identity{Cluster: cluster, Role: mem.Meta.Role.identityRole(),
		Name: strings.TrimSuffix(mem.Name, incarnationSuffix(mem.Meta.Incarnation))}
}

// prove checks each address mem claims against the identity its name and
// role say it holds.
func (m *Membership) prove(mem Member) *ClaimError {
	want := mem.Identity(m.cfg.Auth.Self().Cluster)
	for _, a := range []struct{ field, addr string }{
		{"remote address", mem.Meta.RemoteAddr}, {"data address", mem.Meta.DataAddr}} {
		if a.addr == "" {
			continue
		}
		found, _, err := m.cfg.Auth.Peers().Probe(a.addr)
		if err != nil || found != want {
			return &ClaimError{Member: mem.Name, Field: a.field, Addr: a.addr, Want: want, Found: found, Err: err}
		}
	}
	return nil
}

// settle records the outcome of a probe of mem's claim, unless the run
// is gone or claims something else by now (that claim has its own
// attempt). A proven member is admitted again, verified unless another
// run holds one of its addresses; an EventUpdate reports it.
func (m *Membership) settle(mem Member, cerr *ClaimError) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.pending[mem.Name]
	if a == nil || a.claim != claimOf(mem) {
		return
	}
	a.busy = false
	if cerr != nil {
		m.failedLocked(a, cerr)
		return
	}
	delete(m.pending, mem.Name)
	m.proofs[mem.Name] = a.claim
	cur := m.members[mem.Name] // present: a pending run is always in the table
	cur.Verified = true
	if holder := m.admitLocked(cur); holder != "" {
		m.log.Warn("cluster: proven member waits for the run holding its address", "member", cur.Name,
			"holder", holder)
		return
	}
	m.log.Debug("cluster: member verified", "member", cur.Name, "probes", a.failed+1)
}

// failedLocked schedules the next probe of a failed claim. A certificate
// of another identity at a claimed address is a refusal, counted once per
// claim; nothing of this cluster answering may be a node still starting,
// and is counted at every probe and logged, at Warn the first time.
func (m *Membership) failedLocked(a *attempt, cerr *ClaimError) {
	a.failed++
	a.next = time.Now().Add(a.wait)
	a.wait = min(2*a.wait, m.cfg.VerifyRetryIntervalMax)
	if cerr.Err != nil {
		m.claimsUnanswered.Add(1)
		level := slog.LevelDebug
		if a.failed == 1 {
			level = slog.LevelWarn
		}
		m.log.Log(context.Background(), level, "cluster: member not verified yet; retrying", "member", cerr.Member,
			"probes", a.failed, "err", cerr)
		return
	}
	if !a.refused {
		a.refused = true
		m.claimsRefused.Add(1)
		m.cfg.Auth.Refuse(trust.RefusedAddress, "gossip member's claim", "member", cerr.Member, "err", cerr)
	}
}
