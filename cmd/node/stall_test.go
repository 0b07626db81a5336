package main

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testnet"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// stallCluster is a router, a prefill node and two decode nodes, all
// run with extra.
type stallCluster struct {
	router, prefill *member
	decodes         [2]*member
}

func startStallCluster(t *testing.T, extra ...string) *stallCluster {
	t.Helper()
	c := &stallCluster{router: startMember(t, "router", "", extra...)}
	c.prefill = startMember(t, "prefill", c.router.gossip, extra...)
	for i := range c.decodes {
		c.decodes[i] = startMember(t, "decode", c.router.gossip, extra...)
	}
	waitConverged(t, c.router, c.prefill, c.decodes[0], c.decodes[1])
	return c
}

// ran is a request run by load, and when it started and ended.
type ran struct {
	*request
	start, end time.Time
}

// load runs requests through the router, workers at a time, each worker
// one after another, until stop is closed; it returns every request run,
// once all have ended.
func load(t *testing.T, endpoint string, workers int, stop <-chan struct{}) func() []ran {
	t.Helper()
	var mu sync.Mutex
	var all []ran
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := &request{tenant: testTenants[w%len(testTenants)], maxTokens: 32 + (w*13+i*29)%200,
					prompt: fmt.Sprintf("worker %d request %d asks: %s", w, i, strings.Repeat("more context; ", (w*7+i*3)%60))}
				start := time.Now()
				generateAll(t, endpoint, []*request{r})
				mu.Lock()
				all = append(all, ran{request: r, start: start, end: time.Now()})
				mu.Unlock()
			}
		})
	}
	return func() []ran {
		wg.Wait()
		return all
	}
}

func requests(rs []ran) []*request {
	out := make([]*request, len(rs))
	for i, r := range rs {
		out[i] = r.request
	}
	return out
}

// busyDecode waits until one of the decode nodes has at least n requests
// in flight, and returns it and the other.
func (c *stallCluster) busyDecode(t *testing.T, n uint32) (victim, other *member) {
	t.Helper()
	testwait.Report(t, fmt.Sprintf("a decode node has %d requests in flight", n), commandTimeout, func() (bool, string) {
		var saw []uint32
		for i, d := range c.decodes {
			s, err := statusOf(t, d.addr)
			if err != nil {
				return false, err.Error()
			}
			if s.Node.InFlight >= n {
				victim, other = d, c.decodes[1-i]
				return true, ""
			}
			saw = append(saw, s.Node.InFlight)
		}
		return false, fmt.Sprintf("in flight %v", saw)
	})
	return victim, other
}

// logged waits until p's log has a line with every one of parts.
func logged(t *testing.T, p *member, within time.Duration, parts ...string) string {
	t.Helper()
	return loggedAfter(t, p, 0, within, parts...)
}

// loggedAfter is logged for the lines after the log's first from bytes.
func loggedAfter(t *testing.T, p *member, from int, within time.Duration, parts ...string) string {
	t.Helper()
	var found string
	testwait.Report(t, fmt.Sprintf("%s logs %q", p.role, parts), within, func() (bool, string) {
		for _, line := range strings.Split(p.stderr.String()[from:], "\n") {
			all := true
			for _, part := range parts {
				all = all && strings.Contains(line, part)
			}
			if all {
				found = line
				return true, ""
			}
		}
		return false, "not yet"
	})
	return found
}

// admitted is how many requests the decode node admitted.
func admitted(t *testing.T, d *member) uint64 {
	t.Helper()
	s, err := statusOf(t, d.addr)
	if err != nil {
		t.Fatal(err)
	}
	return s.Node.Admitted
}

// stallWorkers is how many requests load keeps in flight.
const stallWorkers = 10

// stallPause is how long the decode node is stopped: longer than failure
// detection (a second or two with the local timers), well within the
// default --lost-after.
const stallPause = 5 * time.Second

// TestBinaryClusterDecodeStalled: a decode node stopped (SIGSTOP) for 5 s
// under load, then continued. Membership declares it dead; its remote
// address still completes a handshake, so its requests are held rather
// than failed. Every request answers the reference text, the router logs
// the node as back, and routes to it again.
func TestBinaryClusterDecodeStalled(t *testing.T) {
	c := startStallCluster(t)
	stop := make(chan struct{})
	results := load(t, c.router.addr, stallWorkers, stop)
	victim, other := c.busyDecode(t, 2)
	name := fmt.Sprintf("%016x", victim.incarnation)
	stopped := time.Now()
	if err := syscall.Kill(victim.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := false
	cont := func() {
		if !continued {
			continued = true
			if err := syscall.Kill(victim.cmd.Process.Pid, syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	defer cont()
	logged(t, c.router, convergeTimeout, "member missing; its requests are held", name, "probe=answered")
	// The fault itself lasts stallPause, whatever detection took.
	<-time.After(time.Until(stopped.Add(stallPause)))
	cont()
	back := logged(t, c.router, convergeTimeout, "member came back", name)
	t.Logf("router: %s", back)
	waitConverged(t, c.router, c.prefill, c.decodes[0], c.decodes[1])
	if s := c.router.stderr.String(); strings.Contains(s, "member lost") {
		t.Errorf("the router took a member for lost:\n%s", s)
	}
	// The node gets work again: the router sends it requests of the load,
	// beyond those it had been sent before it stalled.
	before := admitted(t, victim)
	testwait.Report(t, "the router routes to the node that came back", commandTimeout, func() (bool, string) {
		n := admitted(t, victim)
		return n > before+stallWorkers, fmt.Sprintf("admitted %d, %d when it was back; the other decode node %d", n, before, admitted(t, other))
	})
	close(stop)
	reqs := requests(results())
	checkReference(t, reqs)
	t.Logf("%d requests through a %s stall of decode %s, every one the reference", len(reqs), stallPause, name)
}

// lostAway reads the away duration of a "member lost" line.
var lostAway = regexp.MustCompile(`away=(\S+)`)

// TestBinaryClusterDecodeKilled: a decode node killed (SIGKILL) with
// requests in flight. Its remote address refuses connections, so the
// router takes it for lost as soon as failure detection declares it
// dead, not after --lost-after (50 s here, longer than the test waits);
// every request answers the reference or fails with node_lost.
func TestBinaryClusterDecodeKilled(t *testing.T) {
	c := startStallCluster(t, "--lost-after", "50s")
	stop := make(chan struct{})
	results := load(t, c.router.addr, stallWorkers, stop)
	victim, _ := c.busyDecode(t, 2)
	name := fmt.Sprintf("%016x", victim.incarnation)
	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	line := logged(t, c.router, convergeTimeout, "member lost", name, "refused a connection")
	t.Logf("router, %s after the kill: %s", time.Since(killed).Round(time.Millisecond), line)
	if m := lostAway.FindStringSubmatch(line); m != nil {
		if away, err := time.ParseDuration(m[1]); err == nil && away >= 50*time.Second {
			t.Errorf("lost after %s, the bound: the refusal was not taken", away)
		}
	}
	close(stop)
	// Each request answers the reference, or fails node_lost: those the
	// killed node was generating (the router sends one it had not begun
	// to another decode node).
	var ok, lost []*request
	for _, r := range results() {
		if r.code == exitFailed && strings.Contains(r.stderr, "node_lost") {
			lost = append(lost, r.request)
		} else {
			ok = append(ok, r.request)
		}
	}
	// The cluster serves on with the other decode node.
	again := mixedRequests(4, 2, 200, 16)
	generateAll(t, c.router.addr, again)
	checkReference(t, append(ok, again...))
	t.Logf("%d requests answered, %d node_lost", len(ok)+len(again), len(lost))
	if s, err := statusOf(t, c.router.addr); err == nil {
		for _, m := range s.Members {
			if m.Incarnation == victim.incarnation && m.State == messages.MemberAlive {
				t.Errorf("the router still lists the killed decode node alive")
			}
		}
	}
}

// TestBinaryClusterRouterKilled: a router killed (SIGKILL) while a decode
// node holds requests it relayed. Nobody will read those requests' tokens:
// once the router is lost, the decode node cancels them and frees their
// pages, rather than serving them for nobody. The requests are held, with
// the prefill node's remote behind a shut gate, until the loss is seen:
// generating ones could end first on a fast machine and leave nothing to
// cancel.
func TestBinaryClusterRouterKilled(t *testing.T) {
	gate := testnet.NewGate(t)
	listen := freeTCPAddr(t)
	gate.Open(listen)
	router := startMember(t, "router", "")
	prefill := startMember(t, "prefill", router.gossip, "--listen", listen, "--advertise", gate.Addr())
	decode := startMember(t, "decode", router.gossip)
	waitConverged(t, router, prefill, decode)
	gate.Shut()
	var held []*request
	for i := range 4 {
		held = append(held, &request{tenant: "acme", prompt: fmt.Sprintf("request %d, which nobody will read", i), maxTokens: 64})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		generateAll(t, router.addr, held)
	}()
	testwait.Report(t, "the decode node holds the requests", commandTimeout, func() (bool, string) {
		l, err := testControl(t).inFlight(decode.addr, messages.InFlightListMax, statusPollTimeout)
		if err != nil {
			return false, err.Error()
		}
		return len(l.Requests) == len(held), fmt.Sprintf("%+v", l)
	})
	if err := router.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("decode node's log:\n%s", decode.stderr)
		}
	})
	t.Log(logged(t, decode, convergeTimeout, "requests of a lost sender cancelled", fmt.Sprintf("requests=%d", len(held))))
	testwait.Report(t, "the decode node's pools free", reclaimTimeout, func() (bool, string) {
		s, err := statusOf(t, decode.addr)
		return err == nil && allFree(s.Node.Pools) && s.Node.InFlight == 0, fmt.Sprintf("%+v %v", s, err)
	})
	select {
	case <-done:
	case <-time.After(commandTimeout):
		t.Fatalf("the clients of the killed router did not exit within %s", commandTimeout)
	}
	for _, r := range held {
		if r.code == exitOK {
			t.Errorf("a request of the killed router answered %q", r.stdout)
		}
	}
}

// TestBinaryClusterPrefillStalled: a prefill node stopped (SIGSTOP) for
// 5 s while it holds a transfer, under load, then continued: the decode
// node holds the requests planned with it, the router sends new ones to
// the other prefill node, and every request answers the reference.
func TestBinaryClusterPrefillStalled(t *testing.T) {
	router := startMember(t, "router", "")
	prefills := []*member{startMember(t, "prefill", router.gossip), startMember(t, "prefill", router.gossip)}
	decode := startMember(t, "decode", router.gossip)
	waitConverged(t, router, prefills[0], prefills[1], decode)
	stop := make(chan struct{})
	results := load(t, router.addr, stallWorkers, stop)
	var victim *member
	testwait.Report(t, "a prefill node holds a transfer's pages", commandTimeout, func() (bool, string) {
		for _, p := range prefills {
			if s, err := statusOf(t, p.addr); err == nil && !allFree(s.Node.Pools) {
				victim = p
				return true, ""
			}
		}
		return false, "no prefill pool in use"
	})
	stopped := time.Now()
	if err := syscall.Kill(victim.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := false
	defer func() {
		if !continued {
			syscall.Kill(victim.cmd.Process.Pid, syscall.SIGCONT)
		}
	}()
	name := fmt.Sprintf("%016x", victim.incarnation)
	logged(t, decode, convergeTimeout, "member missing; its requests are held", name)
	<-time.After(time.Until(stopped.Add(stallPause))) // the fault itself
	continued = true
	if err := syscall.Kill(victim.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	logged(t, decode, convergeTimeout, "member came back", name)
	waitConverged(t, router, prefills[0], prefills[1], decode)
	close(stop)
	reqs := requests(results())
	checkReference(t, reqs)
	for _, m := range []*member{router, decode} {
		if s := m.stderr.String(); strings.Contains(s, "member lost") {
			t.Errorf("the %s took a member for lost:\n%s", m.role, s)
		}
	}
	t.Logf("%d requests through a %s stall of prefill %s, every one the reference", len(reqs), stallPause, name)
}
