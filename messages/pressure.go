package messages

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Pool pressure, a chaos tester's fault: an operator asks a node to hold
// pages of its KV pools for a while with a PressureRequest, so that
// admission and routing meet pools that many pages smaller; the node
// answers with a PressureReply. Only a chaos build holds pages; a
// production build answers with an error.

// PressureRequest asks a node to hold Pages pages of each of its KV pools,
// as an owner of its own and through its pools' own reservations, for
// DurationMs, and then to release them.
type PressureRequest struct {
	// Pages is the pages to hold in each pool, 1 to PressurePagesMax; a
	// pool with fewer free pages holds those it has.
	Pages uint32 `msgpack:"pages"`
	// DurationMs is how long the pages are held, in milliseconds, 1 to
	// PressureDurationMsMax.
	DurationMs uint32 `msgpack:"duration_ms"`
}

var pressureRequestKeys = []string{"pages", "duration_ms"}

func (*PressureRequest) TypeCode() TypeCode { return TypePressureRequest }

func (m *PressureRequest) Validate() error {
	const t = TypePressureRequest
	if err := checkRange(t, "pages", uint64(m.Pages), 1, PressurePagesMax); err != nil {
		return err
	}
	return checkRange(t, "duration_ms", uint64(m.DurationMs), 1, PressureDurationMsMax)
}

func (m *PressureRequest) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypePressureRequest
	return fields(d, t, pressureRequestKeys, func(i int) error {
		if i == 0 {
			return readU32(d, t, "pages", &m.Pages)
		}
		return readU32(d, t, "duration_ms", &m.DurationMs)
	})
}

// PressureReply answers a PressureRequest: the pages held in each pool,
// or why none are.
type PressureReply struct {
	// Held has one entry per pool of the node, at most PoolsMax; none
	// with an error.
	Held []PoolHeld `msgpack:"held"`
	// Err says why the node holds nothing: a build without fault points, a
	// duration its pools would not let an owner hold pages for, too many
	// holds at once.
	Err *WireError `msgpack:"err,omitempty"`
}

var pressureReplyKeys = []string{"held", "err"}

func (*PressureReply) TypeCode() TypeCode { return TypePressureReply }

func (m *PressureReply) Validate() error {
	const t = TypePressureReply
	if err := checkLen(t, "held", len(m.Held), PoolsMax); err != nil {
		return err
	}
	for i := range m.Held {
		if err := checkName(t, fmt.Sprintf("held[%d].name", i), m.Held[i].Name, PoolNameBytesMax); err != nil {
			return err
		}
	}
	if m.Err == nil {
		return nil
	}
	if len(m.Held) != 0 {
		return &InvalidFieldError{t, "held", fmt.Sprintf("%d pools", len(m.Held)), "none with an error"}
	}
	return m.Err.validate(t, "err")
}

func (m *PressureReply) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypePressureReply
	return fields(d, t, pressureReplyKeys, func(i int) error {
		if i == 0 {
			return readSlice(d, t, "held", PoolsMax, &m.Held, func(h *PoolHeld) error {
				return fields(d, t, poolHeldKeys, func(k int) error {
					if k == 0 {
						return readString(d, t, "held.name", PoolNameBytesMax, &h.Name)
					}
					return readU32(d, t, "held.pages", &h.Pages)
				})
			})
		}
		var err error
		m.Err, err = readWireError(d, t, "err", true)
		return err
	})
}

// PoolHeld is what a PressureReply holds of one pool.
type PoolHeld struct {
	// Name is the pool's, as in PoolStatus.
	Name string `msgpack:"name"`
	// Pages is the pages held: the pages asked for, or the pool's free
	// pages when it had fewer.
	Pages uint32 `msgpack:"pages"`
}

var poolHeldKeys = []string{"name", "pages"}
