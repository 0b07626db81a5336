package sim

import (
	"flag"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	flagSeed     = flag.Uint64("seed", 1, "the seed TestSimSeed replays")
	flagSeeds    = flag.Int("seeds", 2000, "seeds TestSim runs")
	flagFirst    = flag.Uint64("first", 1, "the first seed TestSim runs")
	flagDuration = flag.Duration("duration", 0, "run TestSim's seeds for this long instead of -seeds")
)

// reachSeedsMin is the fewest seeds of which TestSim asks that every fault
// kind enabled reached its paths.
const reachSeedsMin = 100

// TestSim runs the CI campaign: every fault enabled, thousands of seeds, no
// invariant broken, and every fault kind reaching its paths.
func TestSim(t *testing.T) {
	opt := DefaultOptions()
	c := Campaign{First: *flagFirst, Seeds: *flagSeeds, Duration: *flagDuration}
	switch {
	case c.Duration > 0:
		c.Seeds = 0
	case c.Seeds < 1:
		t.Fatalf("-seeds %d: want at least 1 (or -duration)", c.Seeds)
	}
	s := Sweep(opt, c)
	for _, f := range s.Failures {
		t.Errorf("%v", f.Violation)
	}
	report(t, s)
	if s.Seeds == 0 {
		t.Fatal("no seed ran")
	}
	if s.Seeds < reachSeedsMin {
		t.Logf("%d seeds: too few to ask every fault path of them; not checked (from %d seeds on it is)", s.Seeds, reachSeedsMin)
		return
	}
	for _, u := range s.Counters.Unreached(opt.Faults) {
		t.Errorf("fault kind enabled but never reached in %d seeds: %s", s.Seeds, u)
	}
	for _, u := range s.Counters.UnreachedCache(opt) {
		t.Errorf("path of the prefix cache never reached in %d seeds: %s", s.Seeds, u)
	}
}

// report logs the campaign's figures and, with -v, its counters.
func report(t *testing.T, s Summary) {
	t.Helper()
	secs := s.Wall.Seconds()
	t.Logf("%d seeds, %d requests, %d steps in %s: %.0f seeds/s, %.0f steps/s", s.Seeds, s.Requests, s.Steps,
		s.Wall.Round(time.Millisecond), float64(s.Seeds)/secs, float64(s.Steps)/secs)
	var outcomes []string
	for k, v := range s.Outcomes {
		outcomes = append(outcomes, k+"="+strconv.Itoa(v))
	}
	sort.Strings(outcomes)
	t.Logf("outcomes: %s", strings.Join(outcomes, " "))
	if testing.Verbose() {
		var b strings.Builder
		s.Counters.WriteTable(&b)
		t.Logf("counters:\n%s", b.String())
	}
}

// TestSimSeed replays one seed (-seed N), with its trace on stdout under
// -v: every step, every event and every effect.
func TestSimSeed(t *testing.T) {
	opt := DefaultOptions()
	if testing.Verbose() {
		opt.Trace = os.Stdout
	}
	r := Run(*flagSeed, opt)
	if r.Violation != nil {
		t.Fatalf("%v", r.Violation)
	}
	t.Logf("seed=%d: %d steps, %d requests %v, %s simulated, trace hash %x", r.Seed, r.Steps, r.Requests, r.Outcomes, r.Elapsed, r.TraceHash)
}
