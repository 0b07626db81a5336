package actors

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/kv"
)

// TestUnleaseOfALeaseNotHeldStaysHere: a page counts leases, not whose
// they are, so a client gives back only the leases it holds: a second
// unlease of a shared lease is refused at the client, and the other
// reader's lease still keeps the evicted page from being freed until that
// reader gives it back.
func TestUnleaseOfALeaseNotHeldStaysHere(t *testing.T) {
	cfg := testConfig()
	n := startNode(t, cfg)
	pool, err := spawnPool(n.Root(), "unlease/pool", cfg.pool(2, n.Config().Incarnation), n.Mailbox(), cfg.CallTimeout,
		time.Now, cfg.fairness(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
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
