package cluster

import (
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/testwait"
)

// eventDeadline bounds every wait for an event. It is far above what the
// waits take (joins and leaves ~0.1 s, a crash a few seconds) so that a
// loaded machine or the race detector does not make the tests flaky; it is
// only reached when something is broken.
const eventDeadline = 30 * time.Second

// waitFor waits for a condition with a bound; every test of the package
// that waits for a counter or a state to change uses it.
var waitFor = testwait.For

// testModel stands for the fingerprint of the model a test's nodes serve.
var testModel = engine.Fingerprint{0x6b, 0x76}
