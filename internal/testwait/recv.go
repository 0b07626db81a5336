package testwait

import (
	"sync"
	"testing"
	"time"
)

// Recv receives one value from ch and fails tb if none comes within: a test
// that waits for another goroutine's answer says what it waited for
// instead of blocking until the test binary's own timeout.
func Recv[T any](tb testing.TB, what string, within time.Duration, ch <-chan T) T {
	tb.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		tb.Fatalf("%s: not within %s", what, within)
	}
	var zero T
	return zero // for a TB whose Fatalf returns
}

// Group waits for wg and fails tb if it is not done within: a test that
// stops its own goroutines says which did not stop instead of blocking
// until the test binary's own timeout.
func Group(tb testing.TB, what string, within time.Duration, wg *sync.WaitGroup) {
	tb.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	Recv(tb, what, within, done)
}
