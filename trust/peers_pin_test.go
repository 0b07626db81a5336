package trust_test

import (
	"errors"
	"testing"

	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// TestPinnedAddressesAreKept: an address a live stream is bound to is never
// forgotten, however many others are looked up after it; when every
// address held has a live stream, a new one is refused, not let in by
// forgetting one.
func TestPinnedAddressesAreKept(t *testing.T) {
	ca := trusttest.New(t)
	cfg := trust.DefaultConfig()
	cfg.PeersMax = 2
	a, err := trust.New(ca.Bundle(t, trust.RoleDecode, "d"), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	router := trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleRouter, "r"))
	if _, _, err := a.Peers().Probe(router); err != nil || !a.Peers().Pin(router) {
		t.Fatalf("probe and pin of the router: %v", err)
	}
	for i := range 5 {
		if _, _, err := a.Peers().Probe(trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleTenant, "t"))); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	if id, ok := a.Peers().At(router); !ok || id.Role != trust.RoleRouter {
		t.Fatalf("the router's pinned address was forgotten: %s, %v", id, ok)
	}
	last := trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleTenant, "u"))
	if _, _, err := a.Peers().Probe(last); err != nil || !a.Peers().Pin(last) {
		t.Fatalf("probe and pin of a second address: %v", err)
	}
	if _, _, err := a.Peers().Probe(trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleTenant, "v"))); !errors.Is(err, trust.ErrBookFull) {
		t.Fatalf("probe with every address pinned: %v, want ErrBookFull", err)
	}
	a.Peers().Unpin(last)
	if _, _, err := a.Peers().Probe(trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleTenant, "w"))); err != nil {
		t.Fatalf("probe after an unpin: %v", err)
	}
	if _, ok := a.Peers().At(router); !ok {
		t.Fatal("the router's pinned address was forgotten for the unpinned one's successor")
	}
}
