package trust_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// claimFrom is where the tests' claimants connect from.
const claimFrom = "10.0.0.9:4000"

func TestPeersVerify(t *testing.T) {
	ca := trusttest.New(t)
	holder, claimant := ca.Bundle(t, trust.RoleDecode, "d0"), ca.Bundle(t, trust.RoleDecode, "d1")
	addr := trusttest.ServeTLS(t, holder)
	peers := ca.Authority(t, trust.RoleRouter, "r0", nil).Peers()

	if _, ok := peers.At(addr); ok {
		t.Fatal("the book knows an address nobody dialed")
	}
	if err := peers.Verify(claimFrom, addr, holder.Self, holder.Leaf); err != nil {
		t.Fatalf("Verify(holder) = %v", err)
	}
	if id, ok := peers.At(addr); !ok || id != holder.Self {
		t.Fatalf("At(%s) = %s, %v; want %s", addr, id, ok, holder.Self)
	}
	var ae *trust.AddressError
	err := peers.Verify(claimFrom, addr, claimant.Self, claimant.Leaf)
	if !errors.As(err, &ae) || ae.Found != holder.Self || ae.Claimed != claimant.Self || ae.Err != nil || ae.Addr != addr {
		t.Fatalf("Verify(claimant) = %v, want an AddressError finding %s", err, holder.Self)
	}
	if !errors.Is(err, trust.ErrNotAuthenticated) || !strings.Contains(err.Error(), "served by "+holder.Self.String()) {
		t.Fatalf("claimant's error %q", err)
	}
	dead := trusttest.ClosedAddr(t)
	err = peers.Verify(claimFrom, dead, holder.Self, holder.Leaf)
	if !errors.As(err, &ae) || ae.Err == nil || !ae.Found.IsZero() {
		t.Fatalf("Verify(nothing listening) = %v, want an AddressError with the dial error", err)
	}
	if _, ok := peers.At(dead); ok {
		t.Fatal("the book records an address where nothing answered")
	}
}

// A server of a foreign CA proves nothing, and is not recorded.
func TestPeersProbeStranger(t *testing.T) {
	ca := trusttest.New(t)
	addr := trusttest.ServeTLS(t, trusttest.New(t).Bundle(t, trust.RoleDecode, "d0"))
	peers := ca.Authority(t, trust.RoleDecode, "d1", nil).Peers()
	var ce *trust.CertError
	if _, _, err := peers.Probe(addr); !errors.As(err, &ce) {
		t.Fatalf("Probe(stranger) = %v, want a CertError", err)
	}
	if _, ok := peers.At(addr); ok {
		t.Fatal("a stranger's address was recorded")
	}
}

func TestPeersBookBounded(t *testing.T) {
	ca := trusttest.New(t)
	cfg := trust.DefaultConfig()
	cfg.PeersMax = 2
	a, err := trust.New(ca.Bundle(t, trust.RoleRouter, "r0"), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, name := range []string{"d0", "d1", "d2"} {
		addr := trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleDecode, name))
		if id, _, err := a.Peers().Probe(addr); err != nil || id.Name != name {
			t.Fatalf("Probe(%s) = %s, %v", addr, id, err)
		}
		addrs = append(addrs, addr)
	}
	if _, ok := a.Peers().At(addrs[0]); ok {
		t.Fatalf("the book holds %s beyond PeersMax (2)", addrs[0])
	}
	for _, addr := range addrs[1:] {
		if _, ok := a.Peers().At(addr); !ok {
			t.Fatalf("the book forgot %s, seen after the oldest", addr)
		}
	}
}

func TestAuthorityConfigValidate(t *testing.T) {
	b := trusttest.New(t).Bundle(t, trust.RoleDecode, "d0")
	tests := []struct {
		edit func(*trust.Config)
		want string
	}{
		{func(c *trust.Config) { c.PeersMax = 0 }, "PeersMax (0) must be at least 1"},
		{func(c *trust.Config) { c.DialTimeout = 0 }, "DialTimeout (0s) must be positive"},
		{func(c *trust.Config) { c.StreamsPerConnMax = 0 }, "StreamsPerConnMax (0) must be at least 1"},
		{func(c *trust.Config) { c.ClaimProbeWait = 0 }, "ClaimProbeWait (0s) must be positive"},
		{func(c *trust.Config) { c.ClaimProbesReserved = 16 }, "ClaimProbesReserved (16) must be in [0, ClaimProbesMax (16))"},
		{func(c *trust.Config) { c.ClaimProbesPerIdentityMax = 0 }, "ClaimProbesPerIdentityMax (0) must be in [1, ClaimProbesMax (16)]"},
		{func(c *trust.Config) { c.ClaimProbesPerAddrMax = 17 }, "ClaimProbesPerAddrMax (17) must be in [1, ClaimProbesMax (16)]"},
		{func(c *trust.Config) { c.ClaimFailureTTL = -time.Second }, "ClaimFailureTTL (-1s) must be positive"},
		{func(c *trust.Config) { c.ClaimFailuresMax = 0 }, "ClaimFailuresMax (0) must be at least 1"},
		{func(c *trust.Config) { c.RemoteHandshakesMax = 0 }, "RemoteHandshakesMax (0) must be at least 1"},
		{func(c *trust.Config) { c.RemoteHandshakesReserved = 256 }, "RemoteHandshakesReserved (256) must be in [0, RemoteHandshakesMax (256))"},
		{func(c *trust.Config) { c.RemoteHandshakesPerAddrMax = 193 },
			"RemoteHandshakesPerAddrMax (193) must be in [1, RemoteHandshakesMax (256) - RemoteHandshakesReserved (64)]"},
		{func(c *trust.Config) { c.ProvenAddrTTL = 0 }, "ProvenAddrTTL (0s) must be positive"},
		{func(c *trust.Config) { c.ProvenAddrsMax = 0 }, "ProvenAddrsMax (0) must be at least 1"},
	}
	for _, tt := range tests {
		c := trust.DefaultConfig()
		tt.edit(&c)
		if _, err := trust.New(b, c, nil); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New = %v, want %q", err, tt.want)
		}
	}
	if _, err := trust.New(nil, trust.DefaultConfig(), nil); err == nil || !strings.Contains(err.Error(), "Insecure") {
		t.Errorf("New(nil bundle) = %v, want a pointer to Insecure", err)
	}
}

func TestSenderOf(t *testing.T) {
	ca := trusttest.New(t)
	server := ca.Bundle(t, trust.RoleDecode, "d0")
	addr := trusttest.ServeTLS(t, server)
	a := ca.Authority(t, trust.RoleRouter, "r0", nil)
	if _, _, err := a.Peers().Probe(addr); err != nil {
		t.Fatal(err)
	}
	self := actor.NewPID("127.0.0.1:1", "admission")
	tests := []struct {
		name   string
		auth   *trust.Authority
		sender *actor.PID
		want   trust.Sender
		may    []trust.Role // roles it may act as
		mayNot []trust.Role
	}{
		{"no sender", a, nil, trust.Sender{Local: true}, []trust.Role{trust.RoleOperator}, nil},
		{"this process", a, actor.NewPID(self.Address, "x"), trust.Sender{Local: true}, []trust.Role{trust.RoleOperator}, nil},
		{"proven peer", a, actor.NewPID(addr, "x"), trust.Sender{Identity: server.Self},
			[]trust.Role{trust.RoleDecode}, []trust.Role{trust.RoleOperator, trust.RolePrefill}},
		{"unknown peer", a, actor.NewPID("127.0.0.1:2", "x"), trust.Sender{},
			nil, []trust.Role{trust.RoleDecode, trust.RoleTenant, ""}},
		{"insecure", trust.Insecure(nil), actor.NewPID("127.0.0.1:2", "x"), trust.Sender{Insecure: true},
			[]trust.Role{trust.RoleOperator}, nil},
	}
	for _, tt := range tests {
		got := tt.auth.SenderOf(self, tt.sender)
		if got != tt.want {
			t.Errorf("%s: SenderOf = %+v, want %+v", tt.name, got, tt.want)
		}
		for _, r := range tt.may {
			if !got.May(r) {
				t.Errorf("%s: %s may not act as %s", tt.name, got, r)
			}
		}
		for _, r := range tt.mayNot {
			if got.May(r) {
				t.Errorf("%s: %s may act as %q", tt.name, got, r)
			}
		}
	}
}

func TestRefusalsCounted(t *testing.T) {
	a := trust.Insecure(nil)
	a.Refuse(trust.RefusedBatch, "test")
	a.Refuse(trust.RefusedBatch, "test")
	a.Refuse(trust.RefusedDataPlane, "test")
	got := a.Refused()
	if got[trust.RefusedBatch] != 2 || got[trust.RefusedDataPlane] != 1 || got.Total() != 3 {
		t.Fatalf("Refused = %v, want 2 batch and 1 data-plane", got)
	}
	names := trust.RefusalNames()
	if len(names) != len(got) || names[trust.RefusedAddress] != "address" || trust.RefusedPanic.String() != "panic" ||
		trust.Refusal(200).String() != "unknown" {
		t.Fatalf("refusal names %v", names)
	}
}
