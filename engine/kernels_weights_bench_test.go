package engine

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// benchRingBytes is the bytes of the matrices a memory-bound benchmark
// multiplies by in turn, as a decode step does a model's layers: twice the
// last-level cache lscpu reports here (480 MiB, shared), so that a
// matrix has left every cache before it is read again.
const benchRingBytes = 1 << 30

// benchMatrices are matrices of outs × in random elements of type t, of
// ringBytes in all (at least one): each row the same, a random row of
// values below 1 in magnitude quantized as a GGUF file stores it.
func benchMatrices(t WeightType, in, outs, ringBytes int) []Matrix {
	rng := splitMix64(uint64(in))
	row := make([]float32, in)
	for i := range row {
		row[i] = float32(rng.next()>>11)/(1<<53)*2 - 1
	}
	raw := quantize(row, t)
	ms := make([]Matrix, max(1, ringBytes/(outs*len(raw))))
	for i := range ms {
		ms[i] = Matrix{Type: t, Rows: outs, Cols: in}
		if t == WeightF32 {
			ms[i].F32 = make([]float32, 0, outs*in)
			for range outs {
				ms[i].F32 = append(ms[i].F32, row...)
			}
			continue
		}
		ms[i].Raw = make([]byte, 0, outs*len(raw))
		for range outs {
			ms[i].Raw = append(ms[i].Raw, raw...)
		}
	}
	return ms
}

// BenchmarkMatmulWeights multiplies one row of x, a decode step's, by
// matrices of each weight type: cache, one 256×256 matrix, which stays in
// the L2 cache; memory, 4096×4096 matrices of benchRingBytes in all, in
// turn, on the caller alone (cores=1) and split between goroutines as
// the engine splits a large product (cores=N). It reports the weight bytes
// read per second and x_f32, F32's time over the type's (measured just
// before in the same run, when the run includes it): what a step of a
// model whose weights stream from memory gains from the type.
func BenchmarkMatmulWeights(b *testing.B) {
	type shape struct {
		name                 string
		in, outs, ring, part int
	}
	shapes := []shape{{"cache", 256, 256, 0, 1}, {"memory/cores=1", 4096, 4096, benchRingBytes, 1}}
	helpers.once.Do(startHelpers)
	if cores := len(helpers.all) + 1; cores > 1 {
		shapes = append(shapes, shape{fmt.Sprintf("memory/cores=%d", cores), 4096, 4096, benchRingBytes, cores})
	}
	for _, c := range shapes {
		var f32 float64 // F32's ns/op
		for _, t := range append([]WeightType{WeightF32}, kernelWeightTypes...) {
			b.Run(c.name+"/"+t.String(), func(b *testing.B) {
				ms := benchMatrices(t, c.in, c.outs, c.ring)
				rng := splitMix64(1)
				x := make([]float32, c.in)
				for i := range x {
					x[i] = float32(rng.next()>>11)/(1<<53)*2 - 1
				}
				out := make([]float32, c.outs)
				b.SetBytes(ms[0].Bytes())
				var wg sync.WaitGroup
				i := 0
				for b.Loop() {
					m := &ms[i%len(ms)]
					i++
					if c.part == 1 {
						kern.matmulM(out, x, m, 0, m.Rows)
						continue
					}
					j := matmulJob{out: out, x: x, w: m}
					split(&j, c.part, &wg)
				}
				ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
				if t == WeightF32 {
					f32 = ns
				}
				if f32 > 0 {
					b.ReportMetric(f32/ns, "x_f32")
				}
			})
			runtime.GC() // a gigabyte, before the next type's
		}
	}
}
