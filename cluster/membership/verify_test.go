package membership

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// provenConfig is a member holding the certificate of role/name, its
// remote address serving that certificate and answering the run
// challenge with its incarnation (and, for a role that receives KV, its
// data address serving the certificate), as a real node's do; it joins
// through join.
func provenConfig(t *testing.T, ca *trusttest.CA, role Role, name string, join ...*Membership) (Config, Meta, *trust.Authority) {
	t.Helper()
	auth := ca.Authority(t, role.identityRole(), name, nil)
	meta := testMeta()
	meta.Role, meta.DataAddr = role, ""
	meta.RemoteAddr, _ = trusttest.ServeRemote(t, auth, "127.0.0.1:0", meta.Incarnation)
	if role.receivesKV() {
		meta.DataAddr = trusttest.ServeTLS(t, auth.Bundle())
	}
	if role == RoleRouter {
		meta.CapacityPages, meta.FreePages = 0, 0
	}
	cfg := DefaultLocalConfig().Secured(auth)
	for _, j := range join {
		cfg.JoinAddrs = append(cfg.JoinAddrs, j.LocalAddr().String())
	}
	return cfg, meta, auth
}

func provenMember(t *testing.T, ca *trusttest.CA, role Role, name string, join ...*Membership) (*Membership, *trust.Authority) {
	t.Helper()
	cfg, meta, auth := provenConfig(t, ca, role, name, join...)
	return startMember(t, cfg, meta), auth
}

// impostor starts a member that holds the gossip key (every node does)
// and gossips whatever name and metadata it likes, verifying no one.
func impostor(t *testing.T, ca *trusttest.CA, prefix string, meta Meta, join *Membership) *Membership {
	t.Helper()
	cfg := DefaultLocalConfig()
	cfg.Insecure, cfg.Keys, cfg.NamePrefix = true, ca.Gossip, prefix
	cfg.JoinAddrs = []string{join.LocalAddr().String()}
	return startMember(t, cfg, meta)
}

func verified(ev Event) bool   { return ev.Member.Verified }
func unverified(ev Event) bool { return !ev.Member.Verified }

// verifiedNames are the names of the members of role that m lists
// verified: the only ones a router may pick.
func verifiedNames(m *Membership, role Role) []string {
	var out []string
	for _, e := range m.Members() {
		if e.Verified && e.Meta.Role == role {
			out = append(out, e.Name)
		}
	}
	return out
}

// Each member is listed unverified when it joins, and verified once its
// addresses proved it; only then is it a candidate for routing.
func TestMemberVerifiedWithinBound(t *testing.T) {
	ca := trusttest.New(t)
	start := time.Now()
	r, _ := provenMember(t, ca, RoleRouter, "r0")
	d, _ := provenMember(t, ca, RoleDecode, "d0", r)
	p, _ := provenMember(t, ca, RolePrefill, "p0", r)
	all := []*Membership{r, d, p}
	for _, m := range all {
		var want []match
		for _, o := range all {
			if o != m {
				want = append(want, match{kind: EventJoin, name: o.Name(), ok: unverified},
					match{kind: EventUpdate, name: o.Name(), ok: verified})
			}
		}
		awaitEvents(t, m, want...)
	}
	t.Logf("3 members verified each other %s after the first start", time.Since(start))
	for _, m := range all {
		for _, mem := range m.Members() {
			if !mem.Verified {
				t.Fatalf("%s lists %s unverified", m.Name(), mem.Name)
			}
		}
		if st := m.Stats(); st != (MembershipStats{}) {
			t.Fatalf("%s stats %+v, want zero", m.Name(), st)
		}
	}
	if got := verifiedNames(r, RoleDecode); !slices.Equal(got, []string{d.Name()}) {
		t.Fatalf("decode candidates %v, want %s", got, d.Name())
	}
	if got := verifiedNames(r, RolePrefill); !slices.Equal(got, []string{p.Name()}) {
		t.Fatalf("prefill candidates %v, want %s", got, p.Name())
	}
}

// A holder of the gossip key can announce any member; none of these lies
// gets verified, none is a candidate for routing, and none evicts the real
// node whose address it names, however late it claims to have started and
// however many free pages it advertises: another node's certificate at an
// address, a run of another incarnation there, a data address served by
// another node, no TLS of this cluster, nothing at all.
func TestImpostorsNeverVerified(t *testing.T) {
	ca := trusttest.New(t)
	r, rauth := provenMember(t, ca, RoleRouter, "r0")
	d, _ := provenMember(t, ca, RoleDecode, "d0", r)
	p, _ := provenMember(t, ca, RolePrefill, "p0", r)
	awaitEvents(t, r, match{kind: EventUpdate, name: d.Name(), ok: verified},
		match{kind: EventUpdate, name: p.Name(), ok: verified})

	lie := func(role Role, remote, data string) Meta {
		m := testMeta()
		m.Role, m.RemoteAddr, m.DataAddr = role, remote, data
		m.CapacityPages, m.FreePages = 1<<30, 1<<30
		return m
	}
	serve := func(role trust.Role, name string) string { return trusttest.ServeTLS(t, ca.Bundle(t, role, name)) }
	run := func(name string, inc uint64) string {
		addr, _ := trusttest.ServeRemote(t, ca.Authority(t, trust.RoleDecode, name, nil), "127.0.0.1:0", inc)
		return addr
	}
	dm, pm := d.Meta(), p.Meta()
	d4, d5 := lie(RoleDecode, "", dm.DataAddr), lie(RoleDecode, "", serve(trust.RoleDecode, "d5"))
	d4.RemoteAddr, d5.RemoteAddr = run("d4", d4.Incarnation), run("d5", d5.Incarnation+1)
	refused := []*Membership{
		impostor(t, ca, "d1", lie(RoleDecode, serve(trust.RolePrefill, "d1"), serve(trust.RolePrefill, "d1")), r),
		impostor(t, ca, "d2", lie(RoleDecode, serve(trust.RoleDecode, "d9"), serve(trust.RoleDecode, "d9")), r),
		impostor(t, ca, "d3", lie(RoleDecode, dm.RemoteAddr, dm.DataAddr), r),
		impostor(t, ca, "p1", lie(RolePrefill, pm.RemoteAddr, ""), r),
		impostor(t, ca, "d4", d4, r),
		impostor(t, ca, "d5", d5, r),
	}
	unanswered := []*Membership{
		impostor(t, ca, "p5", lie(RolePrefill, trusttest.ServeTLS(t, trusttest.New(t).Bundle(t, trust.RolePrefill, "p5")), ""), r),
		impostor(t, ca, "p6", lie(RolePrefill, trusttest.ClosedAddr(t), ""), r),
		impostor(t, ca, "p7", lie(RolePrefill, serve(trust.RolePrefill, "p7"), ""), r),
	}
	waitFor(t, "every lie refused and every unanswered claim retried", eventDeadline, func() bool {
		st := r.Stats()
		return st.ClaimsRefused == uint64(len(refused)) && st.ClaimsUnanswered >= 2*uint64(len(unanswered))
	})
	if got := rauth.Refused()[trust.RefusedAddress]; got != uint64(len(refused)) {
		t.Fatalf("the authority counted %d address refusals, want %d", got, len(refused))
	}
	impostors := map[string]bool{}
	for _, m := range append(refused, unanswered...) {
		impostors[m.Name()] = true
	}
	for _, ev := range drain(r) {
		if impostors[ev.Member.Name] && ev.Member.Verified {
			t.Fatalf("event %s %s reported verified", ev.Kind, ev.Member.Name)
		}
	}
	listed := 0
	for _, mem := range r.Members() {
		if impostors[mem.Name] {
			listed++
			if mem.Verified || mem.Unverified == "" || mem.Unverified == notProbedYet {
				t.Fatalf("%s listed verified %v, unverified because %q: want the probe's refusal", mem.Name, mem.Verified,
					mem.Unverified)
			}
		}
	}
	if listed != len(impostors) {
		t.Fatalf("%d of %d impostors listed; the test wants each of them seen", listed, len(impostors))
	}
	if got := verifiedNames(r, RoleDecode); !slices.Equal(got, []string{d.Name()}) {
		t.Fatalf("decode candidates %v, want only %s", got, d.Name())
	}
	if got := verifiedNames(r, RolePrefill); !slices.Equal(got, []string{p.Name()}) {
		t.Fatalf("prefill candidates %v, want only %s", got, p.Name())
	}
	if st := r.Stats(); st.Superseded != 0 {
		t.Fatalf("stats %+v: an unproven claim superseded a member", st)
	}
}

// drain is what m's Events channel holds now, without waiting for more.
func drain(m *Membership) []Event {
	var out []Event
	for {
		select {
		case ev := <-m.Events():
			out = append(out, ev)
		default:
			return out
		}
	}
}

// A member is verified as a run, not a name. A holder of the gossip key
// announcing a run of d0 at d0's addresses (as d0's certificate serves
// there, it proves the name, never the run) is refused while d0 runs, and
// stays refused after d0 crashes and a new run of d0 starts on the same
// ports: that run is verified at once, supersedes the old one and is the
// only decode node routed to; the refusal says which incarnation
// answered. A verified member that then claims an address it cannot
// prove is unverified again.
func TestMemberVerifiedAsRun(t *testing.T) {
	ca := trusttest.New(t)
	r, _ := provenMember(t, ca, RoleRouter, "r0")
	dauth := ca.Authority(t, trust.RoleDecode, "d0", nil)
	meta := testMeta()
	remote, stopRemote := trusttest.ServeRemote(t, dauth, "127.0.0.1:0", meta.Incarnation)
	meta.RemoteAddr, meta.DataAddr = remote, trusttest.ServeTLS(t, dauth.Bundle())
	cfg := DefaultLocalConfig().Secured(dauth)
	cfg.JoinAddrs = []string{r.LocalAddr().String()}
	d := startMember(t, cfg, meta)
	awaitEvents(t, r, match{kind: EventUpdate, name: d.Name(), ok: verified})

	fakeMeta := testMeta()
	fakeMeta.RemoteAddr, fakeMeta.DataAddr = meta.RemoteAddr, meta.DataAddr
	fake := impostor(t, ca, "d0", fakeMeta, r)
	want := fmt.Sprintf("announces incarnation %016x, but the run of %s at remote address %s answers incarnation %016x",
		fakeMeta.Incarnation, d.Members()[0].Identity(trusttest.Cluster), meta.RemoteAddr, meta.Incarnation)
	waitFor(t, "the fake refused with the incarnations", eventDeadline, func() bool {
		return r.Stats().ClaimsRefused == 1 && strings.Contains(listed(r, fake.Name()).Unverified, want)
	})

	// The crash: gossip and the remote stop at once, without a leave. The
	// restart binds the same remote port; the data plane's certificate
	// server stands for the restarted data plane.
	_ = d.Shutdown()
	stopRemote()
	restart := testMeta()
	restart.RemoteAddr, restart.DataAddr = meta.RemoteAddr, meta.DataAddr
	trusttest.ServeRemote(t, dauth, restart.RemoteAddr, restart.Incarnation)
	started := time.Now()
	rerun := startMember(t, cfg, restart)
	awaitEvents(t, r, match{kind: EventUpdate, name: rerun.Name(), ok: verified}, match{kind: EventFail, name: d.Name()})
	t.Logf("the restarted run was verified %s after it started", time.Since(started))
	if got := verifiedNames(r, RoleDecode); !slices.Equal(got, []string{rerun.Name()}) {
		t.Fatalf("decode candidates %v, want only the restarted run %s", got, rerun.Name())
	}
	want = fmt.Sprintf("answers incarnation %016x", restart.Incarnation)
	waitFor(t, "the fake refused again, by the restarted run", eventDeadline, func() bool {
		return strings.Contains(listed(r, fake.Name()).Unverified, want)
	})
	for _, ev := range drain(r) {
		if ev.Member.Name == fake.Name() && ev.Member.Verified {
			t.Fatalf("event %s reported the fake verified", ev.Kind)
		}
	}
	if m := listed(r, fake.Name()); m.Verified {
		t.Fatalf("the fake is listed verified: %+v", m)
	}

	moved := rerun.Meta()
	moved.RemoteAddr = trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleDecode, "d9"))
	if err := rerun.UpdateMeta(moved); err != nil {
		t.Fatal(err)
	}
	awaitEvents(t, r, match{kind: EventUpdate, name: rerun.Name(),
		ok: func(ev Event) bool { return !ev.Member.Verified && ev.Member.Meta.RemoteAddr == moved.RemoteAddr }})
	waitFor(t, "the moved claim refused", eventDeadline, func() bool { return r.Stats().ClaimsRefused == 2 })
	if got := verifiedNames(r, RoleDecode); len(got) != 0 {
		t.Fatalf("decode candidates %v, want none", got)
	}
}

// listed is the member name as m lists it; zero if it does not.
func listed(m *Membership, name string) Member {
	for _, e := range m.Members() {
		if e.Name == name {
			return e
		}
	}
	return Member{}
}
