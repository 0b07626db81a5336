package messages

import (
	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/kv"
)

// Limits of the wire protocol. They are constants, not node configuration:
// a sender and a receiver with different limits would let a message pass
// Validate on one side and fail decoding on the other, and a message the
// receiver cannot decode costs more than itself (see doc.go). Raising one is
// a protocol change: bump the version of every message type it affects.
//
// Every valid message fits in MessageBytesMax; TestWorstCaseFits checks it.
const (
	// HeaderBytes is the size of the frame header: type code (2 bytes, big
	// endian) and wire version (1 byte).
	HeaderBytes = 3

	// MessageBytesMax bounds one encoded frame, header included, in bytes.
	MessageBytesMax = 1 << 20

	// Identity.

	// TenantBytesMax bounds a tenant name in bytes; it is kv's bound, so a
	// tenant that crosses the wire always fits a page owner.
	TenantBytesMax = kv.TenantBytesMax

	// Client requests.

	// PromptBytesMax bounds GenerateRequest.Prompt in bytes of UTF-8.
	PromptBytesMax = 512 << 10
	// GenerateTokensMax bounds GenerateRequest.MaxTokens and the tokens of a
	// GenerateResult, in tokens.
	GenerateTokensMax = 32 << 10
	// ChunkTokensMax bounds the tokens of one TokenChunk, in tokens.
	ChunkTokensMax = 1 << 10
	// TextBytesMax bounds the text of a TokenChunk or GenerateResult in bytes.
	TextBytesMax = 256 << 10

	// Handshake.

	// PromptTokensMax bounds TransferPlan.PromptTokens and TokenCount, in
	// tokens.
	PromptTokensMax = 128 << 10
	// PlanTagsMax bounds the destination tags of one TransferPlan, in pages.
	// With PromptTokensMax it implies pages of at least 16 tokens for the
	// longest prompts.
	PlanTagsMax = 8 << 10
	// PageTokensMax bounds TransferPlan.PageTokens, in tokens.
	PageTokensMax = 1 << 16
	// AddrBytesMax bounds a node or data-plane address ("host:port") in
	// bytes.
	AddrBytesMax = 256

	// Cluster.

	// RouteAttemptsMax bounds RoutedRequest.Attempt, in retries.
	RouteAttemptsMax = 8
	// NodeNameBytesMax bounds the name of a node (NodeStatus.Name,
	// MemberStatus.Name) in bytes.
	NodeNameBytesMax = 128
	// PoolNameBytesMax bounds PoolStatus.Name in bytes.
	PoolNameBytesMax = 128
	// PoolsMax bounds the pools of one NodeStatus, in pools.
	PoolsMax = 64
	// CacheSummaryKeysMax bounds the page keys of one CacheSummary (16
	// bytes each: 64 KiB).
	CacheSummaryKeysMax = 4096
	// MembersMax bounds the members of one StatusReply, in members.
	MembersMax = 256
	// UnverifiedBytesMax bounds MemberStatus.Unverified in bytes; a node
	// cuts a longer reason at a character boundary.
	UnverifiedBytesMax = 512
	// IdentityBytesMax bounds a certificate identity in NodeStatus.
	IdentityBytesMax = 200
	// RefusalKindsMax bounds NodeStatus.Refused, in kinds.
	RefusalKindsMax = 16
	// RejectBoundsMax bounds NodeStatus.RejectedBy, in bounds, and
	// IntegrityReasonsMax NodeStatus.Integrity, in reasons: room for those
	// of newer builds.
	RejectBoundsMax     = 16
	IntegrityReasonsMax = 16

	// Chaos.

	// FaultSpecBytesMax bounds NodeStatus.Faults in bytes; it is the
	// faults package's bound, so a spec a node runs always fits.
	FaultSpecBytesMax = faults.SpecBytesMax
	// FaultKindsMax bounds NodeStatus.FaultCounts, in kinds: room for kinds
	// of newer builds.
	FaultKindsMax = 16
	// PressurePagesMax bounds PressureRequest.Pages, in pages per pool.
	PressurePagesMax = 1 << 16
	// PressureDurationMsMax bounds PressureRequest.DurationMs: one hour.
	PressureDurationMsMax = 60 * 60 * 1000

	// Errors.

	// ErrorMessageBytesMax bounds WireError.Message in bytes.
	ErrorMessageBytesMax = 1 << 10
	// WhereBytesMax bounds WireError.Where in bytes.
	WhereBytesMax = 128
)

// Remote batching. protoactor's endpoint writer packs up to
// EndpointWriterBatchSize messages (1000 by default) into one gRPC message,
// and gRPC refuses a received message above its MaxRecvMsgSize (4 MiB by
// default) by closing the stream. RemoteOptions sizes both so that a batch
// of maximum-size messages always passes.
const (
	// RemoteBatchMessagesMax is the endpoint writer batch size, in messages.
	RemoteBatchMessagesMax = 64
	// RemoteEnvelopeOverheadBytes is a generous bound on what protoactor adds
	// to each message in a batch (envelope fields, PIDs, type names), in
	// bytes. Message headers are not bounded by this package: keep them small.
	RemoteEnvelopeOverheadBytes = 4 << 10
	// RemoteRecvBytesMax is the gRPC server's receive limit, in bytes.
	RemoteRecvBytesMax = RemoteBatchMessagesMax * (MessageBytesMax + RemoteEnvelopeOverheadBytes)
)
