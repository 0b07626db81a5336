package gpu

import (
	"errors"
	"strings"
	"testing"
)

// The incident: a 1,048,576-token window advertised over a 681,280-token
// pool; the fix: a pool of about 2.04 M tokens.
const (
	incidentContextTokens = 1048576
	incidentPoolTokens    = 681280
	resizedPoolTokens     = 2040000
)

func configuredPreflight(poolTokens int64) PreflightConfig {
	s := DefaultSizingConfig()
	s.KVPoolTokens = poolTokens
	return PreflightConfig{ContextTokens: incidentContextTokens, Sizing: s}
}

func TestPreflightIncidentConfiguredPoolFails(t *testing.T) {
	r := Preflight(CPUDevice(0), configuredPreflight(incidentPoolTokens))
	if r.OK() {
		t.Fatalf("preflight passed a %d-token pool for a %d-token context", incidentPoolTokens, incidentContextTokens)
	}
	var e *PoolTooSmallError
	if !errors.As(r.Err, &e) {
		t.Fatalf("Err = %v, want *PoolTooSmallError", r.Err)
	}
	// Default geometry: 16-token pages of 2 MiB.
	if e.ContextTokens != incidentContextTokens || e.PoolTokens != incidentPoolTokens || e.PoolPages != 42580 ||
		e.NeedPages != 65536 || e.NeedTokens != incidentContextTokens || e.NeedPoolBytes != 128*gib {
		t.Fatalf("numbers: %+v", e)
	}
	if e.NeedMemoryBytes != MemoryForPool(128*gib, configuredPreflight(0).Sizing) || e.NeedMemoryBytes <= 128*gib {
		t.Fatalf("NeedMemoryBytes = %d, want the 0.9-fraction memory for 128 GiB", e.NeedMemoryBytes)
	}
	if r.FullContextRequests != 0 {
		t.Fatalf("FullContextRequests = %d, want 0", r.FullContextRequests)
	}
	msg := r.Err.Error()
	for _, want := range []string{"681280 tokens", "1048576 tokens", "at most 681280 tokens",
		"KVPoolTokens to at least 1048576", "137438953472 bytes", "cpu:0"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
}

func TestPreflightIncidentResizedPoolPasses(t *testing.T) {
	r := Preflight(CPUDevice(0), configuredPreflight(resizedPoolTokens))
	if !r.OK() {
		t.Fatalf("preflight failed: %v", r.Err)
	}
	if r.Pool.Tokens != resizedPoolTokens || r.Pool.Pages != 127500 || r.ContextPages != 65536 || r.FullContextRequests != 1 {
		t.Fatalf("report: pool %+v context pages %d fit %d", r.Pool, r.ContextPages, r.FullContextRequests)
	}
	if r.Warning != nil {
		t.Fatalf("unexpected warning on a device with unknown memory: %v", r.Warning)
	}
}

func TestPreflightIncidentMemoryDerived(t *testing.T) {
	// The incident's pool derived from memory on an 80 GB device, then the
	// same node on a 141 GB device.
	cfg := PreflightConfig{ContextTokens: incidentContextTokens,
		Sizing: SizingConfig{Geometry: geom64K, MemoryFraction: 1, WeightBytes: 39340 * mib}}
	r := Preflight(gpuDevice("NVIDIA H100 80GB HBM3", 81920*mib), cfg)
	var e *PoolTooSmallError
	if !errors.As(r.Err, &e) {
		t.Fatalf("Err = %v, want *PoolTooSmallError", r.Err)
	}
	// 65,536 pages of 1 MiB plus 39,340 MiB of weights at fraction 1.
	if e.PoolTokens != incidentPoolTokens || e.NeedPoolBytes != 65536*mib || e.NeedMemoryBytes != 104876*mib {
		t.Fatalf("numbers: %+v", e)
	}
	if msg := e.Error(); !strings.Contains(msg, "109970456576 bytes of device memory") ||
		!strings.Contains(msg, "advertise a context window of at most 681280 tokens") {
		t.Fatalf("message %q lacks the memory fix or the context fix", msg)
	}

	cfg.Sizing.WeightBytes = 16884 * mib
	r = Preflight(gpuDevice("NVIDIA H200 141GB HBM3e", 144384*mib), cfg)
	if !r.OK() || r.Pool.Tokens != resizedPoolTokens || r.FullContextRequests != 1 {
		t.Fatalf("resized: ok=%v err=%v pool=%d fit=%d", r.OK(), r.Err, r.Pool.Tokens, r.FullContextRequests)
	}
}

func TestPreflightFullContextRequests(t *testing.T) {
	tests := []struct {
		name                 string
		pool, context        int64
		contextPages, fit    int64
		ok                   bool
		pageTokens, wantPool int64
	}{
		{"exact one", 1048576, 1048576, 65536, 1, true, 16, 1048576},
		{"three and a bit", 3*1048576 + 500, 1048576, 65536, 3, true, 16, 3*1048576 + 496},
		// 20 tokens need 2 pages; 64 tokens are 4 pages: 2 requests, not
		// the 3 that 64/20 would suggest, because requests never share a page.
		{"pages not tokens", 64, 20, 2, 2, true, 16, 64},
		{"one token short", 1048560, 1048561, 65536, 0, false, 16, 1048560},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configuredPreflight(tc.pool)
			cfg.ContextTokens = tc.context
			r := Preflight(CPUDevice(0), cfg)
			if r.OK() != tc.ok || r.ContextPages != tc.contextPages || r.FullContextRequests != tc.fit || r.Pool.Tokens != tc.wantPool {
				t.Fatalf("ok=%v (%v) context pages=%d fit=%d pool=%d; want %v %d %d %d",
					r.OK(), r.Err, r.ContextPages, r.FullContextRequests, r.Pool.Tokens, tc.ok, tc.contextPages, tc.fit, tc.wantPool)
			}
		})
	}
}

func TestPreflightRejects(t *testing.T) {
	t.Run("zero context", func(t *testing.T) {
		cfg := configuredPreflight(resizedPoolTokens)
		cfg.ContextTokens = 0
		var e *ContextTokensError
		if err := cfg.Validate(); !errors.As(err, &e) || !strings.Contains(err.Error(), "ContextTokens (0) must be at least 1") {
			t.Fatalf("Validate = %v, want *ContextTokensError naming 0", err)
		}
		reports, err := PreflightAll([]Device{CPUDevice(0)}, cfg)
		if !errors.As(err, &e) || reports != nil {
			t.Fatalf("PreflightAll = %v, %v; want no reports and *ContextTokensError", reports, err)
		}
		if r := Preflight(CPUDevice(0), cfg); r.OK() {
			t.Fatal("Preflight passed a zero context window")
		}
	})
	t.Run("context above maximum", func(t *testing.T) {
		cfg := configuredPreflight(resizedPoolTokens)
		cfg.ContextTokens = ContextTokensMax + 1
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "4294967297") {
			t.Fatalf("Validate = %v", err)
		}
	})
	t.Run("configured pool below one page", func(t *testing.T) {
		r := Preflight(CPUDevice(0), configuredPreflight(15))
		var e *EmptyPoolError
		if !errors.As(r.Err, &e) || !strings.Contains(r.Err.Error(), "KVPoolTokens (15) is less than one page of 16 tokens") {
			t.Fatalf("Err = %v, want *EmptyPoolError", r.Err)
		}
	})
	t.Run("memory pool below one page", func(t *testing.T) {
		cfg := PreflightConfig{ContextTokens: 16, Sizing: SizingConfig{Geometry: geom64K, MemoryFraction: 1, ReserveBytes: mib + 1}}
		r := Preflight(gpuDevice("tiny", 2*mib), cfg)
		var e *EmptyPoolError
		if !errors.As(r.Err, &e) || !strings.Contains(r.Err.Error(), "1048575 bytes left") ||
			!strings.Contains(r.Err.Error(), "0 pages of 1048576 bytes") {
			t.Fatalf("Err = %v, want *EmptyPoolError with the numbers", r.Err)
		}
	})
	t.Run("unknown memory", func(t *testing.T) {
		cfg := configuredPreflight(0)
		r := Preflight(CPUDevice(0), cfg)
		var e *UnknownMemoryError
		if !errors.As(r.Err, &e) {
			t.Fatalf("Err = %v, want *UnknownMemoryError", r.Err)
		}
	})
}

func TestPreflightAllJoinsEveryFailure(t *testing.T) {
	cfg := PreflightConfig{ContextTokens: incidentContextTokens,
		Sizing: SizingConfig{Geometry: geom64K, MemoryFraction: 1, WeightBytes: 16884 * mib}}
	devs := []Device{
		gpuDevice("NVIDIA H200 141GB HBM3e", 144384*mib),
		{Index: 1, Name: "NVIDIA H100 80GB HBM3", MemoryTotalBytes: 81920 * mib, Kind: KindNVML},
		{Index: 2, Name: "tiny", MemoryTotalBytes: 16884 * mib, Kind: KindNVML},
	}
	reports, err := PreflightAll(devs, cfg)
	if len(reports) != 3 || !reports[0].OK() || reports[1].OK() || reports[2].OK() {
		t.Fatalf("reports: %+v", reports)
	}
	var small *PoolTooSmallError
	var empty *EmptyPoolError
	if !errors.As(err, &small) || small.Device.Index != 1 || !errors.As(err, &empty) || empty.Pool.Device.Index != 2 {
		t.Fatalf("joined error %v lacks device 1's PoolTooSmallError or device 2's EmptyPoolError", err)
	}
}

func TestPreflightWarnsWhenConfiguredPoolExceedsMemory(t *testing.T) {
	// 2.04 M tokens at 128 KiB a token is about 249 GiB, far more than a
	// 40 GB device: the node may start (the pool was measured), but the
	// report says the numbers do not add up.
	r := Preflight(gpuDevice("Mock NVIDIA A100-SXM4-40GB", 40960*mib), configuredPreflight(resizedPoolTokens))
	if !r.OK() {
		t.Fatalf("preflight failed: %v", r.Err)
	}
	var w *PoolExceedsMemoryError
	if !errors.As(r.Warning, &w) || !strings.Contains(r.Warning.Error(), "267386880000 bytes") {
		t.Fatalf("Warning = %v, want *PoolExceedsMemoryError with the pool bytes", r.Warning)
	}
}
