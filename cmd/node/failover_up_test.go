package main

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// TestBinaryUpRouters: node up --routers 2 starts two routers, each in the
// table with its address and API; status and generate with no credential
// flags find up's credentials at the second router's address; generate
// given both routers answers the reference before and after the first is
// killed (SIGKILL), which up survives (with --restarts-max 0, it gives the
// router up and the other serves on); SIGTERM then stops up, which
// removes the credentials it made for both addresses.
func TestBinaryUpRouters(t *testing.T) {
	up := startUp(t, "--routers", "2", "--http", "127.0.0.1:0", "--restarts-max", "0", "--", "--reclaim-after", "2s")
	listen, second := up.nodes["router-0"].addr, up.nodes["router-1"].addr
	printed := strings.Join(up.printed, "\n")
	if len(up.nodes) != 4 || second == "" || !strings.Contains(up.printed[0], "2 routers on "+listen+", "+second) ||
		!strings.Contains(printed, "/v1 through router-1") || !strings.Contains(printed, "--endpoint "+listen+","+second) {
		t.Fatalf("up printed %d nodes, want 4 with router-0 on %s, router-1 and its API:\n%s", len(up.nodes), listen, printed)
	}

	code, stdout, stderr := runBinary(t, "", "status", "--endpoint", second)
	if code != exitOK || !strings.Contains(stdout, "role router") || !strings.Contains(stdout, "\n4 members:\n") {
		t.Fatalf("status at router-1: exit %d, want router-1 seeing 4 members:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	before := mixedRequests(4, 2, 200, 16)
	generateAll(t, second, before)
	checkReference(t, before)

	if err := syscall.Kill(up.nodes["router-0"].pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	upLine(t, up, regexp.MustCompile(`^gave up on router-0: it exited \(signal: killed\) after 0 restarts within `))
	after := mixedRequests(6, 3, 200, 16)
	generateAll(t, listen+","+second, after)
	checkReference(t, after)

	up.stop(t)
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
