package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/messages"
)

// The burst of TestBinaryBurstSpreads: burstCount requests of one size,
// burstPerNode of which fill a decode pool: more than one decode node
// holds, within what two hold.
const (
	burstPerNode   = 8
	burstCount     = 14
	burstMaxTokens = 400
)

// burstPrompt is the prompt of every request of the burst: one prompt, so
// that every request holds the same pages and the requests each decode
// node served measure the pages it held.
var burstPrompt = strings.Repeat("a long story for a burst. ", 4)

// TestBinaryBurstSpreads: a router, two prefill and two decode nodes, each
// decode pool holding burstPerNode of the burst's requests; burstCount
// requests sent at once to the router's HTTP API (from goroutines of this
// process, inside one gossip interval, which client processes each
// starting on their own would not be) are all answered the reference text, none busy, and the decode
// nodes' pages (requests completed × pages each: a request answered busy
// holds none) are within 25 % of each other. Figures in the log:
//
//	go test -run TestBinaryBurstSpreads -v ./cmd/node
func TestBinaryBurstSpreads(t *testing.T) {
	cfg := actors.DefaultConfig()
	tokens, err := handoff.Encode(cfg.Limits(), modeltest.Builtin(t, cfg.Model).Tokenizer(), burstPrompt, false)
	if err != nil {
		t.Fatal(err)
	}
	_, pages := handoff.RequestPages(cfg.Geometry(), len(tokens), burstMaxTokens)
	pool := burstPerNode * pages
	if pool < cfg.ContextTokens/cfg.PageTokens {
		t.Fatalf("a pool of %d pages cannot hold the %d-token context", pool, cfg.ContextTokens)
	}
	router, web, key := startAPIRouter(t)
	decodeArgs := []string{"--decode-pages", strconv.Itoa(pool)}
	ms := []*member{router, startMember(t, "prefill", router.gossip), startMember(t, "prefill", router.gossip),
		startMember(t, "decode", router.gossip, decodeArgs...), startMember(t, "decode", router.gossip, decodeArgs...)}
	waitConverged(t, ms...)

	want, _ := referenceText(t, cfg, burstPrompt, burstMaxTokens)
	answers := make([]burstAnswer, burstCount)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = complete("http://"+web+"/v1/completions", key) })
	}
	wg.Wait()
	busy := 0
	for i, a := range answers {
		switch {
		case strings.Contains(a.body, `"`+messages.CodeBusy.String()+`"`):
			busy++
			t.Errorf("request %d answered busy: %d %s", i, a.status, a.body)
		case a.status != http.StatusOK || a.text != want:
			t.Errorf("request %d: %d %q, want the reference %q", i, a.status, a.body, want)
		}
	}
	var served [2]uint64
	for i, d := range ms[3:] {
		s, err := statusOf(t, d.addr)
		if err != nil {
			t.Fatal(err)
		}
		served[i] = s.Node.Completed
	}
	t.Logf("%d requests of %d pages, decode pools of %d: decode-0 %d pages (%d requests), decode-1 %d pages (%d); %d answered busy",
		burstCount, pages, pool, served[0]*uint64(pages), served[0], served[1]*uint64(pages), served[1], busy)
	if lo, hi := min(served[0], served[1]), max(served[0], served[1]); 4*(hi-lo) > hi {
		t.Errorf("decode nodes held %d and %d pages: more than 25 %% apart", served[0]*uint64(pages), served[1]*uint64(pages))
	}
}

// burstAnswer is an HTTP answer: its status, body and, on success, the
// completion's text.
type burstAnswer struct {
	status     int
	body, text string
}

// complete asks url for the completion of burstPrompt with key.
func complete(url, key string) burstAnswer {
	body, _ := json.Marshal(map[string]any{"model": engine.BuiltinName, "prompt": burstPrompt, "max_tokens": burstMaxTokens})
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return burstAnswer{body: err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return burstAnswer{body: err.Error()}
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var c struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	a := burstAnswer{status: res.StatusCode, body: string(raw)}
	if json.Unmarshal(raw, &c) == nil && len(c.Choices) == 1 {
		a.text = c.Choices[0].Text
	}
	return a
}
