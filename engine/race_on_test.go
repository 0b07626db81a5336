//go:build race

package engine

// raceEnabled: the race detector's instrumentation allocates, so counts of
// allocations mean nothing under it.
const raceEnabled = true
