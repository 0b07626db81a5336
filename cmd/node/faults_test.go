//go:build !race

// The node serves in this process, beside the tests' control client:
// several protoactor remotes in one process race inside protoactor.

package main

import (
	"bufio"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/trust"
)

// TestServeFaultsAndPressure serves a node in this process as node run
// does, with --faults in a chaos build: its readiness line and its status
// say what it injects, its log warns of it, and pool pressure holds pages
// of its pools. In a production build the line says nothing of faults and
// pressure is refused with how to build a node that has it.
func TestServeFaultsAndPressure(t *testing.T) {
	const spec = "seed=3,frame-drop=0.5"
	cfg := defaultNodeConfig()
	cfg.ContextTokens = int64(actors.DefaultConfig().ContextTokens)
	cfg.DType = actors.DefaultConfig().Model.KVDType.String()
	cfg.Listen = "127.0.0.1:0"
	if faults.Available {
		cfg.Faults = spec
	}
	model, err := cfg.model()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := cfg.clusterNode(model)
	if err != nil {
		t.Fatal(err)
	}
	inj, err := cfg.injector()
	if err != nil {
		t.Fatal(err)
	}
	var logs testwait.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	installFaults(log, inj)
	t.Cleanup(func() { faults.Install(nil) })
	nc.Auth = trust.Insecure(log)
	stdout, w := io.Pipe()
	signals := make(chan os.Signal, 1)
	served := make(chan error, 1)
	go func() { served <- serve(w, log, nc, webOptions{}, signals) }()
	defer func() {
		signals <- os.Interrupt
		if err := testwait.Recv(t, "serve to return after SIGINT", exitTimeout, served); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	line = strings.TrimSuffix(line, "\n")
	m, up := readyLine.FindStringSubmatch(line), readinessLine.FindStringSubmatch(line)
	if m == nil || up == nil {
		t.Fatalf("readiness line %q is not one node up reads", line)
	}
	if said := strings.Contains(m[5], ", FAULTS "+spec); said != faults.Available {
		t.Fatalf("readiness line %q: says FAULTS %t, chaos build %t", line, said, faults.Available)
	}
	if warned := strings.Contains(logs.String(), "level=WARN msg=\"FAULTS:"); warned != faults.Available {
		t.Fatalf("log warns of faults %t, chaos build %t:\n%s", warned, faults.Available, logs.String())
	}
	c, err := dialControl("127.0.0.1", trust.Insecure(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	s, err := c.status(m[1], 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if s.Node.Chaos != faults.Available || (faults.Available && s.Node.Faults != spec) {
		t.Fatalf("status says chaos %t, faults %q", s.Node.Chaos, s.Node.Faults)
	}
	rep, err := c.pressure(m[1], 2, 100*time.Millisecond, 10*time.Second)
	if !faults.Available {
		if err == nil || rep == nil || !strings.Contains(err.Error(), "go build -tags chaos ./cmd/node") {
			t.Fatalf("pressure on a production node: %+v, %v", rep, err)
		}
		return
	}
	if err != nil || len(rep.Held) != len(s.Node.Pools) {
		t.Fatalf("pressure of 2 pages: %+v, %v", rep, err)
	}
	for _, h := range rep.Held {
		if h.Pages != 2 {
			t.Errorf("pool %s holds %d pages, want 2", h.Name, h.Pages)
		}
	}
}

// TestPressureArguments are refused before anything is sent.
func TestPressureArguments(t *testing.T) {
	var c controlClient
	for _, tc := range []struct {
		pages int
		d     time.Duration
		want  string
	}{
		{0, time.Second, "0 pages, want 1 to 65536"},
		{1 << 17, time.Second, "131072 pages"},
		{1, 0, "a hold of 0s, want 1ms to 1h0m0s"},
		{1, 2 * time.Hour, "a hold of 2h0m0s"},
	} {
		if _, err := c.pressure("127.0.0.1:1", tc.pages, tc.d, time.Second); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pressure of %d pages for %s: %v, want %q", tc.pages, tc.d, err, tc.want)
		}
	}
}
