package cluster

import (
	"fmt"
	"slices"
	"time"
)

// Telling a stall from a death. Failure detection declares a member dead
// when it stops answering gossip, which a crashed process and a stopped
// one (SIGSTOP, a long GC or swap pause, a VM migration) do alike. Only a
// crash should fail the member's requests at once; a member that comes
// back soon should finish them. absences decides which: a pure state
// machine, fed the alive members, probe results and ticks by Node.watch,
// which carries out its effects (the dial, the log lines, PeerLost and
// memberLost). It has no goroutine, clock or I/O of its own.

// reach is what a dial of a missing member's protoactor remote address
// found.
type reach uint8

const (
	// reachRefused: nothing listens there, so the member's process is
	// gone (a killed process's sockets are closed by its kernel at once).
	reachRefused reach = iota + 1
	// reachAnswered: the handshake completed, so the process still holds
	// its port: it is alive but not answering (stopped, paused), or
	// something answers in its place (a proxy).
	reachAnswered
	// reachSilent: no answer within the dial's bound: the host is down or
	// cut off, which a dial cannot tell from a stall.
	reachSilent
)

func (r reach) String() string {
	switch r {
	case reachRefused:
		return "refused"
	case reachAnswered:
		return "answered"
	case reachSilent:
		return "no answer"
	}
	return "not probed"
}

// absenceEffect is what the watch loop carries out for absences.
type absenceEffect interface{ absenceEffect() }

// probeMember: dial the member's remote address, and report what was
// found with absences.Probed.
type probeMember struct {
	Incarnation uint64
	Addr        string
}

// heldMember: the member is missing but its process may live; its
// requests are held, and it gets no new work (membership no longer lists
// it). Told once per absence, after the first probe that did not refuse.
type heldMember struct {
	Member Member
	Reach  reach
	Until  time.Time
}

// lostMember: the member is lost for good; Since is when it was last
// seen alive, Away how long it had been missing by then (zero for a
// leave), Why says how that was decided.
type lostMember struct {
	Member Member
	Since  time.Time
	Away   time.Duration
	Why    string
}

// backMember: a missing member is alive again, with the same incarnation,
// after Away. WasLost says its requests had already been given up.
type backMember struct {
	Member  Member
	Away    time.Duration
	WasLost bool
}

func (probeMember) absenceEffect() {}
func (heldMember) absenceEffect()  {}
func (lostMember) absenceEffect()  {}
func (backMember) absenceEffect()  {}

// absences tracks every member seen alive, by incarnation. Not safe for
// concurrent use.
type absences struct {
	// bound is how long a missing member whose address does not refuse
	// keeps its requests (NodeConfig.LostAfter).
	bound time.Duration
	// reprobe is how long after one probe of a missing member the next
	// starts, so that a stalled process killed during its absence is
	// found lost within about reprobe.
	reprobe time.Duration
	// remember is how long a member lost for good is remembered, to log
	// its return as one.
	remember time.Duration
	members  map[uint64]*tracked
}

// tracked is one member as absences sees it.
type tracked struct {
	m        Member
	state    trackedState
	since    time.Time // missing since (away, lost)
	lostAt   time.Time
	probedAt time.Time
	probing  bool  // a probe is out, not yet reported
	reach    reach // of the last probe reported
	held     bool  // heldMember was told for this absence
}

type trackedState uint8

const (
	trackedAlive trackedState = iota + 1
	trackedAway
	trackedLost
)

func newAbsences(bound, reprobe, remember time.Duration) *absences {
	if bound <= 0 || reprobe <= 0 || remember <= 0 {
		panic(fmt.Sprintf("cluster: absences bound %s, reprobe %s, remember %s: each must be positive", bound, reprobe, remember))
	}
	return &absences{bound: bound, reprobe: reprobe, remember: remember, members: map[uint64]*tracked{}}
}

// Alive takes the members membership lists alive now, of which only the
// verified count: no work goes to an unverified one, and anyone holding
// the gossip key may announce one, with a real member's incarnation (it
// would keep that member listed after it died) and any address (its
// absence would be probed, held and logged). A member listed for the
// first time is tracked; a missing one listed again is back; a tracked
// member no longer listed goes missing, and is probed, unless
// another run, verified, serves its remote address: then it is lost at
// once, missing or not yet. A stopped process keeps its port, and
// cannot complete the handshake verification needs, so that run is
// another process there (a restart on the same port, whose dial would
// have answered and held a crashed run's requests for the bound).
func (a *absences) Alive(ms []Member, now time.Time) []absenceEffect {
	var out []absenceEffect
	listed := make(map[uint64]bool, len(ms))
	for _, m := range ms {
		if m.State != StateAlive || !m.Verified {
			continue
		}
		listed[m.Meta.Incarnation] = true
		t, ok := a.members[m.Meta.Incarnation]
		switch {
		case !ok:
			a.members[m.Meta.Incarnation] = &tracked{m: m, state: trackedAlive}
			continue
		case t.state == trackedAway:
			out = append(out, backMember{Member: m, Away: now.Sub(t.since)})
		case t.state == trackedLost:
			out = append(out, backMember{Member: m, Away: now.Sub(t.since), WasLost: true})
		}
		*t = tracked{m: m, state: trackedAlive}
	}
	for inc, t := range a.members {
		if t.state == trackedAlive && !listed[inc] {
			t.state, t.since = trackedAway, now
			if !servedByOther(ms, t.m) {
				out = append(out, a.probe(t, now))
			}
		}
		if t.state == trackedAway && servedByOther(ms, t.m) {
			out = append(out, a.lose(t, now.Sub(t.since), "another run, verified, serves its remote address", now))
		}
	}
	return out
}

// servedByOther says whether a verified alive member of another
// incarnation than m's serves protoactor remote at m's address.
func servedByOther(ms []Member, m Member) bool {
	return slices.ContainsFunc(ms, func(o Member) bool {
		return o.State == StateAlive && o.Verified && o.Meta.Incarnation != m.Meta.Incarnation &&
			o.Meta.RemoteAddr == m.Meta.RemoteAddr
	})
}

// Gone takes a member that is gone for certain (it left gracefully, a
// later run took one of its addresses): it is lost now, whatever it was.
func (a *absences) Gone(inc uint64, why string, now time.Time) []absenceEffect {
	t, ok := a.members[inc]
	if !ok || t.state == trackedLost {
		return nil
	}
	away := time.Duration(0)
	if t.state == trackedAway {
		away = now.Sub(t.since)
	} else {
		t.since = now
	}
	return []absenceEffect{a.lose(t, away, why, now)}
}

// Probed takes what a probe of a missing member found. A refusal loses
// it now; anything else holds its requests until the bound.
func (a *absences) Probed(inc uint64, r reach, now time.Time) []absenceEffect {
	t, ok := a.members[inc]
	if !ok || t.state != trackedAway || !t.probing {
		return nil // back or lost since the probe left
	}
	t.probing, t.reach = false, r
	if r == reachRefused {
		return []absenceEffect{a.lose(t, now.Sub(t.since), "its remote address refused a connection: the process is gone", now)}
	}
	if t.held {
		return nil
	}
	t.held = true
	return []absenceEffect{heldMember{Member: t.m, Reach: r, Until: t.since.Add(a.bound)}}
}

// Tick loses the missing members whose bound has passed, probes the
// others again every reprobe, and forgets the members lost longer ago
// than remember.
func (a *absences) Tick(now time.Time) []absenceEffect {
	var out []absenceEffect
	for inc, t := range a.members {
		switch {
		case t.state == trackedLost && now.Sub(t.lostAt) >= a.remember:
			delete(a.members, inc)
		case t.state != trackedAway:
		case now.Sub(t.since) >= a.bound:
			out = append(out, a.lose(t, now.Sub(t.since),
				fmt.Sprintf("missing for the bound %s (last probe: %s)", a.bound, t.reach), now))
		case !t.probing && now.Sub(t.probedAt) >= a.reprobe:
			out = append(out, a.probe(t, now))
		}
	}
	return out
}

// Returning says whether the member of that incarnation is missing or
// was lost: a join of it is a return, not a first join.
func (a *absences) Returning(inc uint64) bool {
	t, ok := a.members[inc]
	return ok && t.state != trackedAlive
}

// Held is the members missing with their requests held, as last seen
// alive.
func (a *absences) Held() []Member {
	var out []Member
	for _, t := range a.members {
		if t.state == trackedAway {
			out = append(out, t.m)
		}
	}
	return out
}

func (a *absences) probe(t *tracked, now time.Time) absenceEffect {
	t.probing, t.probedAt = true, now
	return probeMember{Incarnation: t.m.Meta.Incarnation, Addr: t.m.Meta.RemoteAddr}
}

func (a *absences) lose(t *tracked, away time.Duration, why string, now time.Time) absenceEffect {
	t.state, t.lostAt, t.probing = trackedLost, now, false
	return lostMember{Member: t.m, Since: t.since, Away: away, Why: why}
}
