package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/cluster/membership"
)

func absentMember(inc uint64, role Role) Member {
	return Member{Name: membership.NodeName("n", inc), State: StateAlive, Verified: true,
		Meta: membership.Meta{Role: role, Incarnation: inc, RemoteAddr: fmt.Sprintf("127.0.0.1:%d", 9000+inc)}}
}

// kinds names the effects in order, as "probe 2", "lost 2", … for
// comparison.
func kinds(es []absenceEffect) string {
	var out []string
	for _, e := range es {
		switch e := e.(type) {
		case probeMember:
			out = append(out, fmt.Sprintf("probe %d", e.Incarnation))
		case heldMember:
			out = append(out, fmt.Sprintf("held %d %s", e.Member.Meta.Incarnation, e.Reach))
		case lostMember:
			out = append(out, fmt.Sprintf("lost %d", e.Member.Meta.Incarnation))
		case backMember:
			out = append(out, fmt.Sprintf("back %d lost=%v", e.Member.Meta.Incarnation, e.WasLost))
		}
	}
	return strings.Join(out, ", ")
}

const (
	testBound   = 10 * time.Second
	testReprobe = time.Second
)

// TestAbsences walks the decisions step by step: each row feeds one input
// at a time (seconds after the start) and names the effects it must give.
func TestAbsences(t *testing.T) {
	a1, a2, r3 := absentMember(1, RoleDecode), absentMember(2, RoleDecode), absentMember(3, RoleRouter)
	// Later runs at a2's address: one verified, one not (yet).
	restarted2, unproven2 := absentMember(5, RoleDecode), absentMember(4, RoleDecode)
	restarted2.Meta.RemoteAddr, unproven2.Meta.RemoteAddr, unproven2.Verified = a2.Meta.RemoteAddr, a2.Meta.RemoteAddr, false
	// An unverified member that claims a2's incarnation under another name.
	impostor2 := absentMember(2, RoleDecode)
	impostor2.Name, impostor2.Verified = membership.NodeName("m", 2), false
	type step struct {
		at   float64
		in   func(a *absences, now time.Time) []absenceEffect
		want string
	}
	alive := func(ms ...Member) func(*absences, time.Time) []absenceEffect {
		return func(a *absences, now time.Time) []absenceEffect { return a.Alive(ms, now) }
	}
	probed := func(inc uint64, r reach) func(*absences, time.Time) []absenceEffect {
		return func(a *absences, now time.Time) []absenceEffect { return a.Probed(inc, r, now) }
	}
	tick := func(a *absences, now time.Time) []absenceEffect { return a.Tick(now) }
	gone := func(inc uint64) func(*absences, time.Time) []absenceEffect {
		return func(a *absences, now time.Time) []absenceEffect { return a.Gone(inc, "it left the cluster", now) }
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a crash refuses: lost at the first probe", []step{
			{0, alive(a1, a2), ""},
			{1, alive(a1), "probe 2"},
			{1.1, probed(2, reachRefused), "lost 2"},
			{20, tick, ""},
			{21, alive(a1), ""},
		}},
		{"a stall answers: held, then back within the bound", []step{
			{0, alive(a1, a2), ""},
			{1, alive(a1), "probe 2"},
			{1.1, probed(2, reachAnswered), "held 2 answered"},
			{1.5, tick, ""}, // the next probe waits a reprobe interval
			{2.1, tick, "probe 2"},
			{2.2, probed(2, reachAnswered), ""}, // told held once
			{6, alive(a1, a2), "back 2 lost=false"},
			{30, tick, ""},
		}},
		{"a stall past the bound is lost, and logged back when it returns", []step{
			{0, alive(a1, a2), ""},
			{1, alive(a1), "probe 2"},
			{1.1, probed(2, reachSilent), "held 2 no answer"},
			{2.1, tick, "probe 2"},
			{10.9, tick, ""}, // the probe is still out: no second one
			{11, tick, "lost 2"},
			{11.1, probed(2, reachRefused), ""}, // too late to matter
			{12, tick, ""},
			{40, alive(a1, a2), "back 2 lost=true"},
		}},
		{"a stalled process killed while held is lost at the next probe", []step{
			{0, alive(a1, a2), ""},
			{1, alive(a1), "probe 2"},
			{1.1, probed(2, reachAnswered), "held 2 answered"},
			{2.1, tick, "probe 2"},
			{2.2, probed(2, reachRefused), "lost 2"},
		}},
		{"back before the probe answers: the answer is ignored", []step{
			{0, alive(a1, a2), ""},
			{1, alive(a1), "probe 2"},
			{1.2, alive(a1, a2), "back 2 lost=false"},
			{1.3, probed(2, reachRefused), ""},
			{20, tick, ""},
		}},
		{"a leave loses at once, alive or missing", []step{
			{0, alive(a1, a2, r3), ""},
			{1, gone(3), "lost 3"},
			{1, alive(a1, a2), ""},
			{2, alive(a1), "probe 2"},
			{3, gone(2), "lost 2"},
			{3, gone(2), ""},
			{3.1, probed(2, reachAnswered), ""},
		}},
		{"a run whose address a later, verified run serves is lost at once", []step{
			{0, alive(a1, a2), ""},
			{1, alive(a1, unproven2), "probe 2"}, // anyone may claim an address
			{1.1, probed(2, reachAnswered), "held 2 answered"},
			{2, alive(a1, unproven2, restarted2), "lost 2"},
			{3, alive(a1, restarted2), ""}, // the unverified claimant was never tracked
			{4, alive(a1), "probe 5"},
		}},
		{"unverified members count for nothing", []step{
			{0, alive(a1, a2), ""},
			{1, alive(a1, impostor2), "probe 2"}, // it does not keep a2 listed
			{1.1, probed(2, reachRefused), "lost 2"},
			{2, alive(a1, unproven2), ""},
			{3, alive(a1), ""},
		}},
		{"members never seen alive are not tracked", []step{
			{0, gone(5), ""},
			{0, probed(5, reachRefused), ""},
			{0, alive(absentMember(6, RoleDecode), Member{Name: "x", State: membership.StateDead, Meta: membership.Meta{Incarnation: 7}}), ""},
			{1, alive(), "probe 6"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAbsences(testBound, testReprobe, time.Hour)
			start := time.Unix(1_000_000, 0)
			for i, s := range tc.steps {
				now := start.Add(time.Duration(s.at * float64(time.Second)))
				if got := kinds(s.in(a, now)); got != s.want {
					t.Fatalf("step %d (at %.1f s): effects %q, want %q", i, s.at, got, s.want)
				}
			}
		})
	}
}

// TestAbsencesAwayAndWhy: what a loss and a return report: how long the
// member was missing, and why it was lost.
func TestAbsencesAwayAndWhy(t *testing.T) {
	a := newAbsences(testBound, testReprobe, time.Minute)
	start := time.Unix(1_000_000, 0)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	m := absentMember(2, RoleDecode)
	a.Alive([]Member{m}, at(0))
	a.Alive(nil, at(1))
	held := a.Probed(2, reachAnswered, at(1.5))
	if h, ok := held[0].(heldMember); !ok || !h.Until.Equal(at(11)) {
		t.Fatalf("held %+v, want until the bound from the first miss (%s)", held, at(11))
	}
	if !a.Returning(2) {
		t.Fatal("a missing member is not returning")
	}
	lost := a.Tick(at(11))
	l, ok := lost[0].(lostMember)
	if !ok || l.Away != 10*time.Second || !strings.Contains(l.Why, "bound 10s") || !strings.Contains(l.Why, "answered") {
		t.Fatalf("lost %+v, want away 10s for the bound, after an answered probe", lost)
	}
	back := a.Alive([]Member{m}, at(31))
	if b, ok := back[0].(backMember); !ok || b.Away != 30*time.Second || !b.WasLost {
		t.Fatalf("back %+v, want away 30s, lost", back)
	}
	if a.Returning(2) {
		t.Fatal("a member alive again is still returning")
	}
	// A lost member is forgotten after remember: its return is a first
	// join again.
	a.Alive(nil, at(40))
	a.Probed(2, reachRefused, at(40))
	a.Tick(at(101))
	if a.Returning(2) {
		t.Fatal("a member lost longer ago than remember is still remembered")
	}
	if got := kinds(a.Alive([]Member{m}, at(102))); got != "" {
		t.Fatalf("the return of a forgotten member gave %q", got)
	}
}

func TestNodeConfigLostAfter(t *testing.T) {
	for _, tc := range []struct {
		lostAfter, requestTimeout, want time.Duration
		err                             string
	}{
		{0, 30 * time.Second, 15 * time.Second, ""}, // half the request timeout
		{0, 50 * time.Second, DefaultLostAfter, ""},
		{29 * time.Second, 30 * time.Second, 29 * time.Second, ""},
		{-time.Second, 30 * time.Second, 0, "LostAfter (-1s) must be in [0, the request timeout (30s))"},
		{30 * time.Second, 30 * time.Second, 0, "LostAfter (30s) must be in [0, the request timeout (30s))"},
		{0, time.Nanosecond, 0, "half the request timeout (1ns), which is zero"}, // absences would panic
	} {
		c := DefaultLocalNodeConfig(actors.RoleDecode)
		c.LostAfter, c.Actors.RequestTimeout = tc.lostAfter, tc.requestTimeout
		err := c.Validate()
		if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("LostAfter %s, request timeout %s: %v, want %q", tc.lostAfter, tc.requestTimeout, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		d := c.dataPlane()
		if got := c.lostAfter(); got != tc.want || d.AckTimeout < got || d.WriteTimeout < got || d.ReadTimeout < got || d.DialTimeout < got {
			t.Errorf("LostAfter %s, request timeout %s: bound %s, data plane %+v; want %s, the data plane waiting as long",
				tc.lostAfter, tc.requestTimeout, got, d, tc.want)
		}
	}
}

// TestLostRouter: a lost router's requests are cancelled, dated from when
// it went missing, only when no alive member serves its address now.
func TestLostRouter(t *testing.T) {
	r, d := absentMember(3, RoleRouter), absentMember(1, RoleDecode)
	lost := func(m Member) lostMember {
		a := newAbsences(testBound, testReprobe, time.Hour)
		t0 := time.Unix(1000, 0)
		a.Alive([]Member{m}, t0)
		a.Alive(nil, t0.Add(time.Second))
		es := a.Probed(m.Meta.Incarnation, reachRefused, t0.Add(2*time.Second))
		if len(es) != 1 {
			t.Fatalf("%s refused: %s, want lost", m.Name, kinds(es))
		}
		e := es[0].(lostMember)
		if want := t0.Add(time.Second); !e.Since.Equal(want) {
			t.Fatalf("%s lost, last seen alive at %s, want %s", m.Name, e.Since, want)
		}
		return e
	}
	later := absentMember(4, RoleRouter)
	later.Meta.RemoteAddr = r.Meta.RemoteAddr
	for _, tc := range []struct {
		name string
		e    lostMember
		ms   []Member
		want bool
	}{
		{"a verified router", lost(r), []Member{d}, true},
		{"a decode node", lost(d), nil, false},
		{"a router whose address a later run serves", lost(r), []Member{d, later}, false},
	} {
		if got := lostRouter(tc.e, tc.ms); got != tc.want {
			t.Errorf("%s: lostRouter %v, want %v", tc.name, got, tc.want)
		}
	}
}
