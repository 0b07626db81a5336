package cluster

import (
	"errors"
	"io"
	"testing"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
)

// A transfer whose data-plane connection broke reaches its client as
// node_lost, also when the worker joined other errors to it.
func TestLostDataPlaneIsNodeLost(t *testing.T) {
	lost := &DataPlaneLostError{Addr: "127.0.0.1:1", Unacked: 2, Err: io.ErrUnexpectedEOF}
	for _, err := range []error{lost, errors.Join(lost, errors.New("lease given back late"))} {
		if w := handoff.Wire(err); w.Code != messages.CodeNodeLost {
			t.Errorf("%v is told as %s, want node_lost", err, w.Code)
		}
	}
}
