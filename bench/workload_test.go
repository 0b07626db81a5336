package bench

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseDist(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want Dist
		err  string
	}{
		{"32", Fixed(32), ""},
		{"fixed:7", Fixed(7), ""},
		{"uniform:16:64", Dist{16, 64}, ""},
		{"uniform:64:16", Dist{}, "greatest length of uniform:64:16: 16 is outside [64, 1.048576e+06]"},
		{"0", Dist{}, "least length of 0: 0 is outside [1, 1.048576e+06]"},
		{"normal:5:2", Dist{}, "want N, fixed:N or uniform:MIN:MAX"},
		{"uniform:a:2", Dist{}, `"a" is not a whole number`},
	} {
		got, err := ParseDist(tc.spec)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseDist(%q) = %v, %v; want an error with %q", tc.spec, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want || got.String() != strings.TrimPrefix(tc.spec, "fixed:") {
			t.Errorf("ParseDist(%q) = %v (%s), %v; want %v", tc.spec, got, got, err, tc.want)
		}
	}
}

func TestParsePrompts(t *testing.T) {
	ps, err := ParsePrompts([]byte("{\"prompt\": \"once upon\", \"max_tokens\": 12}\n\n{\"prompt\": \"\"}\n"))
	if err != nil || len(ps) != 2 || ps[0] != (Prompt{"once upon", 12}) || ps[1] != (Prompt{}) {
		t.Fatalf("ParsePrompts = %+v, %v", ps, err)
	}
	for _, bad := range []string{"", "{\"prompt\": 3}", "{\"text\": \"x\"}", "{\"prompt\": \"x\", \"max_tokens\": -1}"} {
		if _, err := ParsePrompts([]byte(bad)); err == nil {
			t.Errorf("ParsePrompts(%q) took it", bad)
		}
	}
}

// TestWorkload: the same workload gives the same shapes and order; each
// generated prompt has the length drawn, within the distribution; a
// prompts file's max_tokens wins over the output distribution.
func TestWorkload(t *testing.T) {
	w := Workload{PromptBytes: Dist{10, 40}, OutputTokens: Dist{3, 9}, Tenants: 3, Distinct: 50, Seed: 7}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	a, b := w.Shapes(), w.Shapes()
	if len(a) != 50 {
		t.Fatalf("%d shapes, want 50", len(a))
	}
	lens := map[int]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("shape %d differs between two calls: %+v, %+v", i, a[i], b[i])
		}
		n := len(a[i].Prompt)
		if n < 10 || n > 40 || a[i].MaxTokens < 3 || a[i].MaxTokens > 9 || strings.TrimSpace(a[i].Prompt) == "" {
			t.Errorf("shape %d: %d bytes, %d tokens, outside the distributions", i, n, a[i].MaxTokens)
		}
		lens[n] = true
	}
	if len(lens) < 10 {
		t.Errorf("only %d distinct prompt lengths in 50 draws of 31", len(lens))
	}
	reqs := w.Draw(a, 9)
	for i, r := range reqs {
		if r.Tenant != i%3 || r.Shape < 0 || r.Shape >= 50 {
			t.Errorf("request %d: %+v", i, r)
		}
	}
	w.Prompts = []Prompt{{"x", 0}, {"y", 5}}
	shapes := w.Shapes()
	if len(shapes) != 2 {
		t.Fatalf("%d shapes from 2 prompts", len(shapes))
	}
	for _, s := range shapes {
		if s.Prompt == "y" && s.MaxTokens != 5 || s.Prompt == "x" && (s.MaxTokens < 3 || s.MaxTokens > 9) {
			t.Errorf("shape %+v", s)
		}
	}
	var re *RangeError
	if err := (Workload{PromptBytes: Fixed(1), OutputTokens: Fixed(1), Tenants: 0, Distinct: 1}).Validate(); !errors.As(err, &re) || re.What != "tenants" {
		t.Errorf("no tenants: %v", err)
	}
}

// TestPoisson: a seeded Poisson process's mean rate is within a few
// standard errors of the rate asked (1/√n ≈ 0.7 % for 20 000 gaps); the
// warm-up holds the sends before it; the same seed gives the same times.
func TestPoisson(t *testing.T) {
	const rate, n = 50.0, 20000
	at, warm := Poisson(3, rate, 2*time.Second, Bound{Requests: n})
	if len(at)-warm != n {
		t.Fatalf("%d sent after the warm-up, want %d", len(at)-warm, n)
	}
	if warm < 70 || warm > 130 || at[warm-1] >= 2*time.Second || at[warm] < 2*time.Second {
		t.Errorf("%d sends in a 2 s warm-up at %g/s, last %s, first after %s", warm, rate, at[warm-1], at[warm])
	}
	got := float64(len(at)) / at[len(at)-1].Seconds()
	if math.Abs(got-rate)/rate > 0.03 {
		t.Errorf("mean rate %g/s, want %g/s within 3 %%", got, rate)
	}
	again, _ := Poisson(3, rate, 2*time.Second, Bound{Requests: n})
	for i := range at {
		if at[i] != again[i] {
			t.Fatalf("send %d: %s, then %s from the same seed", i, at[i], again[i])
		}
	}
	within, _ := Poisson(3, rate, 0, Bound{Duration: 10 * time.Second})
	if last := within[len(within)-1]; last >= 10*time.Second || len(within) < 400 || len(within) > 600 {
		t.Errorf("10 s at %g/s: %d sends, last at %s", rate, len(within), last)
	}
	if err := CheckRate(0); err == nil {
		t.Error("a rate of 0 was taken")
	}
	if err := (Bound{}).Validate(); err == nil {
		t.Error("a run without a bound was taken")
	}
}

// TestCheckSchedule: a run that would send more than RequestsMax is
// refused with the count, whichever bound ends it, and one within is not.
func TestCheckSchedule(t *testing.T) {
	for _, tc := range []struct {
		rate   float64
		warmup time.Duration
		b      Bound
		ok     bool
	}{
		{1e6, 2 * time.Second, Bound{Duration: 20 * time.Second}, false},
		{1e6, 5 * time.Second, Bound{Requests: 100}, false},
		{1e6, 0, Bound{Duration: time.Hour, Requests: 100}, true},
		{1e5, time.Second, Bound{Duration: 10 * time.Second}, true},
		{0, 0, Bound{Requests: 1}, false},
	} {
		err := CheckSchedule(tc.rate, tc.warmup, tc.b)
		if (err == nil) != tc.ok {
			t.Errorf("%g/s, warm-up %s, %+v: %v, want ok %v", tc.rate, tc.warmup, tc.b, err, tc.ok)
		}
	}
}

// TestWorkloadSharedPrefixes: every prompt starts with one of its
// tenant's prefixes of the length asked, every prefix is used, no two
// tenants share one unless PrefixAcrossTenants, and each request is sent
// as its shape's tenant.
func TestWorkloadSharedPrefixes(t *testing.T) {
	for _, across := range []bool{false, true} {
		w := Workload{PromptBytes: Fixed(20), OutputTokens: Fixed(4), Tenants: 3, Distinct: 30, Seed: 5, PrefixBytes: 64, Prefixes: 2,
			PrefixAcrossTenants: across}
		if err := w.Validate(); err != nil {
			t.Fatal(err)
		}
		shapes := w.Shapes()
		owners := map[string]map[int]bool{} // prefix → tenants that send it
		for i, s := range shapes {
			if len(s.Prompt) != 84 || s.Tenant != i%3 || s.Turn != 0 {
				t.Fatalf("across %v, shape %d: %d bytes, tenant %d, turn %d; want 84 bytes, tenant %d, turn 0", across, i, len(s.Prompt), s.Tenant,
					s.Turn, i%3)
			}
			p := s.Prompt[:64]
			if owners[p] == nil {
				owners[p] = map[int]bool{}
			}
			owners[p][s.Tenant] = true
		}
		wantPrefixes, wantOwners := 6, 1
		if across {
			wantPrefixes, wantOwners = 2, 3
		}
		if len(owners) != wantPrefixes {
			t.Errorf("across %v: %d distinct prefixes, want %d", across, len(owners), wantPrefixes)
		}
		for p, ts := range owners {
			if len(ts) != wantOwners {
				t.Errorf("across %v: prefix %q sent by tenants %v, want %d of them", across, p, ts, wantOwners)
			}
		}
		for i, r := range w.Draw(shapes, 50) {
			if r.Tenant != shapes[r.Shape].Tenant {
				t.Errorf("request %d: shape %d of tenant %d sent as tenant %d", i, r.Shape, shapes[r.Shape].Tenant, r.Tenant)
			}
		}
	}
}

// TestWorkloadChats: a chat is Turns consecutive shapes of one tenant,
// turns numbered from 0, each later turn a new line of the length asked;
// a request starts a conversation at its first turn.
func TestWorkloadChats(t *testing.T) {
	w := Workload{PromptBytes: Fixed(12), OutputTokens: Fixed(4), Tenants: 2, Distinct: 5, Seed: 9, Turns: 3, PrefixBytes: 32, Prefixes: 1}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	shapes := w.Shapes()
	if len(shapes) != 15 {
		t.Fatalf("%d shapes, want 5 chats of 3 turns", len(shapes))
	}
	for i, s := range shapes {
		chat, turn := i/3, i%3
		wantLen := 44
		if turn > 0 {
			wantLen = 13
		}
		if s.Turn != turn || s.Tenant != chat%2 || len(s.Prompt) != wantLen || (turn > 0) != strings.HasPrefix(s.Prompt, "\n") {
			t.Errorf("shape %d: %+v; want turn %d of tenant %d, %d bytes", i, s, turn, chat%2, wantLen)
		}
	}
	for i, r := range w.Draw(shapes, 40) {
		if r.Shape%3 != 0 || r.Tenant != shapes[r.Shape].Tenant {
			t.Errorf("request %d: %+v does not start a conversation as its tenant", i, r)
		}
	}
	for _, bad := range []Workload{
		{PromptBytes: Fixed(1), OutputTokens: Fixed(1), Tenants: 1, Distinct: 1, Turns: TurnsMax + 1},
		{PromptBytes: Fixed(1), OutputTokens: Fixed(1), Tenants: 1, Distinct: ShapesMax, Turns: 2},
		{PromptBytes: Fixed(1), OutputTokens: Fixed(1), Tenants: 1, Distinct: 1, PrefixBytes: 8},
		{PromptBytes: Fixed(1), OutputTokens: Fixed(1), Tenants: 1, Distinct: 1, PrefixBytes: PrefixBytesMax + 1, Prefixes: 1},
		{OutputTokens: Fixed(1), Tenants: 1, Distinct: 1, Turns: 2, Prompts: []Prompt{{"x", 0}}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v taken", bad)
		}
	}
}
