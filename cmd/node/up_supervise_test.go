package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// upLine reads up's stdout, after its table, until a line matches re,
// and returns it; it fails the test when up closes stdout first or prints
// none within readyTimeout.
func upLine(t *testing.T, up *upCluster, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.After(readyTimeout)
	var saw []string
	for {
		select {
		case line, ok := <-up.stdout:
			if !ok {
				t.Fatalf("up closed stdout before printing a line like %q; after its table it printed:\n%s\nstderr:\n%s", re,
					strings.Join(saw, "\n"), up.stderr)
			}
			if re.MatchString(line) {
				return line
			}
			saw = append(saw, line)
		case <-deadline:
			t.Fatalf("up printed no line like %q within %s; after its table it printed:\n%s\nstderr:\n%s", re, readyTimeout,
				strings.Join(saw, "\n"), up.stderr)
		}
	}
}

// upRestarted is the line up prints when a node it restarted serves:
// name, restarts, then pid, address, gossip, HTTP and incarnation.
var upRestarted = regexp.MustCompile(`^restarted (\S+) \((\d+) of at most \d+ restarts within \S+\): pid (\d+), address (\S+), gossip (\S+), http (\S+), incarnation ([0-9a-f]{16})$`)

// awaitRestart waits for up's line saying that node name serves again,
// checks that it is a new process at the same HTTP address (a router also
// at the same address), and returns it as up's table would.
func awaitRestart(t *testing.T, up *upCluster, name string) upNode {
	t.Helper()
	line := upLine(t, up, regexp.MustCompile(`^restarted `+name+` `))
	m := upRestarted.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("up's line on %s's restart, %q, is not of the form %q", name, line, upRestarted)
	}
	pid, _ := strconv.Atoi(m[3])
	inc, _ := strconv.ParseUint(m[7], 16, 64)
	old := up.nodes[name]
	n := upNode{role: old.role, addr: m[4], gossip: m[5], http: m[6], pid: pid, incarnation: inc}
	if n.pid == old.pid || n.incarnation == old.incarnation || n.http != old.http || (n.role == "router" && n.addr != old.addr) {
		t.Fatalf("%s restarted as %+v, was %+v: want a new pid and incarnation at the same HTTP address (a router at its address too)",
			name, n, old)
	}
	up.nodes[name] = n
	return n
}

// upConverged waits until every node of up sees exactly up's nodes
// alive, by their incarnations (node status --json with up's
// credentials).
func upConverged(t *testing.T, up *upCluster) {
	t.Helper()
	var want []uint64
	for _, n := range up.nodes {
		want = append(want, n.incarnation)
	}
	slices.Sort(want)
	certs := localCertsDir(up.nodes["router-0"].addr)
	testwait.Report(t, "every node of up sees every other alive", convergeTimeout, func() (bool, string) {
		for name, n := range up.nodes {
			code, stdout, stderr := runBinary(t, "", "status", "--json", "--endpoint", n.addr, "--certs", certs)
			var s messages.StatusReply
			if code != exitOK || json.Unmarshal([]byte(stdout), &s) != nil {
				return false, fmt.Sprintf("status of %s: exit %d: %s", name, code, stderr)
			}
			if got := aliveIncarnations(&s); !slices.Equal(got, want) {
				return false, fmt.Sprintf("%s sees %x alive, want %x", name, got, want)
			}
		}
		return true, ""
	})
}

// inFlight is the kvwarden_requests_in_flight a node's /metrics gives.
func inFlight(t *testing.T, n upNode) (int, error) {
	t.Helper()
	res, err := http.Get("http://" + n.http + "/metrics")
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`(?m)^kvwarden_requests_in_flight (\d+)$`).FindSubmatch(body)
	if m == nil {
		return 0, fmt.Errorf("%s/metrics has no kvwarden_requests_in_flight", n.http)
	}
	return strconv.Atoi(string(m[1]))
}

// killUnderLoad waits until node name of up has requests in flight, by
// its own metrics, then kills it (SIGKILL).
func killUnderLoad(t *testing.T, up *upCluster, name string) {
	t.Helper()
	testwait.Report(t, name+" has requests in flight", commandTimeout, func() (bool, string) {
		n, err := inFlight(t, up.nodes[name])
		return err == nil && n > 0, fmt.Sprintf("in flight %d (%v)", n, err)
	})
	if err := syscall.Kill(up.nodes[name].pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// TestBinaryUpRestartsNodes: under node up, with requests running through
// both routers, a decode node and then router-0 are killed (SIGKILL). Up
// restarts each (a new process and incarnation; router-0 on its address,
// each node on its HTTP port) and prints it; the cluster forms again, with
// router-0 joined through the nodes that stayed; every request answers the
// reference or fails (those the killed nodes held), and requests after the
// restarts, through router-0 alone, all answer the reference. Up then
// stops on SIGTERM with every process it started, restarts included.
func TestBinaryUpRestartsNodes(t *testing.T) {
	up := startUp(t, "--routers", "2", "--decode", "2", "--restart-backoff", "100ms", "--", "--reclaim-after", "2s")
	if !strings.Contains(strings.Join(up.printed, "\n"), "a node that fails is restarted, at most 5 times within 10m0s") {
		t.Errorf("up does not say that it restarts a node that fails:\n%s", strings.Join(up.printed, "\n"))
	}
	listen := up.nodes["router-0"].addr
	stop := make(chan struct{})
	results := load(t, listen+","+up.nodes["router-1"].addr, 4, stop)

	killUnderLoad(t, up, "decode-0")
	awaitRestart(t, up, "decode-0")
	killUnderLoad(t, up, "router-0")
	awaitRestart(t, up, "router-0")
	close(stop)
	// What the cluster's failover makes of the requests the killed nodes
	// held is not under test here, only that none answers wrongly: each
	// answers the reference or fails node_lost, busy, or at its connection
	// to the killed router.
	var ok []*request
	failed := map[string]int{}
	for _, r := range results() {
		why := ""
		for _, w := range []string{"node_lost", "busy", listen} {
			if r.code == exitFailed && why == "" && strings.Contains(r.stderr, w) {
				why = w
			}
		}
		if why == "" {
			ok = append(ok, r.request)
		}
		failed[why]++
	}
	checkReference(t, ok)
	t.Logf("under load: %d requests answered; failed: %d node_lost, %d busy, %d at the killed router's connection",
		len(ok), failed["node_lost"], failed["busy"], failed[listen])

	upConverged(t, up)
	again := mixedRequests(8, 4, 300, 24)
	generateAll(t, listen, again)
	checkReference(t, again)

	up.stop(t)
}

// TestBinaryUpGivesUpCrashLoop: a node whose restarts cannot serve (its
// certificate is gone from up's credentials) is restarted --restarts-max
// times, each after twice the wait of the one before, then given up, and
// the others serve on: requests answer the reference through the other
// decode node. A drained node exits 0 and stays down.
func TestBinaryUpGivesUpCrashLoop(t *testing.T) {
	up := startUp(t, "--decode", "3", "--restarts-max", "2", "--restart-backoff", "10ms", "--", "--reclaim-after", "2s")
	certs := localCertsDir(up.nodes["router-0"].addr)
	for _, ext := range []string{".crt", ".key"} {
		if err := os.Remove(filepath.Join(certs, "decode-0"+ext)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Kill(up.nodes["decode-0"].pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	line := upLine(t, up, regexp.MustCompile(`^gave up on decode-0: `))
	if want := "gave up on decode-0: it exited before it served (exit status 1) after 2 restarts within 10m0s"; !strings.HasPrefix(line, want) {
		t.Errorf("up printed %q, want %q", line, want)
	}
	for _, wait := range []string{"in=10ms", "in=20ms"} {
		if !regexp.MustCompile(`(?m)node failed; restarting it" node=decode-0 .* ` + wait + ` `).MatchString(up.stderr.String()) {
			t.Errorf("up did not log a restart of decode-0 %s:\n%s", wait, up.stderr)
		}
	}
	delete(up.nodes, "decode-0")

	code, stdout, stderr := runBinary(t, "", "drain", "--endpoint", up.nodes["decode-1"].addr, "--certs", certs, "--wait")
	if code != exitOK {
		t.Fatalf("drain decode-1: exit %d\n%s%s", code, stdout, stderr)
	}
	testwait.For(t, "up logs decode-1's exit 0", exitTimeout, func() bool {
		return strings.Contains(up.stderr.String(), `stays down; the others serve on" node=decode-1`)
	})
	delete(up.nodes, "decode-1")
	upConverged(t, up)
	reqs := mixedRequests(6, 3, 300, 24)
	generateAll(t, up.nodes["router-0"].addr, reqs)
	checkReference(t, reqs)
	if strings.Contains(up.stderr.String(), "node=decode-1 why=") {
		t.Errorf("up restarted the drained decode-1:\n%s", up.stderr)
	}
}

// TestUpRestartFlagsRefused: restart bounds out of range are refused
// before any node starts, each with the value given.
func TestUpRestartFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--restarts-max", "-1"}, "--restarts-max (-1) must be 0 to 100"},
		{[]string{"--restarts-max", "101"}, "--restarts-max (101) must be 0 to 100"},
		{[]string{"--restart-window", "0s"}, "--restart-window (0s) must be positive"},
		{[]string{"--restart-backoff", "11m"}, "--restart-backoff (11m0s) must be 0 to --restart-window (10m0s)"},
		{[]string{"--restart-backoff", "-1s"}, "--restart-backoff (-1s) must be 0 to --restart-window (10m0s)"},
	} {
		code, out := runNode(append([]string{"up"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(out, tc.want) || strings.Contains(out, "starting a local cluster") {
			t.Errorf("up %s: exit %d, want %d with %q before any node starts:\n%s", strings.Join(tc.args, " "), code, exitUsage, tc.want, out)
		}
	}
}

// TestSupervisorExitRightAfterServing: a restarted process that exits
// right after its readiness line, whose exit run took before its start
// (when it was not serving yet), is not left counted as serving, never to
// be restarted: its exit is handled at its start, once.
func TestSupervisorExitRightAfterServing(t *testing.T) {
	router := &child{name: "router-0", role: "router", exited: make(chan struct{})}
	ch := &child{name: "prefill-0", role: "prefill", exited: make(chan struct{}), err: errors.New("exit status 70"),
		logPath: "prefill-0.log"}
	close(ch.exited)
	c := &localCluster{log: slog.New(slog.NewTextHandler(io.Discard, nil)), nodes: []*child{router, ch},
		o: upOptions{restartPolicy: restartPolicy{RestartsMax: 0, RestartWindow: time.Minute}}}
	var out bytes.Buffer
	s := newSupervisor(c, &out)
	delete(s.serving, ch) // a process being restarted serves only from its start
	if err := s.exited(ch); err != nil {
		t.Fatalf("the exit taken before the start: %v", err)
	}
	line := "serving on 127.0.0.1:1 (incarnation 0123456789abcdef, role prefill, gossip 127.0.0.1:2, http 127.0.0.1:3)"
	if err := s.onStarted(startResult{ch: ch, line: line}); err != nil {
		t.Fatalf("the start of a process that exited: %v", err)
	}
	if s.serving[ch] || !s.gaveUp[ch.name] || !strings.Contains(out.String(), "gave up on prefill-0") ||
		strings.Contains(out.String(), "restarted") {
		t.Fatalf("serving %t, given up %t; printed:\n%s\nwant it handled as failed (and given up, with no restarts allowed)",
			s.serving[ch], s.gaveUp[ch.name], out.String())
	}
	if err := s.exited(ch); err != nil || len(s.restarts[ch.name]) != 0 {
		t.Fatalf("the same exit again: %v, restarts %v; want it ignored", err, s.restarts[ch.name])
	}
}

// TestPlannedPortsAvoidGivenOnes: the ports up draws for its nodes never
// take one its flags give a node (--listen's, the gossip base port, the
// routers' HTTP ports), even where that is in the range it draws from.
func TestPlannedPortsAvoidGivenOnes(t *testing.T) {
	o := upOptions{Listen: "127.0.0.1:25000", GossipBasePort: 25001, HTTP: "127.0.0.1:25002", Routers: 2}
	given := o.givenPorts()
	if fmt.Sprint(given) != "map[25000:true 25001:true 25002:true 25003:true]" {
		t.Fatalf("given ports %v, want --listen's, the gossip base port and both routers' HTTP ports", given)
	}
	// Every even port of the range is avoided: each draw would hit one half
	// the time, and none may be returned.
	ports := fixedPorts{avoid: map[int]bool{}}
	defer ports.release()
	for p := fixedPortMin; p <= fixedPortMax; p += 2 {
		ports.avoid[p] = true
	}
	for range 200 {
		addr, err := ports.take("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(addr)
		if n, _ := strconv.Atoi(port); ports.avoid[n] {
			t.Fatalf("drew %s, a port to avoid", addr)
		}
	}
}
