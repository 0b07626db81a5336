package gpu

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/kv"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// geom64K is 32 layers × 8 KV heads × 64 elements in bf16: 65,536 bytes a
// token, so a 16-token page is exactly 1 MiB and pool MiB equal pool pages.
var geom64K = kv.Geometry{Layers: 32, KVHeads: 8, HeadDim: 64, PageTokens: 16, DType: kv.BF16}

func gpuDevice(name string, totalBytes int64) Device {
	return Device{Index: 0, Name: name, UUID: "GPU-test", MemoryTotalBytes: totalBytes, Kind: KindNVML}
}

func TestSizePool(t *testing.T) {
	h100 := gpuDevice("NVIDIA H100 80GB HBM3", 81920*mib)
	h200 := gpuDevice("NVIDIA H200 141GB HBM3e", 144384*mib)
	a100 := gpuDevice("Mock NVIDIA A100-SXM4-40GB", 40960*mib)
	cpuNoBudget := CPUDevice(0)

	tests := []struct {
		name      string
		dev       Device
		cfg       SizingConfig
		source    PoolSource
		pages     int64
		tokens    int64
		bytes     int64
		available int64
	}{
		{
			// The incident's pool: 681,280 tokens on one prefill GPU.
			name:   "incident pool from memory",
			dev:    h100,
			cfg:    SizingConfig{Geometry: geom64K, MemoryFraction: 1, WeightBytes: 39340 * mib},
			source: PoolFromMemory, pages: 42580, tokens: 681280, bytes: 42580 * mib, available: 42580 * mib,
		},
		{
			// The incident's fix: about 2.04 M tokens.
			name:   "resized pool from memory",
			dev:    h200,
			cfg:    SizingConfig{Geometry: geom64K, MemoryFraction: 1, WeightBytes: 16884 * mib},
			source: PoolFromMemory, pages: 127500, tokens: 2040000, bytes: 127500 * mib, available: 127500 * mib,
		},
		{
			// 0.9 × 40 GiB = 36 GiB; minus 14 GiB weights and 2 GiB reserve
			// leaves 20 GiB = 10,240 pages of 2 MiB (default geometry).
			name: "fraction weights and reserve",
			dev:  a100,
			cfg: SizingConfig{Geometry: DefaultSizingConfig().Geometry, MemoryFraction: 0.9,
				WeightBytes: 14 * gib, ReserveBytes: 2 * gib},
			source: PoolFromMemory, pages: 10240, tokens: 163840, bytes: 20 * gib, available: 20 * gib,
		},
		{
			name:   "partial page is floored",
			dev:    gpuDevice("small", 4*mib-1),
			cfg:    SizingConfig{Geometry: geom64K, MemoryFraction: 1},
			source: PoolFromMemory, pages: 3, tokens: 48, bytes: 3 * mib, available: 4*mib - 1,
		},
		{
			name:   "less than one page gives zero pages",
			dev:    gpuDevice("tiny", 2*mib),
			cfg:    SizingConfig{Geometry: geom64K, MemoryFraction: 1, ReserveBytes: mib + 1},
			source: PoolFromMemory, pages: 0, tokens: 0, bytes: 0, available: mib - 1,
		},
		{
			name:   "configured incident pool on a CPU device without budget",
			dev:    cpuNoBudget,
			cfg:    SizingConfig{Geometry: geom64K, MemoryFraction: 0.9, KVPoolTokens: 681280},
			source: PoolConfigured, pages: 42580, tokens: 681280, bytes: 42580 * mib,
		},
		{
			name:   "configured pool rounds down to whole pages",
			dev:    cpuNoBudget,
			cfg:    SizingConfig{Geometry: geom64K, MemoryFraction: 0.9, KVPoolTokens: 681295},
			source: PoolConfigured, pages: 42580, tokens: 681280, bytes: 42580 * mib,
		},
		{
			name:   "configured pool ignores memory",
			dev:    h100,
			cfg:    SizingConfig{Geometry: geom64K, MemoryFraction: 1, KVPoolTokens: 2040000},
			source: PoolConfigured, pages: 127500, tokens: 2040000, bytes: 127500 * mib, available: 81920 * mib,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := SizePool(tc.dev, tc.cfg)
			if err != nil {
				t.Fatalf("SizePool: %v", err)
			}
			if p.Source != tc.source || p.Pages != tc.pages || p.Tokens != tc.tokens || p.Bytes != tc.bytes ||
				p.AvailableBytes != tc.available {
				t.Fatalf("got source=%s pages=%d tokens=%d bytes=%d available=%d; want %s %d %d %d %d",
					p.Source, p.Pages, p.Tokens, p.Bytes, p.AvailableBytes,
					tc.source, tc.pages, tc.tokens, tc.bytes, tc.available)
			}
			if p.Tokens != p.Pages*int64(tc.cfg.Geometry.PageTokens) || p.Bytes != p.Pages*int64(tc.cfg.Geometry.PageBytes()) {
				t.Fatalf("tokens/bytes not consistent with pages: %+v", p)
			}
		})
	}
}

func TestSizePoolErrors(t *testing.T) {
	t.Run("unknown memory", func(t *testing.T) {
		_, err := SizePool(CPUDevice(0), SizingConfig{Geometry: geom64K, MemoryFraction: 0.9})
		var e *UnknownMemoryError
		if !errors.As(err, &e) {
			t.Fatalf("err = %v, want *UnknownMemoryError", err)
		}
		for _, want := range []string{"cpu:0", "CPUMemoryBytes", "KVPoolTokens"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message %q lacks %q", err, want)
			}
		}
	})
	t.Run("weights and reserve exceed usable memory", func(t *testing.T) {
		dev := gpuDevice("A100", 40*gib)
		_, err := SizePool(dev, SizingConfig{Geometry: geom64K, MemoryFraction: 0.5, WeightBytes: 19 * gib, ReserveBytes: 2 * gib})
		var e *MemoryBudgetError
		if !errors.As(err, &e) {
			t.Fatalf("err = %v, want *MemoryBudgetError", err)
		}
		if e.UsableBytes != 20*gib || e.WeightBytes != 19*gib || e.ReserveBytes != 2*gib {
			t.Fatalf("numbers: %+v", e)
		}
		for _, want := range []string{"20401094656", "22548578304", "21474836480", "0.5", "42949672960"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message %q lacks %q", err, want)
			}
		}
	})
	t.Run("invalid config", func(t *testing.T) {
		_, err := SizePool(gpuDevice("x", gib), SizingConfig{Geometry: geom64K})
		if err == nil || !strings.Contains(err.Error(), "MemoryFraction (0)") {
			t.Fatalf("err = %v, want MemoryFraction error", err)
		}
	})
}

func TestSizingConfigValidate(t *testing.T) {
	ok := SizingConfig{Geometry: geom64K, MemoryFraction: 0.9}
	tests := []struct {
		name string
		mod  func(*SizingConfig)
		want string // "" means valid
	}{
		{"default", func(c *SizingConfig) { *c = DefaultSizingConfig() }, ""},
		{"fraction one", func(c *SizingConfig) { c.MemoryFraction = 1 }, ""},
		{"fraction zero", func(c *SizingConfig) { c.MemoryFraction = 0 }, "MemoryFraction (0) must be in (0, 1]"},
		{"fraction negative", func(c *SizingConfig) { c.MemoryFraction = -0.25 }, "MemoryFraction (-0.25)"},
		{"fraction above one", func(c *SizingConfig) { c.MemoryFraction = 1.5 }, "MemoryFraction (1.5)"},
		{"fraction NaN", func(c *SizingConfig) { c.MemoryFraction = math.NaN() }, "MemoryFraction (NaN)"},
		{"weights negative", func(c *SizingConfig) { c.WeightBytes = -1 }, "WeightBytes (-1)"},
		{"reserve negative", func(c *SizingConfig) { c.ReserveBytes = -7 }, "ReserveBytes (-7)"},
		{"weights absurd", func(c *SizingConfig) { c.WeightBytes = math.MaxInt64 }, "WeightBytes (9223372036854775807)"},
		{"pool tokens negative", func(c *SizingConfig) { c.KVPoolTokens = -3 }, "KVPoolTokens (-3)"},
		{"pool tokens overflow", func(c *SizingConfig) { c.KVPoolTokens = math.MaxInt64 / 2 }, "KVPoolTokens (4611686018427387903)"},
		{"bad geometry", func(c *SizingConfig) { c.Geometry.PageTokens = 0 }, "PageTokens (0)"},
		{"bad dtype", func(c *SizingConfig) { c.Geometry.DType = 0 }, "DType"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mod(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want message containing %q", err, tc.want)
			}
		})
	}
}

func TestMemoryForPool(t *testing.T) {
	// Exact cases first.
	cfg := SizingConfig{Geometry: geom64K, MemoryFraction: 1, WeightBytes: 39340 * mib}
	if got := MemoryForPool(65536*mib, cfg); got != 104876*mib {
		t.Fatalf("MemoryForPool(64 GiB, fraction 1, 39340 MiB weights) = %d, want %d", got, 104876*mib)
	}
	cfg = SizingConfig{Geometry: geom64K, MemoryFraction: 0.5, ReserveBytes: 1}
	if got := MemoryForPool(9, cfg); got != 20 {
		t.Fatalf("MemoryForPool(9, fraction 0.5, reserve 1) = %d, want 20", got)
	}
	// Then the defining property over awkward fractions and sizes: the
	// least m whose floor(m × fraction) covers the need.
	for _, f := range []float64{0.9, 0.95, 0.333, 0.7, 1e-3, 1} {
		for _, pool := range []int64{0, 1, 3, 1023, 128 * gib, 137438953472, 1 << 46} {
			c := SizingConfig{Geometry: geom64K, MemoryFraction: f, WeightBytes: 12345, ReserveBytes: 678}
			need := pool + c.WeightBytes + c.ReserveBytes
			m := MemoryForPool(pool, c)
			if int64(math.Floor(float64(m)*f)) < need {
				t.Fatalf("fraction %g pool %d: m=%d gives %v < need %d", f, pool, m, math.Floor(float64(m)*f), need)
			}
			if int64(math.Floor(float64(m-1)*f)) >= need {
				t.Fatalf("fraction %g pool %d: m=%d is not the least (m-1 suffices)", f, pool, m)
			}
			// And the memory it names really yields at least that pool
			// (for devices below the 1 PiB bound sizing clamps to).
			if m > bytesMax {
				continue
			}
			got, err := SizePool(gpuDevice("x", m), SizingConfig{Geometry: geom64K, MemoryFraction: f,
				WeightBytes: c.WeightBytes, ReserveBytes: c.ReserveBytes})
			if err != nil || got.AvailableBytes < pool {
				t.Fatalf("fraction %g pool %d: SizePool on %d bytes = %+v, %v", f, pool, m, got, err)
			}
		}
	}
}
