package messages

import (
	"fmt"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvwarden/kvwarden/kv"
)

// A running request moves from the decode node it runs on (the source) to
// another (the target) with the handshake prefill and decode use: the
// source pauses the request and sends a MoveRequest; the target reserves
// pages for the source's layout and answers with a MovePlan; the source
// sends its pages as kv frames to the plan's data plane, then a
// TransferDone (First: the last token it streamed, which the target
// recomputes); the target seals and verifies every page and answers
// TransferAck, upon which the source tells the stream's receiver
// StreamMoved, after its last chunk, and lets its pages go. The receiver
// then takes the stream from the target alone and sends it StreamTake,
// from which the target streams. TransferAbort ends a move from either
// side; until the source has sent StreamMoved it goes on streaming itself.

// MoveRequest asks a decode node to take over a running request.
type MoveRequest struct {
	// MoveID is the source's name for the move, non-zero: the MovePlan,
	// TransferDone and TransferAck of the move name it or the target's
	// request the plan names.
	MoveID uint64 `msgpack:"id"`
	Tenant string `msgpack:"tenant"`
	// ClientID is the request id the stream's chunks carry, non-zero.
	ClientID uint64 `msgpack:"client_id"`
	// Receiver is the host:port of the process the stream goes to (a
	// router), ReceiverID the receiving actor's id there, 1 to
	// StreamToBytesMax bytes: the target takes StreamTake only from it and
	// streams only to it.
	Receiver   string `msgpack:"receiver"`
	ReceiverID string `msgpack:"receiver_id"`
	// Prompt is the request's prompt tokens, 1 to PromptTokensMax; Tokens
	// those streamed so far, at least 1 and fewer than MaxTokens, the most
	// the request generates (GenerateTokensMax at most). Seq is the last
	// chunk's sequence number, 1 to len(Tokens).
	Prompt    []uint32 `msgpack:"prompt"`
	Tokens    []uint32 `msgpack:"tokens"`
	MaxTokens uint32   `msgpack:"max_tokens"`
	Seq       uint32   `msgpack:"seq"`
	// PageTokens is the page size both pools must share, 1 to
	// PageTokensMax. Layout is the tokens of each page the source sends,
	// in order, each 1 to PageTokens, at most PlanTagsMax pages: they hold
	// the KV of every position before the last token streamed,
	// len(Prompt) + len(Tokens) - 1 in all.
	PageTokens uint32   `msgpack:"page_tokens"`
	Layout     []uint32 `msgpack:"layout"`
	// SourceIncarnation and TargetIncarnation are the two nodes' runs,
	// non-zero: a node restarted since refuses a move of its old self's.
	SourceIncarnation uint64 `msgpack:"source_inc"`
	TargetIncarnation uint64 `msgpack:"target_inc"`
	// Model is the fingerprint of the model the source computes
	// (TransferPlan.Model); CacheSalt the client's (GenerateRequest).
	Model     string `msgpack:"model"`
	CacheSalt string `msgpack:"cache_salt,omitempty"`
	// TimeLeftMs is what is left of the request's time (its RequestTimeout
	// from its start on the first decode node), in milliseconds: the
	// target gives it no more than that. 0 (a source of a build before it
	// was sent): the target's own RequestTimeout.
	TimeLeftMs uint32 `msgpack:"time_left_ms,omitempty"`
	// CachedTokens is how many of the prompt's first tokens its prefill
	// read from a prefix cache (GenerateResult.CachedTokens), fewer than
	// len(Prompt): the target reports them in the answer. It and
	// TimeLeftMs are MoveRequest version 2.
	CachedTokens uint32 `msgpack:"cached_tokens,omitempty"`
}

var moveRequestKeys = []string{"id", "tenant", "client_id", "receiver", "receiver_id", "prompt", "tokens", "max_tokens", "seq",
	"page_tokens", "layout", "source_inc", "target_inc", "model", "cache_salt",
	"time_left_ms", "cached_tokens"}

func (*MoveRequest) TypeCode() TypeCode { return TypeMoveRequest }

// Positions is how many positions' KV the move carries.
func (m *MoveRequest) Positions() int { return len(m.Prompt) + len(m.Tokens) - 1 }

func (m *MoveRequest) Validate() error {
	const t = TypeMoveRequest
	if err := checkOwner(t, m.MoveID, m.Tenant); err != nil {
		return err
	}
	if m.ClientID == 0 {
		return &InvalidFieldError{t, "client_id", "0", "a non-zero request id"}
	}
	if err := checkAddr(t, "receiver", m.Receiver, false); err != nil {
		return err
	}
	if err := checkName(t, "receiver_id", m.ReceiverID, StreamToBytesMax); err != nil {
		return err
	}
	if err := checkRange(t, "prompt", uint64(len(m.Prompt)), 1, PromptTokensMax); err != nil {
		return err
	}
	if err := checkRange(t, "max_tokens", uint64(m.MaxTokens), 2, GenerateTokensMax); err != nil {
		return err
	}
	if err := checkRange(t, "tokens", uint64(len(m.Tokens)), 1, uint64(m.MaxTokens)-1); err != nil {
		return err
	}
	if err := checkRange(t, "seq", uint64(m.Seq), 1, uint64(len(m.Tokens))); err != nil {
		return err
	}
	if m.CachedTokens >= uint32(len(m.Prompt)) {
		return &InvalidFieldError{t, "cached_tokens", fmt.Sprint(m.CachedTokens), fmt.Sprintf("fewer than the prompt's %d tokens", len(m.Prompt))}
	}
	if err := checkRange(t, "page_tokens", uint64(m.PageTokens), 1, PageTokensMax); err != nil {
		return err
	}
	if err := m.checkLayout(); err != nil {
		return err
	}
	if m.SourceIncarnation == 0 {
		return &InvalidFieldError{t, "source_inc", "0", "a non-zero incarnation"}
	}
	if m.TargetIncarnation == 0 {
		return &InvalidFieldError{t, "target_inc", "0", "a non-zero incarnation"}
	}
	if err := CheckFingerprint(t, "model", m.Model); err != nil {
		return err
	}
	return checkCacheSalt(t, m.CacheSalt)
}

// MoveExtraPagesMax bounds the pages of a move's layout beyond those its
// positions fill: a sequence holds a partial page where its prompt ends
// and one where each move before sealed its tail. A layout of smaller
// pages would have its target reserve more than the request's pages.
const MoveExtraPagesMax = 8

// checkLayout wants 1 to PlanTagsMax pages of 1 to PageTokens tokens each,
// Positions in all, at most MoveExtraPagesMax more pages than full pages
// would take.
func (m *MoveRequest) checkLayout() error {
	const t = TypeMoveRequest
	least := (m.Positions() + int(m.PageTokens) - 1) / int(m.PageTokens)
	if err := checkRange(t, "layout", uint64(len(m.Layout)), 1, uint64(min(PlanTagsMax, least+MoveExtraPagesMax))); err != nil {
		return err
	}
	sum := 0
	for i, n := range m.Layout {
		if err := checkRange(t, fmt.Sprintf("layout[%d]", i), uint64(n), 1, uint64(m.PageTokens)); err != nil {
			return err
		}
		sum += int(n)
	}
	if sum != m.Positions() {
		return &InvalidFieldError{t, "layout", fmt.Sprintf("%d tokens", sum),
			fmt.Sprintf("%d (%d prompt tokens and %d streamed, the last not yet fed)", m.Positions(), len(m.Prompt), len(m.Tokens))}
	}
	return nil
}

// wireVersion is 2 for a move that carries its time left or cached tokens,
// 1 otherwise.
func (m *MoveRequest) wireVersion() uint8 {
	if m.TimeLeftMs != 0 || m.CachedTokens != 0 {
		return 2
	}
	return 1
}

func (m *MoveRequest) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeMoveRequest
	return fields(d, t, moveRequestKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.MoveID)
		case 1:
			return readString(d, t, "tenant", TenantBytesMax, &m.Tenant)
		case 2:
			return readU64(d, t, "client_id", &m.ClientID)
		case 3:
			return readString(d, t, "receiver", AddrBytesMax, &m.Receiver)
		case 4:
			return readString(d, t, "receiver_id", StreamToBytesMax, &m.ReceiverID)
		case 5:
			return readTokens(d, t, "prompt", PromptTokensMax, &m.Prompt)
		case 6:
			return readTokens(d, t, "tokens", GenerateTokensMax, &m.Tokens)
		case 7:
			return readU32(d, t, "max_tokens", &m.MaxTokens)
		case 8:
			return readU32(d, t, "seq", &m.Seq)
		case 9:
			return readU32(d, t, "page_tokens", &m.PageTokens)
		case 10:
			return readTokens(d, t, "layout", PlanTagsMax, &m.Layout)
		case 11:
			return readU64(d, t, "source_inc", &m.SourceIncarnation)
		case 12:
			return readU64(d, t, "target_inc", &m.TargetIncarnation)
		case 13:
			return readString(d, t, "model", FingerprintDigits, &m.Model)
		case 14:
			return readString(d, t, "cache_salt", kv.CacheSaltBytesMax, &m.CacheSalt)
		case 15:
			return readU32(d, t, "time_left_ms", &m.TimeLeftMs)
		default:
			return readU32(d, t, "cached_tokens", &m.CachedTokens)
		}
	})
}

// MovePlan is the target's answer to a MoveRequest: the pages it reserved,
// one for each page of the move's Layout and at the same positions, owned
// by its request Request of the move's tenant, and the data plane the
// frames go to.
type MovePlan struct {
	MoveID    uint64   `msgpack:"id"`
	Tenant    string   `msgpack:"tenant"`
	Request   uint64   `msgpack:"request"`
	DestTags  []kv.Tag `msgpack:"dest_tags"`
	DataPlane string   `msgpack:"data_plane"`
}

var movePlanKeys = []string{"id", "tenant", "request", "dest_tags", "data_plane"}

func (*MovePlan) TypeCode() TypeCode { return TypeMovePlan }

// Owner is the owner of the destination pages, whom the frames name.
func (m *MovePlan) Owner() kv.Owner { return kv.Owner{Request: m.Request, Tenant: m.Tenant} }

func (m *MovePlan) Validate() error {
	const t = TypeMovePlan
	if err := checkOwner(t, m.MoveID, m.Tenant); err != nil {
		return err
	}
	if m.Request == 0 {
		return &InvalidFieldError{t, "request", "0", "a non-zero request id"}
	}
	if err := checkRange(t, "dest_tags", uint64(len(m.DestTags)), 1, PlanTagsMax); err != nil {
		return err
	}
	if err := checkTags(t, "dest_tags", m.DestTags); err != nil {
		return err
	}
	return checkAddr(t, "data_plane", m.DataPlane, false)
}

func (m *MovePlan) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeMovePlan
	return fields(d, t, movePlanKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.MoveID)
		case 1:
			return readString(d, t, "tenant", TenantBytesMax, &m.Tenant)
		case 2:
			return readU64(d, t, "request", &m.Request)
		case 3:
			return readTags(d, t, "dest_tags", PlanTagsMax, &m.DestTags)
		default:
			return readString(d, t, "data_plane", AddrBytesMax, &m.DataPlane)
		}
	})
}

// StreamMoved is the source's word to the stream's receiver, after its
// last chunk: the stream of request RequestID, passed on up to chunk Seq,
// goes on from the actor ToID at To, of the run ToIncarnation.
type StreamMoved struct {
	RequestID     uint64 `msgpack:"id"`
	Seq           uint32 `msgpack:"seq"`
	To            string `msgpack:"to"`
	ToID          string `msgpack:"to_id"`
	ToIncarnation uint64 `msgpack:"to_inc"`
}

var streamMovedKeys = []string{"id", "seq", "to", "to_id", "to_inc"}

func (*StreamMoved) TypeCode() TypeCode { return TypeStreamMoved }

func (m *StreamMoved) Validate() error {
	const t = TypeStreamMoved
	if err := checkRequestID(t, m.RequestID); err != nil {
		return err
	}
	if err := checkRange(t, "seq", uint64(m.Seq), 1, GenerateTokensMax); err != nil {
		return err
	}
	if err := checkAddr(t, "to", m.To, false); err != nil {
		return err
	}
	if err := checkName(t, "to_id", m.ToID, StreamToBytesMax); err != nil {
		return err
	}
	if m.ToIncarnation == 0 {
		return &InvalidFieldError{t, "to_inc", "0", "a non-zero incarnation"}
	}
	return nil
}

func (m *StreamMoved) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeStreamMoved
	return fields(d, t, streamMovedKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readU32(d, t, "seq", &m.Seq)
		case 2:
			return readString(d, t, "to", AddrBytesMax, &m.To)
		case 3:
			return readString(d, t, "to_id", StreamToBytesMax, &m.ToID)
		default:
			return readU64(d, t, "to_inc", &m.ToIncarnation)
		}
	})
}

// StreamTake is the receiver's word to the target of a move: it passed the
// stream of request RequestID on up to chunk Seq, and takes the rest from
// the target alone.
type StreamTake struct {
	RequestID uint64 `msgpack:"id"`
	Seq       uint32 `msgpack:"seq"`
}

var streamTakeKeys = []string{"id", "seq"}

func (*StreamTake) TypeCode() TypeCode { return TypeStreamTake }

func (m *StreamTake) Validate() error {
	const t = TypeStreamTake
	if err := checkRequestID(t, m.RequestID); err != nil {
		return err
	}
	return checkRange(t, "seq", uint64(m.Seq), 1, GenerateTokensMax)
}

func (m *StreamTake) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeStreamTake
	return fields(d, t, streamTakeKeys, func(i int) error {
		if i == 0 {
			return readU64(d, t, "id", &m.RequestID)
		}
		return readU32(d, t, "seq", &m.Seq)
	})
}

func (m *MoveRequest) Serialize() (remote.RootSerialized, error) { return serialize(m) }
func (m *MovePlan) Serialize() (remote.RootSerialized, error)    { return serialize(m) }
func (m *StreamMoved) Serialize() (remote.RootSerialized, error) { return serialize(m) }
func (m *StreamTake) Serialize() (remote.RootSerialized, error)  { return serialize(m) }

// MigrateRequest is an operator's ask to a decode node: move the request
// in flight of that number (messages.InFlight.Number) in the node's run
// Incarnation, or every one when Number is 0, to other decode nodes.
// Answered with a MigrateReply once every move is over.
type MigrateRequest struct {
	Number      uint64 `msgpack:"number,omitempty"`
	Incarnation uint64 `msgpack:"inc,omitempty"`
}

var migrateRequestKeys = []string{"number", "inc"}

func (*MigrateRequest) TypeCode() TypeCode { return TypeMigrateRequest }

func (m *MigrateRequest) Validate() error {
	if (m.Number == 0) != (m.Incarnation == 0) {
		return &InvalidFieldError{TypeMigrateRequest, "inc", fmt.Sprint(m.Incarnation), "the run of the request's number, or none for every request"}
	}
	return nil
}

func (m *MigrateRequest) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeMigrateRequest
	return fields(d, t, migrateRequestKeys, func(i int) error {
		if i == 0 {
			return readU64(d, t, "number", &m.Number)
		}
		return readU64(d, t, "inc", &m.Incarnation)
	})
}

// MigrateReply is how a MigrateRequest went: the requests that moved, and
// those that stayed (they could not move, or no decode node took them);
// Err is why the last that stayed did, if any did.
type MigrateReply struct {
	Moved  uint32     `msgpack:"moved"`
	Stayed uint32     `msgpack:"stayed"`
	Err    *WireError `msgpack:"err,omitempty"`
}

var migrateReplyKeys = []string{"moved", "stayed", "err"}

func (*MigrateReply) TypeCode() TypeCode { return TypeMigrateReply }

func (m *MigrateReply) Validate() error {
	if m.Err != nil && m.Stayed == 0 {
		return &InvalidFieldError{TypeMigrateReply, "err", m.Err.Error(), "none when every request moved"}
	}
	return nil
}

func (m *MigrateReply) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeMigrateReply
	return fields(d, t, migrateReplyKeys, func(i int) error {
		switch i {
		case 0:
			return readU32(d, t, "moved", &m.Moved)
		case 1:
			return readU32(d, t, "stayed", &m.Stayed)
		}
		var err error
		m.Err, err = readWireError(d, t, "err", true)
		return err
	})
}

func (m *MigrateRequest) Serialize() (remote.RootSerialized, error) { return serialize(m) }
func (m *MigrateReply) Serialize() (remote.RootSerialized, error)   { return serialize(m) }
