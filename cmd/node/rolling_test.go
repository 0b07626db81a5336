package main

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// Shape of the rolling restart's load: clients, each sending one request
// after the other through the router, from a pool of distinct requests
// sent again and again (each answer is checked against the reference, and
// a reference costs one engine's whole generation). The outputs are long,
// 500 to 1000 tokens, so that requests are running when each drain comes.
const (
	rollingClients   = 8
	rollingPool      = 8
	rollingMaxTokens = 1000
	// rollingEarly is how many tokens a request may have streamed and
	// still count as one a drain begun now finds running: every request
	// asks for at least rollingMaxTokens/2.
	rollingEarly = 64
)

// unanswered is the log line of a move a drain waited out (its node never
// answered it): every move is answered, moved or refused, at once.
var unanswered = regexp.MustCompile(`move not taken.*no answer`)

// rollingLoad is clients sending requests one after the other until it is
// stopped, each answer kept with the pool entry it was sent from.
type rollingLoad struct {
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	mu       sync.Mutex
	sent     []sentRequest
}

type sentRequest struct {
	entry int
	r     *request
}

// startRollingLoad starts clients clients sending the requests of pool in
// turn through the router at endpoint, until finish or the end of the test.
func startRollingLoad(t *testing.T, endpoint string, clients int, pool []*request) *rollingLoad {
	t.Helper()
	l := &rollingLoad{stop: make(chan struct{})}
	t.Cleanup(func() { l.finish(t) })
	var next atomic.Int64
	for range clients {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				entry := int(next.Add(1)-1) % len(pool)
				r := *pool[entry]
				generateAll(t, endpoint, []*request{&r})
				l.mu.Lock()
				l.sent = append(l.sent, sentRequest{entry, &r})
				l.mu.Unlock()
			}
		})
	}
	return l
}

// finish stops the clients, waits for the requests they are sending, and
// returns every request sent.
func (l *rollingLoad) finish(t *testing.T) []sentRequest {
	t.Helper()
	l.stopOnce.Do(func() { close(l.stop) })
	testwait.Group(t, "the load's last requests", commandTimeout, &l.wg)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent
}

// checkSent checks every answer against the reference: answers alike (the
// same request, exit code and text) are checked once, since a reference
// costs a whole generation.
func checkSent(t *testing.T, sent []sentRequest) {
	t.Helper()
	type outcome struct {
		entry  int
		code   int
		stdout string
	}
	seen := map[outcome]bool{}
	var distinct []*request
	for _, s := range sent {
		o := outcome{s.entry, s.r.code, s.r.stdout}
		if !seen[o] {
			seen[o] = true
			distinct = append(distinct, s.r)
		}
	}
	t.Logf("%d requests sent, %d distinct answers", len(sent), len(distinct))
	checkReference(t, distinct)
}

// waitRunning waits until the decode node m decodes a request with most
// of its tokens to go: one that a drain begun now finds running (the load
// goes through the router, so it can move). It returns the request's ID,
// as node requests prints it.
func waitRunning(t *testing.T, m *member) (id string) {
	t.Helper()
	testwait.Report(t, "a request decoding on "+m.addr+" with its tokens to go", commandTimeout, func() (bool, string) {
		l, err := testControl(t).inFlight(m.addr, 0, statusPollTimeout)
		if err != nil {
			return false, err.Error()
		}
		var saw []string
		for _, r := range l.Requests {
			if r.Phase == messages.PhaseDecode && r.Tokens >= 1 && r.Tokens <= rollingEarly {
				id = fmt.Sprintf("%016x-%d", l.Incarnation, r.Number)
				return true, ""
			}
			saw = append(saw, fmt.Sprintf("%s after %d tokens", r.Phase, r.Tokens))
		}
		return false, fmt.Sprintf("in flight: %v", saw)
	})
	return id
}

// drainMoved is what node drain --wait says moved.
var drainMoved = regexp.MustCompile(`(\d+) moved to other decode nodes`)

// streamsMoved is how many streams the router at addr has followed from
// one decode node to another.
func streamsMoved(t *testing.T, addr string) uint64 {
	t.Helper()
	s, err := statusOf(t, addr)
	if err != nil {
		t.Fatalf("the router's status: %v", err)
	}
	return s.Node.StreamsMoved
}

// TestBinaryRollingRestart restarts every decode node of a cluster, one
// after the other, under a steady load: each is drained (node drain moves
// its running requests to the other decode nodes, KV and all, and the
// router follows their streams), exits 0, and a new run of it on the same
// address joins before the next is drained. Every request answers the
// reference text, requests moved, and every pool is free at the end.
func TestBinaryRollingRestart(t *testing.T) {
	start := time.Now()
	router := startMember(t, "router", "")
	prefill := startMember(t, "prefill", router.gossip)
	decodes := []*member{startMember(t, "decode", router.gossip), startMember(t, "decode", router.gossip),
		startMember(t, "decode", router.gossip)}
	waitConverged(t, append([]*member{router, prefill}, decodes...)...)

	load := startRollingLoad(t, router.addr, rollingClients, mixedRequests(rollingPool, 4, 600, rollingMaxTokens))
	for i, victim := range decodes {
		waitRunning(t, victim)
		before := streamsMoved(t, router.addr)
		began := time.Now()
		code, stdout, stderr := runBinary(t, "", "drain", "--endpoint", victim.addr, "--wait", "--timeout", "2m")
		if code != exitOK || !strings.Contains(stdout, "drained "+victim.addr) {
			t.Fatalf("drain of decode node %d: exit %d; stdout:\n%s\nstderr:\n%s\nthe node's log:\n%s", i, code, stdout, stderr, victim.stderr)
		}
		if code := victim.exitCode(t, exitTimeout); code != exitOK {
			t.Fatalf("decode node %d exited %d after its drain, want 0; stderr:\n%s", i, code, victim.stderr)
		}
		said := drainMoved.FindStringSubmatch(stdout)
		if said == nil {
			t.Fatalf("drain of decode node %d does not say how many moved:\n%s", i, stdout)
		}
		took := time.Since(began)
		t.Logf("decode node %d drained in %s: the router followed %d streams; drain said: %s", i,
			took.Round(time.Millisecond), streamsMoved(t, router.addr)-before, strings.TrimSpace(stdout))
		if unanswered.MatchString(victim.stderr.String()) {
			t.Errorf("the drain of decode node %d waited out a move nobody answered; the node's log:\n%s", i, victim.stderr)
		}

		// Its restart: a new run on the same addresses, joining through
		// the router, seen alive by every member before the next drain.
		decodes[i] = startMember(t, "decode", router.gossip, "--listen", victim.addr, "--gossip", victim.gossip)
		if decodes[i].incarnation == victim.incarnation {
			t.Fatalf("the restarted decode node %d has its old run's incarnation %016x", i, victim.incarnation)
		}
		waitConverged(t, append([]*member{router, prefill}, decodes...)...)
	}
	sent := load.finish(t)
	checkSent(t, sent)

	moved := streamsMoved(t, router.addr)
	t.Logf("%d requests, %d streams moved, in %s", len(sent), moved, time.Since(start).Round(time.Millisecond))
	if moved == 0 {
		t.Errorf("no stream moved in three drains of decode nodes running requests")
	}
	waitPoolsFree(t, append([]*member{prefill}, decodes...)...)
}

// migrateTries bounds TestBinaryMigrate's asks: each picks a request with
// most of its tokens to go, which may still end before the ask reaches it.
const migrateTries = 20

// TestBinaryMigrate: an operator's node migrate of one running request
// moves it to the other decode node, through the router, under a steady
// load: it says one moved, the node it went to counts it taken over, and
// every request answers the reference text with every pool free. A
// request no longer in flight is refused, naming it.
func TestBinaryMigrate(t *testing.T) {
	router := startMember(t, "router", "")
	prefill := startMember(t, "prefill", router.gossip)
	decodes := []*member{startMember(t, "decode", router.gossip), startMember(t, "decode", router.gossip)}
	waitConverged(t, router, prefill, decodes[0], decodes[1])
	load := startRollingLoad(t, router.addr, rollingClients, mixedRequests(rollingPool, 4, 600, rollingMaxTokens))

	var ended []string // asks that found their request ended
	moved := false
	for range migrateTries {
		id := waitRunning(t, decodes[0])
		code, stdout, stderr := runBinary(t, "", "migrate", "--endpoint", decodes[0].addr, "--request", id)
		if code == exitOK {
			if !strings.Contains(stdout, decodes[0].addr+": 1 requests moved, 0 stayed") {
				t.Fatalf("migrate of %s: %s", id, stdout)
			}
			moved = true
			break
		}
		if !strings.Contains(stderr, "not in flight") {
			t.Fatalf("migrate of %s: exit %d; stdout:\n%s\nstderr:\n%s", id, code, stdout, stderr)
		}
		ended = append(ended, id)
	}
	if !moved {
		t.Fatalf("no request moved in %d asks: each had ended first (%v)", migrateTries, ended)
	}
	checkSent(t, load.finish(t))
	if n := streamsMoved(t, router.addr); n != 1 {
		t.Errorf("the router followed %d streams, want the one migrated", n)
	}
	s, err := statusOf(t, decodes[1].addr)
	if err != nil {
		t.Fatal(err)
	}
	if s.Node.MovedIn != 1 {
		t.Errorf("the other decode node took over %d requests, want 1", s.Node.MovedIn)
	}
	waitPoolsFree(t, prefill, decodes[0], decodes[1])
}
