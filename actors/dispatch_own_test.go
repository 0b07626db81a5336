package actors

import (
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testwait"
)

// TestOwnDispatcherRunsInOrderUntilClosed: runs go one after another on
// the dispatcher's goroutine, a run scheduled from inside one included;
// once closed, a run is dropped, not a panic.
func TestOwnDispatcherRunsInOrderUntilClosed(t *testing.T) {
	d := newOwnDispatcher(300)
	got := make(chan int, 3)
	d.Schedule(func() {
		got <- 1
		d.Schedule(func() { got <- 2 })
	})
	for want := 1; want <= 2; want++ {
		if n := testwait.Recv(t, "a scheduled run", time.Minute, got); n != want {
			t.Fatalf("run %d came as %d", want, n)
		}
	}
	d.close()
	d.close()
	d.Schedule(func() { got <- 3 })
	select {
	case n := <-got:
		t.Fatalf("run %d ran after close", n)
	default:
	}
	if d.Throughput() != 300 {
		t.Errorf("throughput %d, want 300", d.Throughput())
	}
}
