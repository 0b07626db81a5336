package testwait

import (
	"fmt"
	"testing"
	"time"
)

// Receive waits for a value from ch, and fails tb after within if none
// came: a channel a test waits on has a deadline, and the failure names
// what was waited for.
func Receive[T any](tb testing.TB, what string, ch <-chan T, within time.Duration) T {
	tb.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		tb.Fatal(fmt.Sprintf("%s: not within %s", what, within))
	}
	var zero T
	return zero // for a TB whose Fatal returns
}
