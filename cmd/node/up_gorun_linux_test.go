package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"testing"

	"github.com/kvwarden/kvwarden/internal/testwait"
)

// TestUpStopsWithGoRun: "go run ./cmd/node up &" then "kill $!" ends the
// go command, which forwards no SIGTERM to up: up, told by the kernel that
// its parent ended, stops its nodes and exits as on SIGTERM, removing its
// pid file and credentials, rather than keeping the ports.
func TestUpStopsWithGoRun(t *testing.T) {
	nodeBinary(t) // skipped under -short, as the other tests that build
	listen := freeTCPAddr(t)
	goRun := startCommand(t, "go", "run", ".", "up", "--listen", listen, "--gossip-base-port", strconv.Itoa(freeGossipPort(t)),
		"--log-dir", t.TempDir(), "--http", "")
	nodes := map[string]upNode{}
	// go run builds the binary first: a bound for a build and a start.
	out := upPrintedWithin(t, goRun, commandTimeout+readyTimeout, func(line string) { parseUpRow(line, nodes) })
	m := upStopLine.FindStringSubmatch(out[len(out)-1])
	if m == nil || len(nodes) != 3 {
		t.Fatalf("go run . up printed no table of 3 nodes ending with up's pid:\n%v", out)
	}
	upPID, _ := strconv.Atoi(m[2])
	pids := map[string]int{"up": upPID}
	for name, n := range nodes {
		pids[name] = n.pid
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if upPID == goRun.cmd.Process.Pid {
		t.Fatalf("up's pid %d is go run's: want up a child of the go command", upPID)
	}

	if err := goRun.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testwait.Report(t, "up and its nodes exit once the go command is gone", 2*exitTimeout, func() (bool, string) {
		for name, pid := range pids {
			if alive(pid) {
				return false, fmt.Sprintf("%s (pid %d) runs", name, pid)
			}
		}
		return true, ""
	})
	for _, path := range []string{upPIDFile(listen), localCertsDir(listen)} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left: up did not stop as on SIGTERM (%v)", path, err)
		}
	}
}

// regexpZombie matches /proc/PID/stat of a process that has ended: its
// state, after the command name, is Z or X.
var regexpZombie = regexp.MustCompile(`\) [ZX] `)

// alive says whether pid is a process that has not ended (a zombie has).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !regexpZombie.Match(stat)
}
