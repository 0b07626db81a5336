package testwait

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// recorder is a TB whose Fatal and Fatalf record the failure and return.
type recorder struct {
	testing.TB
	failures []string
}

func (r *recorder) Helper()           {}
func (r *recorder) Fatal(args ...any) { r.failures = append(r.failures, args[0].(string)) }
func (r *recorder) Fatalf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

// The waits run in a synctest bubble: its clock moves only when every
// goroutine of the bubble waits, so the times below are exact.
func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var done atomic.Bool
		time.AfterFunc(3*time.Second, func() { done.Store(true) })
		r := &recorder{TB: t}
		start := time.Now()
		For(r, "done", 10*time.Second, done.Load)
		took := time.Since(start)
		if len(r.failures) != 0 || took < 3*time.Second || took > 3*time.Second+PollMax {
			t.Fatalf("returned after %s with failures %q; want after 3s, within %s of it, none", took, r.failures, PollMax)
		}
		start = time.Now()
		For(r, "done again", 10*time.Second, done.Load)
		if took := time.Since(start); took != 0 {
			t.Fatalf("a condition that holds was waited for %s", took)
		}
	})
}

func TestReportFailsAtTheBoundWithWhatItSaw(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{TB: t}
		looks := 0
		start := time.Now()
		Report(r, "the pool frees", 10*time.Second, func() (bool, string) {
			looks++
			return false, "3 pages in use"
		})
		took := time.Since(start)
		if len(r.failures) != 1 || took != 10*time.Second {
			t.Fatalf("after %s, failures %q; want one failure at 10s", took, r.failures)
		}
		if want := "the pool frees: not within 10s; last seen: 3 pages in use"; r.failures[0] != want {
			t.Fatalf("failure %q, want %q", r.failures[0], want)
		}
		// Pauses of 1, 2, 4, … ms up to PollMax: far fewer looks than
		// 10 s at PollMin.
		if most := int(10*time.Second/PollMax) + 8; looks > most || looks < 2 {
			t.Fatalf("%d looks in 10s, want 2 to %d", looks, most)
		}
		For(r, "never", time.Second, func() bool { return false })
		if len(r.failures) != 2 || strings.Contains(r.failures[1], "last seen") {
			t.Fatalf("failure of a condition that says nothing: %q", r.failures[1:])
		}
	})
}

func TestRecvReturnsTheValueOrFailsAtTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := make(chan int, 1)
		time.AfterFunc(2*time.Second, func() { ch <- 7 })
		r := &recorder{TB: t}
		start := time.Now()
		if v := Recv(r, "the answer", 5*time.Second, ch); v != 7 || len(r.failures) != 0 || time.Since(start) != 2*time.Second {
			t.Fatalf("got %d after %s with failures %q; want 7 after 2s, none", v, time.Since(start), r.failures)
		}
		start = time.Now()
		if v := Recv(r, "a second answer", 5*time.Second, ch); v != 0 || time.Since(start) != 5*time.Second {
			t.Fatalf("got %d after %s; want the zero value at the bound, 5s", v, time.Since(start))
		}
		if want := []string{"a second answer: not within 5s"}; fmt.Sprint(r.failures) != fmt.Sprint(want) {
			t.Fatalf("failures %q, want %q", r.failures, want)
		}
	})
}

func TestGroupReturnsOnceDoneOrFailsAtTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var wg sync.WaitGroup
		wg.Go(func() { time.Sleep(2 * time.Second) })
		r := &recorder{TB: t}
		start := time.Now()
		Group(r, "the workers", 5*time.Second, &wg)
		if len(r.failures) != 0 || time.Since(start) != 2*time.Second {
			t.Fatalf("after %s with failures %q; want done after 2s, none", time.Since(start), r.failures)
		}
		block := make(chan struct{})
		wg.Go(func() { <-block })
		Group(r, "the stuck worker", 5*time.Second, &wg)
		if want := []string{"the stuck worker: not within 5s"}; fmt.Sprint(r.failures) != fmt.Sprint(want) {
			t.Fatalf("failures %q, want %q", r.failures, want)
		}
		close(block)
		wg.Wait()
	})
}
