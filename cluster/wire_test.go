package cluster

import (
	"errors"
	"io"
	"testing"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// A transfer whose data-plane connection broke, or never came to be,
// reaches its client as node_lost, also when the worker joined other
// errors to it.
func TestLostDataPlaneIsNodeLost(t *testing.T) {
	lost := &DataPlaneLostError{Addr: "127.0.0.1:1", Unacked: 2, Err: io.ErrUnexpectedEOF}
	reset := &DataPlaneDialError{Addr: "127.0.0.1:1", Stage: "TLS handshake", Err: errors.New("connection reset by peer")}
	for _, err := range []error{lost, errors.Join(lost, errors.New("lease given back late")), reset} {
		if w := handoff.Wire(err); w.Code != messages.CodeNodeLost {
			t.Errorf("%v is told as %s, want node_lost", err, w.Code)
		}
	}
}

// A dial to a data plane nobody serves fails with a DataPlaneDialError.
func TestDialNobodyIsADialError(t *testing.T) {
	_, err := DialDataPlane(dpTestConfig(t, dpSenderInc), trusttest.ClosedAddr(t), dpReceiverInc, trust.Identity{})
	var de *DataPlaneDialError
	if !errors.As(err, &de) || de.Stage != "dial" || handoff.Wire(err).Code != messages.CodeNodeLost {
		t.Fatalf("dial of a closed port: %v, want a dial error told as node_lost", err)
	}
}
