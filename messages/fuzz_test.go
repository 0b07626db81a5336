package messages

import (
	"reflect"
	"testing"
)

// FuzzDecode feeds Decode arbitrary frames. Properties: it never panics;
// whatever it accepts re-encodes and decodes to an equal message; and, as
// nats splits parser input in two to simulate chunked reads, the first half
// of an accepted frame (a frame cut in transit) is always refused, since a
// frame is exactly one self-delimiting msgpack value.
func FuzzDecode(f *testing.F) {
	for _, m := range samples() {
		f.Add(mustEncode(f, m))
	}
	f.Add([]byte{})
	f.Add([]byte{0, 1, 1, 0x80})
	f.Add([]byte{0, 2, 1, 0x81, 0xa6, 't', 'o', 'k', 'e', 'n', 's', 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 5, 1, 0x81, 0xa9, 'd', 'e', 's', 't', '_', 't', 'a', 'g', 's', 0x91, 0x83})
	f.Add([]byte{0, 10, 1, 0x80})
	f.Add([]byte{0, 11, 1, 0x81, 0xa7, 'm', 'e', 'm', 'b', 'e', 'r', 's', 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 11, 1, 0x81, 0xa4, 'n', 'o', 'd', 'e', 0x81, 0xa5, 'p', 'o', 'o', 'l', 's', 0x91, 0x83})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			if m != nil {
				t.Fatalf("Decode returned a message with error %v", err)
			}
			if ToWireError(err).Code != CodeBadRequest {
				t.Fatalf("untyped decode error %T: %v", err, err)
			}
			return
		}
		half := data[:len(data)/2]
		if _, err := Decode(half); err == nil {
			t.Fatalf("first half (%d of %d bytes) of an accepted frame decoded", len(half), len(data))
		}
		again, err := Encode(m)
		if err != nil {
			t.Fatalf("accepted %s does not re-encode: %v", m.TypeCode(), err)
		}
		m2, err := Decode(again)
		if err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", m.TypeCode(), err)
		}
		if !reflect.DeepEqual(normalize(m), normalize(m2)) {
			t.Fatalf("re-encoding changed the message\n got %#v\nwant %#v", m2, m)
		}
	})
}

// normalize maps empty slices to nil: msgpack's omitempty writes neither,
// so an accepted frame with an explicit empty array decodes to nil after a
// round trip.
func normalize(m Message) Message {
	switch v := m.(type) {
	case *GenerateResult:
		c := *v
		if len(c.Tokens) == 0 {
			c.Tokens = nil
		}
		return &c
	}
	return m
}
