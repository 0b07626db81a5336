package main

import (
	"fmt"
	"strings"
)

// checkNodes makes, before up starts any process, every check "node run"
// makes of each role up starts (the arguments after "--" included), and
// checks the nodes' memory together against the host's: a setting one node
// would refuse, or a cluster this machine cannot hold, stops up before any
// node runs.
func checkNodes(o upOptions) error {
	var model []string
	if o.Model != "" {
		model = []string{"--model", o.Model, "--tokenizer", o.Tokenizer}
	}
	var need float64
	var parts []string
	for _, r := range []struct {
		role  string
		count int
	}{{"router", o.routers()}, {"prefill", o.Prefill}, {"decode", o.Decode}} {
		args := append(append([]string{"--role", r.role}, model...), o.NodeArgs...)
		nc, err := checkRunArgs(args)
		if err != nil {
			return fmt.Errorf("up: a %s node would refuse its settings (node run %s): %w", r.role, strings.Join(args, " "), err)
		}
		bytes, _ := nodeBytes(nc.Actors)
		need += float64(r.count) * bytes
		parts = append(parts, fmt.Sprintf("%d %s × %.0f", r.count, r.role, bytes))
	}
	if host := hostMemoryBytes(); host > 0 && need > float64(host) {
		return usageError{fmt.Errorf("up: the nodes need %.0f bytes together (%s), more than the host's memory, %d bytes; "+
			"fewer nodes, or smaller pools after --", need, strings.Join(parts, " + "), host)}
	}
	return nil
}
