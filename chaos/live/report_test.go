package live

import (
	"bytes"
	"encoding/json"
	"image/png"
	"strings"
	"testing"
	"time"
)

// craftedReport is the report of four requests under two faults, one of
// them a wrong answer and one a client's own error.
func craftedReport(t *testing.T) *Report {
	t.Helper()
	w, c := checkerFixture(t)
	tl := newTally(time.Now())
	r := Request{Tenant: TenantName(0), Prompt: 0, Text: w.Prompt(0, 0), MaxTokens: 8}
	want := c.Reference(0, 0, 8)
	for i, o := range []Outcome{
		{Answer: want, Streamed: want, Start: 0, End: 50 * time.Millisecond},
		{Answer: c.Reference(1, 1, 8), Start: 100 * time.Millisecond, End: 900 * time.Millisecond},
		{Err: ErrNothingToSchedule, Start: 1200 * time.Millisecond, End: 1300 * time.Millisecond},
		{Answer: want, Streamed: want, Start: 2 * time.Second, End: 2100 * time.Millisecond},
	} {
		o.Request = r
		o.Request.Index = i
		tl.add(o, c.Check(o))
	}
	applied := []Applied{
		{Fault: Fault{Seq: 0, Kind: Kill, Target: "decode-0"}, Start: 200 * time.Millisecond, End: time.Second},
		{Fault: Fault{Seq: 1, Kind: Latency, Target: "router-0", Latency: 50 * time.Millisecond}, Start: time.Second,
			End: 1500 * time.Millisecond},
	}
	camp := &Campaign{Config: Config{Seed: 77, Model: defaultModel(t)}}
	return buildReport(camp, tl, applied, nil, afterFaults{}, time.Now().Add(-3*time.Second), 2*time.Second, []Kind{Kill, Latency, Pause})
}

func TestReportOutputs(t *testing.T) {
	r := craftedReport(t)
	if r.Passed() || r.Wrong != 1 || r.FaultsByKind["kill"] != 1 || len(r.Unreached) != 1 || r.Unreached[0] != "pause" {
		t.Fatalf("report: wrong %d, faults %v, unreached %v, violations %v", r.Wrong, r.FaultsByKind, r.Unreached, r.Violations)
	}
	// The wrong answer overlapped the kill, the client error the latency.
	shares := map[string]KindShare{}
	for _, s := range r.ByFault {
		shares[s.Kind] = s
	}
	// The client's own error explains nothing: it is no clean error.
	if k, l, n := shares["kill"], shares["latency"], shares["none"]; k.Wrong != 1 || k.CleanShare != 0 || l.CleanErrors != 1 ||
		l.Unexplained != 1 || l.CleanShare != 0 || n.Correct != 2 {
		t.Fatalf("shares by kind: %+v", shares)
	}

	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Seed    uint64 `json:"seed"`
		Wrong   int    `json:"wrong_answers"`
		Records []struct {
			Outcome string `json:"outcome"`
			Start   string `json:"start"`
		} `json:"records"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Seed != 77 || back.Wrong != 1 || len(back.Records) != 4 || back.Records[1].Outcome != "wrong" ||
		back.Records[1].Start != "100ms" {
		t.Fatalf("JSON read back: %+v", back)
	}

	var sum bytes.Buffer
	if err := r.WriteSummary(&sum); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"seed 77: 4 requests, 2 faults", "FAIL", "FAULT KIND", "kill", "VIOLATION: 1 wrong answers",
		"drains of decode nodes: 0 (each exited 0 and was restarted); running requests moved: 0 by the drained nodes' last status",
		"VIOLATION: 1 requests failed with a code no fault explains: client_error 1"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.String())
		}
	}

	var img bytes.Buffer
	if err := r.WritePlot(&img); err != nil {
		t.Fatal(err)
	}
	p, err := png.Decode(&img)
	if err != nil {
		t.Fatal(err)
	}
	if b := p.Bounds(); b.Dx() != 1200 || b.Dy() != 800 {
		t.Fatalf("plot of %v, want 1200 × 800", b)
	}
}

// A fault that failed to inject is no fault injected: it is listed, is a
// violation, and its kind, never injected, is unreached.
func TestFailedInjectionIsAViolation(t *testing.T) {
	applied := []Applied{{Fault: Fault{Seq: 0, Kind: Bandwidth, Target: "decode-0"}, Start: 0, End: time.Second,
		Err: "toxic not added: connection refused"}}
	camp := &Campaign{Config: Config{Seed: 1, Model: defaultModel(t)}}
	r := buildReport(camp, newTally(time.Now()), applied, nil, afterFaults{}, time.Now(), time.Second, []Kind{Bandwidth})
	if r.FaultsByKind["bandwidth"] != 0 || len(r.FaultsFailed) != 1 || len(r.Unreached) != 1 || len(r.ByFault) != 1 {
		t.Fatalf("faults %v, failed %v, unreached %v, shares %+v", r.FaultsByKind, r.FaultsFailed, r.Unreached, r.ByFault)
	}
	if r.Passed() || !strings.Contains(strings.Join(r.Violations, "\n"), "toxic not added") {
		t.Fatalf("violations %v, want the failed fault", r.Violations)
	}
}
