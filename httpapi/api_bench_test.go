//go:build !race

package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/trust"
)

// BenchmarkSSEVersusClient streams the same requests from one node
// serving stories260K through the HTTP API (Server-Sent Events, read as
// curl would) and through the Go client (protoactor remote), alternating
// one of each per iteration, and reports the ratio of their output
// tokens/s and the difference of their mean times to first token.
//
//	go test ./httpapi/ -run '^$' -bench SSEVersusClient -benchtime 40x
func BenchmarkSSEVersusClient(b *testing.B) {
	a := startAPIServing(b, modeltest.Stories(b, kv.F32))
	c, err := client.Dial(a.node.Address(), client.Options{Auth: trust.Insecure(nil)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const prompt, max = "Once upon a time", 128
	body := `{"model":"stories260K","prompt":"` + prompt + `","max_tokens":128,"stream":true,"stream_options":{"include_usage":true}}`
	var httpTime, goTime, httpFirst, goFirst time.Duration
	var httpTokens, goTokens int
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		first, tokens := streamSSE(b, a.srv.URL+"/v1/completions", body)
		httpTime += time.Since(start)
		httpFirst += first
		httpTokens += tokens

		start = time.Now()
		var firstAt time.Duration
		res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: max}, func(int) {
			if firstAt == 0 {
				firstAt = time.Since(start)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		goTime += time.Since(start)
		goFirst += firstAt
		goTokens += len(res.Tokens)
	}
	b.StopTimer()
	httpRate, goRate := float64(httpTokens)/httpTime.Seconds(), float64(goTokens)/goTime.Seconds()
	b.ReportMetric(httpRate, "sse_tokens/s")
	b.ReportMetric(goRate, "client_tokens/s")
	b.ReportMetric(httpRate/goRate, "sse/client")
	b.ReportMetric(float64(httpFirst-goFirst)/float64(b.N)/1e6, "ttft_extra_ms")
}

// streamSSE posts body and reads the SSE stream to [DONE]: the time to its
// first text and the completion tokens its usage counts.
func streamSSE(b *testing.B, url, body string) (time.Duration, int) {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	var first time.Duration
	tokens := -1
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case line == "[DONE]" && tokens >= 0:
			return first, tokens
		case first == 0:
			first = time.Since(start)
		default:
			var u struct{ Usage *usage }
			if err := json.Unmarshal([]byte(line), &u); err != nil {
				b.Fatal(err)
			}
			if u.Usage != nil {
				tokens = u.Usage.CompletionTokens
			}
		}
	}
	b.Fatalf("the stream ended without usage and [DONE]: %v", sc.Err())
	return 0, 0
}
