package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/messages"
)

// TestRunChaosFlagRefusals: --faults, --advertise and --data-advertise
// are checked before anything starts, in every build.
func TestRunChaosFlagRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"probability", []string{"--faults", "seed=1,frame-drop=2"}, []string{"--faults", "frame-drop=2", "[0, 1]"}},
		{"unknown kind", []string{"--faults", "frame-delay=0.1"}, []string{`unknown key "frame-delay"`, "frame-misdirect"}},
		{"advertise wildcard", []string{"--advertise", "0.0.0.0:7070"}, []string{`--advertise "0.0.0.0:7070"`}},
		{"advertise port 0", []string{"--advertise", "proxy:0"}, []string{`--advertise "proxy:0"`, "not 0"}},
		{"advertise no port", []string{"--advertise", "proxy"}, []string{`--advertise "proxy"`}},
		{"data advertise port 0", []string{"--data-advertise", "127.0.0.1:0"}, []string{`--data-advertise "127.0.0.1:0"`}},
		{"data advertise on a router", []string{"--role", "router", "--data-advertise", "proxy:7071"},
			[]string{`--data-advertise "proxy:7071"`, "router node has no data plane"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runNode(append([]string{"run", "--listen", "127.0.0.1:0"}, tc.args...)...)
			if code != exitUsage || strings.Contains(out, "serving on") {
				t.Fatalf("exit %d, want %d without serving; output:\n%s", code, exitUsage, out)
			}
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestPrintChaosStatus: a chaos build's status names its faults and what
// it injected of each kind, and each pool's cross reads; another build's
// says nothing of either.
func TestPrintChaosStatus(t *testing.T) {
	s := &messages.StatusReply{Node: messages.NodeStatus{Name: "p", Role: messages.RolePrefill, Address: "127.0.0.1:1",
		Chaos: true, Faults: "seed=7,frame-drop=0.02", FaultCounts: []uint64{4, 0, 0, 2, 0, 1, 9},
		Pools: []messages.PoolStatus{{Name: "prefill-0/pool", Capacity: 8, Free: 8, CrossTenantRows: 3, CrossRequestRows: 1}}}}
	var out bytes.Buffer
	printStatus(&out, s)
	for _, want := range []string{
		"CHAOS BUILD: faults seed=7,frame-drop=0.02; injected: frame-drop 4 frame-dup 0 frame-reorder 0 frame-corrupt 2 frame-misdirect 0 ack-drop 1 kind6 9",
		"pool prefill-0/pool: 8 of 8 pages free, 3 rows read that another tenant wrote, 1 that another request did",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	s.Node.Chaos, s.Node.Faults, s.Node.FaultCounts = false, "", nil
	out.Reset()
	printStatus(&out, s)
	if strings.Contains(out.String(), "CHAOS") || strings.Contains(out.String(), "rows read") {
		t.Errorf("a production build's status speaks of chaos:\n%s", out.String())
	}
}

// TestPrintPrefixCacheStatus: a prefill pool's prefix cache is shown with
// its figures, and the watch's table counts its pages apart from those in
// use; a pool without a cache says nothing of one.
func TestPrintPrefixCacheStatus(t *testing.T) {
	s := &messages.StatusReply{Node: messages.NodeStatus{Name: "p", Role: messages.RolePrefill, Address: "127.0.0.1:1",
		Pools: []messages.PoolStatus{
			{Name: "prefill-0/pool", Capacity: 64, Free: 20, CachePages: 30, CachePagesMax: 32, CacheQueries: 9,
				CacheQueryTokens: 400, CacheHitTokens: 100, CachePublished: 41, CacheEvicted: 11, CacheGone: 1},
			{Name: "decode-0/pool", Capacity: 96, Free: 90},
		}}}
	var out bytes.Buffer
	printStatus(&out, s)
	want := "prefix cache: 30 of at most 32 pages; 9 lookups, 100 of 400 prompt tokens read from it (25.0%); 41 pages kept, 11 evicted, 1 found gone"
	if !strings.Contains(out.String(), want) || strings.Count(out.String(), "prefix cache") != 1 {
		t.Errorf("status lacks %q once:\n%s", want, out.String())
	}
	out.Reset()
	drawPages(&out, s)
	for _, row := range []string{`prefill-0/pool\s+14\s+30\s+20\s+64\s+25\.0%`, `decode-0/pool\s+6\s+0\s+90\s+96\s+-`} {
		if !regexp.MustCompile(row).MatchString(out.String()) {
			t.Errorf("the watch's pools lack a row matching %s:\n%s", row, out.String())
		}
	}
}
