package cluster

import (
	"fmt"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/cluster/dataplane"
	"github.com/kvwarden/kvwarden/trust"
)

// DataPlaneUnplannedError: a transfer plan named a data plane that no
// alive, verified member of the plan's incarnation advertises, so this
// node does not know whom it would be sending the KV to.
type DataPlaneUnplannedError struct {
	Addr        string
	Incarnation uint64
	// Advertised is the data plane the member of that incarnation
	// advertises; empty when no such member is known.
	Advertised string
}

func (e *DataPlaneUnplannedError) Error() string {
	if e.Advertised == "" {
		return fmt.Sprintf("cluster: data plane %s: no verified member of incarnation %x", e.Addr, e.Incarnation)
	}
	return fmt.Sprintf("cluster: data plane %s: member of incarnation %x advertises %s", e.Addr, e.Incarnation, e.Advertised)
}

// dialPlanned opens a sender to the data plane at addr for a transfer
// planned by the decode node run inc. When secure, the data plane must be
// the one that run advertises as a verified member, and the receiver must
// prove to hold the identity verification found at that member's
// addresses. When insecure nothing is checked.
//
// actors.Dialer hands over only the address and the incarnation, so the
// member is found here by its incarnation.
func (n *Node) dialPlanned(dp dataplane.Config, addr string, inc uint64) (actors.FrameSender, error) {
	var want trust.Identity
	if !dp.Auth.Insecure() {
		var err error
		if want, err = n.plannedReceiver(dp.Auth, addr, inc); err != nil {
			return nil, err
		}
	}
	s, err := dataplane.Dial(dp, addr, inc, want)
	if err != nil {
		// A nil interface, not a nil *dataplane.Sender in a non-nil one.
		return nil, err
	}
	return s, nil
}

// plannedReceiver is the identity of the verified member run inc, whose
// data plane must be addr: the one verification proved at both its
// addresses.
func (n *Node) plannedReceiver(auth *trust.Authority, addr string, inc uint64) (trust.Identity, error) {
	unplanned := &DataPlaneUnplannedError{Addr: addr, Incarnation: inc}
	m, ok := n.verifiedMember(func(m Member) bool { return m.Meta.Incarnation == inc })
	switch {
	case !ok:
		return trust.Identity{}, unplanned
	case m.Meta.DataAddr != addr:
		unplanned.Advertised = m.Meta.DataAddr
		return trust.Identity{}, unplanned
	}
	return m.Identity(auth.Self().Cluster), nil
}

// verifiedMember is the alive, verified member for which match holds or,
// failing that, a missing one whose requests are held and that was
// verified when last seen: a plan it sends, or a transfer to it, for work
// it had before it stalled must not fail for the stall.
func (n *Node) verifiedMember(match func(Member) bool) (Member, bool) {
	mem := n.mem()
	if mem == nil {
		return Member{}, false
	}
	for _, m := range mem.Members() {
		if m.State == StateAlive && m.Verified && match(m) {
			return m, true
		}
	}
	if held := n.holding.Load(); held != nil {
		for _, m := range *held {
			if m.Verified && match(m) {
				return m, true
			}
		}
	}
	return Member{}, false
}
