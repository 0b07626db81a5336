package dataplane

import (
	"time"

	"github.com/kvwarden/kvwarden/engine"
)

// eventDeadline bounds every wait for an event. It is far above what the
// waits take so that a loaded machine or the race detector does not make
// the tests flaky; it is only reached when something is broken.
const eventDeadline = 30 * time.Second

// testModel is the model fingerprint the tests' data planes serve.
var testModel = engine.Fingerprint{0x6b, 0x76}
