package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// memoryBoundConfig is a random-weight llama of about 480 M parameters
// (1.9 GB of float32, 0.5 GB of Q8_0), far above the caches of the
// machines the project runs on, so that a decode step streams its weights
// from memory: the shape of TinyLlama 1.1B's layers, fewer of them.
func memoryBoundConfig() ModelConfig {
	return ModelConfig{Vocab: 8192, Dim: 2048, Layers: 10, Heads: 16, KVHeads: 4, HeadDim: 128, HiddenDim: 5632,
		ContextTokens: 512, RoPETheta: 10000, NormEps: 1e-5, Seed: 11}
}

// benchWeightTypes are the types the weight benchmarks compare with F32.
var benchWeightTypes = []WeightType{WeightF16, WeightBF16, WeightQ8_0, WeightQ4_0}

// generated holds the files generatedGGUF wrote, until the benchmark that
// asked for them ends.
var generated struct {
	sync.Mutex
	paths map[WeightType]string
}

// generatedGGUF writes memoryBoundConfig's model as a GGUF file of each
// weight type into a temporary folder, unless an earlier call of the same
// benchmark did, and returns the paths by type. The files take about 4
// GB in all and a minute to write; they are removed when b ends.
func generatedGGUF(b *testing.B) map[WeightType]string {
	generated.Lock()
	defer generated.Unlock()
	if generated.paths != nil {
		return generated.paths
	}
	dir, err := os.MkdirTemp("", "kvwarden-gguf-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		generated.Lock()
		defer generated.Unlock()
		os.RemoveAll(dir)
		generated.paths = nil
	})
	cfg := memoryBoundConfig()
	w, v := seededWeights(cfg), syntheticVocab(cfg.Vocab)
	paths := map[WeightType]string{}
	for _, typ := range append([]WeightType{WeightF32}, benchWeightTypes...) {
		p := filepath.Join(dir, fmt.Sprintf("random-%s.gguf", typ))
		if err := os.WriteFile(p, writeGGUF(cfg, w, typ, v), 0o600); err != nil {
			b.Fatal(err)
		}
		paths[typ] = p
		runtime.GC() // the file's bytes, gigabytes, before the next
	}
	generated.paths = paths
	return paths
}

// BenchmarkDecodeWeights decodes one sequence, a token at a time, with
// memoryBoundConfig's random weights read from GGUF files of each weight
// type, against the same model in F32 in the same run: the two alternate
// step by step (a run of 16 tokens each from BOS), so that both see the
// same machine. It reports each one's tokens per second, x-f32 (the
// type's tokens per second over F32's: the goal for Q8_0 is at least 2.5),
// and x-roofline (a step's time over the time memcpy takes for the bytes
// the step reads: weights and KV; 1 is memcpy speed).
//
// The files are written to a temporary folder first (generatedGGUF).
func BenchmarkDecodeWeights(b *testing.B) {
	paths := generatedGGUF(b)
	load := func(typ WeightType) *ReferenceEngine {
		g, err := readGGUF(paths[typ], GGUFOptions{})
		if err != nil {
			b.Fatal(err)
		}
		e, err := NewEngine(g.cfg, g.w)
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	f32 := load(WeightF32)
	const run = 16
	step := func(e *ReferenceEngine) time.Duration {
		start := time.Now()
		if _, err := e.Reference([]int{1}, run); err != nil {
			b.Fatal(err)
		}
		return time.Since(start) / run
	}
	for _, typ := range benchWeightTypes {
		b.Run("type="+typ.String(), func(b *testing.B) {
			e := load(typ)
			step(e)
			step(f32) // warm both: the caches, the scratch made
			var tq, tf time.Duration
			for b.Loop() {
				tq += step(e)
				tf += step(f32)
			}
			n := time.Duration(b.N)
			kvBytes := int64(run/2) * int64(e.m.geo.BytesPerToken())
			bytes := e.m.w.Bytes() + kvBytes
			b.ReportMetric(1e9/float64(tq/n), "tok/s")
			b.ReportMetric(1e9/float64(tf/n), "f32-tok/s")
			b.ReportMetric(float64(tf)/float64(tq), "x-f32")
			b.ReportMetric(float64(bytes)/float64(tq/n), "GB/s")
			b.ReportMetric(float64(tq/n)/copyTime(bytes), "x-roofline")
			b.ReportMetric(float64(tf/n)/copyTime(f32.m.w.Bytes()+kvBytes), "f32-x-roofline")
		})
	}
}

// BenchmarkLoadGGUF loads memoryBoundConfig's model from its GGUF file of
// each weight type, as a node does (LoadGGUF: map, check every weight,
// fingerprint), and reports the load's seconds per GB of file and the
// resident memory the load adds over the file's size (x-file: 1 is the
// file once). The files were just written, so they load from the page
// cache, not the disk.
func BenchmarkLoadGGUF(b *testing.B) {
	paths := generatedGGUF(b)
	for _, typ := range append([]WeightType{WeightF32}, benchWeightTypes...) {
		b.Run("type="+typ.String(), func(b *testing.B) {
			fi, err := os.Stat(paths[typ])
			if err != nil {
				b.Fatal(err)
			}
			var rss int64
			var m *Model
			for b.Loop() {
				// What the last load kept goes back to the system first, so
				// that this one's memory is all new.
				b.StopTimer()
				m = nil
				runtime.GC()
				debug.FreeOSMemory()
				before := residentBytes(b)
				b.StartTimer()
				if m, err = LoadGGUF(paths[typ], GGUFOptions{}); err != nil {
					b.Fatal(err)
				}
				rss = max(rss, residentBytes(b)-before)
			}
			runtime.KeepAlive(m)
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)/(float64(fi.Size())/1e9), "s/GB")
			b.ReportMetric(float64(rss)/float64(fi.Size()), "x-file")
		})
	}
}

// residentBytes is the process's resident memory (VmRSS), in bytes.
func residentBytes(b *testing.B) int64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skipf("no /proc/self/status here: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}
