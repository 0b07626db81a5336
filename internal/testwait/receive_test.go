package testwait

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestReceive: a value sent within the bound is returned when it comes; with
// none, the wait fails at the bound, naming what it waited for.
func TestReceive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := make(chan int, 1)
		time.AfterFunc(3*time.Second, func() { ch <- 7 })
		r := &recorder{TB: t}
		start := time.Now()
		if v := Receive(r, "seven", ch, 10*time.Second); v != 7 || len(r.failures) != 0 || time.Since(start) != 3*time.Second {
			t.Fatalf("got %d after %s with failures %q; want 7 after 3s", v, time.Since(start), r.failures)
		}
		start = time.Now()
		if v := Receive(r, "another", ch, 10*time.Second); v != 0 || time.Since(start) != 10*time.Second {
			t.Fatalf("with nothing sent: got %d after %s", v, time.Since(start))
		}
		if want := []string{"another: not within 10s"}; len(r.failures) != 1 || r.failures[0] != want[0] {
			t.Fatalf("failures %q, want %q", r.failures, want)
		}
	})
}
