package main

import (
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kvwarden/kvwarden/internal/testwait"
)

// upRouterRow is a row of node up's table, routers beyond the first
// included.
var upRouterRow = regexp.MustCompile(`^((?:router|prefill|decode)-\d+)\s+(router|prefill|decode)\s+(\S+)\s+\S+\s+[0-9a-f]{16}\s+(\d+)\s+\S+$`)

// TestBinaryUpRouters: node up --routers 2 starts two routers, each in the
// table with its address and API; status and generate with no credential
// flags find up's credentials at the second router's address; generate
// given both routers answers the reference before and after the first is
// killed (SIGKILL), which up survives; SIGTERM then stops up, which
// removes the credentials it made for both addresses.
func TestBinaryUpRouters(t *testing.T) {
	listen := freeTCPAddr(t)
	up := startProcess(t, "up", "--routers", "2", "--listen", listen, "--gossip-base-port", strconv.Itoa(freeGossipPort(t)),
		"--log-dir", t.TempDir(), "--http", "127.0.0.1:0", "--", "--reclaim-after", "2s")
	pids, addrs := map[string]int{}, map[string]string{}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	out := upPrinted(t, up, func(line string) {
		if m := upRouterRow.FindStringSubmatch(line); m != nil {
			pids[m[1]], _ = strconv.Atoi(m[4])
			addrs[m[1]] = m[3]
		}
	})
	printed := strings.Join(out, "\n")
	second := addrs["router-1"]
	if len(pids) != 4 || addrs["router-0"] != listen || second == "" ||
		!strings.Contains(out[0], "2 routers on "+listen+", "+second) || !strings.Contains(printed, "/v1 through router-1") ||
		!strings.Contains(printed, "--endpoint "+listen+","+second) {
		t.Fatalf("up printed %d nodes, want 4 with router-0 on %s, router-1 and its API:\n%s", len(pids), listen, printed)
	}

	code, stdout, stderr := runBinary(t, "", "status", "--endpoint", second)
	if code != exitOK || !strings.Contains(stdout, "role router") || !strings.Contains(stdout, "\n4 members:\n") {
		t.Fatalf("status at router-1: exit %d, want router-1 seeing 4 members:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	before := mixedRequests(4, 2, 200, 16)
	generateAll(t, second, before)
	checkReference(t, before)

	if err := syscall.Kill(pids["router-0"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "up logs router-0's exit", exitTimeout, func() bool {
		return strings.Contains(up.stderr.String(), "router exited; the other routers serve on")
	})
	after := mixedRequests(6, 3, 200, 16)
	generateAll(t, listen+","+second, after)
	checkReference(t, after)

	if err := up.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := up.exitCode(t, 2*exitTimeout); code != exitOK {
		t.Fatalf("up: exit %d after SIGTERM, want 0; stderr:\n%s", code, up.stderr)
	}
	for _, addr := range []string{listen, second} {
		if _, err := os.Lstat(localCertsDir(addr)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the credentials up made for %s are left (%v)", addr, err)
		}
	}
}

// TestRoutersRefused: a --routers out of range, or one whose APIs would
// run past the last port, is refused before any node starts, and a
// generate --endpoint list with an address that is not one, or one twice,
// before anything is sent; each with the value.
func TestRoutersRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"up", "--routers", "0"}, "--routers (0) must be 1 to 16"},
		{[]string{"up", "--routers", "17"}, "--routers (17) must be 1 to 16"},
		{[]string{"up", "--routers", "3", "--http", "127.0.0.1:65534"}, "router-2 would serve on port 65536"},
		{[]string{"generate", "--endpoint", "127.0.0.1:7070,nope", "--tenant", "acme", "--prompt", "hi"}, `--endpoint "nope"`},
		{[]string{"generate", "--endpoint", "127.0.0.1:7070,127.0.0.1:0", "--tenant", "acme", "--prompt", "hi"},
			`--endpoint "127.0.0.1:0": port "0" must be 1 to 65535`},
		{[]string{"generate", "--endpoint", "127.0.0.1:7070,127.0.0.1:7070", "--tenant", "acme", "--prompt", "hi"},
			"names 127.0.0.1:7070 twice"},
	} {
		code, out := runNode(tc.args...)
		if code != exitUsage || !strings.Contains(out, tc.want) || strings.Contains(out, "starting a local cluster") {
			t.Errorf("%s: exit %d, want %d with %q before any node starts:\n%s", strings.Join(tc.args, " "), code, exitUsage, tc.want, out)
		}
	}
}
