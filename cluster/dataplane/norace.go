//go:build !race

package dataplane

// dpRaceEnabled is whether the race detector is on; see writeLoop.
const dpRaceEnabled = false
