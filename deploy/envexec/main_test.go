package main

import (
	"errors"
	"testing"
)

func TestExpand(t *testing.T) {
	env := map[string]string{"POD_IP": "10.1.2.3", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, c := range []struct{ in, want string }{
		{"--endpoint=$(POD_IP):7070", "--endpoint=10.1.2.3:7070"},
		{"$(POD_IP)$(POD_IP)", "10.1.2.310.1.2.3"},
		{"a$(EMPTY)b", "ab"},
		{"$$(POD_IP)", "$(POD_IP)"},
		{"cost $5", "cost $5"},
		{"trailing $", "trailing $"},
		{"open $(POD_IP", "open $(POD_IP"},
		{"", ""},
	} {
		got, unset, ok := expand(c.in, lookup)
		if !ok || got != c.want {
			t.Errorf("expand(%q) = %q (unset %q, ok %v), want %q", c.in, got, unset, ok, c.want)
		}
	}
}

func TestExpandAllRefusesUnset(t *testing.T) {
	lookup := func(k string) (string, bool) { return "x", k == "SET" }
	_, err := expandAll([]string{"/node", "$(SET)", "--endpoint=$(POD_IP):7070"}, lookup)
	var unset *UnsetError
	if !errors.As(err, &unset) || unset.Arg != 2 || unset.Name != "POD_IP" {
		t.Fatalf("expandAll = %v, want an UnsetError for POD_IP at argument 2", err)
	}
}
