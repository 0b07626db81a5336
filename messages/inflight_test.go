package messages

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// inFlightSamples are samples (codec_test.go) of the operators' messages
// about requests in flight, every field set.
func inFlightSamples() []Message {
	routed := InFlight{Number: 12, ClientID: 7, Tenant: "acme", Phase: PhaseRouted, Prefill: "10.0.0.2:8090", Decode: "10.0.0.1:8090",
		AgeMs: 1500}
	decoding := InFlight{Number: math.MaxUint64, ClientID: math.MaxUint64, Tenant: "globex", Phase: PhaseDecode,
		Prefill: "[fe80::1]:8090", Decode: "10.0.0.1:8090", AgeMs: math.MaxUint64, Tokens: math.MaxUint32}
	return []Message{
		&ListInFlight{Limit: 20},
		&InFlightList{Incarnation: 1 << 40, Requests: []InFlight{routed, decoding}, Omitted: 3},
		&CancelInFlight{Incarnation: 1 << 40, Number: 12},
		&CancelInFlightReply{Request: &decoding},
		&CancelInFlightReply{Err: &WireError{Code: CodeBadRequest, Message: "no request 13 in flight", Where: "decode-1"}},
	}
}

// TestListInFlightMax: a limit of 0 asks for as many as a list carries.
func TestListInFlightMax(t *testing.T) {
	if got := (&ListInFlight{}).Max(); got != InFlightListMax {
		t.Fatalf("Max of no limit = %d, want %d", got, InFlightListMax)
	}
	if got := (&ListInFlight{Limit: 3}).Max(); got != 3 {
		t.Fatalf("Max of limit 3 = %d", got)
	}
}

// TestInFlightWorstCaseFits: the longest list a node may send fits a
// frame (see TestWorstCaseFits).
func TestInFlightWorstCaseFits(t *testing.T) {
	addr := strings.Repeat("h", AddrBytesMax-len(":65535")) + ":65535"
	entry := InFlight{Number: math.MaxUint64, ClientID: math.MaxUint64, Tenant: strings.Repeat("t", TenantBytesMax),
		Phase: PhaseTransfer, Prefill: addr, Decode: addr, AgeMs: math.MaxUint64, Tokens: math.MaxUint32}
	werr := WireError{Code: math.MaxUint16, Message: strings.Repeat("m", ErrorMessageBytesMax), Have: math.MaxUint64,
		Limit: math.MaxUint64, Where: strings.Repeat("w", WhereBytesMax)}
	for _, m := range []Message{
		&ListInFlight{Limit: InFlightListMax},
		&InFlightList{Incarnation: math.MaxUint64, Requests: slices.Repeat([]InFlight{entry}, InFlightListMax), Omitted: math.MaxUint32},
		&CancelInFlight{Incarnation: math.MaxUint64, Number: math.MaxUint64},
		&CancelInFlightReply{Request: &entry},
		&CancelInFlightReply{Err: &werr},
	} {
		frame := mustEncode(t, m)
		t.Logf("%-20s worst case %8d bytes (limit %d)", m.TypeCode(), len(frame), MessageBytesMax)
		if _, err := Decode(frame); err != nil {
			t.Errorf("%s: worst case does not decode: %v", m.TypeCode(), err)
		}
	}
}

func TestInFlightValidateRefuses(t *testing.T) {
	list := func(f func(r *InFlight)) Message {
		m := sampleOf[*InFlightList]()
		f(&m.Requests[1])
		return m
	}
	var tooLarge *TooLargeError
	var invalid *InvalidFieldError
	cases := []struct {
		name string
		m    Message
		want any
	}{
		{"limit too large", &ListInFlight{Limit: InFlightListMax + 1}, &tooLarge},
		{"list of no node", &InFlightList{}, &invalid},
		{"list too long", &InFlightList{Incarnation: 1, Requests: make([]InFlight, InFlightListMax+1)}, &tooLarge},
		{"no number", list(func(r *InFlight) { r.Number = 0 }), &invalid},
		{"no client id", list(func(r *InFlight) { r.ClientID = 0 }), &invalid},
		{"no tenant", list(func(r *InFlight) { r.Tenant = "" }), &invalid},
		{"unknown phase", list(func(r *InFlight) { r.Phase = "thinking" }), &invalid},
		{"bad prefill", list(func(r *InFlight) { r.Prefill = "prefill-1" }), &invalid},
		{"no decode", list(func(r *InFlight) { r.Decode = "" }), &invalid},
		{"cancel of no node", &CancelInFlight{Number: 1}, &invalid},
		{"cancel of no number", &CancelInFlight{Incarnation: 1}, &invalid},
		{"cancel reply empty", &CancelInFlightReply{}, &invalid},
		{"cancel reply both", &CancelInFlightReply{Request: &InFlight{}, Err: &WireError{Code: CodeBadRequest}}, &invalid},
		{"cancel reply zero code", &CancelInFlightReply{Err: &WireError{}}, &invalid},
		{"cancel reply bad request", &CancelInFlightReply{Request: &InFlight{Number: 1}}, &invalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Encode(c.m); err == nil || !errors.As(err, c.want) {
				t.Fatalf("Encode = %v, want %T", err, reflect.ValueOf(c.want).Elem().Interface())
			}
		})
	}
}

func TestInFlightDecodeRefuses(t *testing.T) {
	var (
		tooLarge  *TooLargeError
		malformed *MalformedError
		invalid   *InvalidFieldError
	)
	cases := []struct {
		name  string
		frame []byte
		want  any
	}{
		{"limit overflows", frame(t, TypeListInFlight, 1, map[string]any{"limit": uint64(1) << 32}), &malformed},
		{"limit too large", frame(t, TypeListInFlight, 1, map[string]any{"limit": InFlightListMax + 1}), &tooLarge},
		// An array header claiming 2^32-1 requests in 5 bytes: refused
		// before anything is allocated for them.
		{"huge request array", append(frame(t, TypeInFlightList, 1, nil)[:3],
			0x81, 0xa8, 'r', 'e', 'q', 'u', 'e', 's', 't', 's', 0xdd, 0xff, 0xff, 0xff, 0xff), &tooLarge},
		{"request unknown field", frame(t, TypeInFlightList, 1, map[string]any{"inc": 1, "requests": []any{map[string]any{"x": 1}}}), &malformed},
		{"long phase", frame(t, TypeInFlightList, 1, map[string]any{"requests": []any{map[string]any{"phase": strings.Repeat("p", wordBytesMax+1)}}}), &tooLarge},
		{"tokens overflow", frame(t, TypeInFlightList, 1, map[string]any{"requests": []any{map[string]any{"tokens": uint64(1) << 32}}}), &malformed},
		{"list of no node", frame(t, TypeInFlightList, 1, map[string]any{"requests": nil}), &invalid},
		{"cancel negative number", frame(t, TypeCancelInFlight, 1, map[string]any{"inc": 1, "n": -1}), &malformed},
		{"cancel reply nil request", frame(t, TypeCancelInFlightReply, 1, map[string]any{"request": nil}), &malformed},
		{"cancel reply nil err", frame(t, TypeCancelInFlightReply, 1, map[string]any{"err": nil}), &malformed},
		{"cancel reply empty", frame(t, TypeCancelInFlightReply, 1, map[string]any{}), &invalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Decode(c.frame)
			if err == nil || m != nil || !errors.As(err, c.want) {
				t.Fatalf("Decode = %v, %v; want %T", m, err, reflect.ValueOf(c.want).Elem().Interface())
			}
		})
	}
}
