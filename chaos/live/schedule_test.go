package live

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/messages"
)

// testTargets are a router, two prefill and three decode nodes.
var testTargets = []Target{{"router-0", messages.RoleRouter}, {"prefill-0", messages.RolePrefill},
	{"prefill-1", messages.RolePrefill}, {"decode-0", messages.RoleDecode}, {"decode-1", messages.RoleDecode},
	{"decode-2", messages.RoleDecode}}

func drawFaults(t *testing.T, seed uint64, cfg ScheduleConfig, n int) []Fault {
	t.Helper()
	s, err := NewSchedule(seed, cfg, testTargets)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]Fault, n)
	for i := range out {
		out[i] = s.Next()
	}
	return out
}

func TestScheduleIsTheSeeds(t *testing.T) {
	cfg := DefaultScheduleConfig()
	a, b := drawFaults(t, 42, cfg, 300), drawFaults(t, 42, cfg, 300)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two schedules of seed 42 differ")
	}
	if c := drawFaults(t, 43, cfg, 300); reflect.DeepEqual(a, c) {
		t.Fatal("the schedules of seeds 42 and 43 are the same")
	}
	// A schedule is its seed's whatever else draws: the next faults of
	// one drawn halfway are those of one drawn whole.
	s, _ := NewSchedule(42, cfg, testTargets)
	for range 150 {
		s.Next()
	}
	if f := s.Next(); !reflect.DeepEqual(f, a[150]) {
		t.Fatalf("fault 150 is %v, then %v", a[150], f)
	}
}

func TestScheduleBounds(t *testing.T) {
	cfg := DefaultScheduleConfig()
	cfg.Every, cfg.AtOnceMax = 300*time.Millisecond, 3 // crowded: the bounds bind
	role := map[string]string{}
	count := map[string]int{}
	for _, tg := range testTargets {
		role[tg.Name] = tg.Role
		count[tg.Role]++
	}
	for seed := range uint64(20) {
		fs := drawFaults(t, seed, cfg, 400)
		kinds := scheduledKinds(cfg.Kinds)
		first := map[Kind]bool{}
		for _, f := range fs[:len(kinds)] {
			first[f.Kind] = true
		}
		if len(first) != len(kinds) {
			t.Errorf("seed %d: the first %d faults have kinds %v, want each of %v once", seed, len(kinds), first, kinds)
		}
		for i, f := range fs {
			switch {
			case f.For < cfg.LengthMin || f.For > cfg.LengthMax:
				t.Errorf("seed %d: %v: window outside [%s, %s]", seed, f, cfg.LengthMin, cfg.LengthMax)
			case i > 0 && f.At-fs[i-1].At < cfg.Every/2:
				t.Errorf("seed %d: %v starts %s after the last", seed, f, f.At-fs[i-1].At)
			case f.Kind.disrupts() && !slices.Contains(cfg.Roles, role[f.Target]):
				t.Errorf("seed %d: %v hits a %s", seed, f, role[f.Target])
			case f.Kind == Rogue && role[f.Target] != messages.RoleDecode, f.Kind == Pressure && role[f.Target] == messages.RoleRouter,
				f.Kind == Drain && role[f.Target] != messages.RoleDecode:
				t.Errorf("seed %d: %v hits a %s", seed, f, role[f.Target])
			}
			checkOverlaps(t, seed, f, fs[:i], role, count, cfg.AtOnceMax)
		}
	}
}

// scheduledKinds are the kinds of ks a schedule draws.
func scheduledKinds(ks []Kind) []Kind {
	return slices.DeleteFunc(slices.Clone(ks), func(k Kind) bool { return !k.scheduled() })
}

// checkOverlaps checks f against the faults drawn before it.
func checkOverlaps(t *testing.T, seed uint64, f Fault, before []Fault, role map[string]string, count map[string]int, atOnce int) {
	t.Helper()
	open, disrupted := 1, 1
	r := role[f.Target]
	for _, g := range before {
		if g.At >= f.end() || g.end() <= f.At {
			continue
		}
		open++
		if g.Target == f.Target {
			t.Errorf("seed %d: %v overlaps %v on its target", seed, f, g)
		}
		if g.Kind.disrupts() && role[g.Target] == r {
			disrupted++
		}
	}
	if open > atOnce {
		t.Errorf("seed %d: %v opens with %d windows open, at most %d", seed, f, open, atOnce)
	}
	if f.Kind.disrupts() && disrupted > max(count[r]-1, 1) {
		t.Errorf("seed %d: %v disrupts %d %s nodes of %d at once", seed, f, disrupted, r, count[r])
	}
}

func TestScheduleRefuses(t *testing.T) {
	cfg := DefaultScheduleConfig()
	for _, tc := range []struct {
		name    string
		cfg     func(*ScheduleConfig)
		targets []Target
		want    string
	}{
		{"no decode for a rogue", func(c *ScheduleConfig) { c.Kinds = []Kind{Rogue} }, testTargets[:3], "no node a rogue fault"},
		{"one decode for a drain", func(c *ScheduleConfig) { c.Kinds = []Kind{Kill, Drain} }, testTargets[:4],
			"a drain fault needs 2 decode nodes, one to drain and one to take its requests: 1 among 4 targets"},
		{"only frames", func(c *ScheduleConfig) { c.Kinds = []Kind{Frames} }, testTargets, "no fault kind"},
		{"no gap", func(c *ScheduleConfig) { c.Every = 0 }, testTargets, "mean time between faults (0s)"},
		{"windows", func(c *ScheduleConfig) { c.LengthMax = c.LengthMin / 2 }, testTargets, "fault windows from 500ms to 250ms"},
		{"at once", func(c *ScheduleConfig) { c.AtOnceMax = 0 }, testTargets, "faults at once (0)"},
		{"role", func(c *ScheduleConfig) { c.Roles = []string{"gpu"} }, testTargets, `role "gpu"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.Kinds = slices.Clone(cfg.Kinds)
			tc.cfg(&c)
			if _, err := NewSchedule(1, c, tc.targets); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewSchedule: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestDrainSchedule: drains hit decode nodes only, whatever the roles
// kill, pause and partition may hit, and never leave the other decode
// node of two out of service: it takes the drained node's requests.
func TestDrainSchedule(t *testing.T) {
	cfg := DefaultScheduleConfig()
	cfg.Kinds, cfg.Roles = []Kind{Drain, Kill, Pause}, []string{messages.RolePrefill, messages.RoleDecode}
	cfg.Every, cfg.AtOnceMax = 300*time.Millisecond, 3
	two := testTargets[:5] // decode-0 and decode-1
	for seed := range uint64(20) {
		s, err := NewSchedule(seed, cfg, two)
		if err != nil {
			t.Fatal(err)
		}
		var fs []Fault
		drains := 0
		for range 300 {
			f := s.Next()
			if f.Kind == Drain {
				drains++
				if !strings.HasPrefix(f.Target, "decode-") {
					t.Fatalf("seed %d: %v drains a node that does not decode", seed, f)
				}
			}
			// No other decode node is down in a drain's window, nor drained
			// in another decode node's.
			for _, g := range fs {
				if g.At < f.end() && f.At < g.end() && g.Target != f.Target && (f.Kind == Drain || g.Kind == Drain) &&
					strings.HasPrefix(f.Target, "decode-") && strings.HasPrefix(g.Target, "decode-") &&
					f.Kind.disrupts() && g.Kind.disrupts() {
					t.Fatalf("seed %d: %v overlaps %v: no decode node left to take the requests", seed, f, g)
				}
			}
			fs = append(fs, f)
		}
		if drains == 0 {
			t.Fatalf("seed %d: no drain in 300 faults", seed)
		}
	}
	// Roles that leave decode nodes out of kills leave them to drains.
	cfg.Kinds, cfg.Roles = []Kind{Drain}, []string{messages.RolePrefill}
	for _, f := range drawFaults(t, 1, cfg, 50) {
		if f.Kind != Drain || !strings.HasPrefix(f.Target, "decode-") {
			t.Fatalf("%v: want drains of decode nodes", f)
		}
	}
}

// TestKindNeeds: what each kind takes to inject, and which the schedule
// draws and spares a node of its role for.
func TestKindNeeds(t *testing.T) {
	for _, tc := range []struct {
		k                    Kind
		need                 Need
		scheduled, disrupted bool
	}{
		{Kill, NeedProcesses, true, true}, {Pause, NeedProcesses, true, true}, {Drain, NeedProcesses, true, true},
		{Latency, NeedNetwork, true, false}, {Partition, NeedNetwork, true, true}, {Pressure, NeedPressure, true, false},
		{Rogue, NeedRogue, true, false}, {Frames, NeedChaosBuild, false, false},
	} {
		if tc.k.Needs() != tc.need || tc.k.scheduled() != tc.scheduled || tc.k.disrupts() != tc.disrupted {
			t.Errorf("%s: needs %q, scheduled %t, disrupts %t; want %q, %t, %t", tc.k, tc.k.Needs(), tc.k.scheduled(),
				tc.k.disrupts(), tc.need, tc.scheduled, tc.disrupted)
		}
	}
	if !(Controls{Processes: &fakeProcesses{}}).Can(Drain) || (Controls{Network: &Network{}}).Can(Drain) {
		t.Error("drains need the node processes, and only them")
	}
}

func TestKindNames(t *testing.T) {
	for _, k := range AllKinds() {
		got, err := ParseKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %v, %v", k.String(), got, err)
		}
	}
	if _, err := ParseKind("meteor"); err == nil || !strings.Contains(err.Error(), "kill, pause") ||
		!strings.Contains(err.Error(), "rogue, drain, frames") {
		t.Errorf("ParseKind(meteor): %v, want the kinds listed", err)
	}
	if k, err := ParseKind("drain"); err != nil || k != Drain || !slices.Contains(AllKinds(), Drain) {
		t.Errorf("ParseKind(drain) = %v, %v; all kinds %v", k, err, AllKinds())
	}
}
