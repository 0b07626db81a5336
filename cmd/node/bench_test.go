package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvwarden/kvwarden/bench"
)

// readReport reads the report bench wrote with --json.
func readReport(t *testing.T, path string) benchReport {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep benchReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, data)
	}
	return rep
}

// TestBenchStub: bench against the in-process stub sends exactly the
// requests asked after the warm-up, every answer the reference's, and
// writes its table, report and plots; a sweep adds the plots against the
// rate.
func TestBenchStub(t *testing.T) {
	dir := t.TempDir()
	report, plots := filepath.Join(dir, "report.json"), filepath.Join(dir, "plots")
	code, out := runNode("bench", "--stub", "--rates", "100,200", "--requests", "40", "--duration", "0", "--warmup", "100ms",
		"--tenants", "3", "--distinct", "8", "--output-len", "uniform:4:24", "--slo-ttft", "10s", "--json", report, "--plot", plots)
	if code != exitOK {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if !strings.Contains(out, "stub 100/s") || !strings.Contains(out, "stub 200/s") {
		t.Errorf("the table lacks a run:\n%s", out)
	}
	rep := readReport(t, report)
	if len(rep.Runs) != 2 {
		t.Fatalf("%d runs in the report, want 2", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		s := r.Summary
		if s.Requests != 40 || s.OK != 40 || s.Wrong != 0 || len(s.Errors) != 0 || s.GoodputPerS != s.RequestsPerS || s.TTFT.Count != 40 {
			t.Errorf("%s: %+v; want 40 requests answered, all within the SLO", r.Layout, s)
		}
	}
	for _, f := range []string{"ttft_cdf.png", "itl_cdf.png", "e2e_cdf.png", "goodput.png", "ttft_p99.png", "itl_p99.png"} {
		if st, err := os.Stat(filepath.Join(plots, f)); err != nil || st.Size() == 0 {
			t.Errorf("plot %s: %v", f, err)
		}
	}
}

// TestBenchStubChats: with --turns, a request of the schedule is a whole
// chat: each of its turns is sent after the one before it, as its
// conversation's tenant, with the conversation so far, and is counted as a
// request of its own; the report names the workload's prefix and turns.
func TestBenchStubChats(t *testing.T) {
	report := filepath.Join(t.TempDir(), "report.json")
	code, out := runNode("bench", "--stub", "--turns", "3", "--shared-prefix-len", "64", "--shared-prefixes", "2", "--tenants", "2",
		"--distinct", "4", "--prompt-len", "16", "--output-len", "4", "--concurrency", "2", "--requests", "6", "--duration", "0",
		"--warmup", "0", "--json", report)
	if code != exitOK {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if !strings.Contains(out, "CACHED") || !strings.Contains(out, "HIT") {
		t.Errorf("the table has no cache columns:\n%s", out)
	}
	rep := readReport(t, report)
	if s := rep.Runs[0].Summary; s.Requests != 18 || s.OK != 18 || s.CachedTokens != 0 || s.PromptTokens == 0 {
		t.Errorf("%+v; want 6 chats of 3 turns answered, none read from a cache (a stub has none)", s)
	}
	wl, _ := rep.Workload.(map[string]any)
	if wl["turns"] != 3.0 || wl["shared_prefix_len"] != 64.0 {
		t.Errorf("the report's workload %v lacks the turns and the prefix", rep.Workload)
	}
}

// TestBenchChatPrompts: a chat's later turn sends the turn before it, that
// turn's reference answer and its own message, so that its prompt starts
// with the last turn's; each prompt is longer than the one before.
func TestBenchChatPrompts(t *testing.T) {
	f := defaultWorkloadFlags()
	f.Distinct, f.Turns, f.PromptLen, f.OutputLen = 2, 3, "12", "5"
	w, err := f.build()
	if err != nil {
		t.Fatal(err)
	}
	if len(w.shapes) != 6 {
		t.Fatalf("%d shapes, want 2 chats of 3 turns", len(w.shapes))
	}
	for i := 1; i < 6; i++ {
		prev, s := w.shapes[i-1], w.shapes[i]
		if s.Turn == 0 {
			continue
		}
		head := prev.Prompt + w.refs[i-1].jsonText
		if !strings.HasPrefix(s.Prompt, head) || len(s.Prompt) != len(head)+13 {
			t.Errorf("turn %d of chat %d: %q does not continue %q with a message of 13 bytes", s.Turn, i/3, s.Prompt, head)
		}
		if w.refs[i].promptTokens <= w.refs[i-1].promptTokens {
			t.Errorf("turn %d: %d prompt tokens, not more than the turn before's %d", s.Turn, w.refs[i].promptTokens, w.refs[i-1].promptTokens)
		}
	}
}

// TestBenchWrongAnswer: an endpoint that answers one request wrong has the
// answer counted as wrong, never as speed, and the run fails.
func TestBenchWrongAnswer(t *testing.T) {
	f := defaultWorkloadFlags()
	f.Distinct, f.OutputLen, f.Requests, f.Duration, f.Warmup = 4, "8", 20, 0, 0
	w, err := f.build()
	if err != nil {
		t.Fatal(err)
	}
	answers := append([]reference(nil), w.refs...)
	answers[2].tokens = append([]int{answers[2].tokens[1]}, answers[2].tokens[1:]...)
	addr, stop, err := startStub(slog.New(slog.DiscardHandler), w.shapes, answers)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	o := benchOptions{workloadFlags: f, Concurrency: 2, NoAnswerAfter: time.Minute}
	s, err := o.dial(context.Background(), slog.New(slog.DiscardHandler), w, []string{addr}, credFlags{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	rep := &benchReport{}
	if err := runAll(context.Background(), &strings.Builder{}, o, w, s, "stub", rep); err != nil {
		t.Fatal(err)
	}
	want := 0
	for i := range 20 {
		if w.order[i].Shape == 2 {
			want++
		}
	}
	if want == 0 {
		t.Fatal("the seed sends no request of shape 2; pick another")
	}
	sum := rep.Runs[0].Summary
	if sum.Wrong != want || sum.OK != 20-want {
		t.Errorf("%d wrong and %d right of 20, want %d wrong", sum.Wrong, sum.OK, want)
	}
	var wrong *wrongAnswersError
	if err := wrongAnswers(rep); !errors.As(err, &wrong) || wrong.Wrong != want || wrong.Requests != 20 {
		t.Errorf("wrongAnswers: %v, want %d of 20", err, want)
	}
}

// TestBenchHTTP: over HTTP, the answer is read from the event stream
// (text chunks, the usage, [DONE]) and checked against the reference; a
// refusal is counted by its status and code; a stream that breaks off is
// an error, not an answer.
func TestBenchHTTP(t *testing.T) {
	f := defaultWorkloadFlags()
	f.Distinct, f.OutputLen = 1, "6"
	w, err := f.build()
	if err != nil {
		t.Fatal(err)
	}
	ref := w.refs[0]
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var body struct {
			Prompt    string `json:"prompt"`
			MaxTokens int    `json:"max_tokens"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		switch r.Header.Get("Authorization") {
		case "Bearer busy":
			rw.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(rw, `{"error": {"code": "busy", "message": "later"}}`)
			return
		case "Bearer right", "Bearer cut":
		default:
			t.Errorf("key %q", r.Header.Get("Authorization"))
		}
		if body.Prompt != w.shapes[0].Prompt || body.MaxTokens != 6 {
			t.Errorf("request %+v", body)
		}
		rw.Header().Set("Content-Type", "text/event-stream")
		// A chunk a character, as the API streams whole characters.
		for text := ref.text; text != ""; {
			_, n := utf8.DecodeRuneInString(text)
			chunk, _ := json.Marshal(map[string]any{"choices": []map[string]string{{"text": text[:n]}}})
			fmt.Fprintf(rw, "data: %s\n\n", chunk)
			text = text[n:]
		}
		if r.Header.Get("Authorization") == "Bearer cut" {
			return
		}
		fmt.Fprintf(rw, "data: {\"choices\": [], \"usage\": {\"completion_tokens\": %d, \"prompt_tokens_details\": {\"cached_tokens\": 16}}}\n\ndata: [DONE]\n\n",
			len(ref.tokens))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		key, code string
	}{{"right", ""}, {"busy", "http_429_busy"}, {"cut", "http_stream_ended"}} {
		h := newHTTPSender(srv.URL, []string{tc.key}, w.model.Name(), 1, time.Minute)
		a := h.send(context.Background(), 0, w.shapes[0])
		h.close()
		if a.code != tc.code || (tc.code == "" && (!ref.matches(a) || a.cached != 16)) {
			t.Errorf("key %s: code %q, text %q (%d tokens, %d cached); want code %q and the reference %q (%d tokens, 16 cached)", tc.key,
				a.code, a.text, a.count, a.cached, tc.code, ref.text, len(ref.tokens))
		}
	}
}

// TestBenchUsage: flags that cannot make a run are refused before
// anything starts, exit 2, naming the flag.
func TestBenchUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate", "0"}, "request rate per second: 0"},
		{[]string{"--rates", "1,x"}, `--rates: "x" is not a number`},
		{[]string{"--concurrency", "4", "--rate", "3"}, "--concurrency and --rate"},
		{[]string{"--prompt-len", "uniform:9:3"}, "--prompt-len"},
		{[]string{"--stub", "--compare", "2"}, "give one"},
		{[]string{"--duration", "0"}, "the run's bound"},
		{[]string{"--stub", "--rates", "2,1000000", "--duration", "20s"}, "2.2e+07 is outside [1, 4.194304e+06]"},
		{[]string{"--http", "http://127.0.0.1:1"}, "--http needs --api-key"},
		{[]string{"--", "--batch-max", "4"}, "arguments after -- are for the nodes --compare and --path start"},
		{[]string{"--side-channel", "10"}, "--side-channel needs --shared-prefix-len"},
		{[]string{"--side-channel", "10", "--shared-prefix-len", "64", "--stub"}, "give one"},
		{[]string{"--turns", "65"}, "turns: 65 is outside [1, 64]"},
		{[]string{"--shared-prefix-len", "64", "--shared-prefixes", "0"}, "shared prefixes: 0"},
		{[]string{"--path", "2", "--stub"}, "give one"},
		{[]string{"--path", "101"}, "--path (101) must be 1 to 100 rounds"},
		{[]string{"--path", "1", "--http", "http://127.0.0.1:1", "--api-key", "k"}, "--path brings up its own nodes"},
	} {
		code, out := runNode(append([]string{"bench"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(out, tc.want) {
			t.Errorf("bench %s: exit %d, want %d with %q:\n%s", strings.Join(tc.args, " "), code, exitUsage, tc.want, out)
		}
	}
}

// TestBinaryBenchCompare: bench --compare 2 brings up two nodes of role
// all behind a router, then one prefill and one decode node, each as
// child processes of the real binary; every answer is the reference's, and
// the ratio of their goodputs is printed; no node outlives it.
func TestBinaryBenchCompare(t *testing.T) {
	report := filepath.Join(t.TempDir(), "compare.json")
	code, stdout, stderr := runBinary(t, "", "bench", "--compare", "2", "--rate", "20", "--requests", "16", "--duration", "0",
		"--warmup", "0", "--tenants", "2", "--distinct", "6", "--output-len", "uniform:8:32", "--json", report)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rep := readReport(t, report)
	var layouts []string
	for _, r := range rep.Runs {
		layouts = append(layouts, r.Layout)
		if r.Summary.OK != 16 || r.Summary.Wrong != 0 {
			t.Errorf("%s: %d of 16 answered with the reference, %d wrong, errors %v", r.Layout, r.Summary.OK, r.Summary.Wrong, r.Summary.Errors)
		}
	}
	if strings.Join(layouts, ",") != "2 all,1P:1D" {
		t.Errorf("layouts %v, want 2 all then 1P:1D", layouts)
	}
	if len(rep.Ratios) != 1 || rep.Ratios[0].Layout != "1P:1D" || !(rep.Ratios[0].Goodput > 0) {
		t.Errorf("ratios %+v, want 1P:1D over 2 all", rep.Ratios)
	}
	if !strings.Contains(stdout, "goodput 1P:1D / 2 all at 20/s: ") {
		t.Errorf("no ratio printed:\n%s", stdout)
	}
	for _, l := range []string{"2 all", "1P:1D"} {
		if !strings.Contains(stderr, "bringing up "+l+" behind a router") {
			t.Errorf("stderr does not say it brings up %s:\n%s", l, stderr)
		}
	}
}

// TestGoodputRatios: each split's goodput over the colocated layout's at
// the same rate; a rate where the colocated layout had no goodput has no
// ratio.
func TestGoodputRatios(t *testing.T) {
	run := func(layout string, rate, goodput float64) benchRun {
		return benchRun{Layout: layout, RatePerS: rate, Summary: bench.Summary{GoodputPerS: goodput}}
	}
	rep := &benchReport{Runs: []benchRun{run("2 all", 4, 4), run("2 all", 8, 0), run("1P:1D", 4, 2), run("1P:1D", 8, 1)}}
	got := goodputRatios(rep, []bench.Layout{{All: 2}, {Prefill: 1, Decode: 1}})
	if len(got) != 1 || got[0] != (benchRatio{Layout: "1P:1D", Over: "2 all", RatePerS: 4, Goodput: 0.5}) {
		t.Errorf("ratios %+v, want 1P:1D over 2 all at 4/s: 0.5", got)
	}
}

// TestBenchPrompts: a JSONL prompts file is the workload: each prompt is
// sent, its max_tokens asked, and every answer checked as the reference's.
func TestBenchPrompts(t *testing.T) {
	dir := t.TempDir()
	prompts, report := filepath.Join(dir, "prompts.jsonl"), filepath.Join(dir, "report.json")
	if err := os.WriteFile(prompts, []byte("{\"prompt\": \"Once upon a time\", \"max_tokens\": 6}\n\n{\"prompt\": \"The cat\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := runNode("bench", "--stub", "--prompts", prompts, "--output-len", "3", "--rate", "200", "--requests", "20",
		"--duration", "0", "--warmup", "0", "--json", report)
	if code != exitOK {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	rep := readReport(t, report)
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs in the report, want 1", len(rep.Runs))
	}
	if s := rep.Runs[0].Summary; s.Requests != 20 || s.OK != 20 || s.Wrong != 0 || len(s.Errors) != 0 {
		t.Errorf("%+v; want 20 requests answered with the reference's answers", s)
	}
}

// TestBenchHTTPNoAnswer: an API that goes quiet, before its headers or
// after a chunk of the stream, has the request given up after
// --no-answer-after as http_no_answer, so that it cannot hold the run.
func TestBenchHTTPNoAnswer(t *testing.T) {
	f := defaultWorkloadFlags()
	f.Distinct, f.OutputLen = 1, "6"
	w, err := f.build()
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer chunk" {
			rw.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(rw, "data: {\"choices\": [{\"text\": \"a\"}]}\n\n")
			rw.(http.Flusher).Flush()
		}
		<-release
	}))
	defer srv.Close()
	defer close(release)
	for _, key := range []string{"headers", "chunk"} {
		h := newHTTPSender(srv.URL, []string{key}, w.model.Name(), 1, 50*time.Millisecond)
		a := h.send(context.Background(), 0, w.shapes[0])
		h.close()
		if a.code != codeNoAnswer {
			t.Errorf("quiet after %s: code %q, want %q", key, a.code, codeNoAnswer)
		}
	}
}

// TestBenchPlotsDegenerateRuns: the latency CDFs are drawn when every
// answer of a run has the same latency (every token of a request arrived
// in one read, so each inter-token latency is zero) or when a run has no
// answer at all; gonum's range for a single value reaches below zero,
// which its log scale refuses by panicking.
func TestBenchPlotsDegenerateRuns(t *testing.T) {
	same := bench.Sample{TTFT: time.Millisecond, E2E: time.Millisecond, Tokens: 8, Gaps: make([]time.Duration, 7)}
	for name, samples := range map[string][]bench.Sample{
		"equal":      {same, same, same},
		"one":        {same},
		"unanswered": {{Code: "busy"}},
		"none":       nil,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			rep := &benchReport{Runs: []benchRun{{RatePerS: 10, samples: samples}}}
			if err := writePlots(dir, rep); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"ttft_cdf.png", "itl_cdf.png", "e2e_cdf.png"} {
				if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
					t.Errorf("plot %s: %v", f, err)
				}
			}
		})
	}
}

// TestBinaryBenchPath runs the serving path's comparison for one round:
// every target measured, every process's CPU read, every ratio computed
// from figures that are there.
func TestBinaryBenchPath(t *testing.T) {
	report := filepath.Join(t.TempDir(), "path.json")
	code, stdout, stderr := runBinary(t, "", "bench", "--path", "1", "--json", report)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep pathReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	procs := map[string][]string{pathEngine: {"client"}, pathNode: {"all-0", "client"},
		pathCluster: {"client", "decode-0", "prefill-0", "router-0"}}
	for target, want := range procs {
		rounds := rep.Targets[target]
		if len(rounds) != 1 {
			t.Fatalf("%s: %d rounds, want 1", target, len(rounds))
		}
		r := rounds[0]
		if !(r.SingleTokensPerS > 0 && r.BatchTokensPerS > 0 && r.TTFTS > 0) {
			t.Errorf("%s: a figure is not positive: %+v", target, r)
		}
		if got := slices.Sorted(maps.Keys(r.CPUPerToken)); !slices.Equal(got, want) {
			t.Errorf("%s: CPU read of %v, want %v", target, got, want)
		}
		if !(r.CPUPerToken["client"] > 0) || !(r.BatchCPUPerToken[want[len(want)-1]] > 0) {
			t.Errorf("%s: no CPU time read: %v, %v", target, r.CPUPerToken, r.BatchCPUPerToken)
		}
		// The decoding process splits the first tokens: prefill and the
		// checks take time everywhere, the KV crosses a data plane in the
		// cluster, and the hops outside the phases take time too.
		ph := r.FirstTokenS
		switch {
		case target == pathEngine && ph != nil:
			t.Errorf("the engine's first tokens split: %v", ph)
		case target != pathEngine && (len(ph) != len(pathPhases) || !(ph["prefill"] > 0) || !(ph["verify"] > 0) ||
			target == pathCluster && !(ph["transfer"] > 0) || !(ph["outside"] > 0)):
			t.Errorf("%s: first tokens split as %v, time to first token %gs", target, ph, r.TTFTS)
		}
	}
	if !strings.Contains(stdout, "OUTSIDE") {
		t.Errorf("no table of the first tokens' phases:\n%s", stdout)
	}
	if rep.PromptTokens != pathPromptTokens {
		t.Errorf("first-token prompts of %d tokens, want %d", rep.PromptTokens, pathPromptTokens)
	}
	for _, r := range rep.Ratios {
		if !(r.Median > 0) || !strings.Contains(stdout, r.What) {
			t.Errorf("ratio %q: %v, or not printed:\n%s", r.What, r.Median, stdout)
		}
	}
	if len(rep.Ratios) != 9 {
		t.Errorf("%d ratios, want 9", len(rep.Ratios))
	}
}
