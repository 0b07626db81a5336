package tenancy

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

func TestParseFillsANamedTenantFromTheDefault(t *testing.T) {
	p, err := Parse("t.json", []byte(`{"default": {"weight": 1, "concurrent_max": 8},
		"tenants": {"acme": {"weight": 4, "pages_max": 512, "pool_percent_max": 100}, "globex": {"concurrent_max": 2}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for tenant, want := range map[string]Share{
		"acme":     {Weight: 4, ConcurrentMax: 8, PagesMax: 512, PoolPercentMax: 100},
		"globex":   {Weight: 1, ConcurrentMax: 2, PoolPercentMax: 75},
		"stranger": {Weight: 1, ConcurrentMax: 8, PoolPercentMax: 75},
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
		{`{"tenants": {"acme": {"pool_percent_max": 101}}}`, `pool_percent_max 101, want 1 to 100`},
		{`{"default": {"weight": 2}}`, `tenant "default": weight 2 and concurrent_max 0`},
		{`{"tenants": {"": {}}}`, `want a non-empty tenant`},
		{`{"tenants": {}, "keys": []}`, `unknown field "keys"`},
		{`{} {}`, `more after the JSON object`},
		{`{"default": {"weight": 1, "concurrent_max": 4, "cache_scope": "all"}}`, `cache_scope "all": a shared cache scope is declared tenant by tenant`},
		{`{"tenants": {"acme": {"cache_scope": "a b"}}}`, `cache_scope:`},
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

// TestCacheScopeComesFromThePolicyAndOnlyNarrows: a tenant's prefix cache
// scope is its own unless the policy puts it in a group; tenants of one
// group share it, a tenant left out does not, a tenant named like the
// group is not in it, and a salt narrows a scope to a new one without
// widening any.
func TestCacheScopeComesFromThePolicyAndOnlyNarrows(t *testing.T) {
	p, err := Parse("p.json", []byte(`{"tenants": {"acme": {"cache_scope": "g"}, "globex": {"cache_scope": "g"}, "initech": {}}}`))
	if err != nil {
		t.Fatal(err)
	}
	acme, globex, initech := p.CacheScope("acme", ""), p.CacheScope("globex", ""), p.CacheScope("initech", "")
	if acme != globex || acme != kv.SharedScope("g") {
		t.Errorf("acme's scope %s and globex's %s, want both the group's %s", acme, globex, kv.SharedScope("g"))
	}
	for _, other := range []kv.Scope{initech, p.CacheScope("g", ""), p.CacheScope("umbrella", ""), acme.Narrow("x")} {
		if other == acme {
			t.Errorf("scope %s is the group's", other)
		}
	}
	if p.CacheScope("initech", "") != kv.TenantScope("initech") || p.CacheScope("acme", "x") != p.CacheScope("globex", "x") ||
		p.CacheScope("acme", "x") == p.CacheScope("acme", "y") || initech.Narrow("") != initech {
		t.Errorf("salts: %s %s %s", p.CacheScope("acme", "x"), p.CacheScope("globex", "x"), p.CacheScope("acme", "y"))
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
	if room := l.Room(p, "stranger"); room == nil || room.Error() != err.Error() {
		t.Fatalf("Room at the bound: %v, want Take's refusal %v", room, err)
	}
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
	if err := l.Room(p, "acme"); err != nil {
		t.Fatalf("Room for a tenant below its concurrent_max, whatever its pages: %v", err)
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

// worker is sequences of tenants at a decode worker, stepped by Steps for
// steps batches of at most n; it returns each tenant's compute (the costs
// of its sequences stepped) and steps, and each sequence's steps. The
// sequences never end, so each tenant is backlogged throughout; as the
// worker does (actors' rotate), the sequences a step took go behind those
// it did not.
func worker(tenants []string, costs []float64, w map[string]int, n, steps int) (compute map[string]float64, stepped map[string]int, each []int) {
	s := NewSteps()
	compute, stepped, each = map[string]float64{}, map[string]int{}, make([]int, len(tenants))
	order := make([]int, len(tenants)) // sequence ids, as the worker holds them
	for i := range order {
		order[i] = i
	}
	for range steps {
		ts, cs := make([]string, len(order)), make([]float64, len(order))
		for i, id := range order {
			ts[i], cs[i] = tenants[id], costs[id]
		}
		took := map[int]bool{}
		for _, i := range s.Choose(ts, cs, weights(w), n, nil) {
			compute[ts[i]] += cs[i]
			stepped[ts[i]]++
			each[order[i]]++
			took[i] = true
		}
		var waited, ran []int
		for i, id := range order {
			if took[i] {
				ran = append(ran, id)
			} else {
				waited = append(waited, id)
			}
		}
		order = append(waited, ran...)
	}
	return compute, stepped, each
}

// flood is 8 long-context sequences of a flooding tenant (each step costs
// 4.5 units) and 4 short ones of another (1 unit).
func flood() (tenants []string, costs []float64) {
	for range 8 {
		tenants, costs = append(tenants, "flood"), append(costs, 4.5)
	}
	for range 4 {
		tenants, costs = append(tenants, "victim"), append(costs, 1)
	}
	return tenants, costs
}

func TestStepsShareComputeByWeightNotBySequences(t *testing.T) {
	tenants, costs := flood()
	for _, c := range []struct {
		victimWeight int
		want         float64 // the victim's part of the compute
	}{{1, 0.5}, {3, 0.75}} {
		compute, stepped, each := worker(tenants, costs, map[string]int{"flood": 1, "victim": c.victimWeight}, 32, 1000)
		part := compute["victim"] / (compute["victim"] + compute["flood"])
		if math.Abs(part-c.want) > 0.03 {
			t.Errorf("weights %d to 1: the victim's part of the compute %.3f, want %.2f (steps: %v)", c.victimWeight, part, c.want, stepped)
		}
		// The victim's four short sequences step at every step.
		if stepped["victim"] != 4*1000 {
			t.Errorf("weights %d to 1: the victim's sequences stepped %d times in 1000 steps, want 4000", c.victimWeight, stepped["victim"])
		}
		// The flood's sequences take turns: none waits while another of
		// its own is stepped again and again.
		least, most := slices.Min(each[:8]), slices.Max(each[:8])
		if most-least > 1 {
			t.Errorf("weights %d to 1: the flood's sequences stepped %d to %d times each, want within one of each other", c.victimWeight, least, most)
		}
	}
}

// Tenants that all ask little share a step with nothing held back: the
// batch takes every sequence, as it would take one tenant's.
func TestStepsFillTheBatchWithoutContention(t *testing.T) {
	var tenants []string
	var costs []float64
	for i := range 8 {
		tenants, costs = append(tenants, fmt.Sprint("tenant-", i%2)), append(costs, 1000+float64(i))
	}
	if got := NewSteps().Choose(tenants, costs, weights(map[string]int{"tenant-0": 1, "tenant-1": 1}), 32, nil); len(got) != 8 {
		t.Fatalf("two tenants of four short sequences each: %v stepped, want all 8", got)
	}
	// A tenant of one sequence beside another of many: the one is stepped
	// at every step, the many get about as much compute, and each of the
	// many gets its turn.
	tenants, costs = []string{"one"}, []float64{1}
	for range 32 {
		tenants, costs = append(tenants, "many"), append(costs, 1)
	}
	compute, stepped, each := worker(tenants, costs, map[string]int{"one": 1, "many": 1}, 64, 3200)
	if stepped["one"] != 3200 || math.Abs(compute["many"]/compute["one"]-1) > 0.05 {
		t.Fatalf("one sequence beside 32: stepped %v, compute %v; want the one at every step and as much compute each", stepped, compute)
	}
	if least, most := slices.Min(each[1:]), slices.Max(each[1:]); most-least > 1 {
		t.Fatalf("the 32 sequences stepped %d to %d times each, want within one of each other", least, most)
	}
}

func TestStepsAloneFillTheBatch(t *testing.T) {
	tenants, costs := flood()
	tenants, costs = tenants[:8], costs[:8]
	if got := NewSteps().Choose(tenants, costs, weights(nil), 32, nil); len(got) != 8 {
		t.Fatalf("a tenant alone: %v of its 8 sequences stepped, want all", got)
	}
	if got := NewSteps().Choose(tenants, costs, weights(nil), 5, nil); len(got) != 5 {
		t.Fatalf("a tenant alone, a batch of 5: %v stepped", got)
	}
}

func TestStepsGiveNoCreditForTimeAway(t *testing.T) {
	tenants, costs := flood()
	s := NewSteps()
	w := weights(map[string]int{"flood": 1, "victim": 1})
	for range 100 {
		s.Choose(tenants[:8], costs[:8], w, 32, nil) // the flood alone
	}
	// The victim comes: the flood keeps its part from the first step on,
	// the victim has no backlog of credit to shut it out with.
	floodSteps := 0
	for range 10 {
		for _, i := range s.Choose(tenants, costs, w, 32, nil) {
			if tenants[i] == "flood" {
				floodSteps++
			}
		}
	}
	if floodSteps < 7 {
		t.Fatalf("the flood stepped %d times in the victim's first 10 steps, want about 9", floodSteps)
	}
}

func TestStepsProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := []string{"a", "b", "c", "d"}
		s := NewSteps()
		w := map[string]int{}
		for _, n := range names {
			w[n] = rapid.IntRange(1, 5).Draw(t, "weight "+n)
		}
		for range rapid.IntRange(1, 20).Draw(t, "steps") {
			tenants := rapid.SliceOfN(rapid.SampledFrom(names), 1, 40).Draw(t, "tenants")
			costs := make([]float64, len(tenants))
			for i := range costs {
				costs[i] = float64(rapid.IntRange(1, 2000).Draw(t, "cost"))
			}
			n := rapid.IntRange(1, 40).Draw(t, "n")
			chosen := s.Choose(tenants, costs, weights(w), n, nil)
			if len(chosen) < 1 || len(chosen) > n {
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
			has, got := map[string]int{}, map[string]int{}
			for _, i := range chosen {
				got[tenants[i]]++
			}
			for i, tn := range tenants {
				if has[tn] < got[tn] && !seen[i] {
					t.Fatalf("sequence %d of %s skipped for a later one", i, tn)
				}
				has[tn]++
			}
			if len(has) == 1 && len(chosen) != min(n, len(tenants)) {
				t.Fatalf("one tenant alone: %d of %d stepped in a batch of %d", len(chosen), len(tenants), n)
			}
			if len(s.pass) != len(has) {
				t.Fatalf("%d passes kept for %d tenants with sequences", len(s.pass), len(has))
			}
		}
	})
}

// TestPoolSharesLeaveRoomAndShareWhileOthersWait: a tenant alone holds at
// most its pool_percent_max of a pool; while another waits for pages, a
// tenant at its weight's part is refused the pages freed, which go to the
// waiter; once no one waits, it may take up to its bound again.
func TestPoolSharesLeaveRoomAndShareWhileOthersWait(t *testing.T) {
	p := DefaultPolicy() // weight 1, 75% of a pool
	now := time.Unix(1000, 0)
	s := NewPoolShares(1024, 20*time.Millisecond)
	free := 1024
	var ids uint64
	owners := map[string][]kv.Owner{} // each tenant's requests, one a take
	take := func(tenant string, n int) (int, int, bool) {
		ids++
		o := kv.Owner{Request: ids, Tenant: tenant}
		avail, bound, ok := s.Reserve(p, o, n, free, now)
		if ok {
			free -= n
			owners[tenant] = append(owners[tenant], o)
		}
		return avail, bound, ok
	}
	freeOne := func(tenant string) {
		o := owners[tenant][0]
		owners[tenant] = owners[tenant][1:]
		s.Freed(o, 128)
		free += 128
	}
	for range 6 { // six of a flood's max-context requests
		if _, _, ok := take("flood", 128); !ok {
			t.Fatal("a tenant alone refused below its bound")
		}
	}
	if avail, bound, ok := take("flood", 128); ok || avail != 0 || bound != 768 {
		t.Fatalf("the flood past 75%% of the pool: avail %d, bound %d, granted %v; want 0, 768, refused", avail, bound, ok)
	}
	if _, _, ok := take("victim", 3); !ok {
		t.Fatal("another tenant refused the room the flood's bound left")
	}
	// The victim wants more than is free: it waits, and the flood, over
	// its half while the victim waits, is refused what frees.
	if _, _, ok := take("victim", 300); ok {
		t.Fatalf("granted 300 pages of %d free", free)
	}
	freeOne("flood")
	if avail, bound, ok := take("flood", 128); ok || avail != 0 || bound != 512 {
		t.Fatalf("the flood while the victim waits: avail %d, bound %d, granted %v; want 0, its half 512, refused", avail, bound, ok)
	}
	if _, _, ok := take("victim", 300); !ok {
		t.Fatalf("the victim refused %d pages free while under its share", free)
	}
	// No one waits any more (past four retries): the flood takes up to its
	// bound again.
	freeOne("flood")
	now = now.Add(100 * time.Millisecond)
	if avail, _, ok := take("flood", 128); !ok {
		t.Fatalf("the flood refused %d free (avail %d) with no one waiting and below its bound", free, avail)
	}
	if got := s.Held("flood"); got != 640 {
		t.Fatalf("the flood holds %d pages, want 640", got)
	}
}

// A request larger than its tenant's bound is held to the free pages
// alone when its tenant holds nothing else, in both of its reservations
// (the prompt's pages, then the generated tokens'): it does not wait
// forever.
func TestPoolSharesNeverStarveALargeRequest(t *testing.T) {
	p := DefaultPolicy()
	s := NewPoolShares(100, time.Second)
	o := kv.Owner{Request: 1, Tenant: "acme"}
	if _, _, ok := s.Reserve(p, o, 60, 100, time.Unix(0, 0)); !ok {
		t.Fatal("a prompt of 60% of an empty pool refused to a tenant holding nothing")
	}
	if _, _, ok := s.Reserve(p, o, 30, 40, time.Unix(0, 0)); !ok {
		t.Fatal("the same request's 30 more pages refused: its tenant holds nothing else")
	}
	if avail, _, ok := s.Reserve(p, kv.Owner{Request: 2, Tenant: "acme"}, 5, 10, time.Unix(0, 0)); ok || avail != 0 {
		t.Fatalf("another request of the tenant past its bound: avail %d, granted %v", avail, ok)
	}
}
