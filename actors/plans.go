package actors

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// DataPlaneOf says, from authenticated membership, which data plane the
// node serving protoactor remote at remoteAddr advertises and who that
// node is; ok is false when no such member is known. The cluster layer
// provides it; a node without one (a single node) takes plans only from
// itself.
type DataPlaneOf func(remoteAddr string) (dataAddr string, id trust.Identity, ok bool)

// DataPlaneMismatchError: a transfer plan from another node names a data
// plane that is not the one membership says that node advertises. Sending there would hand a tenant's KV to
// whoever the plan chose.
type DataPlaneMismatchError struct {
	Sender     string // who sent the plan, as authenticated
	Named      string // the plan's data plane
	Advertised string // the sender's, from membership; empty if unknown
}

func (e *DataPlaneMismatchError) Error() string {
	if e.Advertised == "" {
		return fmt.Sprintf("actors: plan from %s names data plane %q, and no member advertises one for it", e.Sender, e.Named)
	}
	return fmt.Sprintf("actors: plan from %s names data plane %q, the sender advertises %q", e.Sender, e.Named, e.Advertised)
}

// Wire is what a client is told of e.
func (e *DataPlaneMismatchError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeForbidden, Message: e.Error()}
}

// NotMemberError: a transfer plan came from a node that membership does
// not know as a verified member (yet): its data plane is unknown, so its
// KV goes nowhere. Told as busy: the request may be retried.
type NotMemberError struct {
	Sender  string // who sent the plan, as authenticated
	Address string // its remote address
}

func (e *NotMemberError) Error() string {
	return fmt.Sprintf("actors: plan from %s at %s, which is not a verified member here (yet)", e.Sender, e.Address)
}

// Wire is what a client is told of e.
func (e *NotMemberError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeBusy, Message: e.Error(), Where: "membership"}
}

// planPolicy is who may have a prefill node compute and send KV: nodes
// that decode, each only to its own data plane. The dispatcher and every
// worker apply it, since both can be named from outside.
type planPolicy struct {
	auth        *trust.Authority
	dataPlaneOf DataPlaneOf
}

// check refuses, counting it, a plan from a sender that does not decode,
// or whose data plane is not the one membership gives for the sender's
// (authenticated) address.
func (p planPolicy) check(c actor.Context, m *messages.TransferPlan) error {
	s := p.auth.Of(c)
	if !s.May(trust.RoleDecode, trust.RoleAll) {
		p.auth.Refuse(trust.RefusedRole, "transfer plan", "sender", s.String(), "request", m.RequestID)
		return &ForbiddenError{Sender: s.String(), Reason: "only nodes that decode plan transfers"}
	}
	if s.Local {
		return nil
	}
	mismatch := &DataPlaneMismatchError{Sender: s.String(), Named: m.DataPlane}
	if p.dataPlaneOf != nil {
		addr, id, ok := p.dataPlaneOf(c.Sender().Address)
		if !ok {
			// Not a verified member (yet): a node that just (re)started is
			// not known everywhere at once. Nothing is sent to it, and its
			// request may retry elsewhere or later.
			p.auth.Refuse(trust.RefusedStranger, "transfer plan", "sender", s.String(), "request", m.RequestID,
				"data_plane", m.DataPlane, "member", "unknown")
			return &NotMemberError{Sender: s.String(), Address: c.Sender().Address}
		}
		mismatch.Advertised = addr
		// An insecure node knows nobody's identity; membership's word
		// on the address is all there is.
		if ok && addr != "" && addr == m.DataPlane && (s.Insecure || id == s.Identity) {
			return nil
		}
	}
	p.auth.Refuse(trust.RefusedStranger, "transfer plan", "sender", s.String(), "request", m.RequestID,
		"data_plane", m.DataPlane, "advertised", mismatch.Advertised)
	return mismatch
}

// refusePlan answers a plan that will not run with a TransferDone error,
// so that decode does not wait for its PrefillTimeout. A plan without a
// sender (from inside this process) has no one to answer.
func refusePlan(c actor.Context, m *messages.TransferPlan, err error) error {
	if c.Sender() == nil {
		return nil
	}
	return messages.Send(c, c.Sender(), &messages.TransferDone{RequestID: m.RequestID, Tenant: m.Tenant, Err: handoff.Wire(err)})
}
