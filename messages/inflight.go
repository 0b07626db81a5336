package messages

import (
	"fmt"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/vmihailenco/msgpack/v5"
)

// Operators' view of the requests a node has in flight (node requests,
// node cancel): an operator asks a node with ListInFlight and gets an
// InFlightList; CancelInFlight cancels one of them and is answered with a
// CancelInFlightReply. Only operators may ask, as for StatusRequest.
//
// A request in flight is named by the node that holds it: the node's
// incarnation and the node's own number for the request (InFlight.Number),
// unique in that run. The client's request id is not enough, being unique
// only per client, and a number alone could name another request after the
// node restarted at the same address; a CancelInFlight for another
// incarnation is refused.

// The phases of a request in flight (InFlight.Phase). A decode node sees
// the request's own life; a router sees only what it relays.
const (
	// PhaseQueued: admitted, waiting for the decode node's pages.
	PhaseQueued = "queued"
	// PhasePrefill: the transfer plan is out, no KV frame has come yet
	// (the prefill node queues and computes).
	PhasePrefill = "prefill"
	// PhaseTransfer: KV frames are arriving from the prefill node.
	PhaseTransfer = "transfer"
	// PhaseDecode: tokens are being generated (on a router: relayed).
	PhaseDecode = "decode"
	// PhaseRouted: a router sent the request to its decode node and has
	// had no token back yet.
	PhaseRouted = "routed"
)

var phases = []string{PhaseQueued, PhasePrefill, PhaseTransfer, PhaseDecode, PhaseRouted}

// InFlightListMax bounds the requests of one InFlightList, in requests: a
// node's default QueueMax, and an answer of about 180 KiB at most.
const InFlightListMax = 256

// ListInFlight asks a node for the requests it has in flight, oldest
// first.
type ListInFlight struct {
	// Limit is the most requests to list, 0 to InFlightListMax; 0 means
	// InFlightListMax.
	Limit uint32 `msgpack:"limit,omitempty"`
}

var listInFlightKeys = []string{"limit"}

func (*ListInFlight) TypeCode() TypeCode { return TypeListInFlight }

func (m *ListInFlight) Validate() error {
	return checkRange(TypeListInFlight, "limit", uint64(m.Limit), 0, InFlightListMax)
}

// Max is the most requests the answer may list: Limit, or
// InFlightListMax when it is 0.
func (m *ListInFlight) Max() int {
	if m.Limit == 0 {
		return InFlightListMax
	}
	return int(m.Limit)
}

func (m *ListInFlight) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeListInFlight
	return fields(d, t, listInFlightKeys, func(int) error {
		return readU32(d, t, "limit", &m.Limit)
	})
}

// InFlightList answers ListInFlight.
type InFlightList struct {
	// Incarnation is the answering node's run, non-zero: with a request's
	// Number it names the request.
	Incarnation uint64 `msgpack:"inc"`
	// Requests are the oldest requests in flight, at most the limit asked
	// for.
	Requests []InFlight `msgpack:"requests"`
	// Omitted counts the requests in flight that are not listed.
	Omitted uint32 `msgpack:"omitted,omitempty"`
}

var inFlightListKeys = []string{"inc", "requests", "omitted"}

func (*InFlightList) TypeCode() TypeCode { return TypeInFlightList }

func (m *InFlightList) Validate() error {
	const t = TypeInFlightList
	if m.Incarnation == 0 {
		return &InvalidFieldError{t, "inc", "0", "a non-zero incarnation"}
	}
	if err := checkLen(t, "requests", len(m.Requests), InFlightListMax); err != nil {
		return err
	}
	for i := range m.Requests {
		if err := m.Requests[i].validate(t, fmt.Sprintf("requests[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

func (m *InFlightList) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeInFlightList
	return fields(d, t, inFlightListKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "inc", &m.Incarnation)
		case 1:
			return readSlice(d, t, "requests", InFlightListMax, &m.Requests, func(r *InFlight) error {
				return r.decode(d, t, "requests")
			})
		default:
			return readU32(d, t, "omitted", &m.Omitted)
		}
	})
}

// InFlight is one request in flight as the node holding it sees it (not a
// message: a part of InFlightList and CancelInFlightReply).
type InFlight struct {
	// Number is the node's own number for the request, non-zero and
	// unique in the node's run.
	Number uint64 `msgpack:"n"`
	// ClientID is the request id its client chose, non-zero.
	ClientID uint64 `msgpack:"client_id"`
	Tenant   string `msgpack:"tenant"`
	// Phase is one of the Phase words.
	Phase string `msgpack:"phase"`
	// Prefill is the remote address (host:port) of the prefill node of
	// the request's current transfer attempt; "" when there is none.
	Prefill string `msgpack:"prefill,omitempty"`
	// Decode is the remote address of the decode node the request runs
	// on: the answering node itself, or on a router the node it routed
	// the request to.
	Decode string `msgpack:"decode"`
	// AgeMs is how long ago the node took the request, in milliseconds.
	AgeMs uint64 `msgpack:"age_ms"`
	// Tokens counts the tokens streamed to its client so far.
	Tokens uint32 `msgpack:"tokens,omitempty"`
}

var inFlightKeys = []string{"n", "client_id", "tenant", "phase", "prefill", "decode", "age_ms", "tokens"}

func (r *InFlight) validate(t TypeCode, field string) error {
	if r.Number == 0 {
		return &InvalidFieldError{t, field + ".n", "0", "a non-zero request number"}
	}
	if r.ClientID == 0 {
		return &InvalidFieldError{t, field + ".client_id", "0", "a non-zero request id"}
	}
	if err := checkTenant(t, r.Tenant); err != nil {
		return err
	}
	if err := checkWord(t, field+".phase", r.Phase, phases); err != nil {
		return err
	}
	if err := checkAddr(t, field+".prefill", r.Prefill, true); err != nil {
		return err
	}
	return checkAddr(t, field+".decode", r.Decode, false)
}

func (r *InFlight) decode(d *msgpack.Decoder, t TypeCode, field string) error {
	return fields(d, t, inFlightKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, field+".n", &r.Number)
		case 1:
			return readU64(d, t, field+".client_id", &r.ClientID)
		case 2:
			return readString(d, t, field+".tenant", TenantBytesMax, &r.Tenant)
		case 3:
			return readString(d, t, field+".phase", wordBytesMax, &r.Phase)
		case 4:
			return readString(d, t, field+".prefill", AddrBytesMax, &r.Prefill)
		case 5:
			return readString(d, t, field+".decode", AddrBytesMax, &r.Decode)
		case 6:
			return readU64(d, t, field+".age_ms", &r.AgeMs)
		default:
			return readU32(d, t, field+".tokens", &r.Tokens)
		}
	})
}

// CancelInFlight asks a node to cancel one of its requests in flight, as
// its InFlightList named it: the request's client is answered
// CodeCancelled and its pages are released.
type CancelInFlight struct {
	// Incarnation is the run of the node the request was listed by,
	// non-zero.
	Incarnation uint64 `msgpack:"inc"`
	// Number is the request's InFlight.Number, non-zero.
	Number uint64 `msgpack:"n"`
}

var cancelInFlightKeys = []string{"inc", "n"}

func (*CancelInFlight) TypeCode() TypeCode { return TypeCancelInFlight }

func (m *CancelInFlight) Validate() error {
	const t = TypeCancelInFlight
	if m.Incarnation == 0 {
		return &InvalidFieldError{t, "inc", "0", "a non-zero incarnation"}
	}
	if m.Number == 0 {
		return &InvalidFieldError{t, "n", "0", "a non-zero request number"}
	}
	return nil
}

func (m *CancelInFlight) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeCancelInFlight
	return fields(d, t, cancelInFlightKeys, func(i int) error {
		if i == 0 {
			return readU64(d, t, "inc", &m.Incarnation)
		}
		return readU64(d, t, "n", &m.Number)
	})
}

// CancelInFlightReply answers CancelInFlight: the request the cancel went
// to, or why there is none.
type CancelInFlightReply struct {
	// Request is the request cancelled, as it was when the cancel reached
	// it; nil with Err.
	Request *InFlight `msgpack:"request,omitempty"`
	// Err says why nothing was cancelled: no such request in flight, or
	// a number of another run of the node.
	Err *WireError `msgpack:"err,omitempty"`
}

var cancelInFlightReplyKeys = []string{"request", "err"}

func (*CancelInFlightReply) TypeCode() TypeCode { return TypeCancelInFlightReply }

func (m *CancelInFlightReply) Validate() error {
	const t = TypeCancelInFlightReply
	switch {
	case (m.Request == nil) == (m.Err == nil):
		return &InvalidFieldError{t, "request", fmt.Sprintf("present %v with an error %v", m.Request != nil, m.Err != nil),
			"either a request or an error"}
	case m.Err != nil:
		return m.Err.validate(t, "err")
	}
	return m.Request.validate(t, "request")
}

func (m *CancelInFlightReply) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeCancelInFlightReply
	return fields(d, t, cancelInFlightReplyKeys, func(i int) error {
		var err error
		if i == 0 {
			m.Request = new(InFlight)
			return m.Request.decode(d, t, "request")
		}
		m.Err, err = readWireError(d, t, "err", false)
		return err
	})
}

func (m *ListInFlight) Serialize() (remote.RootSerialized, error)        { return serialize(m) }
func (m *InFlightList) Serialize() (remote.RootSerialized, error)        { return serialize(m) }
func (m *CancelInFlight) Serialize() (remote.RootSerialized, error)      { return serialize(m) }
func (m *CancelInFlightReply) Serialize() (remote.RootSerialized, error) { return serialize(m) }
