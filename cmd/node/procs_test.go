package main

import (
	"runtime"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/actors"
)

// TestProcsFor: --procs wins; without it a router runs on one processor
// unless GOMAXPROCS is set, and every other role on Go's default.
func TestProcsFor(t *testing.T) {
	all := runtime.GOMAXPROCS(0)
	for _, tc := range []struct {
		procs int
		role  actors.Role
		env   bool
		want  int
	}{
		{3, actors.RoleRouter, false, 3},
		{3, actors.RoleDecode, true, 3},
		{0, actors.RoleRouter, false, 1},
		{0, actors.RoleRouter, true, all},
		{0, actors.RoleDecode, false, all},
		{0, actors.RoleAll, false, all},
	} {
		if got := procsFor(tc.procs, tc.role, tc.env); got != tc.want {
			t.Errorf("procsFor(%d, %s, env %t) = %d, want %d", tc.procs, tc.role, tc.env, got, tc.want)
		}
	}
	if _, err := checkRunArgs([]string{"--procs", "1025"}); err == nil || !strings.Contains(err.Error(), "--procs (1025) must be 0") {
		t.Errorf("--procs 1025: %v", err)
	}
}
