package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// upStopLine is up's last line, with up's pid.
var upStopLine = regexp.MustCompile(`(?m)^stop: +(.*) \(up is pid (\d+)\)$`)

// TestBinaryUpDetachDown: node up --detach returns once the cluster serves,
// having printed its table, and leaves it serving; a second up for the
// same address is refused with the first one's pid, before it touches the
// running cluster's credentials; node down stops the first and returns
// once it and its nodes have exited, its pid file and credentials gone; a
// second node down finds nothing to stop.
func TestBinaryUpDetachDown(t *testing.T) {
	listen, logs := freeTCPAddr(t), t.TempDir()
	up := []string{"up", "--listen", listen, "--gossip-base-port", strconv.Itoa(freeGossipPort(t)), "--log-dir", logs}
	code, stdout, stderr := runBinary(t, "", append(up, "--detach", "--", "--reclaim-after", "2s")...)
	nodes := map[string]upNode{}
	for _, line := range strings.Split(stdout, "\n") {
		parseUpRow(line, nodes)
	}
	m := upStopLine.FindStringSubmatch(stdout)
	if code != exitOK || m == nil || len(nodes) != 3 {
		t.Fatalf("up --detach: exit %d, want 0 with the table of 3 nodes and up's pid\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	pid, _ := strconv.Atoi(m[2])
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for _, n := range nodes {
			_ = syscall.Kill(n.pid, syscall.SIGKILL)
		}
	})
	if want := "node down --listen " + listen; m[1] != want {
		t.Errorf("up --detach says to stop it with %q, want %q", m[1], want)
	}

	reqs := mixedRequests(4, 2, 200, 16)
	generateAll(t, listen, reqs)
	checkReference(t, reqs)

	code, stdout, stderr = runBinary(t, "", up...)
	if want := "node up (pid " + m[2] + ") runs the cluster at " + listen + " already"; code != exitFailed ||
		!strings.Contains(stderr, want) || strings.Contains(stderr, "starting a local cluster") {
		t.Fatalf("a second up at %s: exit %d, want %d with %q before it starts anything\nstdout:\n%s\nstderr:\n%s",
			listen, code, exitFailed, want, stdout, stderr)
	}
	generateAll(t, listen, reqs[:1])
	checkReference(t, reqs[:1])

	// A record whose process started at another time names a process that
	// took up's pid after it ended: down must not stop it.
	record, err := os.ReadFile(upPIDFile(listen))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(upPIDFile(listen), fmt.Appendf(nil, "%d %d\n", pid, processStart(pid)+1), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runBinary(t, "", "down", "--listen", listen)
	if code != exitFailed || !strings.Contains(stderr, "no node up runs a cluster at "+listen) || !processIsUp(pid) {
		t.Fatalf("down with a record of another process's start: exit %d, up running %t; want %d and up left running:\n%s",
			code, processIsUp(pid), exitFailed, stderr)
	}
	if err := os.WriteFile(upPIDFile(listen), record, 0o600); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr = runBinary(t, "", "down", "--listen", listen)
	if want := "stopped node up (pid " + m[2] + ")"; code != exitOK || !strings.Contains(stdout, want) {
		t.Fatalf("down: exit %d, want 0 with %q\nstdout:\n%s\nstderr:\n%s", code, want, stdout, stderr)
	}
	if processIsUp(pid) {
		t.Errorf("up, pid %d, still runs after node down returned", pid)
	}
	for name, n := range nodes {
		if err := syscall.Kill(n.pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s, pid %d, still exists after node down returned (kill 0: %v)", name, n.pid, err)
		}
	}
	for _, path := range []string{upPIDFile(listen), localCertsDir(listen)} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left after node down (%v)", path, err)
		}
	}
	if log, err := os.ReadFile(logs + "/up.log"); err != nil || !strings.Contains(string(log), `msg="stopping the local cluster" signal=terminated`) {
		t.Errorf("up.log does not say up stopped on SIGTERM (%v):\n%s", err, log)
	}

	code, stdout, stderr = runBinary(t, "", "down", "--listen", listen)
	if want := "no node up runs a cluster at " + listen; code != exitFailed || !strings.Contains(stderr, want) {
		t.Errorf("a second down: exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", code, exitFailed, want, stdout, stderr)
	}
}

// TestUpDetachRefusals: --detach with --prompt, and a --ready-fd that is
// not past stderr, are refused before anything starts.
func TestUpDetachRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"up", "--detach", "--prompt", "hi"}, "--detach leaves the cluster serving, --prompt stops it"},
		{[]string{"up", "--ready-fd", "1"}, "--ready-fd (1) must be a descriptor past stderr"},
		{[]string{"down", "--timeout", "0s"}, "--timeout (0s) must be positive"},
		{[]string{"down", "--listen", "nowhere"}, `--listen "nowhere"`},
	} {
		code, out := runNode(tc.args...)
		if code != exitUsage || !strings.Contains(out, tc.want) || strings.Contains(out, "starting a local cluster") {
			t.Errorf("%s: exit %d, want %d with %q:\n%s", strings.Join(tc.args, " "), code, exitUsage, tc.want, out)
		}
	}
}

// TestClaimPIDTakesAStaleRecord: a record of a run that has ended (its
// pid gone, or taken by a process that started at another time) is
// replaced by the new run's; release removes only its own record.
func TestClaimPIDTakesAStaleRecord(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	listen := "127.0.0.1:7071"
	path := upPIDFile(listen)
	self := upRun{pid: os.Getpid(), start: processStart(os.Getpid())}
	for _, stale := range []string{fmt.Sprintf("%d %d\n", self.pid, self.start+1), "2147483646 1\n"} {
		if err := os.WriteFile(path, []byte(stale), 0o600); err != nil {
			t.Fatal(err)
		}
		release, err := claimPID(listen)
		if err != nil {
			t.Fatalf("a stale record %q: %v", stale, err)
		}
		if run, err := readPID(path); err != nil || run != self {
			t.Fatalf("after the claim the record is %+v (%v), want this run %+v", run, err, self)
		}
		release()
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("release left the record (%v)", err)
		}
	}
	if _, err := claimPID(listen); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("2147483646 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	release, _ := claimPID(listen) // takes the stale one
	if err := os.WriteFile(path, []byte("2147483645 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	release() // the record is another run's now
	if run, err := readPID(path); err != nil || run.pid != 2147483645 {
		t.Fatalf("release removed another run's record: %+v, %v", run, err)
	}
}
