package trust

import (
	"crypto/tls"
	"errors"
	"testing"
	"time"
)

// TestPinnedAddressesAreKept: an address a live stream is bound to is never
// forgotten, however many others are looked up after it; when every
// address held has a live stream, a new one is refused, not let in by
// forgetting one.
func TestPinnedAddressesAreKept(t *testing.T) {
	ca, err := NewCA("test", 2*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	bundle := func(role Role, name string) *Bundle {
		b, err := ca.Bundle(Identity{Cluster: "test", Role: role, Name: name}, nil, time.Hour, time.Now(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	serve := func(b *Bundle) string {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", b.ServerTLS())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.(*tls.Conn).Handshake()
				c.Close()
			}
		}()
		return ln.Addr().String()
	}
	cfg := DefaultConfig()
	cfg.PeersMax = 2
	a, err := New(bundle(RoleDecode, "d"), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	router := serve(bundle(RoleRouter, "r"))
	if _, _, err := a.peers.Probe(router); err != nil || !a.peers.pin(router) {
		t.Fatalf("probe and pin of the router: %v", err)
	}
	for i := range 5 {
		if _, _, err := a.peers.Probe(serve(bundle(RoleTenant, "t"))); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	if id, ok := a.peers.At(router); !ok || id.Role != RoleRouter {
		t.Fatalf("the router's pinned address was forgotten: %s, %v", id, ok)
	}
	last := serve(bundle(RoleTenant, "u"))
	if _, _, err := a.peers.Probe(last); err != nil || !a.peers.pin(last) {
		t.Fatalf("probe and pin of a second address: %v", err)
	}
	if _, _, err := a.peers.Probe(serve(bundle(RoleTenant, "v"))); !errors.Is(err, ErrBookFull) {
		t.Fatalf("probe with every address pinned: %v, want ErrBookFull", err)
	}
	a.peers.unpin(last)
	if _, _, err := a.peers.Probe(serve(bundle(RoleTenant, "w"))); err != nil {
		t.Fatalf("probe after an unpin: %v", err)
	}
	if _, ok := a.peers.At(router); !ok {
		t.Fatal("the router's pinned address was forgotten for the unpinned one's successor")
	}
}
