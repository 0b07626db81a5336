package actors

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
)

// TestUnleaseOfALeaseNotHeldStaysHere: a page counts leases, not whose
// they are, so a client gives back only the leases it holds: a second
// unlease of a shared lease is refused at the client, and the other
// reader's lease still keeps the evicted page from being freed until that
// reader gives it back.
func TestUnleaseOfALeaseNotHeldStaysHere(t *testing.T) {
	cfg := testConfig()
	n := startNode(t, cfg)
	pool := nodePool(t, n, "unlease/pool", 2, cfg.CallTimeout)
	a, b := newPageClient(pool, n.Root()), newPageClient(pool, n.Root())
	writer := kv.Owner{Request: 1, Tenant: "acme"}
	scope := kv.TenantScope("acme")
	tags, err := a.Reserve(writer, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	row := make([]byte, cfg.Geometry().PageBytes())
	if err := a.Write(tags[0], writer, 0, row); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Seal(tags[0], writer); err != nil {
		t.Fatal(err)
	}
	if err := a.AwaitAck(tags[0], writer); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(tags[0], writer); err != nil {
		t.Fatal(err)
	}
	cached, err := a.AckPublish(tags[0], writer, scope)
	if err != nil || cached.Tag == (kv.Tag{}) {
		t.Fatalf("publish on the ack: %+v, %v", cached, err)
	}
	la, err := a.LeaseShared(cached, kv.Owner{Request: 2, Tenant: "acme"}, scope)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.LeaseShared(cached, kv.Owner{Request: 3, Tenant: "acme"}, scope)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Unlease(la); err != nil {
		t.Fatal(err)
	}
	var se *kv.StateError
	if err := a.Unlease(la); !errors.As(err, &se) {
		t.Fatalf("a second unlease of one lease: %v, want refused here", err)
	}
	if err := a.Evict(cached); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Read(lb); err != nil {
		t.Fatalf("the other reader's read after the eviction, its lease held: %v", err)
	}
	if s, _ := pool.Status(n.Root()); s.Free != 1 {
		t.Fatalf("%d of 2 pages free while a lease holds the evicted page, want 1", s.Free)
	}
	if err := b.Unlease(lb); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the evicted page freed at its last unlease", time.Minute, func() bool {
		s, _ := pool.Status(n.Root())
		return s.Free == 2
	})
}

// TestCachedPagesAreNoTenantsShare: a page published to the prefix cache
// is no longer held by the tenant whose request computed it, so a tenant
// whose cached pages reach its pool share still gets pages while the pool
// has them free.
func TestCachedPagesAreNoTenantsShare(t *testing.T) {
	sys := messages.NewActorSystem(nil)
	t.Cleanup(sys.Shutdown)
	cfg := testConfig().pool(8, 1)
	var drops atomic.Uint64
	pool, err := spawnPool(sys.Root, "p/pool", cfg, NewMailbox(sys, 64, &drops), 5*time.Second, time.Now,
		poolFairness{tenants: tenancy.NewShares(tenancy.DefaultPolicy()), retry: time.Second}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c := newPageClient(pool, sys.Root)
	g := cfg.Geometry
	scope := kv.TenantScope("acme")
	// Two requests of acme leave 3 full pages each in the cache: 6 of 8,
	// the default share's 75%.
	for r := range 2 {
		o := kv.Owner{Request: uint64(r + 1), Tenant: "acme"}
		tags, err := pool.Reserve(sys.Root, o, 0, 3)
		if err != nil {
			t.Fatal(err)
		}
		for i, tag := range tags {
			if err := c.Write(tag, o, i*g.PageTokens, make([]byte, g.PageTokens*g.BytesPerToken())); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Seal(tag, o); err != nil {
				t.Fatal(err)
			}
			if err := c.AwaitAck(tag, o); err != nil {
				t.Fatal(err)
			}
			if err := c.Release(tag, o); err != nil {
				t.Fatal(err)
			}
			if cp, err := c.AckPublish(tag, o, scope); err != nil || cp.Tag == (kv.Tag{}) {
				t.Fatalf("publish: %v", err)
			}
		}
	}
	if _, err := pool.Reserve(sys.Root, kv.Owner{Request: 3, Tenant: "acme"}, 0, 2); err != nil {
		t.Fatalf("acme, holding no request's page, refused the 2 free pages: %v", err)
	}
}
