package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinaryBenchSideChannel: the side-channel harness against a node of
// role all, its own process. Victim and attacker in scopes of their own:
// the attacker is told on no request that it read anything from the cache,
// its guesses of the victim's prefix included, while the victim reads its
// own. In one scope the tenants file declares: every guess reads the
// victim's prefix and no random prefix does, which shows the harness
// finds what is there. Every answer is the reference engine's. The AUCs
// are not asserted: timing on a shared machine is noise (docs/prefix-cache.md
// gives measured ones).
func TestBinaryBenchSideChannel(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(shared, []byte(`{"tenants": {"tenant-0": {"cache_scope": "team"}, "tenant-1": {"cache_scope": "team"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	const trials = 4
	for _, tc := range []struct {
		name string
		node []string
	}{{"scopes of their own", nil}, {"one shared scope", []string{"--tenants", shared}}} {
		t.Run(tc.name, func(t *testing.T) {
			n := startMember(t, roleAll, "", tc.node...)
			report := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".json")
			code, stdout, stderr := runBinary(t, "", "bench", "--endpoint", n.addr, "--side-channel", "4", "--shared-prefix-len", "64",
				"--prompt-len", "16", "--output-len", "2", "--json", report)
			if code != exitOK {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			if !strings.Contains(stdout, "side channel: 4 trials") {
				t.Errorf("no figures printed:\n%s", stdout)
			}
			rep := readReport(t, report)
			sc := rep.SideChannel
			if sc == nil || sc.Separation.Hits != trials || sc.Separation.Misses != trials {
				t.Fatalf("report %+v: want %d guesses and %d random prefixes timed", sc, trials, trials)
			}
			runs := map[string]benchRun{}
			for _, r := range rep.Runs {
				runs[r.Layout] = r
				if r.Summary.Wrong != 0 || r.Summary.OK != r.Summary.Requests {
					t.Errorf("%s: %+v; want every answer the reference's", r.Layout, r.Summary)
				}
			}
			if v := runs["victim"].Summary; v.Requests < 2*trials || v.CachedTokens == 0 {
				t.Errorf("victim: %d requests, %d tokens read from the cache; want at least two a trial, the later ones reading its prefix",
					v.Requests, v.CachedTokens)
			}
			if a := runs["attacker"].Summary; a.Requests != 2*trials {
				t.Errorf("attacker: %d requests, want %d", a.Requests, 2*trials)
			}
			if sc.MissesCached != 0 || sc.MissCachedTokens != 0 {
				t.Errorf("%d random prefixes read %d tokens from the cache; want none", sc.MissesCached, sc.MissCachedTokens)
			}
			wantGuesses := 0
			if tc.node != nil {
				wantGuesses = trials
			}
			if sc.GuessesCached != wantGuesses || (wantGuesses == 0) != (sc.GuessCachedTokens == 0) {
				t.Errorf("%d of %d guesses of the victim's prefix read %d tokens from the cache; want %d of them", sc.GuessesCached, trials,
					sc.GuessCachedTokens, wantGuesses)
			}
		})
	}
}
