package main

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
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
	// 10 s TCP timeout of membership.DefaultConfig.
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

// TestUpChecksNodeSettings: up makes every check node run would make of
// each node, the arguments after "--" and the nodes' memory together
// included, before it starts any process: a usage error, and no node's log
// in --log-dir.
func TestUpChecksNodeSettings(t *testing.T) {
	host := hostMemoryBytes()
	if host == 0 {
		t.Fatal("the host's memory is unknown here; the memory case needs it")
	}
	// Three decode nodes of pools just over a third of the host each: any
	// one fits the host, the three together do not.
	pages := strconv.FormatInt(host/3/int64(actors.DefaultConfig().Geometry().PageBytes())+1, 10)
	tests := []struct {
		name string
		args []string
		exit int
		want string
	}{
		{"unknown flag", []string{"--", "--bogus-flag"}, exitUsage,
			"a router node would refuse its settings (node run --role router --bogus-flag): unknown flag: --bogus-flag"},
		{"queue", []string{"--", "--queue-max", "0"}, exitUsage, "QueueMax (0) must be at least 1"},
		// Preflight's refusal, as node run exits with it.
		{"decode pool", []string{"--", "--decode-pages", "8"}, exitFailed,
			"a decode node would refuse its settings (node run --role decode --decode-pages 8): run: each decode worker's pool holds 128 tokens"},
		{"memory together", []string{"--decode", "3", "--", "--decode-pages", pages}, exitUsage,
			"more than the host's memory, " + strconv.FormatInt(host, 10) + " bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logs := t.TempDir()
			code, stdout, stderr := runBinary(t, "", append([]string{"up", "--listen", freeTCPAddr(t), "--gossip-base-port", "0",
				"--log-dir", logs}, tc.args...)...)
			if code != tc.exit || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", code, tc.exit, tc.want, stdout, stderr)
			}
			if started, _ := filepath.Glob(filepath.Join(logs, "*.log")); len(started) > 0 {
				t.Fatalf("up started nodes before refusing: %v", started)
			}
		})
	}
}
