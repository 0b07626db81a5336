package tenancy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvwarden/kvwarden/messages"
)

func TestParseFillsANamedTenantFromTheDefault(t *testing.T) {
	p, err := Parse("t.json", []byte(`{"default": {"weight": 1, "concurrent_max": 8},
		"tenants": {"acme": {"weight": 4, "pages_max": 512}, "globex": {"concurrent_max": 2}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for tenant, want := range map[string]Share{
		"acme":     {Weight: 4, ConcurrentMax: 8, PagesMax: 512},
		"globex":   {Weight: 1, ConcurrentMax: 2},
		"stranger": {Weight: 1, ConcurrentMax: 8},
	} {
		if got := p.Of(tenant); got != want {
			t.Errorf("%s: %+v, want %+v", tenant, got, want)
		}
	}
	if got := fmt.Sprint(p.Named()); got != "[acme globex]" {
		t.Errorf("named %s", got)
	}
	empty, err := Parse("e.json", []byte(`{}`))
	if err != nil || empty.Of("anyone") != DefaultShare() {
		t.Fatalf("an empty policy: %v, %+v; want DefaultShare for everyone", err, empty)
	}
}

func TestParseRefusesWithTheNumbers(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{"tenants": {"acme": {"weight": 1001}}}`, `tenant "acme": weight 1001, want 1 to 1000`},
		{`{"tenants": {"acme": {"concurrent_max": -1}}}`, `concurrent_max -1, want 1 to 65536`},
		{`{"tenants": {"acme": {"pages_max": 1073741825}}}`, `pages_max 1073741825, want 0 (no bound of its own) or 1 to 1073741824`},
		{`{"default": {"weight": 2}}`, `tenant "default": weight 2 and concurrent_max 0`},
		{`{"tenants": {"": {}}}`, `want a non-empty tenant`},
		{`{"tenants": {}, "keys": []}`, `unknown field "keys"`},
		{`{} {}`, `more after the JSON object`},
	} {
		_, err := Parse("p.json", []byte(c.json))
		var pe *PolicyError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "p.json") {
			t.Errorf("%s: %v, want a PolicyError saying %q", c.json, err, c.want)
		}
	}
	big := make([]byte, FileBytesMax+1)
	if _, err := Parse("big.json", big); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d bytes, at most %d", FileBytesMax+1, FileBytesMax)) {
		t.Errorf("an oversized policy: %v", err)
	}
}

func TestLoadReadsAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(path, []byte(`{"tenants": {"acme": {"weight": 3}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil || p.Of("acme").Weight != 3 {
		t.Fatalf("%v, %+v", err, p)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "none.json")); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "none.json") {
		t.Fatalf("a missing file: %v", err)
	}
}

func TestLedgerHoldsEachTenantToItsBounds(t *testing.T) {
	p, err := Parse("p.json", []byte(`{"default": {"weight": 1, "concurrent_max": 2}, "tenants": {"acme": {"concurrent_max": 10, "pages_max": 100}}}`))
	if err != nil {
		t.Fatal(err)
	}
	l := NewLedger()
	for range 2 {
		if err := l.Take(p, "stranger", 1000); err != nil {
			t.Fatal(err)
		}
	}
	err = l.Take(p, "stranger", 1)
	var le *LimitError
	if !errors.As(err, &le) || *le != (LimitError{Tenant: "stranger", Bound: BoundConcurrent, Have: 2, Want: 1, Limit: 2}) {
		t.Fatalf("a third request of an unnamed tenant: %v", err)
	}
	if w := le.Wire(); w.Code != messages.CodeBusy || w.Where != "tenant concurrent_max" || w.Have != 2 || w.Limit != 2 {
		t.Fatalf("on the wire: %+v", w)
	}
	if err := l.Take(p, "acme", 60); err != nil {
		t.Fatal(err)
	}
	err = l.Take(p, "acme", 41)
	if !errors.As(err, &le) || *le != (LimitError{Tenant: "acme", Bound: BoundPages, Have: 60, Want: 41, Limit: 100}) {
		t.Fatalf("pages past acme's pages_max: %v", err)
	}
	if !strings.Contains(err.Error(), `tenant "acme" has 60 KV pages in flight and asks 41 more, its pages_max is 100`) {
		t.Fatalf("message: %v", err)
	}
	if err := l.Take(p, "acme", 40); err != nil {
		t.Fatalf("pages up to acme's pages_max: %v", err)
	}
	if got := l.Refused(); got[BoundConcurrent] != 1 || got[BoundPages] != 1 {
		t.Fatalf("refused %v", got)
	}
	l.Give("stranger", 1000)
	if err := l.Take(p, "stranger", 5); err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	l.Give("stranger", 1000)
	l.Give("stranger", 5)
	l.Give("acme", 60)
	l.Give("acme", 40)
	if l.Tenants() != 0 {
		t.Fatalf("%d tenants left in flight after every request ended", l.Tenants())
	}
}

func TestLedgerPanicsOnAGiveWithoutATake(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a Give of pages never taken was accepted")
		}
	}()
	NewLedger().Give("acme", 1)
}

func weights(w map[string]int) func(string) int { return func(t string) int { return w[t] } }

func count(tenants []string, chosen []int) map[string]int {
	n := map[string]int{}
	for _, i := range chosen {
		n[tenants[i]]++
	}
	return n
}

func TestChooseStepsSharesABatchByWeightNotBySequences(t *testing.T) {
	var tenants []string
	for i := range 80 {
		// 64 of a flood, 16 of another tenant, interleaved as they came.
		if i%5 == 4 {
			tenants = append(tenants, "victim")
		} else {
			tenants = append(tenants, "flood")
		}
	}
	got := count(tenants, ChooseSteps(tenants, weights(map[string]int{"flood": 1, "victim": 1}), 32, nil))
	if got["victim"] != 16 || got["flood"] != 16 {
		t.Fatalf("equal weights, a batch of 32: %v, want 16 each", got)
	}
	got = count(tenants, ChooseSteps(tenants, weights(map[string]int{"flood": 3, "victim": 1}), 32, nil))
	if got["victim"] != 8 || got["flood"] != 24 {
		t.Fatalf("weights 3:1, a batch of 32: %v, want 24 and 8", got)
	}
	got = count(tenants, ChooseSteps(tenants, weights(map[string]int{"flood": 1, "victim": 4}), 32, nil))
	if got["victim"] != 16 || got["flood"] != 16 {
		t.Fatalf("the victim weighs more than it has sequences: %v, want its 16 and 16 of the flood", got)
	}
}

func TestChooseStepsProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := []string{"a", "b", "c", "d"}
		tenants := rapid.SliceOf(rapid.SampledFrom(names)).Draw(t, "tenants")
		w := map[string]int{}
		for _, n := range names {
			w[n] = rapid.IntRange(1, 5).Draw(t, "weight "+n)
		}
		n := rapid.IntRange(1, 40).Draw(t, "n")
		chosen := ChooseSteps(tenants, weights(w), n, nil)
		if len(chosen) != min(n, len(tenants)) {
			t.Fatalf("%d chosen of %d for a batch of %d", len(chosen), len(tenants), n)
		}
		seen := map[int]bool{}
		for _, i := range chosen {
			if i < 0 || i >= len(tenants) || seen[i] {
				t.Fatalf("index %d out of range or chosen twice: %v", i, chosen)
			}
			seen[i] = true
		}
		// Within a tenant, its first sequences are the ones chosen.
		has, got := map[string]int{}, count(tenants, chosen)
		for i, tn := range tenants {
			if has[tn] < got[tn] && !seen[i] {
				t.Fatalf("sequence %d of %s skipped for a later one", i, tn)
			}
			has[tn]++
		}
		// No tenant gets fewer steps than its weighted share of the batch,
		// unless it has fewer sequences (then it gets them all).
		total := 0
		for tn := range has {
			total += w[tn]
		}
		for tn, h := range has {
			fair := n * w[tn] / total
			if got[tn] < min(h, fair) {
				t.Fatalf("tenant %s of weight %d (of %d) got %d of a batch of %d with %d sequences, fair %d",
					tn, w[tn], total, got[tn], n, h, fair)
			}
		}
	})
}
