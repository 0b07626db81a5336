package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/internal/stories"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// Bounds of the cluster tests, generous for a loaded two-core machine.
const (
	convergeTimeout = 30 * time.Second // every member sees every other alive
	// reclaimTimeout bounds how long after a node's death the survivors'
	// pools are free again: failure detection (a few seconds with the local
	// timers), the transfer's retry or failure, and --reclaim-after.
	reclaimTimeout = 30 * time.Second
)

// clusterArgs are the flags every cluster node of these tests runs with.
// Their bounds decide only how long a broken cluster takes to fail: none
// may end work that a slow machine is still doing. A transfer's
// --prefill-timeout counts its wait in the prefill node's queue, and
// TestBinaryClusterDrain queues four prefills of 700 to 940 tokens on one
// worker (about 5 s of one core, so a 10 s bound failed them as node_lost
// on a loaded machine); a drain past --drain-timeout leaves with requests
// still in flight. Both are as long as a request may take. A killed node
// is reported by membership within seconds, long before either.
var clusterArgs = []string{"--reclaim-after", "2s", "--request-timeout", "1m", "--prefill-timeout", "1m",
	"--drain-timeout", "1m"}

// member is a node run process of a cluster and what its readiness line
// said.
type member struct {
	*process
	role, addr, gossip string
	incarnation        uint64
}

// startMember runs "node run --role role" on free ports, joining join
// unless it is empty, and waits for its readiness line. A prefill or decode
// node is given no --listen: its default is a free port, never the one
// routers and nodes of role all take (defaultEndpoint).
func startMember(t *testing.T, role, join string, extra ...string) *member {
	t.Helper()
	args := []string{"run", "--role", role, "--gossip", "127.0.0.1:0", "--data", "127.0.0.1:0"}
	if role == "router" || role == roleAll {
		args = append(args, "--listen", "127.0.0.1:0")
	}
	if join != "" {
		args = append(args, "--join", join)
	}
	p := startProcess(t, append(append(args, clusterArgs...), extra...)...)
	select {
	case line, ok := <-p.stdout:
		m := readyLine.FindStringSubmatch(line)
		if !ok || m == nil {
			t.Fatalf("%s: first line of stdout is %q (open %v), want the readiness line; stderr:\n%s", role, line, ok, p.stderr)
		}
		if m[3] != role {
			t.Fatalf("readiness line %q names role %s, want %s", line, m[3], role)
		}
		if m[1] == defaultEndpoint {
			t.Fatalf("a %s node with no --listen serves on %s, which routers take by default", role, m[1])
		}
		inc, _ := strconv.ParseUint(m[2], 16, 64)
		return &member{process: p, role: role, addr: m[1], gossip: m[4], incarnation: inc}
	case <-time.After(readyTimeout):
		t.Fatalf("%s: no readiness line within %s; stderr:\n%s", role, readyTimeout, p.stderr)
	}
	return nil
}

// control is one control client for the whole test binary: several
// protoactor remotes in one process race inside protoactor.
var control struct {
	once sync.Once
	c    *controlClient
	err  error
}

func testControl(t *testing.T) *controlClient {
	t.Helper()
	nodeBinary(t) // makes the credentials
	control.once.Do(func() {
		auth, err := credFlags{}.operator(io.Discard)
		if err != nil {
			control.err = err
			return
		}
		control.c, control.err = dialControl("127.0.0.1", auth)
	})
	if control.err != nil {
		t.Fatal(control.err)
	}
	return control.c
}

// statusOf asks the node on addr for its status.
func statusOf(t *testing.T, addr string) (*messages.StatusReply, error) {
	t.Helper()
	return testControl(t).status(addr, statusPollTimeout)
}

// waitConverged waits until every member sees exactly the members given,
// all alive.
func waitConverged(t *testing.T, ms ...*member) {
	t.Helper()
	testwait.Report(t, "membership converges", convergeTimeout, func() (bool, string) {
		for _, m := range ms {
			s, err := statusOf(t, m.addr)
			if err != nil {
				return false, err.Error()
			}
			if got := aliveIncarnations(s); !slices.Equal(got, incarnations(ms...)) {
				return false, fmt.Sprintf("%s %s sees %x, want %x", m.role, m.addr, got, incarnations(ms...))
			}
		}
		return true, ""
	})
}

func incarnations(ms ...*member) []uint64 {
	var out []uint64
	for _, m := range ms {
		out = append(out, m.incarnation)
	}
	slices.Sort(out)
	return out
}

func aliveIncarnations(s *messages.StatusReply) []uint64 {
	var out []uint64
	for _, m := range s.Members {
		if m.State == messages.MemberAlive {
			out = append(out, m.Incarnation)
		}
	}
	slices.Sort(out)
	return out
}

// request is one generation sent through the binary and its outcome.
type request struct {
	tenant, prompt string
	maxTokens      int
	code           int
	stdout, stderr string
}

// generateAll runs the requests concurrently through "node generate" at
// endpoint and returns when all have exited.
func generateAll(t *testing.T, endpoint string, reqs []*request) {
	t.Helper()
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() {
			r.code, r.stdout, r.stderr = runBinary(t, "", "generate", "--endpoint", endpoint, "--tenant", r.tenant,
				"--prompt", r.prompt, "--max-tokens", strconv.Itoa(r.maxTokens))
		})
	}
	wg.Wait()
}

// checkReference fails the test for every request that did not print
// exactly the reference text.
func checkReference(t *testing.T, reqs []*request) {
	t.Helper()
	cfg := actors.DefaultConfig()
	for i, r := range reqs {
		want, _ := referenceText(t, cfg, r.prompt, r.maxTokens)
		if r.code != exitOK {
			t.Errorf("request %d (tenant %s, %d prompt bytes): exit %d; stderr:\n%s", i, r.tenant, len(r.prompt), r.code, r.stderr)
		} else if r.stdout != want+"\n" {
			t.Errorf("request %d (tenant %s, %d prompt bytes): printed %q, reference %q", i, r.tenant, len(r.prompt), r.stdout, want+"\n")
		}
	}
}

// mixedRequests are n requests from tenants tenants, prompts of mixed
// lengths (up to about promptMax bytes) and mixed token counts.
func mixedRequests(n, tenants, promptMax, maxTokens int) []*request {
	var reqs []*request
	for i := range n {
		prompt := strings.Repeat(fmt.Sprintf("tenant %d asks question %d; ", i%tenants, i), promptMax/24+1)
		prompt = prompt[:1+(i*7919)%promptMax]
		reqs = append(reqs, &request{tenant: fmt.Sprintf("tenant-%d", i%tenants), prompt: prompt,
			maxTokens: maxTokens/2 + (i*31)%(maxTokens/2+1)})
	}
	return reqs
}

// freeGossipPort is a port of 127.0.0.1 free for TCP and UDP alike, as
// gossip needs both.
func freeGossipPort(t *testing.T) int {
	t.Helper()
	return freeLocalPort(t, true)
}

// freeTCPAddr is an address of 127.0.0.1 whose TCP port is free.
func freeTCPAddr(t *testing.T) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(freeLocalPort(t, false)))
}

// freeLocalPort is a port of 127.0.0.1 free for TCP (and UDP, if udp is
// set), drawn below the kernel's ephemeral range. A port the kernel hands
// out for ":0" or an outgoing connection could be taken by another test's
// socket between this check and the node's bind; one below that range is
// only ever taken by a name given on purpose.
func freeLocalPort(t *testing.T, udp bool) int {
	t.Helper()
	const lowest, highest = 10000, 32767 // below Linux's default ip_local_port_range, 32768-60999
	for range 100 {
		port := lowest + rand.IntN(highest-lowest+1)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		free := true
		if udp {
			pc, err := net.ListenPacket("udp", addr)
			if free = err == nil; free {
				pc.Close()
			}
		}
		ln.Close()
		if free {
			return port
		}
	}
	t.Fatalf("no port of 127.0.0.1 in %d-%d free in 100 tries", lowest, highest)
	return 0
}

// upPrinted reads up's stdout until the end of its table (the "stop:"
// line), handing each line to each as it comes, and returns the lines. It
// fails the test when up closes stdout first, or takes over readyTimeout.
func upPrinted(t *testing.T, up *process, each func(line string)) []string {
	t.Helper()
	return upPrintedWithin(t, up, readyTimeout, each)
}

// upPrintedWithin is upPrinted with its bound.
func upPrintedWithin(t *testing.T, up *process, readyTimeout time.Duration, each func(line string)) []string {
	t.Helper()
	deadline := time.After(readyTimeout)
	var out []string
	for {
		select {
		case line, ok := <-up.stdout:
			if !ok {
				t.Fatalf("up closed stdout before the cluster was up; stdout:\n%s\nstderr:\n%s", strings.Join(out, "\n"), up.stderr)
			}
			out = append(out, line)
			each(line)
			if strings.HasPrefix(line, "stop:") {
				return out
			}
		case <-deadline:
			t.Fatalf("up did not print the cluster within %s; stdout:\n%s\nstderr:\n%s", readyTimeout,
				strings.Join(out, "\n"), up.stderr)
		}
	}
}

// upRow is a row of node up's table: name, role, address, gossip, HTTP,
// incarnation, pid and log.
var upRow = regexp.MustCompile(`^((?:router|prefill|decode)-\d+)\s+(router|prefill|decode)\s+(\S+)\s+(\S+)\s+(\S+)\s+([0-9a-f]{16})\s+(\d+)\s+(\S+)$`)

// upNode is one node of up's table.
type upNode struct {
	role, addr, gossip, http string
	incarnation              uint64
	pid                      int
}

// parseUpRow reads a row of up's table into nodes, by name.
func parseUpRow(line string, nodes map[string]upNode) {
	if m := upRow.FindStringSubmatch(line); m != nil {
		inc, _ := strconv.ParseUint(m[6], 16, 64)
		pid, _ := strconv.Atoi(m[7])
		nodes[m[1]] = upNode{role: m[2], addr: m[3], gossip: m[4], http: m[5], incarnation: inc, pid: pid}
	}
}

// TestBinaryUp: node up starts a router, a prefill and a decode node as
// child processes; node status through the router shows all three alive;
// concurrent requests from several tenants answer the reference; SIGTERM
// stops up and every node with it.
func TestBinaryUp(t *testing.T) {
	up := startUp(t, "--http", "127.0.0.1:0", "--", "--reclaim-after", "2s")
	listen := up.nodes["router-0"].addr
	if len(up.nodes) != 3 || !strings.Contains(up.printed[0], "router on "+listen) {
		t.Fatalf("up printed %d nodes, want 3, and the router on %s:\n%s", len(up.nodes), listen, strings.Join(up.printed, "\n"))
	}
	// Every node serves its probes and metrics on the port the table gives.
	for name, n := range up.nodes {
		res, err := http.Get("http://" + n.http + "/metrics")
		if err != nil {
			t.Fatalf("%s's metrics at %s: %v", name, n.http, err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "kvwarden_members{") {
			t.Errorf("%s's /metrics at %s: %s, want 200 with the members' series:\n%.500s", name, n.http, res.Status, body)
		}
	}

	// No credential flags: status and generate find up's own credentials
	// for the router's endpoint, ahead of the tests' ($KVWARDEN_CERTS).
	code, stdout, stderr := runBinary(t, "", "status", "--endpoint", listen)
	if code != exitOK {
		t.Fatalf("status: exit %d; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "role router") || !strings.Contains(stdout, "\n3 members:\n") {
		t.Errorf("status lacks the router or 3 members:\n%s", stdout)
	}
	for _, role := range []string{"router", "prefill", "decode"} {
		if !regexp.MustCompile(`(?m)^\S+-[0-9a-f]{16}\s+` + role + `\s.*\salive\s.*\syes\s+[0-9a-f]{12}$`).MatchString(stdout) {
			t.Errorf("status lacks an alive %s member:\n%s", role, stdout)
		}
	}

	reqs := mixedRequests(8, 4, 300, 24)
	generateAll(t, listen, reqs)
	checkReference(t, reqs)

	up.stop(t)
}

// TestBinaryUpPrompt is the README's main command: up with --prompt brings
// a cluster up, prints the reference answer for the prompt, stops every node
// and exits 0.
func TestBinaryUpPrompt(t *testing.T) {
	const prompt, maxTokens = "Hello, kvwarden", 16
	code, stdout, stderr := runBinary(t, "", "up", "--listen", freeTCPAddr(t),
		"--gossip-base-port", strconv.Itoa(freeGossipPort(t)), "--log-dir", t.TempDir(),
		"--prompt", prompt, "--max-tokens", strconv.Itoa(maxTokens))
	if code != exitOK {
		t.Fatalf("up --prompt: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	want, n := referenceText(t, actors.DefaultConfig(), prompt, maxTokens)
	if !strings.Contains(stdout, "\n"+want+"\n") || !strings.Contains(stdout, fmt.Sprintf("%d tokens, finish", n)) {
		t.Fatalf("up --prompt did not print the reference answer %q:\n%s", want, stdout)
	}
	if got := strings.Count(stderr, `exit="exit 0"`); got != 3 {
		t.Errorf("%d of 3 nodes stopped with exit 0:\n%s", got, stderr)
	}
}

// TestBinaryUpStories: up serving stories260K, router, prefill and decode
// each its own process with the KV moved over the data plane, writes the
// model card's story from an empty prompt, word for word.
func TestBinaryUpStories(t *testing.T) {
	model, tok := stories.Files(t)
	code, stdout, stderr := runBinary(t, "", "up", "--listen", freeTCPAddr(t),
		"--gossip-base-port", strconv.Itoa(freeGossipPort(t)), "--log-dir", t.TempDir(),
		"--model", model, "--tokenizer", tok, "--prompt", "")
	if code != exitOK {
		t.Fatalf("up --model --prompt \"\": exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if want := stories.Published(t); !strings.Contains(stdout, "\n"+want+"\n") ||
		!strings.Contains(stdout, fmt.Sprintf("%d tokens, finish length", stories.PublishedTokens)) {
		t.Fatalf("up did not print the published story:\n%s", stdout)
	}
}

// TestBinaryUpNodeFails: a node that cannot start for a reason up cannot
// check beforehand (here the decode node's data-plane port is taken) makes
// up stop the others and exit 1 with the end of the node's log.
func TestBinaryUpNodeFails(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	code, stdout, stderr := runBinary(t, "", "up", "--listen", freeTCPAddr(t), "--gossip-base-port", "0",
		"--log-dir", t.TempDir(), "--", "--data", taken.Addr().String())
	if code != exitFailed || strings.Contains(stdout, "cluster up") {
		t.Fatalf("exit %d, want %d and no cluster; stdout:\n%s\nstderr:\n%s", code, exitFailed, stdout, stderr)
	}
	for _, want := range []string{"decode-0 exited before it served (exit status 1)", "address already in use"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// TestBinaryClusterDrain drains one of two decode nodes while requests run
// on it: each of them finishes with the reference text, requests sent once
// the router sees the drain go to the other node, the drained node exits 0
// and the router no longer lists it.
func TestBinaryClusterDrain(t *testing.T) {
	router := startMember(t, "router", "")
	prefill := startMember(t, "prefill", router.gossip)
	decodes := []*member{startMember(t, "decode", router.gossip), startMember(t, "decode", router.gossip)}
	waitConverged(t, router, prefill, decodes[0], decodes[1])

	// Long prompts, so that the requests are still running when the drain
	// begins.
	during := mixedRequests(4, 2, 1500, 64)
	for _, r := range during {
		r.prompt = strings.Repeat(r.prompt, 1000/len(r.prompt)+1)[:700+len(r.prompt)%300]
	}
	running := make(chan struct{})
	go func() {
		defer close(running)
		generateAll(t, router.addr, during)
	}()
	// Every request is admitted before the drain begins: one routed to the
	// node after it began draining, before the router heard of it, would be
	// refused (see the package documentation). Admitted only grows, so the
	// wait ends however fast the requests are; the drained node is the one
	// that admitted most of them.
	var victim, other *member
	testwait.Report(t, "every request admitted by a decode node", commandTimeout, func() (bool, string) {
		admitted := make([]uint64, len(decodes))
		for i, d := range decodes {
			s, err := statusOf(t, d.addr)
			if err != nil {
				return false, err.Error()
			}
			admitted[i] = s.Node.Admitted
		}
		if int(admitted[0]+admitted[1]) < len(during) {
			return false, fmt.Sprintf("admitted %v", admitted)
		}
		victim, other = decodes[0], decodes[1]
		if admitted[1] > admitted[0] {
			victim, other = other, victim
		}
		return true, ""
	})

	type result struct {
		code           int
		stdout, stderr string
	}
	drained := make(chan result, 1)
	go func() {
		code, stdout, stderr := runBinary(t, "", "drain", "--endpoint", victim.addr, "--wait")
		drained <- result{code, stdout, stderr}
	}()
	testwait.Report(t, "the router sees the drain", convergeTimeout, func() (bool, string) {
		s, err := statusOf(t, router.addr)
		if err != nil {
			return false, err.Error()
		}
		for _, m := range s.Members {
			if m.Incarnation == victim.incarnation && !m.Draining {
				return false, "not draining yet"
			}
		}
		return true, ""
	})
	after := mixedRequests(4, 2, 200, 16)
	generateAll(t, router.addr, after)
	testwait.Recv(t, "the requests sent before", commandTimeout, running)
	checkReference(t, during)
	checkReference(t, after)

	d := testwait.Recv(t, "node drain --wait", commandTimeout, drained)
	if d.code != exitOK || !strings.Contains(d.stdout, "drained "+victim.addr) {
		t.Errorf("drain: exit %d; stdout:\n%s\nstderr:\n%s", d.code, d.stdout, d.stderr)
	}
	t.Logf("drain said: %s", strings.TrimSpace(d.stdout))
	if code := victim.exitCode(t, exitTimeout); code != exitOK {
		t.Errorf("the drained node exited %d, want 0; stderr:\n%s", code, victim.stderr)
	}
	if !strings.Contains(victim.stderr.String(), "node drained") {
		t.Errorf("the drained node's log lacks the drain:\n%s", victim.stderr)
	}
	if s, err := statusOf(t, other.addr); err != nil || s.Node.Admitted < uint64(len(after)) {
		t.Errorf("the other decode node admitted %v (err %v), want at least the %d requests sent after the drain",
			s.Node.Admitted, err, len(after))
	}
	waitConverged(t, router, prefill, other)
	code, stdout, _ := runBinary(t, "", "status", "--endpoint", router.addr)
	if code != exitOK || strings.Contains(stdout, fmt.Sprintf("%016x", victim.incarnation)) || !strings.Contains(stdout, "\n3 members:\n") {
		t.Errorf("status after the drain: exit %d, want 3 members and not %016x:\n%s", code, victim.incarnation, stdout)
	}
}

// TestBinaryClusterJoin: a decode node that joins a serving cluster is
// seen alive within a bound and receives work, and requests keep answering
// the reference throughout.
func TestBinaryClusterJoin(t *testing.T) {
	router := startMember(t, "router", "")
	prefill := startMember(t, "prefill", router.gossip)
	decode := startMember(t, "decode", router.gossip)
	waitConverged(t, router, prefill, decode)
	before := mixedRequests(4, 2, 200, 16)
	generateAll(t, router.addr, before)
	checkReference(t, before)

	// The router sends each request to the decode node with the most free
	// pages: the newcomer's larger pool makes it the one.
	joined := startMember(t, "decode", prefill.gossip, "--decode-pages", "2048")
	waitConverged(t, router, prefill, decode, joined)
	after := mixedRequests(6, 3, 200, 16)
	generateAll(t, router.addr, after)
	checkReference(t, after)
	s, err := statusOf(t, joined.addr)
	if err != nil {
		t.Fatal(err)
	}
	if s.Node.Admitted == 0 || s.Node.Completed == 0 {
		t.Errorf("the joined decode node admitted %d and completed %d requests, want some", s.Node.Admitted, s.Node.Completed)
	}
}

// TestBinaryClusterPrefillKilled kills (SIGKILL) the prefill node working
// on a long request while another prefill node serves: the request answers
// the reference (retried on the other node) or fails with node_lost, never
// with a wrong text; the survivors' pools are then entirely free again.
func TestBinaryClusterPrefillKilled(t *testing.T) {
	router := startMember(t, "router", "")
	prefills := []*member{startMember(t, "prefill", router.gossip), startMember(t, "prefill", router.gossip)}
	decode := startMember(t, "decode", router.gossip)
	waitConverged(t, router, prefills[0], prefills[1], decode)

	long := &request{tenant: "acme", prompt: strings.Repeat("a long prompt to prefill; ", 80)[:1900], maxTokens: 100}
	running := make(chan struct{})
	go func() {
		defer close(running)
		generateAll(t, router.addr, []*request{long})
	}()
	var victim, survivor *member
	testwait.Report(t, "a prefill node holds the request's pages", commandTimeout, func() (bool, string) {
		for i, p := range prefills {
			if s, err := statusOf(t, p.addr); err == nil && !allFree(s.Node.Pools) {
				victim, survivor = p, prefills[1-i]
				return true, ""
			}
		}
		return false, "no prefill pool in use"
	})
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, "the requests sent before", commandTimeout, running)
	want, _ := referenceText(t, actors.DefaultConfig(), long.prompt, long.maxTokens)
	switch {
	case long.code == exitOK && long.stdout == want+"\n":
		t.Logf("the request was retried and answered the reference")
	case long.code == exitFailed && strings.Contains(long.stderr, "node_lost") && long.stdout == "":
		t.Logf("the request failed with node_lost: %s", strings.TrimSpace(long.stderr))
	default:
		t.Fatalf("exit %d, printed %q; want the reference %q or a node_lost failure; stderr:\n%s",
			long.code, long.stdout, want, long.stderr)
	}

	for _, m := range []*member{decode, survivor} {
		testwait.Report(t, m.role+" pools entirely free", reclaimTimeout, func() (bool, string) {
			s, err := statusOf(t, m.addr)
			if err != nil {
				return false, err.Error()
			}
			return allFree(s.Node.Pools), fmt.Sprintf("%+v", s.Node.Pools)
		})
	}
	waitConverged(t, router, survivor, decode)
	// The cluster serves on with the surviving prefill node.
	again := mixedRequests(2, 2, 200, 16)
	generateAll(t, router.addr, again)
	checkReference(t, again)
	code, stdout, stderr := runBinary(t, "", "status", "--endpoint", decode.addr, "--json")
	var s messages.StatusReply
	if err := json.Unmarshal([]byte(stdout), &s); code != exitOK || err != nil || !allFree(s.Node.Pools) {
		t.Errorf("status --json of the decode node: exit %d, %v, want every pool free:\n%s\nstderr:\n%s", code, err, stdout, stderr)
	}
}

func allFree(pools []messages.PoolStatus) bool {
	for _, p := range pools {
		if !p.Idle() {
			return false
		}
	}
	return len(pools) > 0
}

func TestStatusAndDrainRefusals(t *testing.T) {
	// The commands find the tests' credentials, which building the binary
	// makes, even when this test runs first.
	nodeBinary(t)
	nothing := freeTCPAddr(t) // just closed: nothing listens there
	for _, tc := range []struct {
		args []string
		exit int
		want string
	}{
		{[]string{"status", "--endpoint", "localhost"}, exitUsage, `--endpoint "localhost"`},
		{[]string{"status", "--timeout", "0s"}, exitUsage, "--timeout (0s) must be positive"},
		{[]string{"status", "--endpoint", nothing}, exitFailed, "no node reachable at " + nothing},
		{[]string{"drain", "--endpoint", "127.0.0.1:0"}, exitUsage, `port "0" must be 1 to 65535`},
		{[]string{"drain", "--endpoint", nothing, "--wait"}, exitFailed, "no node reachable at " + nothing},
		{[]string{"up", "--prefill", "0"}, exitUsage, "--prefill (0) and --decode (1) must be at least 1 each"},
		{[]string{"up", "--gossip-base-port", "70000"}, exitUsage, "--gossip-base-port (70000)"},
		{[]string{"up", "stray"}, exitUsage, `"stray"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out := runNode(tc.args...)
			if code != tc.exit || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d with %q; output:\n%s", code, tc.exit, tc.want, out)
			}
		})
	}
}
