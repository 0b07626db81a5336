package sim

import (
	"flag"
	"testing"

	"github.com/kvwarden/kvwarden/internal/mutant"
)

var flagMutantSeeds = flag.Int("mutant-seeds", 5000, "seeds TestSimCatchesMutant runs before it gives up")

// TestSimCatchesMutant runs seeds of the CI campaign on a mutant build
// (go test -tags mutant_<name>) until an invariant breaks, and fails if
// none does within -mutant-seeds. Its last line, "MUTANT name caught
// seeds=N seed=S invariant=I", is what chaos/mutants.sh tabulates.
func TestSimCatchesMutant(t *testing.T) {
	if mutant.Active == "" {
		t.Skip("not a mutant build: chaos/mutants.sh runs this test under each tag mutant_<name>")
	}
	s := Sweep(DefaultOptions(), Campaign{First: 1, Seeds: *flagMutantSeeds, StopAtFirst: true})
	if len(s.Failures) == 0 {
		t.Logf("MUTANT %s missed seeds=%d", mutant.Active, s.Seeds)
		t.Fatalf("mutant %s: no invariant broke in %d seeds", mutant.Active, s.Seeds)
	}
	v := s.Failures[0].Violation
	t.Logf("%v", v)
	t.Logf("MUTANT %s caught seeds=%d seed=%d invariant=%q", mutant.Active, s.Seeds, v.Seed, v.Invariant)
}
