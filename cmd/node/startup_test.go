package main

import (
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testwait"
)

// TestBinarySignalDuringStart: a node whose join waits on a member that
// never answers (a listener whose kernel completes the TCP handshake, and
// nothing reads) stops on SIGTERM while it joins: exit 0 and the start-up
// signal logged, rather than waiting out the gossip TCP timeout and
// exiting 1 with the failed join.
func TestBinarySignalDuringStart(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// LAN timers (gossip on every interface): the join waits up to the
	// 10 s TCP timeout of cluster.DefaultConfig.
	p := startProcess(t, "run", "--insecure", "--role", "decode", "--listen", "127.0.0.1:0", "--gossip", "0.0.0.0:0",
		"--join", silent.Addr().String())
	testwait.For(t, "the node to begin its start", readyTimeout, func() bool {
		return strings.Contains(p.stderr.String(), `msg="starting the node"`)
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.exitCode(t, exitTimeout); code != exitOK {
		t.Fatalf("exit %d after SIGTERM during start-up, want %d; stderr:\n%s", code, exitOK, p.stderr)
	}
	if s := p.stderr.String(); !strings.Contains(s, "signal during start-up: stopping") || strings.Contains(s, "failed to join") {
		t.Fatalf("stderr does not say the signal stopped the start (or the join failed first):\n%s", s)
	}
}

// BenchmarkSignalDuringStart measures, side by side, how long a node that
// joins a silent member takes to exit: stopped by SIGTERM during the join
// (stop_ms), and left alone until the join gives up (join_fail_ms, the
// local gossip TCP timeout); stop/join is their ratio.
func BenchmarkSignalDuringStart(b *testing.B) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer silent.Close()
	args := []string{"run", "--insecure", "--role", "decode", "--listen", "127.0.0.1:0", "--gossip", "127.0.0.1:0",
		"--join", silent.Addr().String()}
	var stopped, failed time.Duration
	for b.Loop() {
		for _, signal := range []bool{true, false} {
			p := startProcess(b, args...)
			for !strings.Contains(p.stderr.String(), `msg="starting the node"`) {
				time.Sleep(time.Millisecond)
			}
			began := time.Now()
			if signal {
				if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					b.Fatal(err)
				}
			}
			<-p.exited
			if signal {
				stopped += time.Since(began)
			} else {
				failed += time.Since(began)
			}
		}
	}
	b.ReportMetric(float64(stopped.Milliseconds())/float64(b.N), "stop_ms")
	b.ReportMetric(float64(failed.Milliseconds())/float64(b.N), "join_fail_ms")
	b.ReportMetric(float64(stopped)/float64(failed), "stop/join")
}
