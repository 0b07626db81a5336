// Package testwait waits, in tests, for a condition that something else
// makes true: another goroutine, another process, the network. Tests ask
// for the outcome they expect and wait for it with a bound, never sleep
// for a guessed time: the bound only decides how long a broken system
// takes to fail the test, so it is generous, and a fast machine does not
// wait longer than the condition needs.
//
// Conditions are polled: the things tests wait for here (a process's
// status, a server's counters, a pool's free pages) have no event to wait
// on. The first look is immediate; then the pause between looks doubles
// from PollMin to PollMax, so that a quick condition is seen at once and a
// slow one does not load the machine it waits on.
package testwait

import (
	"fmt"
	"testing"
	"time"
)

// PollMin and PollMax bound the pause between two looks at a condition.
const (
	PollMin = time.Millisecond
	PollMax = 50 * time.Millisecond
)

// For waits until cond holds, and fails tb after within if it has not.
func For(tb testing.TB, what string, within time.Duration, cond func() bool) {
	tb.Helper()
	Report(tb, what, within, func() (bool, string) { return cond(), "" })
}

// Report is For for a condition that says what it saw when it does not
// hold; the last thing it said is in the failure.
func Report(tb testing.TB, what string, within time.Duration, cond func() (ok bool, saw string)) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for pause := PollMin; ; pause = min(2*pause, PollMax) {
		ok, saw := cond()
		if ok {
			return
		}
		if !time.Now().Before(deadline) {
			msg := fmt.Sprintf("%s: not within %s", what, within)
			if saw != "" {
				msg += "; last seen: " + saw
			}
			tb.Fatal(msg)
			return // for a TB whose Fatal returns
		}
		time.Sleep(min(pause, time.Until(deadline)))
	}
}
