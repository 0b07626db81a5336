package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/tenancy"
)

// TestTenantsSet: tenants set makes the file, changes only the fields
// given, sets the default share with --default, and refuses a share out
// of range with the numbers, leaving the file as it was.
func TestTenantsSet(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tenants.json")
	for _, args := range [][]string{
		{"--tenant", "acme", "--weight", "4", "--concurrent-max", "128"},
		{"--tenant", "acme", "--pages-max", "4096", "--pool-percent-max", "50"},
		{"--tenant", "globex", "--weight", "2"},
		{"--default", "--concurrent-max", "16"},
	} {
		if code, out := runNode(append([]string{"tenants", "set", "--file", file}, args...)...); code != exitOK {
			t.Fatalf("tenants set %q: exit %d; output:\n%s", args, code, out)
		}
	}
	p, err := tenancy.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	for tenant, want := range map[string]tenancy.Share{
		"acme":     {Weight: 4, ConcurrentMax: 128, PagesMax: 4096, PoolPercentMax: 50},
		"globex":   {Weight: 2, ConcurrentMax: 16, PoolPercentMax: 75},
		"stranger": {Weight: 1, ConcurrentMax: 16, PoolPercentMax: 75},
	} {
		if got := p.Of(tenant); got != want {
			t.Errorf("%s: %+v, want %+v", tenant, got, want)
		}
	}
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tenant", "acme", "--weight", "1001"}, "weight 1001, want 1 to 1000"},
		{[]string{"--default", "--pool-percent-max", "0"}, "--pool-percent-max 0, want at least 1"},
		{[]string{"--tenant", "acme", "--pool-percent-max", "101"}, "pool_percent_max 101, want 1 to 100"},
		{[]string{"--tenant", "acme", "--default"}, "one of --tenant"},
		{[]string{"--weight", "2"}, "one of --tenant"},
	} {
		code, out := runNode(append([]string{"tenants", "set", "--file", file}, c.args...)...)
		if code != exitUsage || !strings.Contains(out, c.want) {
			t.Errorf("tenants set %q: exit %d, want %d saying %q; output:\n%s", c.args, code, exitUsage, c.want, out)
		}
	}
	if after, err := os.ReadFile(file); err != nil || string(after) != string(before) {
		t.Fatalf("a refused change altered the file (%v):\n%s", err, after)
	}
}
