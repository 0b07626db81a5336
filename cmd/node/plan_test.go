package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/bench"
)

// TestPlanCommand: plan reads a profile, predicts every split of the
// nodes and recommends the best; a missing or broken profile is a usage
// error.
func TestPlanCommand(t *testing.T) {
	dir := t.TempDir()
	profile := filepath.Join(dir, "profile.json")
	p := bench.Profile{PrefillTokensPerS: 2000, Decode: []bench.DecodeRate{{Batch: 1, TokensPerS: 5000}, {Batch: 32, TokensPerS: 50000}},
		KVBytesPerToken: 2048, TransferBytesPerS: 1e9, OverheadS: 0.002, BatchMax: 32}
	data, _ := json.Marshal(p)
	if err := os.WriteFile(profile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	preds := filepath.Join(dir, "plan.json")
	// Long prompts, short answers: prefill decides, and three nodes of
	// role all prefill at three times one prefill node's rate.
	code, out := runNode("plan", "--profile", profile, "--nodes", "3", "--rate", "8", "--prompt-len", "400", "--output-len", "4",
		"--duration", "20s", "--slo-ttft", "500ms", "--json", preds)
	if code != exitOK {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{"3 all", "1P:2D", "2P:1D", "recommended: 3 all"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	var got []bench.Prediction
	data, err := os.ReadFile(preds)
	if err != nil || json.Unmarshal(data, &got) != nil || len(got) != 3 {
		t.Fatalf("--json: %v, %d predictions:\n%s", err, len(got), data)
	}
	if got[0].Summary.GoodputPerS < 7 || got[2].Layout != (bench.Layout{Prefill: 1, Decode: 2}) {
		t.Errorf("best %s at %g/s, worst %s; want 3 all near 8/s, 1P:2D last", got[0].Layout, got[0].Summary.GoodputPerS, got[2].Layout)
	}
	os.WriteFile(profile, []byte(`{"prefill_tokens_per_s": 0}`), 0o644)
	for _, args := range [][]string{{"plan"}, {"plan", "--profile", profile}, {"plan", "--profile", profile + ".none"}} {
		if code, out := runNode(args...); code != exitUsage {
			t.Errorf("%s: exit %d, want %d:\n%s", strings.Join(args, " "), code, exitUsage, out)
		}
	}
}
