//go:build !race

package cluster

// dpRaceEnabled is whether the race detector is on; see writeLoop.
const dpRaceEnabled = false
