package messages

import (
	"fmt"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/vmihailenco/msgpack/v5"
)

// TypeCode names a message type on the wire. Codes are stable: a code is
// never renumbered and a retired code is never reused, because nodes of
// different builds exchange them during a rolling upgrade.
type TypeCode uint16

// The message types. Client API first, then the prefill ↔ decode
// handshake, then the cluster.
const (
	TypeGenerateRequest TypeCode = 1
	TypeTokenChunk      TypeCode = 2
	TypeGenerateResult  TypeCode = 3
	TypeCancelRequest   TypeCode = 4
	TypeTransferPlan    TypeCode = 5
	TypeTransferAck     TypeCode = 6
	TypeTransferAbort   TypeCode = 7
	TypeTransferDone    TypeCode = 8
	TypeRoutedRequest   TypeCode = 9
	TypeStatusRequest   TypeCode = 10
	TypeStatusReply     TypeCode = 11
	TypeDrainRequest    TypeCode = 12
	TypeDrainReply      TypeCode = 13
	TypePressureRequest TypeCode = 14
	TypePressureReply   TypeCode = 15
	// Operators' view of the requests in flight (inflight.go).
	TypeListInFlight        TypeCode = 16
	TypeInFlightList        TypeCode = 17
	TypeCancelInFlight      TypeCode = 18
	TypeCancelInFlightReply TypeCode = 19
	// Routers' view of the prefix caches of prefilling nodes
	// (cachesummary.go).
	TypeCacheSummaryRequest TypeCode = 20
	TypeCacheSummary        TypeCode = 21
	// Streams' tokens and results in batches (stream.go).
	TypeTokenBatch TypeCode = 22
	// A running request's move between decode nodes (move.go).
	TypeMoveRequest TypeCode = 23
	TypeMovePlan    TypeCode = 24
	TypeStreamMoved TypeCode = 25
	TypeStreamTake  TypeCode = 26
	// An operator's ask to move a node's requests elsewhere (move.go).
	TypeMigrateRequest TypeCode = 27
	TypeMigrateReply   TypeCode = 28
)

// Message is implemented by every message that crosses an actor or node
// boundary. Only pointers implement it (*GenerateRequest, …), so that a value
// sent by mistake is a compile error in the helpers (Send, RequestFuture)
// instead of a message that silently fails to serialize.
type Message interface {
	// TypeCode is the message's stable type code.
	TypeCode() TypeCode
	// Validate checks every field against this package's limits; the sender
	// calls it (through Encode) before anything leaves the process.
	Validate() error
	// DecodeMsgpack reads the message body, bounded by the limits.
	msgpack.CustomDecoder
	// Serialize turns the message into the protobuf envelope that
	// protoactor remote can carry (see envelope.go).
	remote.RootSerializable
}

// typeInfo describes one message type: its name for errors, the range of
// wire versions this build decodes, the version it encodes, and a
// constructor.
type typeInfo struct {
	name       string
	versionMin uint8
	version    uint8
	new        func() Message
}

// types is indexed by TypeCode; a zero entry is an unknown code.
// TransferDone version 2 carries the source pages' owner and seal
// checksums, which decode requires: a version 1 sender is refused by its
// version, not by a missing field. StatusReply version 2 adds a chaos
// build's fault counts and its pools' cross reads, version 3 why a member
// is unverified, version 4 the tenants' shares, version 5 the phases of
// the first token, version 6 the requests and streams moved between decode
// nodes, all optional, so versions 1 to 5 still decode; a build that reads
// only up to 5 refuses a version 6 reply by its version.
// CancelRequest version 2 carries a reason; a withdrawal is still sent as
// version 1 (see CancelRequest). DrainRequest version 2 asks the node to
// keep its requests (Stay), and is sent only then. MoveRequest version 2
// carries the request's time left and cached tokens: a target of a build
// that reads only version 1 refuses it by its version, and the move ends at
// its deadline with the request decoding on where it was.
var types = [...]typeInfo{
	TypeGenerateRequest: {"GenerateRequest", 1, 1, func() Message { return new(GenerateRequest) }},
	TypeTokenChunk:      {"TokenChunk", 1, 1, func() Message { return new(TokenChunk) }},
	TypeGenerateResult:  {"GenerateResult", 1, 1, func() Message { return new(GenerateResult) }},
	TypeCancelRequest:   {"CancelRequest", 1, 2, func() Message { return new(CancelRequest) }},
	TypeTransferPlan:    {"TransferPlan", 1, 1, func() Message { return new(TransferPlan) }},
	TypeTransferAck:     {"TransferAck", 1, 1, func() Message { return new(TransferAck) }},
	TypeTransferAbort:   {"TransferAbort", 1, 1, func() Message { return new(TransferAbort) }},
	TypeTransferDone:    {"TransferDone", 2, 2, func() Message { return new(TransferDone) }},
	TypeRoutedRequest:   {"RoutedRequest", 1, 1, func() Message { return new(RoutedRequest) }},
	TypeStatusRequest:   {"StatusRequest", 1, 1, func() Message { return new(StatusRequest) }},
	TypeStatusReply:     {"StatusReply", 1, 6, func() Message { return new(StatusReply) }},
	TypeDrainRequest:    {"DrainRequest", 1, 2, func() Message { return new(DrainRequest) }},
	TypeDrainReply:      {"DrainReply", 1, 1, func() Message { return new(DrainReply) }},
	TypePressureRequest: {"PressureRequest", 1, 1, func() Message { return new(PressureRequest) }},
	TypePressureReply:   {"PressureReply", 1, 1, func() Message { return new(PressureReply) }},
	// Operators' view of the requests in flight (inflight.go).
	TypeListInFlight:        {"ListInFlight", 1, 1, func() Message { return new(ListInFlight) }},
	TypeInFlightList:        {"InFlightList", 1, 1, func() Message { return new(InFlightList) }},
	TypeCancelInFlight:      {"CancelInFlight", 1, 1, func() Message { return new(CancelInFlight) }},
	TypeCancelInFlightReply: {"CancelInFlightReply", 1, 1, func() Message { return new(CancelInFlightReply) }},
	// Routers' view of the prefix caches (cachesummary.go).
	TypeCacheSummaryRequest: {"CacheSummaryRequest", 1, 1, func() Message { return new(CacheSummaryRequest) }},
	TypeCacheSummary:        {"CacheSummary", 1, 1, func() Message { return new(CacheSummary) }},
	// Streams in batches (stream.go).
	TypeTokenBatch: {"TokenBatch", 1, 1, func() Message { return new(TokenBatch) }},
	// A running request's move between decode nodes (move.go).
	TypeMoveRequest: {"MoveRequest", 1, 2, func() Message { return new(MoveRequest) }},
	TypeMovePlan:    {"MovePlan", 1, 1, func() Message { return new(MovePlan) }},
	TypeStreamMoved: {"StreamMoved", 1, 1, func() Message { return new(StreamMoved) }},
	TypeStreamTake:  {"StreamTake", 1, 1, func() Message { return new(StreamTake) }},
	// An operator's ask to move a node's requests elsewhere (move.go).
	TypeMigrateRequest: {"MigrateRequest", 1, 1, func() Message { return new(MigrateRequest) }},
	TypeMigrateReply:   {"MigrateReply", 1, 1, func() Message { return new(MigrateReply) }},
}

func lookup(c TypeCode) (typeInfo, bool) {
	if int(c) >= len(types) || types[c].new == nil {
		return typeInfo{}, false
	}
	return types[c], true
}

// Known reports whether this build can decode messages of type c.
func (c TypeCode) Known() bool { _, ok := lookup(c); return ok }

// Version is the newest wire version this build encodes for type c (a
// message whose version depends on its content may be encoded at an older
// one), or 0 if c is unknown.
func (c TypeCode) Version() uint8 { t, _ := lookup(c); return t.version }

func (c TypeCode) String() string {
	if t, ok := lookup(c); ok {
		return t.name
	}
	return fmt.Sprintf("type(%d)", uint16(c))
}

// TypeCodes lists every known type code in increasing order.
func TypeCodes() []TypeCode {
	var out []TypeCode
	for c := range types {
		if types[c].new != nil {
			out = append(out, TypeCode(c))
		}
	}
	return out
}
