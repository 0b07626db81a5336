package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvwarden/kvwarden/bench"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/messages"
)

// Bounds of a benchmark's load.
const (
	// benchInflightMax bounds the requests an open-loop run has in flight
	// at once; a send beyond it is counted as generator_overload, not
	// queued, so that the generator never hides the cluster's queueing in
	// its own.
	benchInflightMax = 4096
	// benchOrderLen is how many requests' shapes are drawn in advance; a
	// longer run goes round them again.
	benchOrderLen = 1 << 16
	// progressEvery is how often the progress line is redrawn.
	progressEvery = time.Second
)

// codeOverload is a request the generator did not send because
// benchInflightMax were in flight.
const codeOverload = "generator_overload"

// answer is what one request gave back, timed from its send.
type answer struct {
	tokens []int  // the tokens, where the protocol carries them
	text   string // the answer's text
	count  int    // how many tokens
	cached int    // how many prompt tokens were read from the prefix cache
	first  time.Duration
	gaps   []time.Duration
	e2e    time.Duration
	code   string // empty for an answer, else the error's code name
}

// sender sends one request and times its answer; it is safe for
// concurrent use.
type sender interface {
	send(ctx context.Context, tenant int, s bench.Shape) answer
	close()
}

// timer records the arrival of each token of one request.
type timer struct {
	start time.Time
	mu    sync.Mutex
	last  time.Duration
	a     answer
}

func newTimer() *timer { return &timer{start: time.Now()} }

// tokens notes n tokens arriving now.
func (t *timer) tokens(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Since(t.start)
	for range n {
		if t.a.count == 0 {
			t.a.first = now
		} else {
			t.a.gaps = append(t.a.gaps, now-t.last)
		}
		t.last = now
		t.a.count++
	}
}

// end is the answer, ended now.
func (t *timer) end() answer {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.a.e2e = time.Since(t.start)
	return t.a
}

// clientSender sends through the Go client, one client per tenant: the
// tenant of a request is the one its credential names.
type clientSender struct {
	clients []*client.Client
}

func (c *clientSender) send(ctx context.Context, tenant int, s bench.Shape) answer {
	t := newTimer()
	res, err := c.clients[tenant].Generate(ctx, bench.TenantName(tenant), s.Prompt, client.GenerateOptions{MaxTokens: s.MaxTokens},
		func(int) { t.tokens(1) })
	a := t.end()
	if err != nil {
		a.code = errorCode(err)
		return a
	}
	a.tokens, a.text, a.count, a.cached = res.Tokens, res.Text, len(res.Tokens), res.CachedTokens
	return a
}

func (c *clientSender) close() {
	for _, cl := range c.clients {
		cl.Close()
	}
}

// errorCode names an error by its wire code, or says what else it is.
func errorCode(err error) string {
	var we *messages.WireError
	switch {
	case errors.As(err, &we):
		return we.Code.String()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	}
	return "client_error"
}

// reference is the answer the reference engine gives a shape.
type reference struct {
	tokens []int
	text   string
	// jsonText is text as JSON carries it: each byte of invalid UTF-8 (a
	// byte tokenizer's answer may hold any byte) as U+FFFD.
	jsonText     string
	promptTokens int
}

func newReference(tokens []int, text string, promptTokens int) reference {
	data, _ := json.Marshal(text)
	var jsonText string
	_ = json.Unmarshal(data, &jsonText) // a string marshalled is a string
	return reference{tokens: tokens, text: text, jsonText: jsonText, promptTokens: promptTokens}
}

// matches says whether a is the reference answer: its tokens and text
// through the Go client; its text as JSON carries it and its token count
// over HTTP.
func (r reference) matches(a answer) bool {
	if a.tokens == nil {
		return a.text == r.jsonText && a.count == len(r.tokens)
	}
	return slices.Equal(a.tokens, r.tokens) && a.text == r.text
}

// benchLoad is one run's requests and how they are sent.
type benchLoad struct {
	send   sender
	shapes []bench.Shape
	refs   []reference
	order  []bench.Request
	// progress counts the run's requests for the progress line.
	progress *progress
}

// sample sends request i, sent at offset start of the run, and checks its
// answer against the reference; then, for a chat, each of its later turns
// in order, each sent as the turn before it is answered. A turn that
// fails ends the chat: the next would resend an answer it never had.
func (l *benchLoad) sample(ctx context.Context, i int, start time.Duration, warm bool) []bench.Sample {
	r := l.order[i%len(l.order)]
	p := l.progress
	var out []bench.Sample
	begun := time.Now().Add(-start)
	for sh := r.Shape; sh < len(l.shapes) && (sh == r.Shape || l.shapes[sh].Turn > 0); sh++ {
		p.sent.Add(1)
		sent := time.Since(begun)
		a := l.send.send(ctx, r.Tenant, l.shapes[sh])
		ref := l.refs[sh]
		s := bench.Sample{Start: sent, TTFT: a.first, E2E: a.e2e, Tokens: a.count, PromptTokens: ref.promptTokens, CachedTokens: a.cached,
			Gaps: a.gaps, Code: a.code, Warmup: warm}
		switch {
		case a.code != "":
			p.errors.Add(1)
		case !ref.matches(a):
			s.Wrong = true
			p.wrong.Add(1)
		}
		p.done.Add(1)
		out = append(out, s)
		if !s.OK() {
			break
		}
	}
	return out
}

// open sends a request at each offset of at from now, each on its own
// goroutine, the first warm of them the warm-up, and returns their samples
// once every one has ended. Cancelling ctx stops the sends (and cancels
// those in flight).
func (l *benchLoad) open(ctx context.Context, at []time.Duration, warm int) []bench.Sample {
	samples := make([][]bench.Sample, len(at))
	var wg sync.WaitGroup
	var inflight atomic.Int64
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	sent := len(at)
	for i, t := range at {
		timer.Reset(time.Until(start.Add(t)))
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		if ctx.Err() != nil {
			sent = i
			break
		}
		if inflight.Load() >= benchInflightMax {
			samples[i] = []bench.Sample{{Start: time.Since(start), Code: codeOverload, Warmup: i < warm}}
			l.progress.errors.Add(1)
			continue
		}
		inflight.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer inflight.Add(-1)
			samples[i] = l.sample(ctx, i, time.Since(start), i < warm)
		}()
	}
	wg.Wait()
	return slices.Concat(samples[:sent]...)
}

// closed keeps concurrency requests in flight, each sent as the one
// before it on its lane ends, until bound's requests have been sent after
// the warm-up or its duration has passed, and returns their samples.
func (l *benchLoad) closed(ctx context.Context, concurrency int, warmup time.Duration, bound bench.Bound) []bench.Sample {
	var mu sync.Mutex
	var samples []bench.Sample
	measured, next := 0, 0
	start := time.Now()
	// take is the index of the next request to send, whether it is warm-up,
	// and false when the run is over.
	take := func() (int, time.Duration, bool, bool) {
		mu.Lock()
		defer mu.Unlock()
		at := time.Since(start)
		warm := at < warmup
		over := ctx.Err() != nil || (!warm && bound.Requests > 0 && measured >= bound.Requests) ||
			(bound.Duration > 0 && at >= warmup+bound.Duration) || next >= bench.RequestsMax
		if over {
			return 0, 0, false, false
		}
		if !warm {
			measured++
		}
		next++
		return next - 1, at, warm, true
	}
	var wg sync.WaitGroup
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i, at, warm, ok := take()
				if !ok {
					return
				}
				s := l.sample(ctx, i, at, warm)
				mu.Lock()
				samples = append(samples, s...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(samples, func(a, b bench.Sample) int { return int(a.Start - b.Start) })
	return samples
}

// progress is the live count of a run, drawn on one line of stderr.
type progress struct {
	label                     string
	total                     int // requests the run sends; 0 when unknown
	sent, done, errors, wrong atomic.Int64
}

// draw writes the progress line: over itself on a terminal, else as a
// line of its own.
func (p *progress) draw(w io.Writer, since time.Time, terminal bool) {
	of := ""
	if p.total > 0 {
		of = fmt.Sprintf("/%d", p.total)
	}
	line := fmt.Sprintf("%s: %d%s sent, %d done, %d errors, %d wrong, %s", p.label, p.sent.Load(), of, p.done.Load(),
		p.errors.Load(), p.wrong.Load(), time.Since(since).Round(time.Second))
	if terminal {
		fmt.Fprintf(w, "\r\x1b[K%s", line)
	} else {
		fmt.Fprintln(w, line)
	}
}

// show draws p every progressEvery until the returned function is called,
// which draws it a last time.
func (p *progress) show(w io.Writer) func() {
	terminal, since := isTerminal(w), time.Now()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(progressEvery)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				// Off a terminal, a line every ten seconds is enough.
				if terminal || n%10 == 0 {
					p.draw(w, since, terminal)
				}
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped
		p.draw(w, since, terminal)
		if terminal {
			fmt.Fprintln(w)
		}
	}
}
