package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testwait"
)

// TestBinaryStallMeasure measures what pauses of a decode node cost: for
// each pause in $KVW_STALL_PAUSES (say "1s,3s,5s,10s,20s,30s"), a decode
// node holding requests under load is stopped (SIGSTOP) that long and
// continued, and the share of the requests run meanwhile that failed,
// whether the node was taken for lost and when the last request in flight
// at the stop ended are logged; then $KVW_STALL_KILLS times (default 3) a decode node is killed
// (SIGKILL) and the time to the router's loss and to the end of the last
// request in flight is logged. $KVW_LOST_AFTER, if set, is every node's
// --lost-after. Without $KVW_STALL_PAUSES it is skipped: it takes
// minutes.
//
//	KVW_STALL_PAUSES=1s,3s,5s,10s,20s,30s go test -run TestBinaryStallMeasure -v ./cmd/node
func TestBinaryStallMeasure(t *testing.T) {
	spec := os.Getenv("KVW_STALL_PAUSES")
	if spec == "" {
		t.Skip("set KVW_STALL_PAUSES (e.g. 1s,3s,5s,10s,20s) to measure")
	}
	var extra []string
	if la := os.Getenv("KVW_LOST_AFTER"); la != "" {
		extra = append(extra, "--lost-after", la)
	}
	c := startStallCluster(t, extra...)
	for _, f := range strings.Split(spec, ",") {
		pause, err := time.ParseDuration(f)
		if err != nil {
			t.Fatal(err)
		}
		from := len(c.router.stderr.String())
		rs, stopped := c.pauseUnderLoad(t, pause)
		failed, codes := 0, map[string]int{}
		var slowest time.Duration
		for _, r := range rs {
			if r.code != exitOK {
				failed++
				codes[strings.TrimSpace(r.stderr)]++
			}
			if r.start.Before(stopped) {
				slowest = max(slowest, r.end.Sub(stopped))
			}
		}
		t.Logf("pause %s: %d of %d requests failed (%.0f %%); taken for lost: %v; the last request in flight at the stop ended %s after it; %v",
			pause, failed, len(rs), 100*float64(failed)/float64(len(rs)),
			strings.Contains(c.router.stderr.String()[from:], "member lost"), slowest.Round(time.Millisecond), codes)
	}
	kills := 3
	if k := os.Getenv("KVW_STALL_KILLS"); k != "" {
		fmt.Sscan(k, &kills)
	}
	var lost, answered []time.Duration
	for range kills {
		l, a := c.killUnderLoad(t, extra)
		lost, answered = append(lost, l), append(answered, a)
	}
	slices.Sort(lost)
	slices.Sort(answered)
	t.Logf("kill -9 of a decode node, %d times: router's loss after %v; the last request in flight at the kill ended after %v", kills, lost, answered)
}

// pauseUnderLoad stops a busy decode node for pause under load, continues
// it, waits until every member sees every other alive again, and returns
// the requests run meanwhile and when the node was stopped.
func (c *stallCluster) pauseUnderLoad(t *testing.T, pause time.Duration) ([]ran, time.Time) {
	t.Helper()
	stop := make(chan struct{})
	results := load(t, c.router.addr, stallWorkers, stop)
	victim, _ := c.busyDecode(t, 2)
	stopped := time.Now()
	if err := syscall.Kill(victim.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	<-time.After(pause) // the fault itself
	if err := syscall.Kill(victim.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, c.router, c.prefill, c.decodes[0], c.decodes[1])
	// The load goes on until the node that was stopped has been sent
	// requests again, so that the requests counted span the pause.
	before := admitted(t, victim)
	testwait.For(t, "the router routes to the node that was stopped", commandTimeout, func() bool {
		return admitted(t, victim) > before+stallWorkers
	})
	close(stop)
	return results(), stopped
}

// killUnderLoad kills a busy decode node under load and replaces it with a
// new one; it returns how long after the kill the router logged it lost,
// and the last request in flight at the kill ended (answered through the
// other decode node, or failed node_lost).
func (c *stallCluster) killUnderLoad(t *testing.T, extra []string) (lost, answered time.Duration) {
	t.Helper()
	stop := make(chan struct{})
	results := load(t, c.router.addr, stallWorkers, stop)
	victim, other := c.busyDecode(t, 2)
	name := fmt.Sprintf("%016x", victim.incarnation)
	from, killed := len(c.router.stderr.String()), time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	loggedAfter(t, c.router, from, convergeTimeout, "member lost", name)
	lost = time.Since(killed)
	close(stop)
	for _, r := range results() {
		if r.start.Before(killed) {
			answered = max(answered, r.end.Sub(killed))
		}
	}
	fresh := startMember(t, "decode", c.router.gossip, extra...)
	for i, d := range c.decodes {
		if d == victim {
			c.decodes[i] = fresh
		}
	}
	waitConverged(t, c.router, c.prefill, other, fresh)
	return lost, answered
}
