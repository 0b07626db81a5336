package testwait

import (
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
