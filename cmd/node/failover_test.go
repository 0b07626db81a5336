//go:build !race

// The client of these tests runs in the test process, beside the tests'
// control client: two protoactor remotes in one process race inside
// protoactor (see DEPENDENCIES), so the race detector would report
// protoactor, not these tests. The nodes are processes of their own.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// failoverCluster is two routers, a prefill and a decode node, each its
// own process, and a client of both routers in this process.
type failoverCluster struct {
	routers         [2]*member
	prefill, decode *member
	client          *client.Client
}

func startFailoverCluster(t *testing.T, extra ...string) *failoverCluster {
	t.Helper()
	c := &failoverCluster{}
	c.routers[0] = startMember(t, "router", "", extra...)
	c.routers[1] = startMember(t, "router", c.routers[0].gossip, extra...)
	c.prefill = startMember(t, "prefill", c.routers[0].gossip, extra...)
	c.decode = startMember(t, "decode", c.routers[0].gossip, extra...)
	waitConverged(t, c.routers[0], c.routers[1], c.prefill, c.decode)
	auth, err := credFlags{}.authority(slog.New(slog.NewTextHandler(io.Discard, nil)), trust.RoleTenant, "tenant-acme")
	if err != nil {
		t.Fatal(err)
	}
	c.client, err = client.DialEndpoints(context.Background(), []string{c.routers[0].addr, c.routers[1].addr},
		client.Options{Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.client.Close)
	return c
}

// streamed is one request through the client and what it received, with
// when.
type streamed struct {
	prompt    string
	maxTokens int

	mu     sync.Mutex
	text   strings.Builder
	tokens int
	at     []time.Time // of each token delivered
	res    client.Result
	err    error
	end    time.Time // when Generate returned
	// continued is when the client gave up the first endpoint and
	// continued the request through another.
	continued time.Time
	// first is closed at the first token, done when Generate returns.
	first, done chan struct{}
}

func (s *streamed) token(int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens++
	s.at = append(s.at, time.Now())
	if s.tokens == 1 {
		close(s.first)
	}
}

func (s *streamed) onText(x string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.text.WriteString(x)
}

func (s *streamed) delivered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens
}

// tokenAt is when token i (from 0) was delivered; false if it was not
// streamed.
func (s *streamed) tokenAt(i int) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.at) {
		return time.Time{}, false
	}
	return s.at[i], true
}

// send starts the requests through c, each in its own goroutine.
func send(c *client.Client, reqs []*streamed) {
	for _, s := range reqs {
		s.first, s.done = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(s.done)
			onContinue := func(*messages.WireError, string) {
				s.mu.Lock()
				defer s.mu.Unlock()
				if s.continued.IsZero() {
					s.continued = time.Now()
				}
			}
			res, err := c.Generate(context.Background(), "acme", s.prompt,
				client.GenerateOptions{MaxTokens: s.maxTokens, OnText: s.onText, OnContinue: onContinue}, s.token)
			s.mu.Lock()
			s.res, s.err, s.end = res, err, time.Now()
			s.mu.Unlock()
		}()
	}
}

// longRequests are n requests of distinct prompts (tag tells one set from
// another). Many at once, with
// hundreds of tokens each, keep one decode worker busy for a second or
// more on this machine (alone, one of them takes some 100 ms): they are in
// flight when the test kills a router the moment each has its first token.
func longRequests(tag string, n, maxTokens int) []*streamed {
	var out []*streamed
	for i := range n {
		out = append(out, &streamed{prompt: fmt.Sprintf("%srequest %d of the failover test asks for a long story", tag, i),
			maxTokens: maxTokens})
	}
	return out
}

// streaming waits until every request has its first token or has ended
// (an answer may be empty: the model's end of sequence first).
func streaming(t *testing.T, reqs []*streamed) {
	t.Helper()
	deadline := time.After(commandTimeout)
	for i, s := range reqs {
		select {
		case <-s.first:
		case <-s.done:
		case <-deadline:
			t.Fatalf("request %d has no token within %s", i, commandTimeout)
		}
	}
}

// waitAll waits for every request to end and checks that each answered
// the single-node reference, and that what it streamed (OnText) is a
// prefix of it: no byte twice, none wrong. A stream may stop short of the
// answer: a router refuses every chunk after one it missed and passes on
// the result, which holds the whole answer.
func waitAll(t *testing.T, reqs []*streamed) {
	t.Helper()
	cfg := actors.DefaultConfig()
	for i, s := range reqs {
		select {
		case <-s.done:
		case <-time.After(commandTimeout):
			t.Fatalf("request %d did not end within %s", i, commandTimeout)
		}
		want, n := referenceText(t, cfg, s.prompt, s.maxTokens)
		s.mu.Lock()
		streamedText := s.text.String()
		s.mu.Unlock()
		switch {
		case s.err != nil:
			t.Errorf("request %d: %v", i, s.err)
		case s.res.Text != want || len(s.res.Tokens) != n:
			t.Errorf("request %d: answered %q (%d tokens), reference %q (%d)", i, s.res.Text, len(s.res.Tokens), want, n)
		case !strings.HasPrefix(want, streamedText) || s.delivered() > n:
			t.Errorf("request %d: streamed %q in %d tokens, reference %q in %d", i, streamedText, s.delivered(), want, n)
		}
	}
}

// TestBinaryFailoverRouterKilled: with requests in flight through both of
// two routers, one router is killed (SIGKILL); every request, those it was
// carrying included, ends with the reference text, each token delivered
// once; new requests succeed through the other router.
func TestBinaryFailoverRouterKilled(t *testing.T) {
	c := startFailoverCluster(t)
	reqs := longRequests("", 16, 1000)
	send(c.client, reqs)
	streaming(t, reqs)
	if err := c.routers[0].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	after := longRequests("after the kill: ", 4, 16)
	send(c.client, after)
	waitAll(t, reqs)
	waitAll(t, after)
	continued, replayed := 0, 0
	for _, s := range reqs {
		continued += s.res.Continued
		replayed += s.res.Replayed
	}
	t.Logf("%d of %d requests in flight were continued through the other router, %d tokens computed again",
		continued, len(reqs), replayed)
	if continued == 0 {
		t.Fatalf("no request in flight was continued: none was on the killed router")
	}
}

// TestFailoverNoRouterLeft: with both routers killed, a request in flight
// fails with node_lost naming both at once, long before the client's
// silence bound, and a new request fails the same way.
func TestFailoverNoRouterLeft(t *testing.T) {
	c := startFailoverCluster(t)
	reqs := longRequests("", 16, 1000)
	send(c.client, reqs)
	streaming(t, reqs)
	for _, r := range c.routers {
		if err := r.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	lost := func(err error) bool {
		return errors.Is(err, client.ErrNoAnswer) && strings.Contains(err.Error(), c.routers[0].addr) &&
			strings.Contains(err.Error(), c.routers[1].addr)
	}
	failed := 0
	for i, s := range reqs {
		testwait.Recv(t, fmt.Sprintf("request %d", i), commandTimeout, s.done)
		if s.err == nil && s.res.Continued == 0 {
			continue // finished before the kills
		}
		failed++
		if !lost(s.err) {
			t.Errorf("request %d: %v (result %d tokens, continued %d, delivered %d), want node_lost naming both routers", i, s.err,
				len(s.res.Tokens), s.res.Continued, s.delivered())
		}
	}
	if failed == 0 {
		t.Fatal("every request finished before the routers were killed")
	}
	_, err := c.client.Generate(context.Background(), "acme", "anyone?", client.GenerateOptions{MaxTokens: 4}, nil)
	if !lost(err) || !strings.Contains(err.Error(), "no live endpoint") {
		t.Errorf("a request with no router left: %v, want node_lost, no live endpoint, naming both routers", err)
	}
}

var (
	failoverKills    = flag.Int("failover.kills", 0, "routers TestFailoverTimes kills, one at a time (0 skips it)")
	failoverInFlight = flag.Int("failover.inflight", 20, "requests in flight at each kill of TestFailoverTimes")
)

// TestFailoverTimes measures failover after a router dies: with
// -failover.inflight requests in flight over two routers, it kills one
// (SIGKILL), restarts it at its address once every request has ended, and
// again with the other, -failover.kills times. It logs, over the requests
// that were continued, the time from the kill to the continuation's first
// new token and the tokens computed again, and the time from the kill to
// the first token and the success of a request sent just after it. Every
// answer is checked against the reference. Run with
//
//	go test -run TestFailoverTimes -failover.kills 5 -v ./cmd/node
func TestFailoverTimes(t *testing.T) {
	if *failoverKills <= 0 {
		t.Skip("a measurement: run with -failover.kills N")
	}
	c := startFailoverCluster(t)
	var toDetect, toNext, toNewFirst, toNewDone []time.Duration
	var replayed, tokens []int
	for k := range *failoverKills {
		victim := k % 2
		reqs := longRequests(fmt.Sprintf("kill %d: ", k), *failoverInFlight, 1000)
		send(c.client, reqs)
		streaming(t, reqs)
		killed := time.Now()
		if err := c.routers[victim].cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		fresh := longRequests(fmt.Sprintf("after kill %d: ", k), 1, 16)
		send(c.client, fresh)
		waitAll(t, append(reqs, fresh...))
		for _, s := range reqs {
			if s.res.Continued != 1 {
				continue
			}
			toDetect = append(toDetect, s.continued.Sub(killed))
			replayed, tokens = append(replayed, s.res.Replayed), append(tokens, len(s.res.Tokens))
			// The continuation's first new token follows the tokens it
			// replayed, which the first attempt had delivered.
			if at, ok := s.tokenAt(s.res.Replayed); ok {
				toNext = append(toNext, at.Sub(killed))
			}
		}
		if at, ok := fresh[0].tokenAt(0); ok {
			toNewFirst = append(toNewFirst, at.Sub(killed))
		}
		toNewDone = append(toNewDone, fresh[0].end.Sub(killed))
		addr := c.routers[victim].addr
		c.routers[victim] = startMember(t, "router", c.routers[1-victim].gossip, "--listen", addr)
		waitConverged(t, c.routers[0], c.routers[1], c.prefill, c.decode)
	}
	sumR, sumT := 0, 0
	for i := range replayed {
		sumR, sumT = sumR+replayed[i], sumT+tokens[i]
	}
	t.Logf("%d kills, %d requests in flight at each: %d continued", *failoverKills, *failoverInFlight, len(toDetect))
	t.Logf("kill to the continuation sent (the loss learned): p50 %s, p99 %s, max %s", percentile(toDetect, 50),
		percentile(toDetect, 99), percentile(toDetect, 100))
	t.Logf("kill to the continuation's first new token: p50 %s, p99 %s, max %s", percentile(toNext, 50), percentile(toNext, 99),
		percentile(toNext, 100))
	t.Logf("kill to a new request's first token: p50 %s, p99 %s; to its success: p50 %s, p99 %s",
		percentile(toNewFirst, 50), percentile(toNewFirst, 99), percentile(toNewDone, 50), percentile(toNewDone, 99))
	if len(replayed) > 0 {
		t.Logf("tokens computed again per continuation: mean %.1f, p50 %d, max %d; %.1f%% of those continued requests' %d tokens",
			float64(sumR)/float64(len(replayed)), percentileInt(replayed, 50), percentileInt(replayed, 100),
			100*float64(sumR)/float64(sumT), sumT)
	}
}

func percentileInt(xs []int, p int) int {
	ds := make([]time.Duration, len(xs))
	for i, x := range xs {
		ds[i] = time.Duration(x)
	}
	return int(percentile(ds, p))
}

// percentile is the p-th percentile (0 to 100) of ds, nearest rank.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, (len(s)*p+99)/100-1)]
}
