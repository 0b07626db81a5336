package membership

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// provenConfig is a member holding the certificate of role/name, its
// remote address (and, for a role that receives KV, its data address)
// serving that certificate, as a real node's do; it joins through join.
func provenConfig(t *testing.T, ca *trusttest.CA, role Role, name string, join ...*Membership) (Config, Meta, *trust.Authority) {
	t.Helper()
	auth := ca.Authority(t, role.identityRole(), name, nil)
	meta := testMeta()
	meta.Role, meta.RemoteAddr, meta.DataAddr = role, trusttest.ServeTLS(t, auth.Bundle()), ""
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
// however many free pages it advertises.
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
	dm, pm := d.Meta(), p.Meta()
	refused := []*Membership{
		impostor(t, ca, "d1", lie(RoleDecode, serve(trust.RolePrefill, "d1"), serve(trust.RolePrefill, "d1")), r),
		impostor(t, ca, "d2", lie(RoleDecode, serve(trust.RoleDecode, "d9"), serve(trust.RoleDecode, "d9")), r),
		impostor(t, ca, "d3", lie(RoleDecode, dm.RemoteAddr, dm.DataAddr), r),
		impostor(t, ca, "p1", lie(RolePrefill, pm.RemoteAddr, ""), r),
		impostor(t, ca, "d4", lie(RoleDecode, serve(trust.RoleDecode, "d4"), dm.DataAddr), r),
	}
	unanswered := []*Membership{
		impostor(t, ca, "p5", lie(RolePrefill, trusttest.ServeTLS(t, trusttest.New(t).Bundle(t, trust.RolePrefill, "p5")), ""), r),
		impostor(t, ca, "p6", lie(RolePrefill, trusttest.ClosedAddr(t), ""), r),
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
			if mem.Verified {
				t.Fatalf("%s listed verified", mem.Name)
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

// A later run of a node at its addresses (a restart, or a holder of the
// gossip key pretending one: the certificate proves the identity, not the
// incarnation) is proven but waits until the run that holds the
// addresses is gone; a verified member that then claims an address it
// cannot prove is unverified again.
func TestProvenRunKeepsAddressUntilGone(t *testing.T) {
	ca := trusttest.New(t)
	logs := make(logSignal, 64)
	cfg, meta, _ := provenConfig(t, ca, RoleRouter, "r0")
	cfg.Logger = slog.New(logs)
	r := startMember(t, cfg, meta)
	d, _ := provenMember(t, ca, RoleDecode, "d0", r)
	awaitEvents(t, r, match{kind: EventUpdate, name: d.Name(), ok: verified})

	again := testMeta()
	again.RemoteAddr, again.DataAddr = d.Meta().RemoteAddr, d.Meta().DataAddr
	rerun := impostor(t, ca, "d0", again, r)
	awaitLog(t, logs, "cluster: proven member waits for the run holding its address")
	if got := verifiedNames(r, RoleDecode); !slices.Equal(got, []string{d.Name()}) {
		t.Fatalf("decode candidates %v while %s holds the address, want only it", got, d.Name())
	}

	if err := d.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	left := time.Now()
	if err := d.Shutdown(); err != nil {
		t.Fatal(err)
	}
	awaitEvents(t, r, match{kind: EventLeave, name: d.Name()}, match{kind: EventUpdate, name: rerun.Name(), ok: verified})
	t.Logf("the waiting run was verified %s after the holder left", time.Since(left))
	if got := verifiedNames(r, RoleDecode); !slices.Equal(got, []string{rerun.Name()}) {
		t.Fatalf("decode candidates %v, want %s", got, rerun.Name())
	}

	moved := rerun.Meta()
	moved.RemoteAddr = trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleDecode, "d9"))
	if err := rerun.UpdateMeta(moved); err != nil {
		t.Fatal(err)
	}
	awaitEvents(t, r, match{kind: EventUpdate, name: rerun.Name(),
		ok: func(ev Event) bool { return !ev.Member.Verified && ev.Member.Meta.RemoteAddr == moved.RemoteAddr }})
	waitFor(t, "the moved claim refused", eventDeadline, func() bool { return r.Stats().ClaimsRefused == 1 })
	if got := verifiedNames(r, RoleDecode); len(got) != 0 {
		t.Fatalf("decode candidates %v, want none", got)
	}
}

// awaitLog waits for a log record with message msg.
func awaitLog(t *testing.T, logs logSignal, msg string) {
	t.Helper()
	timer := time.NewTimer(eventDeadline)
	defer timer.Stop()
	for {
		select {
		case got := <-logs:
			if got == msg {
				return
			}
		case <-timer.C:
			t.Fatalf("no %q logged within %s", msg, eventDeadline)
		}
	}
}
