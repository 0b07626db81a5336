package main

import (
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/chaos/live"
)

func TestChaosUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no requests and no duration", []string{"--requests", "0"}, "give a number of requests, a duration or both"},
		{"negative requests", []string{"--requests", "-1"}, "requests (-1)"},
		{"unknown kind", []string{"--faults", "kill,flood"}, `fault kind "flood"`},
		{"no tenant", []string{"--tenants", "0"}, "tenants (0)"},
		{"share", []string{"--oversize", "1.5"}, "oversize prompts (1.5)"},
		{"prompts beyond the window", []string{"--context-tokens", "64"}, "exceed the 64-token context window"},
		{"one node of a role", []string{"--decode", "0"}, "--decode (0)"},
		{"windows", []string{"--fault-min", "2s", "--fault-max", "1s"}, "fault windows from 2s to 1s"},
		{"frame rates", []string{"--frame-faults", "frame-drop=2"}, "frame-drop=2"},
		{"credentials without an endpoint", []string{"--certs", "/nonexistent"}, "--certs and --insecure are for --endpoint"},
		{"endpoint", []string{"--endpoint", "nowhere"}, `--endpoint "nowhere"`},
		{"stray argument", []string{"extra"}, `"extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runNode(append([]string{"chaos"}, tc.args...)...)
			if code != exitUsage || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d with %q; output:\n%s", code, exitUsage, tc.want, out)
			}
		})
	}
}

// chaosReport is what the test reads of a campaign's JSON report.
type chaosReport struct {
	Seed     uint64 `json:"seed"`
	Requests struct {
		Total   int            `json:"total"`
		ByClass map[string]int `json:"by_outcome"`
	} `json:"requests"`
	Wrong        int            `json:"wrong_answers"`
	CrossTenant  int            `json:"cross_tenant_bytes"`
	PagesLeaked  int            `json:"pages_leaked"`
	PagesTotal   int            `json:"pages_total"`
	FaultsByKind map[string]int `json:"faults_by_kind"`
	Drains       struct {
		Drains       int    `json:"drains"`
		Moved        uint64 `json:"moved"`
		StreamsMoved uint64 `json:"streams_moved"`
	} `json:"drains"`
	Violations []string `json:"violations"`
	Replay     string   `json:"replay"`
	Records    []struct {
		Outcome string `json:"outcome"`
	} `json:"records"`
}

// TestBinaryChaosCampaign runs a short campaign through the binary: a
// cluster of real processes (a router, two prefill and two decode nodes)
// behind toxiproxy, 40 requests of four tenants, a kill, a pause, latency
// and a drain of a decode node on a seeded schedule. It must find no
// violation: every answer the reference, no page leaked, every drained
// node gone with exit 0, every tenant's probe answered.
func TestBinaryChaosCampaign(t *testing.T) {
	bin := nodeBinary(t)
	dir := t.TempDir()
	report, plot := filepath.Join(dir, "report.json"), filepath.Join(dir, "plot.png")
	code, stdout, stderr := runBinary(t, "", "chaos", "--seed", "5", "--requests", "40", "--rate", "4",
		"--concurrency", "4", "--faults", "kill,pause,latency,drain", "--fault-every", "1500ms", "--fault-max", "2s",
		"--request-timeout", "10s", "--report", report, "--plot", plot, "--log-dir", filepath.Join(dir, "logs"))
	if code != exitOK {
		t.Fatalf("node chaos (%s): exit %d; stdout:\n%s\nstderr:\n%s", bin, code, stdout, stderr)
	}
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var r chaosReport
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if r.Seed != 5 || r.Requests.Total != 40 || len(r.Records) != 40 || r.Wrong != 0 || r.CrossTenant != 0 ||
		r.PagesLeaked != 0 || r.PagesTotal == 0 || len(r.Violations) != 0 {
		t.Fatalf("report: %+v", r)
	}
	if r.FaultsByKind["kill"] < 1 || r.FaultsByKind["pause"] < 1 || r.FaultsByKind["drain"] < 1 ||
		r.Drains.Drains != r.FaultsByKind["drain"] {
		t.Fatalf("faults injected %v, drains %+v; want a kill, a pause and a drain at least", r.FaultsByKind, r.Drains)
	}
	if r.Requests.ByClass["correct"] == 0 || !strings.HasPrefix(r.Replay, "node chaos --seed 5 ") {
		t.Fatalf("outcomes %v, replay %q", r.Requests.ByClass, r.Replay)
	}
	for _, want := range []string{"chaos campaign, seed 5: 40 requests", "PASS", "violations: none", "FAULT KIND",
		fmt.Sprintf("drains of decode nodes: %d (each exited 0 and was restarted); running requests moved: %d by", r.Drains.Drains,
			r.Drains.Moved)} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
	f, err := os.Open(plot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("the plot is no PNG: %v", err)
	}
}

// TestChaosDrainNeedsTwoDecodeNodes: a cluster of one decode node has no
// drains (a drained node's requests move to another), and says so with
// the count; one of two has them.
func TestChaosDrainNeedsTwoDecodeNodes(t *testing.T) {
	if why := localMissing(live.Drain, true, true, 1); !strings.Contains(why, "the cluster has 1 decode node (--decode 2 or more)") {
		t.Errorf("one decode node: %q", why)
	}
	if why := localMissing(live.Drain, false, false, 2); why != "" {
		t.Errorf("two decode nodes: %q, want drains", why)
	}
}
