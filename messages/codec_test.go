package messages

import (
	"bytes"
	"errors"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/kv"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/protobuf/proto"
)

// samples holds one valid message of every type with every field set, so
// that round trips exercise every key.

// testFingerprint is a well-formed model fingerprint.
const testFingerprint = "00112233445566778899aabbccddeeff"

func samples() []Message {
	return append([]Message{
		&GenerateRequest{RequestID: 7, Tenant: "acme", Prompt: "The capital of France is", MaxTokens: 16, Stream: true},
		&GenerateRequest{RequestID: 7, Tenant: "acme", Prompt: "x", MaxTokens: 1, CacheSalt: "user-42 ✓"},
		&TokenBatch{Items: []StreamItem{
			{To: "rx$a1", Chunk: &TokenChunk{RequestID: 7, Seq: 1, Tokens: []uint32{1, 300}, Text: " Par"}},
			{To: "rx$b2", Chunk: &TokenChunk{RequestID: 8, Seq: 4, Tokens: []uint32{70000}}},
			{To: "rx$a1", Result: &GenerateResult{RequestID: 7, Tokens: []uint32{1, 300}, Text: " Par", FinishReason: FinishLength}},
			{To: "rx$c3", Result: &GenerateResult{RequestID: 9, FinishReason: FinishError, Err: &WireError{Code: CodeBusy, Message: "busy"}}},
		}},
		&TokenChunk{RequestID: 7, Seq: 3, Tokens: []uint32{1, 300, 70000}, Text: " Paris"},
		&GenerateResult{RequestID: 7, Tokens: []uint32{5, 6, math.MaxUint32}, Text: " Paris.", FinishReason: FinishStop},
		&GenerateResult{RequestID: 8, FinishReason: FinishError,
			Err: &WireError{Code: CodePromptTooLong, Message: "prompt too long", Have: 9000, Limit: 8192, Where: "context window"}},
		&CancelRequest{RequestID: 7, Tenant: "acme"},
		&CancelRequest{RequestID: 7, Tenant: "acme", Reason: CancelStop},
		&GenerateResult{RequestID: 7, Tokens: []uint32{5, 6}, Text: " Par", FinishReason: FinishStopSequence},
		&GenerateResult{RequestID: 7, Tokens: []uint32{5}, FinishReason: FinishLength, CachedTokens: 512},
		&TransferPlan{RequestID: 1 << 40, Tenant: "globex", TokenCount: 5, PromptTokens: []uint32{1, 2, 3, 4, 5}, PageTokens: 2,
			DestTags:  []kv.Tag{{Incarnation: math.MaxUint64, Index: 0, Generation: 1}, {Incarnation: 9, Index: math.MaxUint32, Generation: 2}, {Incarnation: 9, Index: 4, Generation: math.MaxUint64}},
			DataPlane: "decode-1.internal:7070", Model: testFingerprint, CacheSalt: "conversation-9", HeldPages: 2},
		&TransferAck{RequestID: 1 << 40, Tenant: "globex", TokenCount: 5, Pages: 3},
		&CacheSummaryRequest{},
		&CacheSummary{Incarnation: 7},
		&CacheSummary{Incarnation: math.MaxUint64, Keys: []kv.PrefixKey{{1, 2, 3}, {15: 0xff}}},
		&CacheSummary{Incarnation: 7, DecodeCache: true},
		&TransferAbort{RequestID: 1 << 40, Tenant: "globex", Reason: WireError{Code: CodeIntegrity, Message: "checksum mismatch on page 2", Have: 2, Where: "decode"}},
		&TransferDone{RequestID: 1 << 40, Tenant: "globex", First: 70000, Frames: 3, Source: 9, Sums: []uint64{1, 1 << 63, 7}},
		&TransferDone{RequestID: 1 << 40, Tenant: "globex", First: 1, Frames: 3, Source: 9, Sums: []uint64{1, 2, 3}, Cached: 32},
		&TransferDone{RequestID: 1 << 40, Tenant: "globex", First: 1, Frames: 1, Source: 9, Sums: []uint64{3}, HeldSums: []uint64{1 << 63, 2}},
		&TransferDone{RequestID: 1 << 41, Tenant: "globex", Err: &WireError{Code: CodeNodeLost, Message: "data plane unreachable", Where: "[::1]:7070"}},
		&RoutedRequest{RequestID: 7, Tenant: "acme", Prompt: "The capital of France is", MaxTokens: 16, Prefill: "10.0.0.2:8090", PrefillIncarnation: math.MaxUint64, DecodeIncarnation: 0x1234, Attempt: 2, CacheSalt: "s"},
		&StatusRequest{},
		&StatusReply{
			Node: NodeStatus{Name: "decode-1", Role: RoleDecode, Incarnation: 1 << 33, Address: "10.0.0.1:8090", DataPlane: "10.0.0.1:7070", Draining: true,
				InFlight: 3, Admitted: 100, Completed: 90, Failed: 4, RejectedTooLong: 2, RejectedBusy: math.MaxUint64,
				Pools: []PoolStatus{{Name: "gpu0", Capacity: 4096, Free: 4000, CrossTenantRows: 3, CrossRequestRows: math.MaxUint64},
					{Name: "host", Capacity: math.MaxUint32, Free: math.MaxUint32}},
				Identity: "kvwarden://prod/decode/decode-1", Refused: []uint64{0, 3, math.MaxUint64},
				Chaos: true, Faults: "seed=7,frame-drop=0.02,ack-drop=1", FaultCounts: []uint64{4, 0, 0, 0, 0, math.MaxUint64},
				Model: "stories260K.bin", ModelFingerprint: testFingerprint, FailedByCode: []uint64{0, 2, 7, 0, 1},
				WaitingPages: 1, WaitingKV: 2, Running: math.MaxUint32, PrefillQueued: 4, PrefillInFlight: 5,
				RejectedBy: []uint64{1, 0, math.MaxUint64}, Integrity: []uint64{0, 0, 0, 9},
				KVReceived: &TransferStatus{Transfers: 7, Pages: 21, Bytes: 1 << 40, FailedByCode: []uint64{0, 0, 0, 1}},
				TokensOut:  12345,
				Tenants:    &TenantsStatus{Named: 3, DefaultWeight: 1, DefaultConcurrentMax: 64, DefaultPoolPercentMax: 75, Active: math.MaxUint32},
				FirstToken: &FirstTokenStatus{Requests: 90, QueueNs: 1, PrefillNs: 1 << 40, TransferNs: 3, VerifyNs: math.MaxUint64, Decoded: 89, FirstDecodeNs: 5},
				MovedOut:   4, MovedIn: math.MaxUint64, StreamsMoved: 1},
			Members: []MemberStatus{
				{Name: "prefill-1", Role: RolePrefill, Incarnation: 9, Address: "10.0.0.2:8090", DataPlane: "10.0.0.2:7070", State: MemberAlive, CapacityPages: 2048, FreePages: 17, Draining: true, Verified: true, Model: testFingerprint},
				{Name: "router", Role: RoleRouter, Incarnation: 1, Address: "[fe80::1]:8090", State: MemberSuspect,
					Unverified: "cluster: member router announces incarnation 0000000000000001, but the run answers 0000000000000002"},
			},
		},
		&DrainRequest{Wait: true},
		&DrainReply{InFlight: 3},
		&DrainReply{Done: true},
		&PressureRequest{Pages: 64, DurationMs: 1500},
		&PressureReply{Held: []PoolHeld{{Name: "decode-0/pool", Pages: 64}, {Name: "decode-1/pool", Pages: 0}}},
		&PressureReply{Err: &WireError{Code: CodeBadRequest, Message: "no fault points"}},
		sampleMove(),
		&MoveRequest{MoveID: 1, Tenant: "t", ClientID: 1, Receiver: "[::1]:9", ReceiverID: "r", Prompt: []uint32{1},
			Tokens: []uint32{7}, MaxTokens: 2, Seq: 1, PageTokens: 1, Layout: []uint32{1}, SourceIncarnation: 1,
			TargetIncarnation: 1, Model: testFingerprint},
		&MovePlan{MoveID: 9, Tenant: "globex", Request: 1 << 40, DestTags: []kv.Tag{{Incarnation: 3, Index: 0, Generation: 1},
			{Incarnation: 3, Index: 7, Generation: math.MaxUint64}}, DataPlane: "decode-2.internal:7071"},
		&StreamMoved{RequestID: 7, Seq: 12, To: "10.0.0.3:8090", ToID: "request-0f3c", ToIncarnation: math.MaxUint64},
		&StreamTake{RequestID: 7, Seq: 12},
		&DrainRequest{Wait: true, Stay: true},
		&MigrateRequest{},
		&MigrateRequest{Number: 1 << 40, Incarnation: 0xabc},
		&MigrateReply{Moved: 15},
		&MigrateReply{Moved: 3, Stayed: 2, Err: &WireError{Code: CodeBusy, Message: "no decode node took it"}},
	}, inFlightSamples()...)
}

// sampleMove is a valid MoveRequest: a prompt of 5 tokens in pages of 4,
// 3 tokens streamed, so 7 positions in a page of 4 and a tail of 3.
func sampleMove() *MoveRequest {
	return &MoveRequest{MoveID: 1 << 40, Tenant: "acme", ClientID: 77, Receiver: "router-1.internal:8090",
		ReceiverID: "batched-relay-9f2a", Prompt: []uint32{1, 2, 3, 4, 5}, Tokens: []uint32{6, 7, 8}, MaxTokens: 64, Seq: 3,
		PageTokens: 4, Layout: []uint32{4, 3}, SourceIncarnation: 0xabc, TargetIncarnation: 0xdef, Model: testFingerprint,
		CacheSalt: "conversation-9", TimeLeftMs: 59_000, CachedTokens: 4}
}

// sampleOf returns the first sample of type M, freshly built.
func sampleOf[M Message]() M {
	for _, m := range samples() {
		if s, ok := m.(M); ok {
			return s
		}
	}
	panic("no sample")
}

func mustEncode(t testing.TB, m Message) []byte {
	t.Helper()
	b, err := Encode(m)
	if err != nil {
		t.Fatalf("Encode(%T): %v", m, err)
	}
	return b
}

func TestEveryTypeHasSample(t *testing.T) {
	have := map[TypeCode]bool{}
	for _, m := range samples() {
		have[m.TypeCode()] = true
	}
	for _, c := range TypeCodes() {
		if !have[c] {
			t.Errorf("no sample of %s", c)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for _, m := range samples() {
		t.Run(m.TypeCode().String(), func(t *testing.T) {
			frame := mustEncode(t, m)
			if got := TypeCode(uint16(frame[0])<<8 | uint16(frame[1])); got != m.TypeCode() {
				t.Fatalf("header type %d, want %d", got, m.TypeCode())
			}
			got, err := Decode(frame)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip\n got %#v\nwant %#v", got, m)
			}
		})
	}
}

// TestEnvelopeRoundTrip goes through exactly what protoactor does: Serialize
// on the sender, protobuf marshal, look the type up by name, unmarshal,
// Deserialize.
func TestEnvelopeRoundTrip(t *testing.T) {
	for _, m := range samples() {
		rs, err := m.Serialize()
		if err != nil {
			t.Fatalf("%s: Serialize: %v", m.TypeCode(), err)
		}
		pm := rs.(proto.Message)
		if name := string(proto.MessageName(pm)); name != EnvelopeTypeName {
			t.Fatalf("envelope name %q, want %q", name, EnvelopeTypeName)
		}
		b, err := proto.Marshal(pm)
		if err != nil {
			t.Fatal(err)
		}
		env := new(envelope)
		if err := proto.Unmarshal(b, env); err != nil {
			t.Fatal(err)
		}
		got, err := env.Deserialize()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("%s: envelope round trip\n got %#v\nwant %#v", m.TypeCode(), got, m)
		}
	}
}

// TestKeysMatchTags checks that each hand-written decoder reads exactly the
// keys msgpack's encoder writes from the struct tags.
func TestKeysMatchTags(t *testing.T) {
	cases := []struct {
		v    any
		keys []string
	}{
		{GenerateRequest{}, generateRequestKeys},
		{TokenChunk{}, tokenChunkKeys},
		{GenerateResult{}, generateResultKeys},
		{CancelRequest{}, cancelRequestKeys},
		{TransferPlan{}, transferPlanKeys},
		{TransferAck{}, transferAckKeys},
		{TransferAbort{}, transferAbortKeys},
		{TransferDone{}, transferDoneKeys},
		{RoutedRequest{}, routedRequestKeys},
		{StatusRequest{}, statusRequestKeys},
		{StatusReply{}, statusReplyKeys},
		{NodeStatus{}, nodeStatusKeys},
		{PoolStatus{}, poolStatusKeys},
		{TransferStatus{}, transferStatusKeys},
		{TenantsStatus{}, tenantsStatusKeys},
		{FirstTokenStatus{}, firstTokenStatusKeys},
		{MemberStatus{}, memberStatusKeys},
		{DrainRequest{}, drainRequestKeys},
		{DrainReply{}, drainReplyKeys},
		{PressureRequest{}, pressureRequestKeys},
		{PressureReply{}, pressureReplyKeys},
		{PoolHeld{}, poolHeldKeys},
		{ListInFlight{}, listInFlightKeys},
		{InFlightList{}, inFlightListKeys},
		{InFlight{}, inFlightKeys},
		{CancelInFlight{}, cancelInFlightKeys},
		{CancelInFlightReply{}, cancelInFlightReplyKeys},
		{MoveRequest{}, moveRequestKeys},
		{MovePlan{}, movePlanKeys},
		{StreamMoved{}, streamMovedKeys},
		{StreamTake{}, streamTakeKeys},
		{MigrateRequest{}, migrateRequestKeys},
		{MigrateReply{}, migrateReplyKeys},
		{WireError{}, wireErrorKeys},
		{kv.Tag{}, tagKeys},
	}
	for _, c := range cases {
		typ := reflect.TypeOf(c.v)
		var tags []string
		for i := range typ.NumField() {
			tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("msgpack"), ",")
			if tag == "" || tag == "-" {
				t.Errorf("%s.%s has no msgpack name", typ.Name(), typ.Field(i).Name)
			}
			tags = append(tags, tag)
		}
		if !slices.Equal(tags, c.keys) || len(c.keys) > 64 {
			t.Errorf("%s: tags %v, decoder keys %v", typ.Name(), tags, c.keys)
		}
	}
}

// TestWorstCaseFits encodes the largest valid message of every type and
// checks that it fits MessageBytesMax: Validate's limits must imply it,
// since Send checks only Validate.
func TestWorstCaseFits(t *testing.T) {
	big := func(n int) []uint32 {
		s := make([]uint32, n)
		for i := range s {
			s[i] = math.MaxUint32
		}
		return s
	}
	tenant := strings.Repeat("t", TenantBytesMax)
	// A 4-byte UTF-8 rune repeated: the longest valid prompt in bytes.
	prompt := strings.Repeat("𝄞", PromptBytesMax/4)
	tags := make([]kv.Tag, PlanTagsMax)
	for i := range tags {
		tags[i] = kv.Tag{Incarnation: math.MaxUint64, Index: math.MaxUint32 - uint32(i), Generation: math.MaxUint64}
	}
	werr := WireError{Code: math.MaxUint16, Message: strings.Repeat("m", ErrorMessageBytesMax), Have: math.MaxUint64, Limit: math.MaxUint64, Where: strings.Repeat("w", WhereBytesMax)}
	addr := strings.Repeat("h", AddrBytesMax-len(":65535")) + ":65535"
	name := strings.Repeat("n", NodeNameBytesMax)
	pools := make([]PoolStatus, PoolsMax)
	held := make([]PoolHeld, PoolsMax)
	for i := range pools {
		pools[i] = PoolStatus{Name: strings.Repeat("p", PoolNameBytesMax), Capacity: math.MaxUint32, Free: math.MaxUint32,
			CrossTenantRows: math.MaxUint64, CrossRequestRows: math.MaxUint64}
		held[i] = PoolHeld{Name: pools[i].Name, Pages: math.MaxUint32}
	}
	transfer := TransferStatus{Transfers: math.MaxUint64, Pages: math.MaxUint64, Bytes: math.MaxUint64,
		FailedByCode: slices.Repeat([]uint64{math.MaxUint64}, CodesMax)}
	members := make([]MemberStatus, MembersMax)
	for i := range members {
		members[i] = MemberStatus{Name: name, Role: RolePrefill, Incarnation: math.MaxUint64, Address: addr, DataPlane: addr,
			State: MemberSuspect, CapacityPages: math.MaxUint32, FreePages: math.MaxUint32, Draining: true, Verified: true,
			Model: testFingerprint, Unverified: strings.Repeat("x", UnverifiedBytesMax)}
	}
	worst := []Message{
		&GenerateRequest{RequestID: math.MaxUint64, Tenant: tenant, Prompt: prompt, MaxTokens: GenerateTokensMax, Stream: true,
			CacheSalt: strings.Repeat("s", kv.CacheSaltBytesMax)},
		&TokenChunk{RequestID: math.MaxUint64, Seq: math.MaxUint32, Tokens: big(ChunkTokensMax), Text: strings.Repeat("x", TextBytesMax)},
		&GenerateResult{RequestID: math.MaxUint64, Tokens: big(GenerateTokensMax), Text: strings.Repeat("x", TextBytesMax), FinishReason: FinishLength,
			CachedTokens: math.MaxUint32},
		&GenerateResult{RequestID: math.MaxUint64, FinishReason: FinishError, Err: &werr},
		&CancelRequest{RequestID: math.MaxUint64, Tenant: tenant, Reason: CancelStop},
		&TransferPlan{RequestID: math.MaxUint64, Tenant: tenant, TokenCount: PromptTokensMax, PromptTokens: big(PromptTokensMax),
			PageTokens: PromptTokensMax / PlanTagsMax, DestTags: tags, DataPlane: addr, Model: testFingerprint,
			CacheSalt: strings.Repeat("s", kv.CacheSaltBytesMax)},
		&TransferAck{RequestID: math.MaxUint64, Tenant: tenant, TokenCount: PromptTokensMax, Pages: PlanTagsMax},
		&TransferAbort{RequestID: math.MaxUint64, Tenant: tenant, Reason: werr},
		&TransferDone{RequestID: math.MaxUint64, Tenant: tenant, First: math.MaxUint32, Frames: math.MaxUint32,
			Source: math.MaxUint64, Sums: slices.Repeat([]uint64{math.MaxUint64}, PlanTagsMax), Cached: math.MaxUint32},
		&TransferDone{RequestID: math.MaxUint64, Tenant: tenant, Err: &werr},
		&RoutedRequest{RequestID: math.MaxUint64, Tenant: tenant, Prompt: prompt, MaxTokens: GenerateTokensMax,
			Prefill: addr, PrefillIncarnation: math.MaxUint64, DecodeIncarnation: math.MaxUint64, Attempt: RouteAttemptsMax},
		&StatusRequest{},
		&StatusReply{
			Node: NodeStatus{Name: name, Role: RolePrefill, Incarnation: math.MaxUint64, Address: addr, DataPlane: addr, Draining: true,
				InFlight: math.MaxUint32, Admitted: math.MaxUint64, Completed: math.MaxUint64, Failed: math.MaxUint64,
				RejectedTooLong: math.MaxUint64, RejectedBusy: math.MaxUint64, Pools: pools, Insecure: true,
				Identity: strings.Repeat("i", IdentityBytesMax), Refused: slices.Repeat([]uint64{math.MaxUint64}, RefusalKindsMax),
				// The longest valid spec: spaces around an item are allowed.
				Chaos: true, Faults: "seed=18446744073709551615" + strings.Repeat(" ", FaultSpecBytesMax-len("seed=18446744073709551615")),
				FaultCounts: slices.Repeat([]uint64{math.MaxUint64}, FaultKindsMax),
				Model:       name, ModelFingerprint: testFingerprint, FailedByCode: slices.Repeat([]uint64{math.MaxUint64}, CodesMax),
				WaitingPages: math.MaxUint32, WaitingKV: math.MaxUint32, Running: math.MaxUint32,
				PrefillQueued: math.MaxUint32, PrefillInFlight: math.MaxUint32,
				RejectedBy: slices.Repeat([]uint64{math.MaxUint64}, RejectBoundsMax),
				Integrity:  slices.Repeat([]uint64{math.MaxUint64}, IntegrityReasonsMax),
				KVSent:     &transfer, KVReceived: &transfer, TokensOut: math.MaxUint64,
				FirstToken: &FirstTokenStatus{math.MaxUint64, math.MaxUint64, math.MaxUint64, math.MaxUint64, math.MaxUint64, math.MaxUint64, math.MaxUint64},
				MovedOut:   math.MaxUint64, MovedIn: math.MaxUint64, StreamsMoved: math.MaxUint64},
			Members: members,
		},
		&DrainRequest{Wait: true},
		&DrainReply{InFlight: math.MaxUint32},
		&PressureRequest{Pages: PressurePagesMax, DurationMs: PressureDurationMsMax},
		&PressureReply{Held: held},
		&PressureReply{Err: &werr},
	}
	// A move of every position there can be, in the most pages.
	positions := PromptTokensMax + GenerateTokensMax - 2
	movePage := (positions + PlanTagsMax - 1) / PlanTagsMax
	layout := slices.Repeat([]uint32{uint32(movePage)}, PlanTagsMax-1)
	layout = append(layout, uint32(positions-(PlanTagsMax-1)*movePage))
	worst = append(worst, &CacheSummary{Incarnation: math.MaxUint64, Keys: make([]kv.PrefixKey, CacheSummaryKeysMax)},
		worstBatch(big(ChunkTokensMax), big(GenerateTokensMax), werr),
		&MoveRequest{MoveID: math.MaxUint64, Tenant: tenant, ClientID: math.MaxUint64, Receiver: addr,
			ReceiverID: strings.Repeat("r", StreamToBytesMax), Prompt: big(PromptTokensMax), Tokens: big(GenerateTokensMax - 1),
			MaxTokens: GenerateTokensMax, Seq: GenerateTokensMax - 1, PageTokens: uint32(movePage), Layout: layout,
			SourceIncarnation: math.MaxUint64, TargetIncarnation: math.MaxUint64, Model: testFingerprint,
			CacheSalt: strings.Repeat("s", kv.CacheSaltBytesMax), TimeLeftMs: math.MaxUint32, CachedTokens: PromptTokensMax - 1},
		&MovePlan{MoveID: math.MaxUint64, Tenant: tenant, Request: math.MaxUint64, DestTags: tags, DataPlane: addr},
		&StreamMoved{RequestID: math.MaxUint64, Seq: GenerateTokensMax, To: addr, ToID: strings.Repeat("r", StreamToBytesMax),
			ToIncarnation: math.MaxUint64},
		&StreamTake{RequestID: math.MaxUint64, Seq: GenerateTokensMax},
		&MigrateRequest{Number: math.MaxUint64, Incarnation: math.MaxUint64},
		&MigrateReply{Moved: math.MaxUint32, Stayed: math.MaxUint32, Err: &werr})
	for _, m := range worst {
		frame := mustEncode(t, m)
		t.Logf("%-16s worst case %8d bytes (limit %d)", m.TypeCode(), len(frame), MessageBytesMax)
		if _, err := Decode(frame); err != nil {
			t.Errorf("%s: worst case does not decode: %v", m.TypeCode(), err)
		}
	}
}

// worstBatch is a TokenBatch whose items' WireBytesMax sum to
// StreamBatchBytesMax: full chunks and results, each of the largest
// values, then one more chunk's text up to the bound.
func worstBatch(chunkTokens, resultTokens []uint32, werr WireError) *TokenBatch {
	to := strings.Repeat("x", StreamToBytesMax)
	b := &TokenBatch{Items: []StreamItem{
		{To: to, Result: &GenerateResult{RequestID: math.MaxUint64, Tokens: resultTokens, Text: strings.Repeat("x", TextBytesMax),
			FinishReason: FinishLength, CachedTokens: math.MaxUint32}},
		{To: to, Result: &GenerateResult{RequestID: math.MaxUint64, FinishReason: FinishError, Err: &werr}},
	}}
	used := 0
	for i := range b.Items {
		used += b.Items[i].WireBytesMax()
	}
	for {
		it := StreamItem{To: to, Chunk: &TokenChunk{RequestID: math.MaxUint64, Seq: math.MaxUint32, Tokens: chunkTokens}}
		room := StreamBatchBytesMax - used - it.WireBytesMax()
		if room <= 0 {
			return b
		}
		it.Chunk.Text = strings.Repeat("x", min(room, TextBytesMax))
		used += it.WireBytesMax()
		b.Items = append(b.Items, it)
	}
}

func TestValidateRefuses(t *testing.T) {
	okPlan := func() *TransferPlan { return sampleOf[*TransferPlan]() }
	okRouted := func() *RoutedRequest { return sampleOf[*RoutedRequest]() }
	okStatus := func() *StatusReply { return sampleOf[*StatusReply]() }
	var tooLarge *TooLargeError
	var invalid *InvalidFieldError
	cases := []struct {
		name string
		m    Message
		want any
	}{
		{"zero id", &CancelRequest{Tenant: "a"}, &invalid},
		{"empty tenant", &CancelRequest{RequestID: 1}, &invalid},
		{"long tenant", &CancelRequest{RequestID: 1, Tenant: strings.Repeat("a", TenantBytesMax+1)}, &tooLarge},
		{"tenant with space", &CancelRequest{RequestID: 1, Tenant: "a b"}, &invalid},
		{"tenant non-ascii", &CancelRequest{RequestID: 1, Tenant: "é"}, &invalid},
		{"unknown cancel reason", &CancelRequest{RequestID: 1, Tenant: "a", Reason: CancelStop + 1}, &invalid},
		{"err with stop sequence", &GenerateResult{RequestID: 1, FinishReason: FinishStopSequence, Err: &WireError{Code: CodeBusy}}, &invalid},
		{"long prompt", &GenerateRequest{RequestID: 1, Tenant: "a", Prompt: strings.Repeat("p", PromptBytesMax+1), MaxTokens: 1}, &tooLarge},
		{"bad utf8 prompt", &GenerateRequest{RequestID: 1, Tenant: "a", Prompt: "\xff", MaxTokens: 1}, &invalid},
		{"zero max tokens", &GenerateRequest{RequestID: 1, Tenant: "a", Prompt: "p"}, &invalid},
		{"many max tokens", &GenerateRequest{RequestID: 1, Tenant: "a", Prompt: "p", MaxTokens: GenerateTokensMax + 1}, &tooLarge},
		{"empty chunk", &TokenChunk{RequestID: 1}, &invalid},
		{"big chunk", &TokenChunk{RequestID: 1, Tokens: make([]uint32, ChunkTokensMax+1)}, &tooLarge},
		{"no finish", &GenerateResult{RequestID: 1}, &invalid},
		{"empty batch", &TokenBatch{}, &invalid},
		{"move of no token streamed", func() Message { m := sampleMove(); m.Tokens, m.Seq = nil, 0; return m }(), &invalid},
		{"move with nothing left", func() Message { m := sampleMove(); m.MaxTokens = 3; return m }(), &tooLarge},
		{"move's seq past its tokens", func() Message { m := sampleMove(); m.Seq = 4; return m }(), &tooLarge},
		{"move's layout a token short", func() Message { m := sampleMove(); m.Layout = []uint32{4, 2}; return m }(), &invalid},
		{"move's page over its size", func() Message { m := sampleMove(); m.Layout = []uint32{5, 2}; return m }(), &tooLarge},
		{"move's empty page", func() Message { m := sampleMove(); m.Layout = []uint32{4, 0, 3}; return m }(), &invalid},
		{"move's layout of one-token pages", func() Message {
			m := sampleMove()
			m.Prompt, m.MaxTokens, m.PageTokens = make([]uint32, 40), 64, 4
			m.Layout = slices.Repeat([]uint32{1}, m.Positions())
			return m
		}(), &tooLarge},
		{"move to no receiver", func() Message { m := sampleMove(); m.ReceiverID = ""; return m }(), &invalid},
		{"move's whole prompt cached", func() Message { m := sampleMove(); m.CachedTokens = 5; return m }(), &invalid},
		{"move of no target run", func() Message { m := sampleMove(); m.TargetIncarnation = 0; return m }(), &invalid},
		{"move of another model", func() Message { m := sampleMove(); m.Model = "abc"; return m }(), &invalid},
		{"move plan of no pages", &MovePlan{MoveID: 1, Tenant: "a", Request: 1, DataPlane: "h:1"}, &invalid},
		{"move plan naming a page twice", &MovePlan{MoveID: 1, Tenant: "a", Request: 1, DataPlane: "h:1",
			DestTags: []kv.Tag{{Incarnation: 1, Index: 2, Generation: 1}, {Incarnation: 1, Index: 2, Generation: 2}}}, &invalid},
		{"move plan with no data plane", &MovePlan{MoveID: 1, Tenant: "a", Request: 1,
			DestTags: []kv.Tag{{Incarnation: 1, Index: 2, Generation: 1}}}, &invalid},
		{"stream moved to no run", &StreamMoved{RequestID: 1, Seq: 1, To: "h:1", ToID: "x"}, &invalid},
		{"stream moved before a chunk", &StreamMoved{RequestID: 1, To: "h:1", ToID: "x", ToIncarnation: 1}, &invalid},
		{"stream taken of no request", &StreamTake{Seq: 1}, &invalid},
		{"migrate of a number of no run", &MigrateRequest{Number: 3}, &invalid},
		{"migrate reply of an error and no request stayed", &MigrateReply{Moved: 1, Err: &WireError{Code: CodeBusy}}, &invalid},
		{"batch item of both", &TokenBatch{Items: []StreamItem{{To: "a", Chunk: &TokenChunk{RequestID: 1, Seq: 1, Tokens: []uint32{1}},
			Result: &GenerateResult{RequestID: 1, FinishReason: FinishStop}}}}, &invalid},
		{"batch item of neither", &TokenBatch{Items: []StreamItem{{To: "a"}}}, &invalid},
		{"batch item to no one", &TokenBatch{Items: []StreamItem{{Chunk: &TokenChunk{RequestID: 1, Seq: 1, Tokens: []uint32{1}}}}}, &invalid},
		{"batch item invalid", &TokenBatch{Items: []StreamItem{{To: "a", Chunk: &TokenChunk{RequestID: 1}}}}, &invalid},
		{"batch over its bytes", func() Message {
			b := worstBatch(make([]uint32, ChunkTokensMax), make([]uint32, GenerateTokensMax), WireError{Code: CodeBusy})
			b.Items[len(b.Items)-1].Chunk.Text += strings.Repeat("x", StreamBatchBytesMax)
			b.Items[len(b.Items)-1].Chunk.Text = b.Items[len(b.Items)-1].Chunk.Text[:TextBytesMax]
			b.Items = append(b.Items, b.Items[len(b.Items)-1])
			return b
		}(), &tooLarge},
		{"batch of too many items", &TokenBatch{Items: slices.Repeat([]StreamItem{{To: "a", Chunk: &TokenChunk{RequestID: 1, Seq: 1, Tokens: []uint32{1}}}}, StreamItemsMax+1)}, &tooLarge},
		{"error without err", &GenerateResult{RequestID: 1, FinishReason: FinishError}, &invalid},
		{"err with stop", &GenerateResult{RequestID: 1, FinishReason: FinishStop, Err: &WireError{Code: CodeBusy}}, &invalid},
		{"error with tokens", &GenerateResult{RequestID: 1, FinishReason: FinishError, Tokens: []uint32{1}, Err: &WireError{Code: CodeBusy}}, &invalid},
		{"zero error code", &GenerateResult{RequestID: 1, FinishReason: FinishError, Err: &WireError{}}, &invalid},
		{"long error message", &TransferAbort{RequestID: 1, Tenant: "a", Reason: WireError{Code: 1, Message: strings.Repeat("m", ErrorMessageBytesMax+1)}}, &tooLarge},
		{"plan count mismatch", func() Message { p := okPlan(); p.TokenCount = 4; return p }(), &invalid},
		{"plan zero page tokens", func() Message { p := okPlan(); p.PageTokens = 0; return p }(), &invalid},
		{"plan too few tags", func() Message { p := okPlan(); p.DestTags = p.DestTags[:2]; return p }(), &invalid},
		{"plan zero generation", func() Message { p := okPlan(); p.DestTags[1].Generation = 0; return p }(), &invalid},
		{"plan holds every page", func() Message { p := okPlan(); p.HeldPages = 3; return p }(), &invalid},
		{"plan page twice", func() Message { p := okPlan(); p.DestTags[2].Index = p.DestTags[1].Index; return p }(), &invalid},
		{"plan too many tags", func() Message {
			p := okPlan()
			p.TokenCount, p.PageTokens = PlanTagsMax+1, 1
			p.PromptTokens = make([]uint32, PlanTagsMax+1)
			p.DestTags = make([]kv.Tag, PlanTagsMax+1)
			return p
		}(), &tooLarge},
		{"ack zero pages", &TransferAck{RequestID: 1, Tenant: "a", TokenCount: 1}, &invalid},
		{"plan data plane without port", func() Message { p := okPlan(); p.DataPlane = "decode-1"; return p }(), &invalid},
		{"plan data plane empty port", func() Message { p := okPlan(); p.DataPlane = "decode-1:"; return p }(), &invalid},
		{"plan no model", func() Message { p := okPlan(); p.Model = ""; return p }(), &invalid},
		{"plan model in capitals", func() Message { p := okPlan(); p.Model = strings.ToUpper(testFingerprint); return p }(), &invalid},
		{"plan short model", func() Message { p := okPlan(); p.Model = testFingerprint[1:]; return p }(), &invalid},
		{"plan long data plane", func() Message { p := okPlan(); p.DataPlane = strings.Repeat("h", AddrBytesMax) + ":1"; return p }(), &tooLarge},
		{"done zero id", &TransferDone{Tenant: "a", Frames: 1, Source: 1, Sums: []uint64{1}}, &invalid},
		{"done bad tenant", &TransferDone{RequestID: 1, Tenant: "a b", Frames: 1, Source: 1, Sums: []uint64{1}}, &invalid},
		{"done no frames", &TransferDone{RequestID: 1, Tenant: "a", First: 5, Source: 1, Sums: []uint64{1}}, &invalid},
		{"done no source", &TransferDone{RequestID: 1, Tenant: "a", Frames: 1, Sums: []uint64{1}}, &invalid},
		{"done no sums", &TransferDone{RequestID: 1, Tenant: "a", Frames: 1, Source: 1}, &invalid},
		{"done too many sums", &TransferDone{RequestID: 1, Tenant: "a", Frames: 1, Source: 1, Sums: make([]uint64, PlanTagsMax+1)}, &tooLarge},
		{"done error with first", &TransferDone{RequestID: 1, Tenant: "a", First: 5, Err: &WireError{Code: CodeInternal}}, &invalid},
		{"done error with frames", &TransferDone{RequestID: 1, Tenant: "a", Frames: 2, Err: &WireError{Code: CodeInternal}}, &invalid},
		{"done error with sums", &TransferDone{RequestID: 1, Tenant: "a", Sums: []uint64{1}, Err: &WireError{Code: CodeInternal}}, &invalid},
		{"done error with held sums", &TransferDone{RequestID: 1, Tenant: "a", HeldSums: []uint64{1}, Err: &WireError{Code: CodeInternal}}, &invalid},
		{"done too many pages", &TransferDone{RequestID: 1, Tenant: "a", Frames: 1, Source: 1, Sums: make([]uint64, PlanTagsMax), HeldSums: []uint64{1}}, &tooLarge},
		{"done zero error code", &TransferDone{RequestID: 1, Tenant: "a", Err: &WireError{}}, &invalid},
		{"routed zero id", func() Message { r := okRouted(); r.RequestID = 0; return r }(), &invalid},
		{"routed empty tenant", func() Message { r := okRouted(); r.Tenant = ""; return r }(), &invalid},
		{"routed long prompt", func() Message { r := okRouted(); r.Prompt = strings.Repeat("p", PromptBytesMax+1); return r }(), &tooLarge},
		{"routed bad utf8 prompt", func() Message { r := okRouted(); r.Prompt = "\xff"; return r }(), &invalid},
		{"routed zero max tokens", func() Message { r := okRouted(); r.MaxTokens = 0; return r }(), &invalid},
		{"routed many max tokens", func() Message { r := okRouted(); r.MaxTokens = GenerateTokensMax + 1; return r }(), &tooLarge},
		{"routed no prefill", func() Message { r := okRouted(); r.Prefill = ""; return r }(), &invalid},
		{"routed prefill without port", func() Message { r := okRouted(); r.Prefill = "10.0.0.2"; return r }(), &invalid},
		{"routed long prefill", func() Message { r := okRouted(); r.Prefill = strings.Repeat("h", AddrBytesMax) + ":1"; return r }(), &tooLarge},
		{"routed zero incarnation", func() Message { r := okRouted(); r.PrefillIncarnation = 0; return r }(), &invalid},
		{"routed zero decode incarnation", func() Message { r := okRouted(); r.DecodeIncarnation = 0; return r }(), &invalid},
		{"routed many attempts", func() Message { r := okRouted(); r.Attempt = RouteAttemptsMax + 1; return r }(), &tooLarge},
		{"status empty name", func() Message { s := okStatus(); s.Node.Name = ""; return s }(), &invalid},
		{"status long name", func() Message { s := okStatus(); s.Node.Name = strings.Repeat("n", NodeNameBytesMax+1); return s }(), &tooLarge},
		{"status bad utf8 name", func() Message { s := okStatus(); s.Node.Name = "\xff"; return s }(), &invalid},
		{"status unknown role", func() Message { s := okStatus(); s.Node.Role = "worker"; return s }(), &invalid},
		{"status empty role", func() Message { s := okStatus(); s.Node.Role = ""; return s }(), &invalid},
		{"status bad addr", func() Message { s := okStatus(); s.Node.Address = "10.0.0.1"; return s }(), &invalid},
		{"status bad data plane", func() Message { s := okStatus(); s.Node.DataPlane = "[::1"; return s }(), &invalid},
		{"status too many pools", func() Message {
			s := okStatus()
			s.Node.Pools = make([]PoolStatus, PoolsMax+1)
			return s
		}(), &tooLarge},
		{"status empty pool name", func() Message { s := okStatus(); s.Node.Pools[1].Name = ""; return s }(), &invalid},
		{"status long pool name", func() Message {
			s := okStatus()
			s.Node.Pools[1].Name = strings.Repeat("p", PoolNameBytesMax+1)
			return s
		}(), &tooLarge},
		{"status free over capacity", func() Message { s := okStatus(); s.Node.Pools[0].Free = s.Node.Pools[0].Capacity + 1; return s }(), &invalid},
		{"status too many members", func() Message {
			s := okStatus()
			s.Members = slices.Repeat(s.Members[:1], MembersMax+1)
			return s
		}(), &tooLarge},
		{"status member empty name", func() Message { s := okStatus(); s.Members[1].Name = ""; return s }(), &invalid},
		{"status member unknown role", func() Message { s := okStatus(); s.Members[1].Role = "Decode"; return s }(), &invalid},
		{"status member no addr", func() Message { s := okStatus(); s.Members[1].Address = ""; return s }(), &invalid},
		{"status member long addr", func() Message {
			s := okStatus()
			s.Members[1].Address = strings.Repeat("h", AddrBytesMax) + ":1"
			return s
		}(), &tooLarge},
		{"status member bad data plane", func() Message { s := okStatus(); s.Members[0].DataPlane = "prefill-1"; return s }(), &invalid},
		{"status member unknown state", func() Message { s := okStatus(); s.Members[0].State = "gone"; return s }(), &invalid},
		{"status model without fingerprint", func() Message { s := okStatus(); s.Node.ModelFingerprint = ""; return s }(), &invalid},
		{"status fingerprint without model", func() Message { s := okStatus(); s.Node.Model = ""; return s }(), &invalid},
		{"status too many codes", func() Message { s := okStatus(); s.Node.FailedByCode = make([]uint64, CodesMax+1); return s }(), &tooLarge},
		{"status member bad model", func() Message { s := okStatus(); s.Members[0].Model = "xyz"; return s }(), &invalid},
		{"drain done in flight", &DrainReply{InFlight: 1, Done: true}, &invalid},
		{"status faults not a spec", func() Message { s := okStatus(); s.Node.Faults = "frame-drop=2"; return s }(), &invalid},
		{"status faults unknown kind", func() Message { s := okStatus(); s.Node.Faults = "seed=1,frame-delay=1"; return s }(), &invalid},
		{"status faults from no chaos build", func() Message { s := okStatus(); s.Node.Chaos = false; return s }(), &invalid},
		{"status fault counts without faults", func() Message { s := okStatus(); s.Node.Faults = ""; return s }(), &invalid},
		{"status too many fault counts", func() Message {
			s := okStatus()
			s.Node.FaultCounts = make([]uint64, FaultKindsMax+1)
			return s
		}(), &tooLarge},
		{"pressure no pages", &PressureRequest{DurationMs: 1}, &invalid},
		{"pressure too many pages", &PressureRequest{Pages: PressurePagesMax + 1, DurationMs: 1}, &tooLarge},
		{"pressure no duration", &PressureRequest{Pages: 1}, &invalid},
		{"pressure too long", &PressureRequest{Pages: 1, DurationMs: PressureDurationMsMax + 1}, &tooLarge},
		{"pressure held with error", &PressureReply{Held: []PoolHeld{{Name: "p", Pages: 1}}, Err: &WireError{Code: CodeBusy}}, &invalid},
		{"pressure held without name", &PressureReply{Held: []PoolHeld{{Pages: 1}}}, &invalid},
		{"pressure too many held", &PressureReply{Held: slices.Repeat([]PoolHeld{{Name: "p"}}, PoolsMax+1)}, &tooLarge},
		{"pressure zero error code", &PressureReply{Err: &WireError{}}, &invalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Encode(c.m)
			if err == nil || !errors.As(err, c.want) {
				t.Fatalf("Encode = %v, want %T", err, reflect.ValueOf(c.want).Elem().Interface())
			}
			if _, err := c.m.Serialize(); err == nil {
				t.Fatalf("Serialize accepted an invalid message")
			}
			if we := ToWireError(err); we.Code != CodeBadRequest {
				t.Fatalf("ToWireError code %s, want bad_request", we.Code)
			}
		})
	}
}

// frame builds a frame by hand: header and a msgpack body.
func frame(t testing.TB, code TypeCode, version uint8, body any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{byte(code >> 8), byte(code), version}, b...)
}

func TestDecodeRefuses(t *testing.T) {
	valid := mustEncode(t, samples()[0])
	var (
		tooLarge  *TooLargeError
		truncated *TruncatedError
		unknown   *UnknownTypeError
		version   *VersionError
		malformed *MalformedError
		trailing  *TrailingBytesError
		invalid   *InvalidFieldError
	)
	req := map[string]any{"id": 1, "tenant": "a", "prompt": "p", "max_tokens": 1}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for k, v := range req {
			m[k] = v
		}
		m[k] = v
		return m
	}
	cases := []struct {
		name  string
		frame []byte
		want  any
	}{
		{"empty", nil, &truncated},
		{"two bytes", []byte{0, 1}, &truncated},
		{"oversized", make([]byte, MessageBytesMax+1), &tooLarge},
		{"type zero", []byte{0, 0, 1, 0x80}, &unknown},
		{"type unknown", []byte{0xff, 0xff, 1, 0x80}, &unknown},
		{"version zero", append([]byte{0, 1, 0}, valid[3:]...), &version},
		{"version future", append([]byte{0, 1, 2}, valid[3:]...), &version},
		{"no body", valid[:3], &malformed},
		{"trailing", append(slices.Clone(valid), 0xc0), &trailing},
		{"not a map", frame(t, TypeGenerateRequest, 1, []int{1}), &malformed},
		{"nil body", frame(t, TypeGenerateRequest, 1, nil), &malformed},
		{"unknown field", frame(t, TypeGenerateRequest, 1, with("extra", 1)), &malformed},
		{"negative id", frame(t, TypeGenerateRequest, 1, with("id", -1)), &malformed},
		{"id as string", frame(t, TypeGenerateRequest, 1, with("id", "1")), &malformed},
		{"id as float", frame(t, TypeGenerateRequest, 1, with("id", 1.0)), &malformed},
		{"max_tokens overflows uint32", frame(t, TypeGenerateRequest, 1, with("max_tokens", uint64(1)<<32+1)), &malformed},
		{"tenant too long", frame(t, TypeGenerateRequest, 1, with("tenant", strings.Repeat("a", TenantBytesMax+1))), &tooLarge},
		{"prompt not a string", frame(t, TypeGenerateRequest, 1, with("prompt", []int{1})), &malformed},
		// An array header claiming 2^32-1 elements in 5 bytes: refused
		// before anything is allocated for it.
		{"huge token array", append(frame(t, TypeTokenChunk, 1, map[string]any{"id": 1})[:3],
			0x82, 0xa2, 'i', 'd', 0x01, 0xa6, 't', 'o', 'k', 'e', 'n', 's', 0xdd, 0xff, 0xff, 0xff, 0xff), &tooLarge},
		{"huge tag array", append(frame(t, TypeTransferPlan, 1, nil)[:3],
			0x81, 0xa9, 'd', 'e', 's', 't', '_', 't', 'a', 'g', 's', 0xdd, 0xff, 0xff, 0xff, 0xff), &tooLarge},
		{"huge string", append(frame(t, TypeCancelRequest, 1, nil)[:3],
			0x81, 0xa6, 't', 'e', 'n', 'a', 'n', 't', 0xdb, 0xff, 0xff, 0xff, 0xff, 'a'), &malformed},
		{"repeated field", append(frame(t, TypeCancelRequest, 1, nil)[:3],
			0x82, 0xa2, 'i', 'd', 0x01, 0xa2, 'i', 'd', 0x02), &malformed},
		{"too many fields", append(frame(t, TypeCancelRequest, 1, nil)[:3], 0x84), &malformed},
		{"cancel reason unknown", frame(t, TypeCancelRequest, 2, map[string]any{"id": 1, "tenant": "a", "reason": 2}), &invalid},
		{"cancel reason overflows uint8", frame(t, TypeCancelRequest, 2, map[string]any{"id": 1, "tenant": "a", "reason": 256}), &malformed},
		{"cancel version 3", frame(t, TypeCancelRequest, 3, map[string]any{"id": 1, "tenant": "a"}), &version},
		{"result finish unknown", frame(t, TypeGenerateResult, 1, map[string]any{"id": 1, "finish": 5}), &invalid},
		{"tag index overflow", frame(t, TypeTransferPlan, 1, map[string]any{"dest_tags": []any{map[string]any{"idx": uint64(1) << 32}}}), &malformed},
		{"long data plane", frame(t, TypeTransferPlan, 1, map[string]any{"data_plane": strings.Repeat("h", AddrBytesMax+1)}), &tooLarge},
		{"attempt overflows uint8", frame(t, TypeRoutedRequest, 1, map[string]any{"attempt": 256}), &malformed},
		{"done first overflows uint32", frame(t, TypeTransferDone, 2, map[string]any{"first": uint64(1) << 32}), &malformed},
		{"done nil err", frame(t, TypeTransferDone, 2, map[string]any{"id": 1, "tenant": "a", "err": nil}), &invalid},
		{"done huge sums array", frame(t, TypeTransferDone, 2, map[string]any{"sums": make([]uint64, PlanTagsMax+1)}), &tooLarge},
		{"done version 1", frame(t, TypeTransferDone, 1, map[string]any{"id": 1, "tenant": "a", "frames": 1}), &version},
		{"status request field", frame(t, TypeStatusRequest, 1, map[string]any{"x": 1}), &malformed},
		{"status request nil body", frame(t, TypeStatusRequest, 1, nil), &malformed},
		{"status node not a map", frame(t, TypeStatusReply, 1, map[string]any{"node": 1}), &malformed},
		{"status node unknown field", frame(t, TypeStatusReply, 1, map[string]any{"node": map[string]any{"extra": 1}}), &malformed},
		{"status long role", frame(t, TypeStatusReply, 1, map[string]any{"node": map[string]any{"role": strings.Repeat("r", wordBytesMax+1)}}), &tooLarge},
		{"status in_flight overflows", frame(t, TypeStatusReply, 1, map[string]any{"node": map[string]any{"in_flight": uint64(1) << 32}}), &malformed},
		{"status pool free negative", frame(t, TypeStatusReply, 1, map[string]any{"node": map[string]any{"pools": []any{map[string]any{"free": -1}}}}), &malformed},
		{"status member not a map", frame(t, TypeStatusReply, 1, map[string]any{"members": []any{"m"}}), &malformed},
		{"status member repeated field", append(frame(t, TypeStatusReply, 1, nil)[:3],
			0x81, 0xa7, 'm', 'e', 'm', 'b', 'e', 'r', 's', 0x91, 0x82, 0xa3, 'i', 'n', 'c', 0x01, 0xa3, 'i', 'n', 'c', 0x02), &malformed},
		{"status missing node", frame(t, TypeStatusReply, 1, map[string]any{"members": nil}), &invalid},
		// Array headers claiming 2^32-1 members or pools in 5 bytes: refused
		// before anything is allocated for them.
		{"huge member array", append(frame(t, TypeStatusReply, 1, nil)[:3],
			0x81, 0xa7, 'm', 'e', 'm', 'b', 'e', 'r', 's', 0xdd, 0xff, 0xff, 0xff, 0xff), &tooLarge},
		{"huge pool array", append(frame(t, TypeStatusReply, 1, nil)[:3],
			0x81, 0xa4, 'n', 'o', 'd', 'e', 0x81, 0xa5, 'p', 'o', 'o', 'l', 's', 0xdd, 0xff, 0xff, 0xff, 0xff), &tooLarge},
		{"drain wait not a bool", frame(t, TypeDrainRequest, 1, map[string]any{"wait": 1}), &malformed},
		{"drain stay in a version 1 frame", frame(t, TypeDrainRequest, 1, map[string]any{"stay": true}), &invalid},
		{"move time left in a version 1 frame", func() []byte { b := mustEncode(t, sampleMove()); b[2] = 1; return b }(), &invalid},
		{"move version 3", func() []byte { b := mustEncode(t, sampleMove()); b[2] = 3; return b }(), &version},
		{"status long faults", frame(t, TypeStatusReply, 2, map[string]any{"node": map[string]any{"faults": strings.Repeat("f", FaultSpecBytesMax+1)}}), &tooLarge},
		{"status huge fault counts", frame(t, TypeStatusReply, 2, map[string]any{"node": map[string]any{"fault_counts": make([]uint64, FaultKindsMax+1)}}), &tooLarge},
		{"status huge integrity counts", frame(t, TypeStatusReply, 2, map[string]any{"node": map[string]any{"integrity": make([]uint64, IntegrityReasonsMax+1)}}), &tooLarge},
		{"status transfer unknown field", frame(t, TypeStatusReply, 2, map[string]any{"node": map[string]any{"kv_sent": map[string]any{"rate": 1}}}), &malformed},
		{"status first token not a map", frame(t, TypeStatusReply, 5, map[string]any{"node": map[string]any{"first_token": 1}}), &malformed},
		{"status first token unknown field", frame(t, TypeStatusReply, 5, map[string]any{"node": map[string]any{"first_token": map[string]any{"mean_ns": 1}}}), &malformed},
		{"status first token negative", frame(t, TypeStatusReply, 5, map[string]any{"node": map[string]any{"first_token": map[string]any{"verify_ns": -1}}}), &malformed},
		{"status moved not a number", frame(t, TypeStatusReply, 6, map[string]any{"node": map[string]any{"moved_in": "x"}}), &malformed},
		{"status version 7", frame(t, TypeStatusReply, 7, map[string]any{"node": map[string]any{"name": "d"}}), &version},
		{"status cross rows negative", frame(t, TypeStatusReply, 2, map[string]any{"node": map[string]any{"pools": []any{map[string]any{"cross_tenant_rows": -1}}}}), &malformed},
		{"pressure pages overflow", frame(t, TypePressureRequest, 1, map[string]any{"pages": uint64(1) << 32}), &malformed},
		{"pressure no pages", frame(t, TypePressureRequest, 1, map[string]any{"duration_ms": 1}), &invalid},
		{"pressure held huge", append(frame(t, TypePressureReply, 1, nil)[:3],
			0x81, 0xa4, 'h', 'e', 'l', 'd', 0xdd, 0xff, 0xff, 0xff, 0xff), &tooLarge},
		{"pressure held unknown field", frame(t, TypePressureReply, 1, map[string]any{"held": []any{map[string]any{"free": 1}}}), &malformed},
		{"cache summary short key", frame(t, TypeCacheSummary, 1, map[string]any{"inc": 1, "keys": [][]byte{{1, 2}}}), &invalid},
		{"cache summary key not bytes", frame(t, TypeCacheSummary, 1, map[string]any{"inc": 1, "keys": []any{7}}), &malformed},
		{"cache summary huge", frame(t, TypeCacheSummary, 1, map[string]any{"inc": 1, "keys": make([][]byte, CacheSummaryKeysMax+1)}), &tooLarge},
		{"cache summary request field", frame(t, TypeCacheSummaryRequest, 1, map[string]any{"x": 1}), &malformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Decode(c.frame)
			if err == nil || m != nil || !errors.As(err, c.want) {
				t.Fatalf("Decode = %v, %v; want %T", m, err, reflect.ValueOf(c.want).Elem().Interface())
			}
			if ToWireError(err).Code != CodeBadRequest {
				t.Fatalf("ToWireError(%v) is not bad_request", err)
			}
		})
	}
}

// TestEveryPrefixRefused cuts every valid frame at every length: each
// strict prefix is refused with a typed error, a cut body matching
// io.ErrUnexpectedEOF.
func TestEveryPrefixRefused(t *testing.T) {
	for _, m := range samples() {
		f := mustEncode(t, m)
		for n := range len(f) {
			_, err := Decode(f[:n])
			if err == nil {
				t.Fatalf("%s: prefix of %d/%d bytes decoded", m.TypeCode(), n, len(f))
			}
			var tr *TruncatedError
			if n >= HeaderBytes && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &tr) {
				t.Fatalf("%s: prefix of %d/%d bytes: %v, want unexpected EOF", m.TypeCode(), n, len(f), err)
			}
		}
	}
}

func TestErrorsCarryNumbers(t *testing.T) {
	_, err := Decode(make([]byte, MessageBytesMax+5))
	if want := "1048581, limit 1048576"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not carry %q", err, want)
	}
	we := ToWireError(err)
	if we.Have != MessageBytesMax+5 || we.Limit != MessageBytesMax || we.Code.HTTPStatus() != 400 {
		t.Fatalf("ToWireError = %+v", we)
	}
	busy := &WireError{Code: CodeBusy, Message: "queue full", Have: 64, Limit: 64}
	if !errors.Is(busy, &WireError{Code: CodeBusy}) || errors.Is(busy, &WireError{Code: CodeInternal}) {
		t.Fatal("WireError.Is does not match on code")
	}
	if ToWireError(busy) != busy || ToWireError(errors.New("boom")).Code != CodeInternal {
		t.Fatal("ToWireError passes WireErrors through and makes others internal")
	}
	if CodeForbidden.HTTPStatus() != 403 {
		t.Fatalf("forbidden maps to %d, want 403", CodeForbidden.HTTPStatus())
	}
	if ErrorCode(99).HTTPStatus() != 500 {
		t.Fatal("unknown codes must map to 500")
	}
}

// TestStableCodes pins the numbers: changing one breaks every peer.
func TestStableCodes(t *testing.T) {
	got := []uint16{uint16(TypeGenerateRequest), uint16(TypeTokenChunk), uint16(TypeGenerateResult), uint16(TypeCancelRequest),
		uint16(TypeTransferPlan), uint16(TypeTransferAck), uint16(TypeTransferAbort), uint16(TypeTransferDone),
		uint16(TypeRoutedRequest), uint16(TypeStatusRequest), uint16(TypeStatusReply), uint16(TypeDrainRequest), uint16(TypeDrainReply),
		uint16(TypePressureRequest), uint16(TypePressureReply),
		uint16(TypeListInFlight), uint16(TypeInFlightList), uint16(TypeCancelInFlight), uint16(TypeCancelInFlightReply),
		uint16(TypeCacheSummaryRequest), uint16(TypeCacheSummary),
		uint16(CodePromptTooLong), uint16(CodeBusy), uint16(CodeIntegrity), uint16(CodeNodeLost), uint16(CodeCancelled), uint16(CodeBadRequest), uint16(CodeInternal), uint16(CodeForbidden),
		uint16(CodeModelMismatch), uint16(CodeUnavailable),
		uint16(FinishStop), uint16(FinishLength), uint16(FinishError), uint16(FinishStopSequence),
		uint16(CancelWithdraw), uint16(CancelStop)}
	want := []uint16{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 0, 1}
	if !slices.Equal(got, want) {
		t.Fatalf("stable codes changed: %v, want %v", got, want)
	}
}

// TestCodeCounts: counts by code, up to the last non-zero one; a code
// past CodesMax counts as internal; KnownCodes names every code in order.
func TestCodeCounts(t *testing.T) {
	var c CodeCounts
	c.Add(CodeBusy)
	c.Add(CodeBusy)
	c.Add(CodeNodeLost)
	c.Add(ErrorCode(99))
	if got := c.Counts(); !slices.Equal(got, []uint64{0, 0, 2, 0, 1, 0, 0, 1}) {
		t.Fatalf("counts %v", got)
	}
	if sum := SumCounts([]uint64{1, 2}, []uint64{10, 20, 30}); !slices.Equal(sum, []uint64{11, 22, 30}) {
		t.Fatalf("sum %v", sum)
	}
	known := KnownCodes()
	if len(known) != int(CodeUnavailable) || known[0] != CodePromptTooLong || known[len(known)-1] != CodeUnavailable {
		t.Fatalf("known codes %v", known)
	}
}

// TestEmptyPromptIsAPrompt: the model's BOS comes first, so a request
// without prompt text is a request of one token, and crosses the wire.
func TestEmptyPromptIsAPrompt(t *testing.T) {
	for _, m := range []Message{&GenerateRequest{RequestID: 1, Tenant: "a", MaxTokens: 1},
		func() Message { r := sampleOf[*RoutedRequest](); r.Prompt = ""; return r }()} {
		b, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode(%T with an empty prompt) = %v", m, err)
		}
		got, err := Decode(b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip of %+v: %+v, %v", m, got, err)
		}
	}
}

// TestStatusReplyVersion1 decodes a reply of a node of the build before
// version 2, which knew none of its fields.
func TestStatusReplyVersion1(t *testing.T) {
	m, err := Decode(frame(t, TypeStatusReply, 1, map[string]any{
		"node":    map[string]any{"name": "d", "role": RoleDecode, "addr": "127.0.0.1:1", "pools": []any{map[string]any{"name": "p", "capacity": 2, "free": 1}}},
		"members": nil}))
	if err != nil {
		t.Fatal(err)
	}
	if n := m.(*StatusReply).Node; n.Chaos || n.Faults != "" || n.FaultCounts != nil || n.Pools[0].Free != 1 ||
		n.KVSent != nil || n.Integrity != nil {
		t.Fatalf("version 1 reply decoded as %+v", n)
	}
}

// TestCancelRequestVersions: a withdrawal is encoded as version 1, byte
// for byte the frame of the build before reasons, which decodes it; a stop
// is version 2, which that build refuses by its version, never taking it
// for a withdrawal.
func TestCancelRequestVersions(t *testing.T) {
	withdraw := mustEncode(t, &CancelRequest{RequestID: 7, Tenant: "acme"})
	want := []byte{0, 4, 1, 0x82, 0xa2, 'i', 'd', 7, 0xa6, 't', 'e', 'n', 'a', 'n', 't', 0xa4, 'a', 'c', 'm', 'e'}
	if !bytes.Equal(withdraw, want) {
		t.Fatalf("a withdrawal encodes as % x, the version 1 frame is % x", withdraw, want)
	}
	stop := mustEncode(t, &CancelRequest{RequestID: 7, Tenant: "acme", Reason: CancelStop})
	if stop[2] != 2 {
		t.Fatalf("a stop encodes as version %d, want 2", stop[2])
	}
	// A stop in a version 1 frame, or a withdrawal in a version 2 one, is
	// no frame this build writes, and is refused.
	for _, f := range [][]byte{append([]byte{0, 4, 1}, stop[3:]...), append([]byte{0, 4, 2}, withdraw[3:]...)} {
		var ie *InvalidFieldError
		if m, err := Decode(f); !errors.As(err, &ie) || ie.Field != "version" {
			t.Fatalf("frame % x decodes as %+v, %v; want its version refused", f, m, err)
		}
	}
	// The build before reasons: CancelRequest versions 1 to 1.
	saved := types[TypeCancelRequest]
	types[TypeCancelRequest].version = 1
	defer func() { types[TypeCancelRequest] = saved }()
	if m, err := Decode(withdraw); err != nil || m.(*CancelRequest).Reason != CancelWithdraw {
		t.Fatalf("the older build decodes a withdrawal as %+v, %v", m, err)
	}
	var ve *VersionError
	if m, err := Decode(stop); !errors.As(err, &ve) || ve.Version != 2 || ve.Max != 1 || m != nil {
		t.Fatalf("the older build decodes a stop as %+v, %v; want a VersionError of version 2", m, err)
	}
}

func TestDecodeDoesNotAlias(t *testing.T) {
	f := mustEncode(t, samples()[0])
	m, err := Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	for i := range f {
		f[i] = 0
	}
	if m.(*GenerateRequest).Prompt != "The capital of France is" {
		t.Fatal("decoded message aliases the frame")
	}
}
