// Package messages defines every message that crosses an actor or node
// boundary, its msgpack wire form with enforced size limits, and the glue
// that lets protoactor remote carry it between nodes.
//
// # Common path
//
// Messages are plain Go structs with msgpack tags (GenerateRequest,
// TokenChunk, GenerateResult, CancelRequest for clients; TransferPlan,
// TransferDone, TransferAck, TransferAbort for the prefill ↔ decode
// handshake; RoutedRequest, StatusRequest, StatusReply, DrainRequest,
// DrainReply for the cluster; ListInFlight, InFlightList, CancelInFlight,
// CancelInFlightReply for operators' view of the requests in flight;
// PressureRequest, PressureReply for chaos testers). Send them
// by pointer with Send, RequestFuture or Respond, which call Validate first;
// the receiving actor type-switches on the same pointer types, whether the
// sender was local or on another node. Encode and Decode turn a message into
// a frame and back: a 3-byte header (stable type code, wire version) and a
// msgpack map.
//
// # The envelope, and why
//
// protoactor's remote endpoint writer always serializes with serializer 0
// (protobuf) whatever serializer was registered, so a plain struct fails
// with "msg must be proto.Message" and is dropped. Instead every message
// implements remote.RootSerializable: the endpoint writer calls Serialize,
// which validates and encodes the message into one small protobuf envelope
// (kvwarden.messages.Envelope, a single bytes field holding the frame).
// On the receiving node the endpoint reader unmarshals the envelope through
// the protobuf registry and, because the envelope implements
// remote.RootSerialized, calls its Deserialize on the gRPC stream's
// goroutine before sending the result to the target actor; Deserialize
// runs Decode, so the actor's Receive sees *GenerateRequest and friends.
// The envelope is a hand-written protobuf type (see envelope.go) rather than
// a well-known wrapper because only a type of our own can implement
// Deserialize. Call RemoteOptions when configuring remote, so that protoactor
// batches never exceed gRPC's receive limit.
//
// A message the receiver cannot decode would, if Deserialize returned an
// error, close the gRPC stream and lose the messages behind it. So senders
// validate before sending (Send/RequestFuture/Respond, and again in
// Serialize, where a failure drops only that message), and a frame that
// Decode still refuses is delivered as *Undecodable with Decode's error
// instead of failing the stream.
//
// # Limits and errors
//
// The limits (limits.go) are protocol constants with units in their names,
// checked while decoding before anything is allocated for them, so a frame
// of n bytes costs a small multiple of n (plus msgpack's first string
// buffer, at most 1 MiB). Every refusal is a typed error
// with the numbers (TooLargeError, TruncatedError, UnknownTypeError,
// VersionError, MalformedError, TrailingBytesError, InvalidFieldError);
// ToWireError turns any error into the WireError a peer or client is told.
//
// # Stable codes
//
// TypeCode, ErrorCode and FinishReason values are part of the protocol:
// they are never renumbered and a retired value is never reused. A change to
// a message's fields bumps its wire version; a build decodes a range of
// versions per type and refuses others with VersionError. Unknown fields
// are refused, not ignored, so a field added without a version bump is
// caught rather than silently dropped. A message whose new field is
// optional may be encoded at the older version while it does not use it
// (CancelRequest's reason), so that older builds still take it, and refuse
// by its version only what they could not honour.
//
// # Concurrency
//
// Encode, Decode and the helpers are safe for concurrent use; there is no
// mutable package state. A message is owned by one goroutine at a time:
// protoactor hands a local receiver the sender's own pointer, so after
// sending, neither the sender nor the receiver may modify the message (or
// its slices); a receiver that needs to change one copies it first.
package messages
