package main

import (
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/actors"
)

// TestPoolsWithinHostMemory: without --memory-budget-bytes the pools are
// bounded by the host's memory, which Linux reports.
func TestPoolsWithinHostMemory(t *testing.T) {
	cfg := actors.DefaultConfig()
	if err := poolsWithin(cfg, 0); err != nil {
		t.Fatalf("the default pools on this host: %v", err)
	}
	cfg.DecodeWorkers, cfg.DecodePages = 100000, 100000
	if err := poolsWithin(cfg, 0); err == nil || !strings.Contains(err.Error(), "100000 decode workers × 100000 pages of 32768 bytes") ||
		!strings.Contains(err.Error(), "more than the host's memory") {
		t.Fatalf("10^10 decode pages: %v", err)
	}
}
