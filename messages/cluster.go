package messages

import (
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/kvwarden/kvwarden/chaos/faults"
	"github.com/kvwarden/kvwarden/kv"
)

// The cluster: a router sends each client request to a decode node as a
// RoutedRequest naming the prefill node chosen for it; any node answers a
// StatusRequest with a StatusReply, and a DrainRequest with a DrainReply.

// RoutedRequest is a client's GenerateRequest as the router passes it to a
// decode node, with the prefill node chosen for it. Prompt and MaxTokens
// have GenerateRequest's bounds.
type RoutedRequest struct {
	RequestID uint64 `msgpack:"id"`
	Tenant    string `msgpack:"tenant"`
	Prompt    string `msgpack:"prompt"`
	MaxTokens uint32 `msgpack:"max_tokens"`
	// Prefill is the remote address (host:port) of the prefill node.
	Prefill string `msgpack:"prefill"`
	// PrefillIncarnation is the prefill node's incarnation when the router
	// chose it, non-zero, so that a node that restarted since is not taken
	// for the one chosen.
	PrefillIncarnation uint64 `msgpack:"prefill_inc"`
	// DecodeIncarnation is the incarnation of the decode node the router
	// sent the request to, non-zero: a node restarted at the same address
	// refuses a request meant for its old self.
	DecodeIncarnation uint64 `msgpack:"decode_inc"`
	// Attempt counts the earlier routings of this request, 0 to
	// RouteAttemptsMax.
	Attempt uint8 `msgpack:"attempt,omitempty"`
	// CacheSalt is the client's (GenerateRequest.CacheSalt).
	CacheSalt string `msgpack:"cache_salt,omitempty"`
}

var routedRequestKeys = []string{"id", "tenant", "prompt", "max_tokens", "prefill", "prefill_inc", "decode_inc", "attempt", "cache_salt"}

func (*RoutedRequest) TypeCode() TypeCode { return TypeRoutedRequest }

func (m *RoutedRequest) Validate() error {
	const t = TypeRoutedRequest
	if err := checkOwner(t, m.RequestID, m.Tenant); err != nil {
		return err
	}
	if err := checkPrompt(t, m.Prompt, m.MaxTokens); err != nil {
		return err
	}
	if err := checkAddr(t, "prefill", m.Prefill, false); err != nil {
		return err
	}
	if m.PrefillIncarnation == 0 {
		return &InvalidFieldError{t, "prefill_inc", "0", "a non-zero incarnation"}
	}
	if m.DecodeIncarnation == 0 {
		return &InvalidFieldError{t, "decode_inc", "0", "a non-zero incarnation"}
	}
	if err := checkRange(t, "attempt", uint64(m.Attempt), 0, RouteAttemptsMax); err != nil {
		return err
	}
	return checkCacheSalt(t, m.CacheSalt)
}

func (m *RoutedRequest) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeRoutedRequest
	return fields(d, t, routedRequestKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, "id", &m.RequestID)
		case 1:
			return readString(d, t, "tenant", TenantBytesMax, &m.Tenant)
		case 2:
			return readString(d, t, "prompt", PromptBytesMax, &m.Prompt)
		case 3:
			return readU32(d, t, "max_tokens", &m.MaxTokens)
		case 4:
			return readString(d, t, "prefill", AddrBytesMax, &m.Prefill)
		case 5:
			return readU64(d, t, "prefill_inc", &m.PrefillIncarnation)
		case 6:
			return readU64(d, t, "decode_inc", &m.DecodeIncarnation)
		case 7:
			v, err := readUint(d, t, "attempt", math.MaxUint8)
			m.Attempt = uint8(v)
			return err
		default:
			return readString(d, t, "cache_salt", kv.CacheSaltBytesMax, &m.CacheSalt)
		}
	})
}

// StatusRequest asks a node for its StatusReply. It has no fields: its
// body is an empty map.
type StatusRequest struct{}

var statusRequestKeys []string

func (*StatusRequest) TypeCode() TypeCode { return TypeStatusRequest }

func (*StatusRequest) Validate() error { return nil }

func (*StatusRequest) DecodeMsgpack(d *msgpack.Decoder) error {
	return fields(d, TypeStatusRequest, statusRequestKeys, func(int) error { return nil })
}

// The roles of a node (NodeStatus.Role, MemberStatus.Role).
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
	RoleRouter  = "router"
	RoleAll     = "all" // every role in one process
)

// The states of a member as the membership protocol sees it
// (MemberStatus.State).
const (
	MemberAlive   = "alive"
	MemberSuspect = "suspect"
	MemberDead    = "dead"
	MemberLeft    = "left"
)

var (
	roles        = []string{RolePrefill, RoleDecode, RoleRouter, RoleAll}
	memberStates = []string{MemberAlive, MemberSuspect, MemberDead, MemberLeft}
)

// wordBytesMax bounds, while decoding, a field that Validate then checks
// against a few short words (roles, states), in bytes.
const wordBytesMax = 16

// StatusReply is a node's answer to a StatusRequest: its own status and
// the cluster's members as it sees them.
type StatusReply struct {
	Node NodeStatus `msgpack:"node"`
	// Members holds at most MembersMax members.
	Members []MemberStatus `msgpack:"members"`
}

var statusReplyKeys = []string{"node", "members"}

func (*StatusReply) TypeCode() TypeCode { return TypeStatusReply }

func (m *StatusReply) Validate() error {
	const t = TypeStatusReply
	if err := m.Node.validate(t, "node"); err != nil {
		return err
	}
	if err := checkLen(t, "members", len(m.Members), MembersMax); err != nil {
		return err
	}
	for i := range m.Members {
		if err := m.Members[i].validate(t, fmt.Sprintf("members[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

func (m *StatusReply) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeStatusReply
	return fields(d, t, statusReplyKeys, func(i int) error {
		if i == 0 {
			return m.Node.decode(d, t, "node")
		}
		return readSlice(d, t, "members", MembersMax, &m.Members, func(s *MemberStatus) error {
			return s.decode(d, t, "members")
		})
	})
}

// NodeStatus is one node's own account of itself (not a message: a part of
// StatusReply).
type NodeStatus struct {
	// Name is 1 to NodeNameBytesMax bytes of UTF-8.
	Name string `msgpack:"name"`
	// Role is RolePrefill, RoleDecode, RoleRouter or RoleAll.
	Role        string `msgpack:"role"`
	Incarnation uint64 `msgpack:"inc"`
	// Address is the node's remote address (host:port), "" when it has no
	// remote.
	Address string `msgpack:"addr"`
	// DataPlane is the host:port of the node's KV data plane, "" when it
	// has none.
	DataPlane string `msgpack:"data_plane,omitempty"`
	// Draining: the node takes no new work (see DrainRequest).
	Draining bool `msgpack:"draining,omitempty"`
	// InFlight is the number of requests admitted and not yet finished.
	InFlight uint32 `msgpack:"in_flight"`
	// Request counts since the node started.
	Admitted        uint64 `msgpack:"admitted"`
	Completed       uint64 `msgpack:"completed"`
	Failed          uint64 `msgpack:"failed"`
	RejectedTooLong uint64 `msgpack:"rejected_too_long"`
	RejectedBusy    uint64 `msgpack:"rejected_busy"`
	// Pools holds the node's KV pools, at most PoolsMax.
	Pools []PoolStatus `msgpack:"pools"`
	// Insecure: the node authenticates nobody (it runs --insecure).
	Insecure bool `msgpack:"insecure,omitempty"`
	// Identity is the node's certificate identity (kvwarden://cluster/
	// role/name), at most IdentityBytesMax bytes; "" when insecure.
	Identity string `msgpack:"identity,omitempty"`
	// Refused counts what the node refused from outside, by kind: the
	// kinds of trust.Refusal in its order, at most RefusalKindsMax.
	Refused []uint64 `msgpack:"refused,omitempty"`
	// Chaos: the node is a chaos build (go build -tags chaos): it has
	// fault points, and its pools count cross reads
	// (PoolStatus.CrossTenantRows).
	Chaos bool `msgpack:"chaos,omitempty"`
	// Faults is the fault spec the node injects (node run --faults), a
	// valid faults.Spec of at most FaultSpecBytesMax bytes; "" when it
	// injects none. Only a chaos build injects any.
	Faults string `msgpack:"faults,omitempty"`
	// FaultCounts counts the faults the node injected, by kind: the kinds
	// of faults.Kind in its order, at most FaultKindsMax; none without
	// Faults.
	FaultCounts []uint64 `msgpack:"fault_counts,omitempty"`
	// Model names the model the node serves (a file name, or "builtin"),
	// at most NodeNameBytesMax bytes of UTF-8; ModelFingerprint is its
	// fingerprint, FingerprintDigits hexadecimal digits. A node of a build
	// before models had fingerprints sends neither.
	Model            string `msgpack:"model,omitempty"`
	ModelFingerprint string `msgpack:"model_fp,omitempty"`
	// FailedByCode counts the requests that Failed counts by the code they
	// failed with (index: the ErrorCode), at most CodesMax.
	FailedByCode []uint64 `msgpack:"failed_by_code,omitempty"`
	// WaitingPages, WaitingKV and Running split the requests admitted here
	// and in flight by where they are: waiting for decode pages, waiting
	// for their prompt's KV (planned with a prefill node, not yet
	// verified), and decoding.
	WaitingPages uint32 `msgpack:"waiting_pages,omitempty"`
	WaitingKV    uint32 `msgpack:"waiting_kv,omitempty"`
	Running      uint32 `msgpack:"running,omitempty"`
	// PrefillQueued counts the transfer plans the node's prefill workers
	// hold and have not started computing; PrefillInFlight those computed
	// whose KV is being sent or awaits decode's acknowledgement.
	PrefillQueued   uint32 `msgpack:"prefill_queued,omitempty"`
	PrefillInFlight uint32 `msgpack:"prefill_in_flight,omitempty"`
	// RejectedBy counts the requests refused before they ran by the bound
	// that refused them (actors.RejectBound, in its order), at most
	// RejectBoundsMax.
	RejectedBy []uint64 `msgpack:"rejected_by,omitempty"`
	// Integrity counts what the node's integrity checks refused by reason
	// (actors.IntegrityReason, in its order), at most IntegrityReasonsMax.
	Integrity []uint64 `msgpack:"integrity,omitempty"`
	// KVSent and KVReceived are the node's KV transfers as the prefill
	// (sending) and the decode (receiving) side; nil for a side its role
	// does not have, and from a build before they were counted.
	KVSent     *TransferStatus `msgpack:"kv_sent,omitempty"`
	KVReceived *TransferStatus `msgpack:"kv_received,omitempty"`
	// TokensOut counts the tokens the node streamed to clients since it
	// started: those it generated, or a router those it relayed. Two
	// readings a known time apart give tokens per second.
	TokensOut uint64 `msgpack:"tokens_out,omitempty"`
	// Tenants are the tenants' shares the node holds requests to, and how
	// many tenants it holds now; nil from a prefill node, which admits
	// nothing, and from a build before StatusReply version 4.
	Tenants *TenantsStatus `msgpack:"tenants,omitempty"`
	// FirstToken splits the time to first token of the requests the node
	// decoded to the end; nil from a node that decodes nothing, and from a
	// build before StatusReply version 5.
	FirstToken *FirstTokenStatus `msgpack:"first_token,omitempty"`
	// MovedOut counts the running requests this decode node moved to
	// another, KV and all, and MovedIn those it took over from another
	// (the stream's receiver took it); StreamsMoved the streams a router's
	// relays followed from one decode node to another. All three since the
	// node started; none from a build before StatusReply version 6.
	MovedOut     uint64 `msgpack:"moved_out,omitempty"`
	MovedIn      uint64 `msgpack:"moved_in,omitempty"`
	StreamsMoved uint64 `msgpack:"streams_moved,omitempty"`
}

var nodeStatusKeys = []string{"name", "role", "inc", "addr", "data_plane", "draining", "in_flight",
	"admitted", "completed", "failed", "rejected_too_long", "rejected_busy", "pools", "insecure", "identity", "refused",
	"chaos", "faults", "fault_counts", "model", "model_fp", "failed_by_code", "waiting_pages", "waiting_kv", "running",
	"prefill_queued", "prefill_in_flight", "rejected_by", "integrity", "kv_sent", "kv_received", "tokens_out", "tenants", "first_token",
	"moved_out", "moved_in", "streams_moved"}

// FirstTokenStatus sums, over the Requests a decoding node completed, the
// phases of each one's time to first token as the node saw them, in
// nanoseconds: Queue from the request's arrival to its plan leaving
// (decode pages reserved), Prefill from the plan to the first KV frame
// (the prefill node's compute included), Transfer from the first frame to
// the prefill node's TransferDone, Verify from there to the first token
// leaving (seals, manifest, acknowledgement and decode's recomputation of
// the first token). FirstDecodeNs sums the first decode step, from the
// first token to the second, over the Decoded requests of those that had a
// second. What a client sees beyond the first four is the hops to the node
// and back (a router's among them).
type FirstTokenStatus struct {
	Requests      uint64 `msgpack:"requests"`
	QueueNs       uint64 `msgpack:"queue_ns"`
	PrefillNs     uint64 `msgpack:"prefill_ns"`
	TransferNs    uint64 `msgpack:"transfer_ns"`
	VerifyNs      uint64 `msgpack:"verify_ns"`
	Decoded       uint64 `msgpack:"decoded"`
	FirstDecodeNs uint64 `msgpack:"first_decode_ns"`
}

var firstTokenStatusKeys = []string{"requests", "queue_ns", "prefill_ns", "transfer_ns", "verify_ns", "decoded", "first_decode_ns"}

// readFirstToken reads an optional FirstTokenStatus: nil stays nil.
func readFirstToken(d *msgpack.Decoder, t TypeCode, field string, dst **FirstTokenStatus) error {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return d.DecodeNil()
	}
	s := &FirstTokenStatus{}
	*dst = s
	return fields(d, t, firstTokenStatusKeys, func(i int) error {
		dst := [...]*uint64{&s.Requests, &s.QueueNs, &s.PrefillNs, &s.TransferNs, &s.VerifyNs, &s.Decoded, &s.FirstDecodeNs}[i]
		return readU64(d, t, field+"."+firstTokenStatusKeys[i], dst)
	})
}

// TenantsStatus is a node's tenants' shares (package tenancy) in force: how
// many tenants its policy names and the default share of the others
// (PagesMax 0: none of its own), and how many tenants have requests in
// flight held to their shares here. Who is being limited is in
// NodeStatus.RejectedBy, by bound; no tenant is named.
type TenantsStatus struct {
	Named                uint32 `msgpack:"named"`
	DefaultWeight        uint32 `msgpack:"default_weight"`
	DefaultConcurrentMax uint32 `msgpack:"default_concurrent_max"`
	DefaultPagesMax      uint32 `msgpack:"default_pages_max"`
	// DefaultPoolPercentMax is the most of any one pool, in percent.
	DefaultPoolPercentMax uint32 `msgpack:"default_pool_percent_max"`
	Active                uint32 `msgpack:"active"`
}

var tenantsStatusKeys = []string{"named", "default_weight", "default_concurrent_max", "default_pages_max",
	"default_pool_percent_max", "active"}

// readTenants reads an optional TenantsStatus: nil stays nil.
func readTenants(d *msgpack.Decoder, t TypeCode, field string, dst **TenantsStatus) error {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return d.DecodeNil()
	}
	s := &TenantsStatus{}
	*dst = s
	return fields(d, t, tenantsStatusKeys, func(i int) error {
		dst := [...]*uint32{&s.Named, &s.DefaultWeight, &s.DefaultConcurrentMax, &s.DefaultPagesMax,
			&s.DefaultPoolPercentMax, &s.Active}[i]
		return readU32(d, t, field+"."+tenantsStatusKeys[i], dst)
	})
}

// TransferStatus is one side's account of a node's KV transfers (one per
// request attempt): those that completed, their pages and KV bytes (the
// frames' payloads), and those that failed, by the code of the failure.
type TransferStatus struct {
	Transfers uint64 `msgpack:"transfers"`
	Pages     uint64 `msgpack:"pages"`
	Bytes     uint64 `msgpack:"bytes"`
	// FailedByCode is indexed by ErrorCode, at most CodesMax.
	FailedByCode []uint64 `msgpack:"failed_by_code,omitempty"`
}

var transferStatusKeys = []string{"transfers", "pages", "bytes", "failed_by_code"}

func (s *TransferStatus) decode(d *msgpack.Decoder, t TypeCode, field string) error {
	return fields(d, t, transferStatusKeys, func(i int) error {
		switch i {
		case 0:
			return readU64(d, t, field+".transfers", &s.Transfers)
		case 1:
			return readU64(d, t, field+".pages", &s.Pages)
		case 2:
			return readU64(d, t, field+".bytes", &s.Bytes)
		default:
			return readCounts(d, t, field+".failed_by_code", CodesMax, &s.FailedByCode)
		}
	})
}

// readTransfer reads an optional TransferStatus: nil stays nil.
func readTransfer(d *msgpack.Decoder, t TypeCode, field string, dst **TransferStatus) error {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return d.DecodeNil()
	}
	*dst = &TransferStatus{}
	return (*dst).decode(d, t, field)
}

func (s *NodeStatus) validate(t TypeCode, field string) error {
	if err := checkName(t, field+".name", s.Name, NodeNameBytesMax); err != nil {
		return err
	}
	if err := checkWord(t, field+".role", s.Role, roles); err != nil {
		return err
	}
	if err := checkAddr(t, field+".addr", s.Address, true); err != nil {
		return err
	}
	if err := checkAddr(t, field+".data_plane", s.DataPlane, true); err != nil {
		return err
	}
	if err := checkLen(t, field+".pools", len(s.Pools), PoolsMax); err != nil {
		return err
	}
	if err := checkLen(t, field+".identity", len(s.Identity), IdentityBytesMax); err != nil {
		return err
	}
	if err := checkLen(t, field+".refused", len(s.Refused), RefusalKindsMax); err != nil {
		return err
	}
	if err := s.validateFaults(t, field); err != nil {
		return err
	}
	if err := checkLen(t, field+".failed_by_code", len(s.FailedByCode), CodesMax); err != nil {
		return err
	}
	if err := checkLen(t, field+".rejected_by", len(s.RejectedBy), RejectBoundsMax); err != nil {
		return err
	}
	if err := checkLen(t, field+".integrity", len(s.Integrity), IntegrityReasonsMax); err != nil {
		return err
	}
	for _, x := range []struct {
		name string
		s    *TransferStatus
	}{{"kv_sent", s.KVSent}, {"kv_received", s.KVReceived}} {
		if x.s != nil {
			if err := checkLen(t, field+"."+x.name+".failed_by_code", len(x.s.FailedByCode), CodesMax); err != nil {
				return err
			}
		}
	}
	if s.Model != "" || s.ModelFingerprint != "" {
		if err := checkName(t, field+".model", s.Model, NodeNameBytesMax); err != nil {
			return err
		}
		if err := CheckFingerprint(t, field+".model_fp", s.ModelFingerprint); err != nil {
			return err
		}
	}
	for i := range s.Pools {
		if err := s.Pools[i].validate(t, fmt.Sprintf("%s.pools[%d]", field, i)); err != nil {
			return err
		}
	}
	return nil
}

// validateFaults wants a valid spec, only from a chaos build, and counts
// only with a spec.
func (s *NodeStatus) validateFaults(t TypeCode, field string) error {
	if err := checkLen(t, field+".fault_counts", len(s.FaultCounts), FaultKindsMax); err != nil {
		return err
	}
	if s.Faults == "" {
		if len(s.FaultCounts) > 0 {
			return &InvalidFieldError{t, field + ".fault_counts", fmt.Sprintf("%d counts", len(s.FaultCounts)), "none without faults"}
		}
		return nil
	}
	if !s.Chaos {
		return &InvalidFieldError{t, field + ".faults", fmt.Sprintf("%q", truncate(s.Faults, 64)), "none from a node that is no chaos build"}
	}
	if _, err := faults.Parse(s.Faults); err != nil {
		return &InvalidFieldError{t, field + ".faults", fmt.Sprintf("%q", truncate(s.Faults, 64)), "a fault spec: " + err.Error()}
	}
	return nil
}

func (s *NodeStatus) decode(d *msgpack.Decoder, t TypeCode, field string) error {
	return fields(d, t, nodeStatusKeys, func(i int) error {
		switch i {
		case 0:
			return readString(d, t, field+".name", NodeNameBytesMax, &s.Name)
		case 1:
			return readString(d, t, field+".role", wordBytesMax, &s.Role)
		case 2:
			return readU64(d, t, field+".inc", &s.Incarnation)
		case 3:
			return readString(d, t, field+".addr", AddrBytesMax, &s.Address)
		case 4:
			return readString(d, t, field+".data_plane", AddrBytesMax, &s.DataPlane)
		case 5:
			return readBool(d, t, field+".draining", &s.Draining)
		case 6:
			return readU32(d, t, field+".in_flight", &s.InFlight)
		case 7:
			return readU64(d, t, field+".admitted", &s.Admitted)
		case 8:
			return readU64(d, t, field+".completed", &s.Completed)
		case 9:
			return readU64(d, t, field+".failed", &s.Failed)
		case 10:
			return readU64(d, t, field+".rejected_too_long", &s.RejectedTooLong)
		case 11:
			return readU64(d, t, field+".rejected_busy", &s.RejectedBusy)
		case 12:
			return readSlice(d, t, field+".pools", PoolsMax, &s.Pools, func(p *PoolStatus) error {
				return p.decode(d, t, field+".pools")
			})
		case 13:
			return readBool(d, t, field+".insecure", &s.Insecure)
		case 14:
			return readString(d, t, field+".identity", IdentityBytesMax, &s.Identity)
		case 15:
			return readCounts(d, t, field+".refused", RefusalKindsMax, &s.Refused)
		case 16:
			return readBool(d, t, field+".chaos", &s.Chaos)
		case 17:
			return readString(d, t, field+".faults", FaultSpecBytesMax, &s.Faults)
		case 18:
			return readCounts(d, t, field+".fault_counts", FaultKindsMax, &s.FaultCounts)
		case 19:
			return readString(d, t, field+".model", NodeNameBytesMax, &s.Model)
		case 20:
			return readString(d, t, field+".model_fp", FingerprintDigits, &s.ModelFingerprint)
		case 21:
			return readCounts(d, t, field+".failed_by_code", CodesMax, &s.FailedByCode)
		case 22:
			return readU32(d, t, field+".waiting_pages", &s.WaitingPages)
		case 23:
			return readU32(d, t, field+".waiting_kv", &s.WaitingKV)
		case 24:
			return readU32(d, t, field+".running", &s.Running)
		case 25:
			return readU32(d, t, field+".prefill_queued", &s.PrefillQueued)
		case 26:
			return readU32(d, t, field+".prefill_in_flight", &s.PrefillInFlight)
		case 27:
			return readCounts(d, t, field+".rejected_by", RejectBoundsMax, &s.RejectedBy)
		case 28:
			return readCounts(d, t, field+".integrity", IntegrityReasonsMax, &s.Integrity)
		case 29:
			return readTransfer(d, t, field+".kv_sent", &s.KVSent)
		case 30:
			return readTransfer(d, t, field+".kv_received", &s.KVReceived)
		case 31:
			return readU64(d, t, field+".tokens_out", &s.TokensOut)
		case 32:
			return readTenants(d, t, field+".tenants", &s.Tenants)
		case 33:
			return readFirstToken(d, t, field+".first_token", &s.FirstToken)
		case 34:
			return readU64(d, t, field+".moved_out", &s.MovedOut)
		case 35:
			return readU64(d, t, field+".moved_in", &s.MovedIn)
		default:
			return readU64(d, t, field+".streams_moved", &s.StreamsMoved)
		}
	})
}

// PoolStatus is one KV pool's page accounting, in pages.
type PoolStatus struct {
	// Name is 1 to PoolNameBytesMax bytes of UTF-8.
	Name     string `msgpack:"name"`
	Capacity uint32 `msgpack:"capacity"`
	// Free is at most Capacity.
	Free uint32 `msgpack:"free"`
	// CrossTenantRows and CrossRequestRows count rows the pool's reads
	// returned although another tenant, or another request of the same
	// tenant, wrote them (kv.CrossRows): zero in a correct node, and
	// counted only by a chaos build (NodeStatus.Chaos).
	CrossTenantRows  uint64 `msgpack:"cross_tenant_rows,omitempty"`
	CrossRequestRows uint64 `msgpack:"cross_request_rows,omitempty"`
	// A prefill pool's prefix cache: the pages it holds now and at most
	// (CachePagesMax 0: no cache); prefills that looked it up, the prompt
	// tokens they could have found there and those found; pages kept,
	// evicted to make room, and found gone when leased (a miss).
	CachePages       uint32 `msgpack:"cache_pages,omitempty"`
	CachePagesMax    uint32 `msgpack:"cache_pages_max,omitempty"`
	CacheQueries     uint64 `msgpack:"cache_queries,omitempty"`
	CacheQueryTokens uint64 `msgpack:"cache_query_tokens,omitempty"`
	CacheHitTokens   uint64 `msgpack:"cache_hit_tokens,omitempty"`
	CachePublished   uint64 `msgpack:"cache_published,omitempty"`
	CacheEvicted     uint64 `msgpack:"cache_evicted,omitempty"`
	CacheGone        uint64 `msgpack:"cache_gone,omitempty"`
}

var poolStatusKeys = []string{"name", "capacity", "free", "cross_tenant_rows", "cross_request_rows",
	"cache_pages", "cache_pages_max", "cache_queries", "cache_query_tokens", "cache_hit_tokens", "cache_published",
	"cache_evicted", "cache_gone"}

// Idle says the pool holds nothing for a request: every page is free or
// kept by its prefix cache, which gives pages up when the pool is full.
func (s *PoolStatus) Idle() bool { return s.Free+s.CachePages == s.Capacity }

func (s *PoolStatus) validate(t TypeCode, field string) error {
	if err := checkName(t, field+".name", s.Name, PoolNameBytesMax); err != nil {
		return err
	}
	if s.Free > s.Capacity {
		return &InvalidFieldError{t, field + ".free", fmt.Sprint(s.Free), fmt.Sprintf("at most capacity (%d)", s.Capacity)}
	}
	if s.CachePages > s.CachePagesMax || s.CachePagesMax > s.Capacity {
		return &InvalidFieldError{t, field + ".cache_pages", fmt.Sprintf("%d of at most %d", s.CachePages, s.CachePagesMax),
			fmt.Sprintf("at most cache_pages_max, itself at most capacity (%d)", s.Capacity)}
	}
	return nil
}

func (s *PoolStatus) decode(d *msgpack.Decoder, t TypeCode, field string) error {
	return fields(d, t, poolStatusKeys, func(i int) error {
		switch i {
		case 0:
			return readString(d, t, field+".name", PoolNameBytesMax, &s.Name)
		case 1:
			return readU32(d, t, field+".capacity", &s.Capacity)
		case 2:
			return readU32(d, t, field+".free", &s.Free)
		case 3:
			return readU64(d, t, field+".cross_tenant_rows", &s.CrossTenantRows)
		case 4:
			return readU64(d, t, field+".cross_request_rows", &s.CrossRequestRows)
		case 5:
			return readU32(d, t, field+".cache_pages", &s.CachePages)
		case 6:
			return readU32(d, t, field+".cache_pages_max", &s.CachePagesMax)
		}
		dst := [...]*uint64{&s.CacheQueries, &s.CacheQueryTokens, &s.CacheHitTokens, &s.CachePublished,
			&s.CacheEvicted, &s.CacheGone}[i-7]
		return readU64(d, t, field+"."+poolStatusKeys[i], dst)
	})
}

// MemberStatus is one cluster member as the answering node sees it.
type MemberStatus struct {
	// Name is 1 to NodeNameBytesMax bytes of UTF-8.
	Name string `msgpack:"name"`
	// Role is RolePrefill, RoleDecode, RoleRouter or RoleAll.
	Role        string `msgpack:"role"`
	Incarnation uint64 `msgpack:"inc"`
	// Address is the member's remote address (host:port).
	Address string `msgpack:"addr"`
	// DataPlane is the host:port of the member's KV data plane, "" when it
	// has none.
	DataPlane string `msgpack:"data_plane,omitempty"`
	// State is MemberAlive, MemberSuspect, MemberDead or MemberLeft.
	State string `msgpack:"state"`
	// CapacityPages and FreePages are the member's KV pages as it last
	// reported them.
	CapacityPages uint32 `msgpack:"capacity"`
	FreePages     uint32 `msgpack:"free"`
	Draining      bool   `msgpack:"draining,omitempty"`
	// Verified: the run at the member's remote address answered the run
	// challenge with the member's incarnation, under a certificate naming
	// its role and name (always true on an insecure node).
	Verified bool `msgpack:"verified,omitempty"`
	// Model is the fingerprint of the model the member serves,
	// FingerprintDigits hexadecimal digits ("" from a build before
	// fingerprints).
	Model string `msgpack:"model,omitempty"`
	// Unverified says why a member is not Verified (the last probe's
	// error, or that none has completed), in at most UnverifiedBytesMax
	// bytes of UTF-8; "" when Verified. StatusReply version 3.
	Unverified string `msgpack:"unverified,omitempty"`
}

var memberStatusKeys = []string{"name", "role", "inc", "addr", "data_plane", "state", "capacity", "free", "draining",
	"verified", "model", "unverified"}

func (s *MemberStatus) validate(t TypeCode, field string) error {
	if err := checkName(t, field+".name", s.Name, NodeNameBytesMax); err != nil {
		return err
	}
	if err := checkWord(t, field+".role", s.Role, roles); err != nil {
		return err
	}
	if err := checkAddr(t, field+".addr", s.Address, false); err != nil {
		return err
	}
	if err := checkAddr(t, field+".data_plane", s.DataPlane, true); err != nil {
		return err
	}
	if s.Model != "" {
		if err := CheckFingerprint(t, field+".model", s.Model); err != nil {
			return err
		}
	}
	if err := checkLen(t, field+".unverified", len(s.Unverified), UnverifiedBytesMax); err != nil {
		return err
	}
	if err := checkUTF8(t, field+".unverified", s.Unverified); err != nil {
		return err
	}
	return checkWord(t, field+".state", s.State, memberStates)
}

func (s *MemberStatus) decode(d *msgpack.Decoder, t TypeCode, field string) error {
	return fields(d, t, memberStatusKeys, func(i int) error {
		switch i {
		case 0:
			return readString(d, t, field+".name", NodeNameBytesMax, &s.Name)
		case 1:
			return readString(d, t, field+".role", wordBytesMax, &s.Role)
		case 2:
			return readU64(d, t, field+".inc", &s.Incarnation)
		case 3:
			return readString(d, t, field+".addr", AddrBytesMax, &s.Address)
		case 4:
			return readString(d, t, field+".data_plane", AddrBytesMax, &s.DataPlane)
		case 5:
			return readString(d, t, field+".state", wordBytesMax, &s.State)
		case 6:
			return readU32(d, t, field+".capacity", &s.CapacityPages)
		case 7:
			return readU32(d, t, field+".free", &s.FreePages)
		case 8:
			return readBool(d, t, field+".draining", &s.Draining)
		case 9:
			return readBool(d, t, field+".verified", &s.Verified)
		case 10:
			return readString(d, t, field+".model", FingerprintDigits, &s.Model)
		default:
			return readString(d, t, field+".unverified", UnverifiedBytesMax, &s.Unverified)
		}
	})
}

// DrainRequest asks a node to drain: take no new work, finish the requests
// in flight, then leave the cluster.
type DrainRequest struct {
	// Wait asks for the DrainReply when the drain is done rather than at
	// once.
	Wait bool `msgpack:"wait,omitempty"`
	// Stay keeps the requests in flight where they are until they end; by
	// default a decode node moves each it can to another decode node
	// first (version 2; a node of an older build moves none, and refuses
	// a Stay by its version).
	Stay bool `msgpack:"stay,omitempty"`
}

var drainRequestKeys = []string{"wait", "stay"}

func (*DrainRequest) TypeCode() TypeCode { return TypeDrainRequest }

func (m *DrainRequest) wireVersion() uint8 {
	if m.Stay {
		return 2
	}
	return 1
}

func (*DrainRequest) Validate() error { return nil }

func (m *DrainRequest) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeDrainRequest
	return fields(d, t, drainRequestKeys, func(i int) error {
		if i == 0 {
			return readBool(d, t, "wait", &m.Wait)
		}
		return readBool(d, t, "stay", &m.Stay)
	})
}

// DrainReply answers a DrainRequest.
type DrainReply struct {
	// InFlight is the number of requests still in flight.
	InFlight uint32 `msgpack:"in_flight"`
	// Done: the drain is over; InFlight is then 0.
	Done bool `msgpack:"done"`
}

var drainReplyKeys = []string{"in_flight", "done"}

func (*DrainReply) TypeCode() TypeCode { return TypeDrainReply }

func (m *DrainReply) Validate() error {
	if m.Done && m.InFlight != 0 {
		return &InvalidFieldError{TypeDrainReply, "in_flight", fmt.Sprint(m.InFlight), "0 when done"}
	}
	return nil
}

func (m *DrainReply) DecodeMsgpack(d *msgpack.Decoder) error {
	const t = TypeDrainReply
	return fields(d, t, drainReplyKeys, func(i int) error {
		if i == 0 {
			return readU32(d, t, "in_flight", &m.InFlight)
		}
		return readBool(d, t, "done", &m.Done)
	})
}
