package trust_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testnet"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// claimRefusal is how Verify's error would be counted, and the bound it
// names.
func claimRefusal(t *testing.T, what string, err error) (trust.Refusal, string) {
	t.Helper()
	var ae *trust.AddressError
	if !errors.As(err, &ae) {
		t.Fatalf("%s: %v, want an AddressError", what, err)
	}
	var le *trust.ClaimLimitError
	if errors.As(err, &le) {
		return ae.Refusal(), le.Field
	}
	return ae.Refusal(), ""
}

// A peer that claims addresses which accept TCP and never answer holds
// only its own share of the claim probes (per identity, per address, and
// the tenants' share, which leaves the reserve to nodes): another tenant's
// and a node's claims are still probed and proven while its probes hang,
// its further claims are refused by bound, and once its probes fail the
// same claim is refused from memory, without a probe.
func TestClaimProbesBoundedPerPeer(t *testing.T) {
	ca := trusttest.New(t)
	cfg := trust.DefaultConfig()
	// The hostile probes hang until the test releases them; the other
	// claims wait briefly for a probe that will not come free.
	cfg.DialTimeout, cfg.ClaimProbeWait = time.Minute, 50*time.Millisecond
	cfg.ClaimProbesMax, cfg.ClaimProbesReserved, cfg.ClaimProbesPerIdentityMax, cfg.ClaimProbesPerAddrMax = 6, 2, 2, 3
	a, err := trust.New(ca.Bundle(t, trust.RoleRouter, "r0"), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	peers := a.Peers()
	silent := testnet.NewSilent(t)
	hang, held, release := silent.Addr(), silent.Accepted, silent.Release

	bundles := map[string]*trust.Bundle{}
	tenant := func(name string) *trust.Bundle {
		if bundles[name] == nil {
			bundles[name] = ca.Bundle(t, trust.RoleTenant, name)
		}
		return bundles[name]
	}
	var wg sync.WaitGroup
	var hanging []error
	var mu sync.Mutex
	claimHanging := func(name, from string) {
		b := tenant(name)
		want := held() + 1
		wg.Go(func() {
			err := peers.Verify(from, hang, b.Self, b.Leaf)
			mu.Lock()
			hanging = append(hanging, err)
			mu.Unlock()
		})
		testwait.Report(t, "a hanging probe for "+name, time.Minute, func() (bool, string) {
			return held() >= want, ""
		})
	}
	refused := func(what, name, from string, wantR trust.Refusal, wantField string) {
		t.Helper()
		b := tenant(name)
		r, field := claimRefusal(t, what, peers.Verify(from, hang, b.Self, b.Leaf))
		if r != wantR || field != wantField {
			t.Fatalf("%s: refused as %s by %q, want %s by %q", what, r, field, wantR, wantField)
		}
	}
	proven := func(what string, b *trust.Bundle, from string) {
		t.Helper()
		if err := peers.Verify(from, trusttest.ServeTLS(t, b), b.Self, b.Leaf); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	claimHanging("mallory", "10.0.0.1:1")
	claimHanging("mallory", "10.0.0.1:2")
	refused("mallory's third claim", "mallory", "10.0.0.1:3", trust.RefusedClaimPeer, "ClaimProbesPerIdentityMax")
	proven("another tenant's claim while mallory's probes hang", tenant("acme"), "10.0.0.7:1")

	claimHanging("eve", "10.0.0.1:4")
	refused("a third identity from mallory's host", "trudy", "10.0.0.1:5", trust.RefusedClaimPeer, "ClaimProbesPerAddrMax")
	claimHanging("oscar", "10.0.0.2:1")
	refused("a tenant past the tenants' share", "walter", "10.0.0.3:1", trust.RefusedClaimProbes,
		"ClaimProbesMax less ClaimProbesReserved")
	proven("a node's claim from the reserve", ca.Bundle(t, trust.RoleDecode, "d1"), "10.0.0.4:1")
	if n := held(); n != 4 {
		t.Fatalf("%d probes reached the hanging address, want the 4 the bounds allowed", n)
	}

	release()
	testwait.Group(t, "the hanging probes ended", time.Minute, &wg)
	for _, err := range hanging {
		if r, _ := claimRefusal(t, "a hanging probe", err); r != trust.RefusedAddress {
			t.Fatalf("a hanging probe ended as %s (%v), want an address refusal", r, err)
		}
	}
	refused("mallory's claim again", "mallory", "10.0.0.1:6", trust.RefusedClaimRemembered, "")
	if n := held(); n != 4 {
		t.Fatalf("%d probes reached the hanging address, want no new one for a claim that failed lately", n)
	}
}

// Strangers: one address holds at most PerAddrMax, strangers together at
// most Max - Reserved, and the cluster's own addresses take the reserve
// whatever one address holds; every slot given back can be taken again.
func TestStrangersShares(t *testing.T) {
	s := trust.NewStrangers(trust.StrangerLimits{Max: 6, PerAddrMax: 2, Reserved: 2})
	take := func(host string, proven bool, want trust.Refusal, ok bool) {
		t.Helper()
		if r, got := s.Take(host, proven); got != ok || (!ok && r != want) {
			t.Fatalf("Take(%s, proven %v) = %s, %v; want %s, %v", host, proven, r, got, want, ok)
		}
	}
	take("10.0.0.1", false, 0, true)
	take("10.0.0.1", false, 0, true)
	take("10.0.0.1", false, trust.RefusedHandshakesAddr, false)
	take("10.0.0.2", false, 0, true)
	take("10.0.0.2", false, 0, true)
	take("10.0.0.3", false, trust.RefusedHandshakes, false)
	take("10.0.0.1", true, 0, true)
	take("10.0.0.9", true, 0, true)
	take("10.0.0.9", true, trust.RefusedHandshakes, false)
	if s.Waiting() != 6 {
		t.Fatalf("%d waiting, want 6", s.Waiting())
	}
	s.Give("10.0.0.2")
	s.Give("10.0.0.9")
	take("10.0.0.3", false, trust.RefusedHandshakes, false) // the reserve is the own addresses'
	s.Give("10.0.0.1")
	take("10.0.0.3", false, 0, true)
}
