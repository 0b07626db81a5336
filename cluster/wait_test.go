package cluster

import (
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/testwait"
)

// waitFor waits for a condition with a bound; every test of the package
// that waits for a counter or a state to change uses it.
var waitFor = testwait.For

// testModel stands for the fingerprint of the model a test's nodes serve.
var testModel = engine.Fingerprint{0x6b, 0x76}
