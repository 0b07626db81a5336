package cluster

import (
	"errors"
	"io"
	"testing"

	"github.com/kvwarden/kvwarden/cluster/dataplane"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
)

// A transfer whose data-plane connection broke, or never came to be,
// reaches its client as node_lost, also when the worker joined other
// errors to it.
func TestLostDataPlaneIsNodeLost(t *testing.T) {
	lost := &dataplane.LostError{Addr: "127.0.0.1:1", Unacked: 2, Err: io.ErrUnexpectedEOF}
	reset := &dataplane.DialError{Addr: "127.0.0.1:1", Stage: "TLS handshake", Err: errors.New("connection reset by peer")}
	for _, err := range []error{lost, errors.Join(lost, errors.New("lease given back late")), reset} {
		if w := handoff.Wire(err); w.Code != messages.CodeNodeLost {
			t.Errorf("%v is told as %s, want node_lost", err, w.Code)
		}
	}
}
