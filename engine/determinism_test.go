package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/kv"
)

// ropeHashes hashes the rotary tables of long contexts, where a last-bit
// difference in a frequency rounds some entry differently.
func ropeHashes() string {
	var out []string
	for _, c := range []struct {
		positions, headDim int
		theta              float64
	}{{16384, 64, 1e4}, {8192, 128, 5e5}, {32768, 128, 1e4}} {
		cos, sin := ropeTables(c.positions, c.headDim, c.theta)
		h := sha256.New()
		for _, v := range append(cos, sin...) {
			h.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)))
		}
		out = append(out, fmt.Sprintf("%x", h.Sum(nil)))
	}
	return strings.Join(out, ",")
}

// TestRopeTablesWithoutFMA: the rotary tables are the same bits whether or
// not the CPU's fused multiply-add is used (math.Exp picks it at run time;
// the tables must not): this test binary run again with GODEBUG=cpu.fma=off
// computes the same tables.
func TestRopeTablesWithoutFMA(t *testing.T) {
	if os.Getenv("KVWARDEN_ROPE_CHILD") == "1" {
		fmt.Println(ropeHashes())
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestRopeTablesWithoutFMA$")
	cmd.Env = append(os.Environ(), "KVWARDEN_ROPE_CHILD=1", "GODEBUG=cpu.fma=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the child without FMA: %v\n%s", err, out)
	}
	child, _, _ := strings.Cut(string(out), "\n")
	if here := ropeHashes(); child != here {
		t.Fatalf("rotary tables with FMA %s, without %s", here, child)
	}
}

// TestRopeFrequencies: the package's own exp and ln give the frequencies
// math.Pow gives, to float64's last few bits.
func TestRopeFrequencies(t *testing.T) {
	for _, theta := range []float64{10000, 500000, 1e6, 1.5} {
		for _, hd := range []int{2, 8, 64, 128, 256} {
			for i := range hd / 2 {
				want := math.Pow(theta, -float64(2*i)/float64(hd))
				got := expLn(float64(-float64(2*i)/float64(hd)) * lnOf(theta))
				if math.Abs(got-want) > 1e-14*want {
					t.Fatalf("theta %g, head %d, pair %d: %v, math.Pow %v", theta, hd, i, got, want)
				}
			}
		}
	}
}

// TestStoredNaNIsCanonical: a NaN of any sign and payload is stored as the
// one quiet NaN of the page's type, so that KV bytes do not depend on which
// kernels computed the NaN.
func TestStoredNaNIsCanonical(t *testing.T) {
	for _, bits := range []uint32{0x7fc00000, 0xffc00000, 0x7f800001, 0xffc00002, 0x7fffffff} {
		f := math.Float32frombits(bits)
		for _, c := range []struct {
			dt   kv.DType
			want []byte
		}{{kv.F32, []byte{0x00, 0x00, 0xc0, 0x7f}}, {kv.F16, []byte{0x00, 0x7e}}, {kv.BF16, []byte{0xc0, 0x7f}}} {
			dst := make([]byte, 4)
			encodeKV(dst, []float32{f}, c.dt)
			if got := dst[:len(c.want)]; string(got) != string(c.want) {
				t.Errorf("NaN %08x stored as %s: % x, want % x", bits, c.dt, got, c.want)
			}
		}
	}
}

// panickyKV is a pool whose reads panic.
type panickyKV struct{ KV }

func (panickyKV) Read(kv.Lease) ([]byte, int, error) { panic("a pool's read panicked") }

// TestStepBatchAfterPanic: a batch step that panics in a pool's call
// leaves no sequence marked as in a batch: the next batch steps it.
func TestStepBatchAfterPanic(t *testing.T) {
	e := engineFor(t, DefaultModelConfig())
	p := fragmentedPool(t, e.Config().Geometry(16), 16, 3, 3)
	pf := prefill(t, e, p, ownerA, testPrompt(5, "panic"))
	s, err := e.Decode(p, pf.Manifest, pf.First)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(p)
	toks, errs := make([]int, 1), make([]error, 1)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the pool's panic did not reach the caller")
			}
		}()
		StepBatch(panickyKV{p}, []Sequence{s}, toks, errs)
	}()
	StepBatch(p, []Sequence{s}, toks, errs)
	if errs[0] != nil {
		t.Fatalf("the batch after a panic: %v", errs[0])
	}
}
