package messages

import "testing"

// BenchmarkEncodeDecode measures one Encode and one Decode of each sample
// message; the envelope adds one protobuf bytes field on top.
func BenchmarkEncodeDecode(b *testing.B) {
	for _, m := range samples() {
		name := m.TypeCode().String()
		if r, ok := m.(*GenerateResult); ok && r.Err != nil {
			name += "Error"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var size int
			for b.Loop() {
				f, err := Encode(m)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Decode(f); err != nil {
					b.Fatal(err)
				}
				size = len(f)
			}
			b.ReportMetric(float64(size), "frame-bytes")
		})
	}
}
