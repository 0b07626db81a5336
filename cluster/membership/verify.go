package membership

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvwarden/kvwarden/trust"
)

// Verification of members. Gossip is sealed with a key every node holds,
// so a member's metadata is only what some node says: any holder of the
// key could announce a member with a real node's name and addresses, or a
// prefill node with 2^30 free pages. A member is therefore verified as a
// run before it is routed to: this node asks the node at the member's
// remote address, in a TLS connection it opens itself and in which both
// sides prove their certificates, which run it is (trust.AskRun: a nonce,
// answered with the nonce and the incarnation), and requires the identity
// found to be the one the member's name and role say and the incarnation
// answered to be the one gossip announces; the member's data address must
// serve that identity's certificate (a data plane that is not the run's
// refuses the transfer itself, by the incarnation its sender expects).
// A certificate names a node, not a run, so only the challenge tells a
// run from a claim about it: a holder of the gossip key announcing a
// run of decode/0 at decode/0's addresses is answered another incarnation
// (or none), whatever decode/0 does meanwhile, and is never verified. A
// restarted node is a new run under a known name: its first probe starts
// at once, ahead of every retry, and once it is proven, any other run
// proven earlier at one of its addresses is superseded (that process is
// gone from there).
//
// Memberlist's callbacks only record what is due (they run under its
// lock and must not wait); one goroutine per Membership starts the
// probes, at most VerifyParallelMax at a time, retrying failures with a
// doubling wait.

// claim is what verification proves of a run: that its role's
// certificate, under its name, serves at its addresses, and that the run
// at its remote address has its incarnation.
type claim struct {
	role         Role
	incarnation  uint64
	remote, data string
}

func claimOf(mem Member) claim {
	return claim{mem.Meta.Role, mem.Meta.Incarnation, mem.Meta.RemoteAddr, mem.Meta.DataAddr}
}

// proof is a claim proven, and when: the run answered at its remote
// address at that time.
type proof struct {
	claim claim
	at    time.Time
}

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
// nothing of this cluster answered there (Err says why), the certificate
// that did names Found, not Want, or the run at the remote address
// answered incarnation Answered where gossip announces Announced.
type ClaimError struct {
	Member              string
	Field               string // "remote address" or "data address"
	Addr                string
	Want                trust.Identity
	Found               trust.Identity
	Announced, Answered uint64
	Err                 error
}

func (e *ClaimError) Error() string {
	switch {
	case e.Err != nil:
		return fmt.Sprintf("cluster: member %s claims %s %s, where no peer of this cluster answers: %v",
			e.Member, e.Field, e.Addr, e.Err)
	case e.Found != e.Want:
		return fmt.Sprintf("cluster: member %s claims %s %s, which is served by %s, not %s",
			e.Member, e.Field, e.Addr, e.Found, e.Want)
	}
	return fmt.Sprintf("cluster: member %s announces incarnation %016x, but the run of %s at %s %s answers incarnation %016x",
		e.Member, e.Announced, e.Found, e.Field, e.Addr, e.Answered)
}

func (e *ClaimError) Unwrap() error { return e.Err }

// provenLocked says whether mem's current claim is proven.
func (m *Membership) provenLocked(mem Member) bool {
	if m.cfg.Insecure || mem.Name == m.name {
		return true
	}
	p, ok := m.proofs[mem.Name]
	return ok && p.claim == claimOf(mem)
}

// notProbedYet is Member.Unverified before the first probe completes.
const notProbedYet = "not probed yet"

// awaitProofLocked schedules the verification of mem's claim at once,
// unless that claim is already scheduled, and says why mem is not
// verified meanwhile.
func (m *Membership) awaitProofLocked(mem Member) string {
	c := claimOf(mem)
	if a := m.pending[mem.Name]; a != nil && a.claim == c {
		return cmp.Or(m.members[mem.Name].Unverified, notProbedYet)
	}
	delete(m.proofs, mem.Name)
	m.pending[mem.Name] = &attempt{claim: c, next: time.Now(), wait: m.cfg.VerifyRetryInterval}
	m.signal()
	return notProbedYet
}

// forgetLocked forgets what was proven of the run name and its
// verification under way.
func (m *Membership) forgetLocked(name string) {
	delete(m.proofs, name)
	delete(m.pending, name)
}

func (m *Membership) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// verify starts the verifications due until Shutdown, woken by new
// claims, by each probe's end and every VerifyRetryInterval for retries.
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
		for _, mem := range m.takeDue(time.Now()) {
			m.verifier.Add(1)
			go func() {
				defer m.verifier.Done()
				at, cerr := m.prove(mem)
				m.settle(mem, at, cerr)
				m.signal()
			}()
		}
	}
}

// takeDue marks busy, and returns, the unverified members whose next
// probe is due, as many as free probe slots allow: first probes first
// (a new run, a restart), then the retries that have waited longest.
func (m *Membership) takeDue(now time.Time) []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	free := m.cfg.VerifyParallelMax - m.probing
	if free <= 0 {
		return nil
	}
	var due []Member
	for name, mem := range m.members {
		if a := m.pending[name]; a != nil && !a.busy && !now.Before(a.next) {
			due = append(due, mem)
		}
	}
	slices.SortFunc(due, func(x, y Member) int {
		ax, ay := m.pending[x.Name], m.pending[y.Name]
		return cmp.Or(cmp.Compare(min(ax.failed, 1), min(ay.failed, 1)), ax.next.Compare(ay.next))
	})
	due = due[:min(len(due), free)]
	for _, mem := range due {
		m.pending[mem.Name].busy = true
	}
	m.probing += len(due)
	return due
}

// Identity is who a member of cluster says it is: the certificate its
// name and role name, which verification finds at its addresses.
func (mem Member) Identity(cluster string) trust.Identity {
	return trust.Identity{Cluster: cluster, Role: mem.Meta.Role.identityRole(),
		Name: strings.TrimSuffix(mem.Name, incarnationSuffix(mem.Meta.Incarnation))}
}

// prove asks the run at mem's remote address for its incarnation and
// checks the certificate at its data address, against the identity its
// name and role say it holds. It returns when the run answered.
func (m *Membership) prove(mem Member) (time.Time, *ClaimError) {
	want := mem.Identity(m.cfg.Auth.Self().Cluster)
	remote := mem.Meta.RemoteAddr
	found, inc, err := m.cfg.Auth.AskRun(m.probeCtx, remote)
	at := time.Now()
	switch {
	case !found.IsZero() && found != want:
		return at, &ClaimError{Member: mem.Name, Field: "remote address", Addr: remote, Want: want, Found: found}
	case err != nil:
		return at, &ClaimError{Member: mem.Name, Field: "remote address", Addr: remote, Want: want, Err: err}
	case inc != mem.Meta.Incarnation:
		return at, &ClaimError{Member: mem.Name, Field: "remote address", Addr: remote, Want: want, Found: found,
			Announced: mem.Meta.Incarnation, Answered: inc}
	}
	if data := mem.Meta.DataAddr; data != "" {
		found, _, err := m.cfg.Auth.Peers().ProbeContext(m.probeCtx, data)
		if err != nil || found != want {
			return at, &ClaimError{Member: mem.Name, Field: "data address", Addr: data, Want: want, Found: found, Err: err}
		}
	}
	return at, nil
}

// settle records the outcome of a probe of mem's claim, unless the run
// is gone or claims something else by now (that claim has its own
// attempt). A proven member is verified, and every other run proven
// earlier at one of its addresses is superseded: the process there now is
// this one. A run proven later than this probe's answer at one of its
// addresses keeps them, and this one is probed again.
func (m *Membership) settle(mem Member, at time.Time, cerr *ClaimError) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.probing--
	a := m.pending[mem.Name]
	if a == nil || a.claim != claimOf(mem) {
		return
	}
	a.busy = false
	if cerr == nil {
		if later := m.provenSinceLocked(mem, at); later != "" {
			cerr = &ClaimError{Member: mem.Name, Field: "remote address", Addr: mem.Meta.RemoteAddr,
				Err: fmt.Errorf("run %s was proven at its addresses after this answer", later)}
		}
	}
	if cerr != nil {
		m.failedLocked(mem.Name, a, cerr)
		return
	}
	delete(m.pending, mem.Name)
	m.proofs[mem.Name] = proof{claim: a.claim, at: at}
	m.supersedeProvenLocked(mem)
	cur := m.members[mem.Name] // present: a pending run is always in the table
	cur.Verified, cur.Unverified = true, ""
	m.admitLocked(cur)
	m.log.Debug("cluster: member verified", "member", cur.Name, "probes", a.failed+1)
}

// provenSinceLocked is a verified member other than mem, sharing an
// address with it, whose run answered after at; "" if none.
func (m *Membership) provenSinceLocked(mem Member, at time.Time) string {
	for name, e := range m.members {
		if p, ok := m.proofs[name]; ok && name != mem.Name && e.Verified && sharesAddr(e, mem) && p.at.After(at) {
			return name
		}
	}
	return ""
}

// supersedeProvenLocked drops every verified member other than mem that
// shares an address with it, with an EventFail: mem was just proven
// there, so those runs are gone from it. This member itself is never
// dropped; another run proven at its address is a misconfiguration,
// logged.
func (m *Membership) supersedeProvenLocked(mem Member) {
	for name, e := range m.members {
		if name == mem.Name || !e.Verified || !sharesAddr(e, mem) {
			continue
		}
		if name == m.name {
			m.log.Warn("cluster: another run is proven at this member's address", "member", m.name, "other", mem.Name)
			continue
		}
		delete(m.members, name)
		m.forgetLocked(name)
		m.superseded.Add(1)
		m.cfg.Auth.Warn(m.log, "member_superseded", "cluster: member superseded by a run proven at its address", "member", name, "by", mem.Name)
		e.State = StateDead
		m.emitLocked(Event{Kind: EventFail, Member: e, Reason: "superseded by " + mem.Name})
	}
}

// failedLocked records a failed probe of the run name and schedules the
// next. A certificate of another identity, or a run of another
// incarnation, at a claimed address is a refusal, counted once per claim;
// nothing of this cluster answering may be a node still starting, and is
// counted at every probe and logged, at Warn the first time.
func (m *Membership) failedLocked(name string, a *attempt, cerr *ClaimError) {
	if cur, ok := m.members[name]; ok {
		cur.Unverified = cerr.Error()
		m.members[name] = cur
	}
	a.failed++
	a.next = time.Now().Add(a.wait)
	a.wait = min(2*a.wait, m.cfg.VerifyRetryIntervalMax)
	if cerr.Err != nil {
		m.claimsUnanswered.Add(1)
		// Anyone with the gossip key can announce members that never
		// answer: the first failure of each is a Warn at a bounded rate.
		args := []any{"member", cerr.Member, "probes", a.failed, "err", cerr}
		if a.failed == 1 {
			m.cfg.Auth.Warn(m.log, "member_unverified", "cluster: member not verified yet; retrying", args...)
		} else {
			m.log.Debug("cluster: member not verified yet; retrying", args...)
		}
		return
	}
	if !a.refused {
		a.refused = true
		m.claimsRefused.Add(1)
		m.cfg.Auth.Refuse(trust.RefusedAddress, "gossip member's claim", "member", cerr.Member, "err", cerr)
	}
}
