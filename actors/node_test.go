package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"

	"github.com/kvwarden/kvwarden/trust"
)

// testConfig is small, with room in the decode pool for every request of
// the concurrent test at once, and timeouts generous enough for a loaded
// machine and the race detector's slowdown: these tests check answers, not
// speed.
func testConfig() Config {
	c := DefaultLocalConfig()
	c.PrefillPages = 64
	c.DecodePages = 320
	c.ContextTokens = 512
	c.MaxTokensMax = 64
	c.RequestTimeout = 3 * time.Minute
	c.PrefillTimeout = 2 * time.Minute
	c.OwnedPageTimeout = 4 * time.Minute
	c.ReserveWait = 30 * time.Second
	return c
}

// startNode starts a node and, at the end of the test, checks that no actor
// broke an invariant and that every pool is entirely free again.
func startNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	return startNodeWith(t, cfg, Options{})
}

// withModel is opt with, unless it names one, the built-in model of
// cfg.Model.
func withModel(t testing.TB, cfg Config, opt Options) Options {
	t.Helper()
	if opt.Model == nil {
		opt.Model = modeltest.Builtin(t, cfg.Model)
	}
	return opt
}

// startNodeWith is startNode with options.
func startNodeWith(t *testing.T, cfg Config, opt Options) *Node {
	t.Helper()
	n, err := Start(cfg, withModel(t, cfg, opt))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		quiesce(t, n)
		n.Stop()
	})
	return n
}

// quiesce checks that no actor broke an invariant and that every page of
// every pool is free (Node.PagesInUse) once the messages in flight are
// handled: a client has its answer before the prefill worker handles the
// acknowledgement that frees the prompt's source pages.
func quiesce(t *testing.T, n *Node) {
	t.Helper()
	select {
	case e := <-n.Fatal():
		t.Fatalf("invariant broken: %v", e)
	default:
	}
	testwait.Report(t, "every page free after the test", time.Minute, func() (bool, string) {
		inUse, err := n.PagesInUse()
		return err == nil && inUse == 0, fmt.Sprintf("%d pages in use (%v)", inUse, err)
	})
}

// localClient waits long for a silent node: requests queued behind others
// under the race detector stay silent for tens of seconds.
func localClient(n *Node) *client.Client {
	return client.New(n.Root().ActorSystem(), n.Admission(), client.Options{NoAnswerAfter: 3 * time.Minute, Auth: trust.Insecure(nil)})
}

// reference is the single-engine answer (engine.Model.Answer).
func reference(t *testing.T, cfg Config, prompt string, maxTokens int) []int {
	t.Helper()
	want, err := withModel(t, cfg, Options{}).Model.Answer(prompt, maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

func TestConcurrentTenantsGetReferenceAnswers(t *testing.T) {
	cfg := testConfig()
	n := startNode(t, cfg)
	c := localClient(n)
	type job struct {
		tenant, prompt string
		max            int
	}
	var jobs []job
	for i := range 16 {
		tenant := fmt.Sprintf("tenant-%d", i%4)
		// Prompt lengths from 1 to ~200 tokens cross page boundaries.
		prompt := strings.Repeat(fmt.Sprintf("%s asks question %d. ", tenant, i), 20)[:1+(i*37)%200]
		jobs = append(jobs, job{tenant, prompt, 8 + i%5*7})
	}
	var wg sync.WaitGroup
	errs := make([]error, len(jobs))
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var streamed []int
			res, err := c.Generate(context.Background(), j.tenant, j.prompt, client.GenerateOptions{MaxTokens: j.max},
				func(tok int) { streamed = append(streamed, tok) })
			if err != nil {
				errs[i] = err
				return
			}
			want := reference(t, cfg, j.prompt, j.max)
			if fmt.Sprint(res.Tokens) != fmt.Sprint(want) || fmt.Sprint(streamed) != fmt.Sprint(want) {
				errs[i] = fmt.Errorf("%s %q: got %v (streamed %v), reference %v", j.tenant, j.prompt, res.Tokens, streamed, want)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	s, err := n.Status()
	if err != nil {
		t.Fatal(err)
	}
	if s.Completed != 16 || s.Failed != 0 || s.FramesRefused != 0 || s.FramesAccepted == 0 {
		t.Errorf("status after 16 requests: %+v", s)
	}
}

func TestOversizePromptRefusedBeforeAnyPage(t *testing.T) {
	cfg := testConfig()
	n := startNode(t, cfg)
	c := localClient(n)
	for _, tc := range []struct {
		prompt int // tokens: BOS and prompt-1 bytes
		max    int
		where  string
		have   uint64
		limit  uint64
	}{
		{cfg.ContextTokens + 1, 1, "context window", uint64(cfg.ContextTokens + 1), uint64(cfg.ContextTokens)},
		{cfg.ContextTokens - 4, 10, "context window (prompt + max_tokens)", uint64(cfg.ContextTokens + 6), uint64(cfg.ContextTokens)},
	} {
		_, err := c.Generate(context.Background(), "acme", strings.Repeat("x", tc.prompt-1), client.GenerateOptions{MaxTokens: tc.max}, nil)
		var we *messages.WireError
		if !errors.As(err, &we) || we.Code != messages.CodePromptTooLong || we.Where != tc.where || we.Have != tc.have || we.Limit != tc.limit {
			t.Fatalf("prompt of %d + %d: got %v", tc.prompt, tc.max, err)
		}
		if !strings.Contains(we.Message, fmt.Sprint(tc.have)) || !strings.Contains(we.Message, fmt.Sprint(tc.limit)) {
			t.Errorf("message lacks the numbers: %q", we.Message)
		}
	}
	// Zero pages reserved and zero frames sent, anywhere.
	for _, p := range n.Pools() {
		s, err := p.Status(n.Root())
		if err != nil {
			t.Fatal(err)
		}
		if s.Reservations != 0 {
			t.Errorf("pool %s reserved %d pages for refused prompts", p.PID.Id, s.Reservations)
		}
	}
	for _, w := range n.Workers() {
		s, err := ask[WorkerStatusReply](n.Root(), w, WorkerStatus{}, cfg.CallTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if s.FramesSent != 0 || s.BatchesSent != 0 {
			t.Errorf("worker %s sent %d frames for refused prompts", w.Id, s.FramesSent)
		}
	}
	if s, _ := n.Status(); s.RejectedTooLong != 2 || s.Admitted != 0 {
		t.Errorf("status: %+v", s)
	}
}

func TestSmallestPoolOnPathRefuses(t *testing.T) {
	cfg := testConfig()
	cfg.PrefillPages = 4 // 64 tokens
	n := startNode(t, cfg)
	// BOS and 64 bytes: 65 tokens.
	_, err := localClient(n).Generate(context.Background(), "acme", strings.Repeat("y", 64), client.GenerateOptions{MaxTokens: 1}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodePromptTooLong || we.Where != "prefill pool" || we.Have != 65 || we.Limit != 64 {
		t.Fatalf("prompt of 65 over a 64-token prefill pool: %v", err)
	}
}

func TestCancelMidStreamFreesPages(t *testing.T) {
	cfg := testConfig()
	// The large model, whose decode steps take milliseconds: the cancel
	// after three tokens reaches the node while the request still runs.
	cfg.Model = engine.LargeModelConfig()
	n := startNode(t, cfg)
	c := localClient(n)
	ctx, cancel := context.WithCancel(context.Background())
	got := 0
	_, err := c.Generate(ctx, "acme", "a prompt that will be cut short", client.GenerateOptions{MaxTokens: 64}, func(int) {
		if got++; got == 3 {
			cancel()
		}
	})
	var we *messages.WireError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &we) || we.Code != messages.CodeCancelled {
		t.Fatalf("cancelled generate: %v", err)
	}
	if got >= 64 {
		t.Fatalf("cancel did not stop the stream: %d tokens", got)
	}
	// The cleanup checks that every page is free again.
}

func TestPoolExhaustionWaitsOrBusyNeverWrong(t *testing.T) {
	cfg := testConfig()
	cfg.DecodePages = 12 // a 100-token prompt with 40 new tokens takes 7 + 3 = 10
	cfg.ReserveWait = 200 * time.Millisecond
	n := startNode(t, cfg)
	c := localClient(n)
	prompt := strings.Repeat("z", 100)
	want := reference(t, cfg, prompt, 40)
	var wg sync.WaitGroup
	results := make([]error, 6)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Generate(context.Background(), fmt.Sprintf("t%d", i), prompt, client.GenerateOptions{MaxTokens: 40}, nil)
			if err == nil && fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
				err = fmt.Errorf("wrong answer %v, want %v", res.Tokens, want)
			}
			results[i] = err
		}()
	}
	wg.Wait()
	ok, busy := 0, 0
	for _, err := range results {
		var we *messages.WireError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &we) && we.Code == messages.CodeBusy:
			busy++
		default:
			t.Errorf("neither an answer nor busy: %v", err)
		}
	}
	if ok == 0 {
		t.Fatalf("no request got through: %d busy", busy)
	}
	t.Logf("%d answered, %d busy", ok, busy)
}

// nodePool is a pool of pages pages spawned on n's actor system under
// name, outside the node's own pools, with n's config and mailboxes and
// asks bounded by timeout.
func nodePool(t testing.TB, n *Node, name string, pages int, timeout time.Duration) *Pool {
	t.Helper()
	cfg := n.Config()
	pool, err := spawnPool(n.Root(), name, cfg.pool(pages, cfg.Incarnation), n.Mailbox(), timeout, time.Now, cfg.fairness(),
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return pool
}
