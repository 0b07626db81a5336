//go:build !chaos

package cluster

import "github.com/kvwarden/kvwarden/messages"

// pressureHolds holds nothing: a production build has no pool pressure.
type pressureHolds struct{}

func (*pressureHolds) stop() {}

// pressure refuses: only a chaos build holds pages for pool pressure.
func (n *Node) pressure(*messages.PressureRequest) *messages.PressureReply {
	return &messages.PressureReply{Err: &messages.WireError{Code: messages.CodeBadRequest, Where: "pool pressure",
		Message: "this node has no fault points; build one with: go build -tags chaos ./cmd/node"}}
}
