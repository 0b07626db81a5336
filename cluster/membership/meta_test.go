package membership

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"
	"pgregory.net/rapid"

	"github.com/kvwarden/kvwarden/engine"
)

// longAddr is a valid host:port of exactly n bytes.
// testModel stands for the fingerprint of the model a test's nodes serve.
var testModel = engine.Fingerprint{0x6b, 0x76}

func longAddr(n int) string {
	const port = ":65535"
	return strings.Repeat("h", n-len(port)) + port
}

func validMeta() Meta {
	return Meta{
		Role:             RoleDecode,
		Incarnation:      0xA11CE,
		StartedUnixMilli: 1_700_000_000_000,
		RemoteAddr:       "10.0.0.7:8090",
		DataAddr:         "10.0.0.7:8091",
		CapacityPages:    4096,
		FreePages:        4000,
		Model:            testModel,
	}
}

func TestMetaWorstCaseFits(t *testing.T) {
	m := validMeta()
	m.RemoteAddr, m.DataAddr = longAddr(AddrLenMax), longAddr(AddrLenMax)
	m.Draining = true
	enc, err := EncodeMeta(nil, m)
	if err != nil {
		t.Fatalf("longest allowed addresses refused: %v", err)
	}
	if len(enc) != MetaEncodedLenMax {
		t.Fatalf("worst case encodes to %d bytes, MetaEncodedLenMax says %d", len(enc), MetaEncodedLenMax)
	}
	if MetaEncodedLenMax > memberlist.MetaMaxSize {
		t.Fatalf("worst-case metadata %d bytes exceeds memberlist.MetaMaxSize %d", MetaEncodedLenMax, memberlist.MetaMaxSize)
	}
	t.Logf("worst-case metadata %d bytes of memberlist's %d", MetaEncodedLenMax, memberlist.MetaMaxSize)
}

func TestMetaRoundTrip(t *testing.T) {
	router := validMeta()
	router.Role, router.DataAddr, router.CapacityPages, router.FreePages = RoleRouter, "", 0, 0
	draining := validMeta()
	draining.Draining, draining.FreePages = true, 0
	leaving := validMeta()
	leaving.Leaving = true
	v6 := validMeta()
	v6.Role, v6.RemoteAddr, v6.DataAddr = RoleAll, "[fe80::1%eth0]:8090", "[::1]:1"
	named := validMeta()
	named.Role, named.RemoteAddr, named.DataAddr = RolePrefill, "prefill-0.kv.svc:8090", "prefill-0.kv.svc:8091"
	for _, m := range []Meta{validMeta(), router, draining, leaving, v6, named} {
		enc, err := EncodeMeta(nil, m)
		if err != nil {
			t.Fatalf("%+v: %v", m, err)
		}
		if len(enc) != m.EncodedLen() {
			t.Fatalf("%+v: encoded %d bytes, EncodedLen %d", m, len(enc), m.EncodedLen())
		}
		got, err := DecodeMeta(enc)
		if err != nil {
			t.Fatalf("%+v: decode: %v", m, err)
		}
		if got != m {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
	}
}

func TestMetaRoundTripProperty(t *testing.T) {
	hostChars := rapid.SampledFrom([]byte("abcXYZ19.-_"))
	addr := func(t *rapid.T, label string) string {
		host := rapid.SliceOfN(hostChars, 1, AddrLenMax-6).Draw(t, label+" host")
		port := rapid.IntRange(1, 65535).Draw(t, label+" port")
		return string(host) + ":" + strconv.Itoa(port)
	}
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.Uint32().Draw(t, "capacity")
		m := Meta{
			Role:             Role(rapid.IntRange(int(RolePrefill), int(RoleAll)).Draw(t, "role")),
			Incarnation:      rapid.Uint64Min(1).Draw(t, "incarnation"),
			StartedUnixMilli: rapid.Uint64Min(1).Draw(t, "started"),
			RemoteAddr:       addr(t, "remote"),
			CapacityPages:    capacity,
			FreePages:        rapid.Uint32Max(capacity).Draw(t, "free"),
			Draining:         rapid.Bool().Draw(t, "draining"),
			Leaving:          rapid.Bool().Draw(t, "leaving"),
		}
		copy(m.Model[:], rapid.SliceOfN(rapid.Byte(), len(m.Model), len(m.Model)).Draw(t, "model"))
		m.Model[0] |= 1 // non-zero
		if m.Role == RoleRouter {
			m.CapacityPages, m.FreePages = 0, 0
		} else {
			m.DataAddr = addr(t, "data")
		}
		enc, err := EncodeMeta(nil, m)
		if err != nil {
			t.Fatalf("valid meta refused: %v", err)
		}
		got, err := DecodeMeta(enc)
		if err != nil || got != m {
			t.Fatalf("round trip: got %+v, %v; want %+v", got, err, m)
		}
	})
}

func TestMetaEncodeRefusals(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Meta)
		want string
	}{
		{"remote address too long", func(m *Meta) { m.RemoteAddr = longAddr(AddrLenMax + 1) }, "(201 bytes, limit 200): too long"},
		{"data address too long", func(m *Meta) { m.DataAddr = longAddr(255) }, "(255 bytes, limit 200): too long"},
		{"no remote address", func(m *Meta) { m.RemoteAddr = "" }, "required"},
		{"no data address on a pool role", func(m *Meta) { m.DataAddr = "" }, "data address"},
		{"wildcard host", func(m *Meta) { m.RemoteAddr = "0.0.0.0:80" }, "wildcard"},
		{"wildcard v6 host", func(m *Meta) { m.DataAddr = "[::]:80" }, "wildcard"},
		{"port zero", func(m *Meta) { m.RemoteAddr = "h:0" }, "port"},
		{"port leading zero", func(m *Meta) { m.RemoteAddr = "h:080" }, "port"},
		{"port too big", func(m *Meta) { m.RemoteAddr = "h:65536" }, "port"},
		{"no port", func(m *Meta) { m.RemoteAddr = "host" }, "host:port"},
		{"empty host", func(m *Meta) { m.RemoteAddr = ":80" }, "empty host"},
		{"space in host", func(m *Meta) { m.RemoteAddr = "a b:80" }, "byte 0x20"},
		{"role zero", func(m *Meta) { m.Role = 0 }, "role = 0 (limit 4)"},
		{"role five", func(m *Meta) { m.Role = 5 }, "role = 5 (limit 4)"},
		{"incarnation zero", func(m *Meta) { m.Incarnation = 0 }, "incarnation"},
		{"started zero", func(m *Meta) { m.StartedUnixMilli = 0 }, "started"},
		{"free over capacity", func(m *Meta) { m.FreePages = 4097 }, "free pages = 4097 (limit 4096)"},
		{"router with a pool", func(m *Meta) { m.Role, m.DataAddr = RoleRouter, "" }, "capacity pages = 4096"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := validMeta()
			tt.edit(&m)
			enc, err := EncodeMeta([]byte{7}, m)
			if err == nil {
				t.Fatalf("accepted %+v", m)
			}
			if !errors.Is(err, ErrMetaInvalid) {
				t.Fatalf("error %v does not match ErrMetaInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q lacks %q", err, tt.want)
			}
			if !bytes.Equal(enc, []byte{7}) {
				t.Fatalf("refused encode changed dst to %x", enc)
			}
		})
	}
}

func TestMetaSizeLimitEnforced(t *testing.T) {
	m := validMeta()
	err := m.validate(20)
	var se *MetaSizeError
	if !errors.As(err, &se) || se.Size != m.EncodedLen() || se.Limit != 20 {
		t.Fatalf("validate(20) = %v, want MetaSizeError{Size: %d, Limit: 20}", err, m.EncodedLen())
	}
}

func TestMetaDecodeRefusals(t *testing.T) {
	good, err := EncodeMeta(nil, validMeta())
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	remoteLenAt := metaFixedLen
	tests := []struct {
		name string
		in   []byte
		want any
		text string
	}{
		{"empty", nil, &MetaTruncatedError{}, "need 43 bytes, have 0"},
		{"oversized", make([]byte, memberlist.MetaMaxSize+1), &MetaSizeError{}, "513 bytes, limit 512"},
		{"version 1", edit(func(b []byte) []byte { b[0] = 1; return b }), &MetaVersionError{}, "version 1"},
		{"version 3", edit(func(b []byte) []byte { b[0] = 3; return b }), &MetaVersionError{}, "version 3"},
		{"no model", edit(func(b []byte) []byte { clear(b[27:43]); return b }), &MetaFieldError{}, "model fingerprint"},
		{"version 0", edit(func(b []byte) []byte { b[0] = 0; return b }), &MetaVersionError{}, "version 0"},
		{"unknown flag", edit(func(b []byte) []byte { b[2] = 0x84; return b }), &MetaFieldError{}, "flags = 132 (limit 3)"},
		{"role 9", edit(func(b []byte) []byte { b[1] = 9; return b }), &MetaFieldError{}, "role = 9"},
		{"trailing byte", append(append([]byte(nil), good...), 0), &MetaFieldError{}, "trailing bytes = 1"},
		{"address length over bound", edit(func(b []byte) []byte { b[remoteLenAt] = 201; return b }), &MetaAddrError{}, "201 bytes, limit 200"},
		{"address length past end", edit(func(b []byte) []byte { b[remoteLenAt] = 200; return b }), &MetaTruncatedError{}, "need 200 bytes"},
		{"free over capacity", edit(func(b []byte) []byte { b[26] = 0xff; return b }), &MetaFieldError{}, "free pages"},
		{"bad address byte", edit(func(b []byte) []byte { b[remoteLenAt+1] = 0; return b }), &MetaAddrError{}, "byte 0x00"},
	}
	for i := 0; i < len(good); i++ {
		tests = append(tests, struct {
			name string
			in   []byte
			want any
			text string
		}{"truncated at " + strconv.Itoa(i), good[:i], &MetaTruncatedError{}, "truncated"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := DecodeMeta(tt.in)
			if err == nil {
				t.Fatalf("accepted %x as %+v", tt.in, m)
			}
			if !errors.Is(err, ErrMetaInvalid) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("error %q: want ErrMetaInvalid containing %q", err, tt.text)
			}
			if m != (Meta{}) {
				t.Fatalf("refused decode returned %+v", m)
			}
			switch tt.want.(type) {
			case *MetaTruncatedError:
				var e *MetaTruncatedError
				ok := errors.As(err, &e)
				if !ok || e.Have >= e.Need {
					t.Fatalf("want MetaTruncatedError with Have < Need, got %#v", err)
				}
			case *MetaSizeError:
				var e *MetaSizeError
				if !errors.As(err, &e) {
					t.Fatalf("want MetaSizeError, got %#v", err)
				}
			case *MetaVersionError:
				var e *MetaVersionError
				if !errors.As(err, &e) || e.Supported != MetaVersion {
					t.Fatalf("want MetaVersionError, got %#v", err)
				}
			case *MetaFieldError:
				var e *MetaFieldError
				if !errors.As(err, &e) {
					t.Fatalf("want MetaFieldError, got %#v", err)
				}
			case *MetaAddrError:
				var e *MetaAddrError
				if !errors.As(err, &e) || e.LenMax != AddrLenMax {
					t.Fatalf("want MetaAddrError, got %#v", err)
				}
			}
		})
	}
}

func TestParseRole(t *testing.T) {
	for r := RolePrefill; r <= RoleAll; r++ {
		got, err := ParseRole(r.String())
		if err != nil || got != r {
			t.Fatalf("ParseRole(%q) = %v, %v", r.String(), got, err)
		}
	}
	if _, err := ParseRole("worker"); err == nil {
		t.Fatal("ParseRole accepted worker")
	}
}

// FuzzDecodeMeta: the decoder never panics, and whatever it accepts
// re-encodes to exactly the same bytes (one meaning per blob). As in the kv
// fuzzers, the input is also tried split in two to catch any state carried
// between calls.
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range []Meta{validMeta(), {Role: RoleRouter, Incarnation: 1, StartedUnixMilli: 1, RemoteAddr: "[::1]:1", Model: testModel}} {
		enc, err := EncodeMeta(nil, m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(enc)
		f.Add(enc[:len(enc)/2])
	}
	f.Add([]byte{})
	f.Add(make([]byte, memberlist.MetaMaxSize+1))
	f.Fuzz(func(t *testing.T, b []byte) {
		in := append([]byte(nil), b...)
		m, err := DecodeMeta(b)
		if !bytes.Equal(in, b) {
			t.Fatal("DecodeMeta modified its input")
		}
		if err != nil {
			if !errors.Is(err, ErrMetaInvalid) {
				t.Fatalf("refusal %v does not match ErrMetaInvalid", err)
			}
			return
		}
		if len(b) > MetaEncodedLenMax {
			t.Fatalf("accepted %d bytes, worst case is %d", len(b), MetaEncodedLenMax)
		}
		enc, err := EncodeMeta(nil, m)
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", m, err)
		}
		if !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", b, enc)
		}
		half := len(b) / 2
		if _, err := DecodeMeta(b[:half]); err == nil && half != len(b) {
			t.Fatalf("a strict prefix (%d of %d bytes) of an accepted blob was accepted too", half, len(b))
		}
	})
}
