package gpu

import (
	"fmt"
	"math"

	"github.com/kvwarden/kvwarden/kv"
)

// bytesMax bounds every byte count in a SizingConfig (1 PiB, far above any
// device) so that sums such as WeightBytes+ReserveBytes+pool bytes and the
// float64 product with MemoryFraction stay exact in int64 and float64.
const bytesMax = int64(1) << 50

// SizingConfig says how large each device's KV pool is.
type SizingConfig struct {
	// Geometry is the KV-cache shape of the model; one page takes
	// Geometry.PageBytes() bytes and holds Geometry.PageTokens tokens. It
	// must validate.
	Geometry kv.Geometry
	// MemoryFraction is the share of each device's total memory the node
	// may use for weights, reserve and KV pool together, in (0, 1]. Zero is
	// invalid: there is no silent default.
	MemoryFraction float64
	// WeightBytes is the bytes of model weights resident on each device.
	// Zero means the device holds no weights (the CPU reference engine
	// keeps its small weights outside this budget). Must not be negative.
	WeightBytes int64
	// ReserveBytes is the bytes of each device kept back for activations,
	// the runtime's own context and fragmentation. Zero means nothing is
	// kept back. Must not be negative.
	ReserveBytes int64
	// KVPoolTokens, when non-zero, is the pool size in tokens per device as
	// an operator measured or configured it; it replaces memory-derived
	// sizing and is rounded down to whole pages. Zero means derive the pool
	// from memory. Must not be negative.
	KVPoolTokens int64
}

// DefaultSizingConfig is a 32-layer model with 8 KV heads of 128 elements in
// bf16 (128 KiB a token), 16-token pages, 90% of device memory, no weights
// and no reserve. Real deployments set WeightBytes and ReserveBytes.
func DefaultSizingConfig() SizingConfig {
	return SizingConfig{
		Geometry:       kv.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, PageTokens: 16, DType: kv.BF16},
		MemoryFraction: 0.9,
	}
}

// Validate reports the first field out of range, with its value. Limits that
// depend on a device's memory are checked by SizePool.
func (c SizingConfig) Validate() error {
	if err := c.Geometry.Validate(); err != nil {
		return fmt.Errorf("gpu: sizing: %w", err)
	}
	// The negated form also refuses NaN.
	if !(c.MemoryFraction > 0 && c.MemoryFraction <= 1) {
		return fmt.Errorf("gpu: MemoryFraction (%g) must be in (0, 1]", c.MemoryFraction)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"WeightBytes", c.WeightBytes}, {"ReserveBytes", c.ReserveBytes}} {
		if f.v < 0 || f.v > bytesMax {
			return fmt.Errorf("gpu: %s (%d) must be in [0, %d]", f.name, f.v, bytesMax)
		}
	}
	if tokensMax := bytesMax / int64(c.Geometry.BytesPerToken()); c.KVPoolTokens < 0 || c.KVPoolTokens > tokensMax {
		return fmt.Errorf("gpu: KVPoolTokens (%d) must be in [0, %d] (%d bytes at %d bytes/token)",
			c.KVPoolTokens, tokensMax, bytesMax, c.Geometry.BytesPerToken())
	}
	return nil
}

// PoolSource says how a pool's size was decided.
type PoolSource string

const (
	// PoolFromMemory is derived from device memory, fraction, weights and
	// reserve.
	PoolFromMemory PoolSource = "memory"
	// PoolConfigured is SizingConfig.KVPoolTokens.
	PoolConfigured PoolSource = "configured"
)

// PoolSize is the KV pool of one device.
type PoolSize struct {
	Device Device
	Source PoolSource
	// PageTokens and PageBytes are one page's tokens and bytes.
	PageTokens int64
	PageBytes  int64
	// UsableBytes is floor(device memory × MemoryFraction); zero when the
	// device memory is unknown.
	UsableBytes int64
	// AvailableBytes is UsableBytes − WeightBytes − ReserveBytes, the bytes
	// the pool may take; zero when the device memory is unknown or, for a
	// configured pool, when weights and reserve do not fit.
	AvailableBytes int64
	// Pages, Tokens (Pages × PageTokens) and Bytes (Pages × PageBytes) are
	// the pool's size.
	Pages, Tokens, Bytes int64
}

// SizePool computes dev's pool. From memory:
//
//	pages = floor((memory × MemoryFraction − WeightBytes − ReserveBytes) / page bytes)
//
// With KVPoolTokens set, pages = floor(KVPoolTokens / PageTokens). A pool of
// zero pages is returned without error; Preflight refuses it.
func SizePool(dev Device, cfg SizingConfig) (PoolSize, error) {
	if err := cfg.Validate(); err != nil {
		return PoolSize{}, err
	}
	p := PoolSize{
		Device:     dev,
		PageTokens: int64(cfg.Geometry.PageTokens),
		PageBytes:  int64(cfg.Geometry.PageBytes()),
	}
	budgetErr := p.budget(cfg)
	if cfg.KVPoolTokens > 0 {
		// An operator's measurement wins over our arithmetic; a budget
		// that does not add up is reported by Preflight as a warning.
		p.Source = PoolConfigured
		p.setPages(cfg.KVPoolTokens / p.PageTokens)
		return p, nil
	}
	if budgetErr != nil {
		return PoolSize{}, budgetErr
	}
	p.Source = PoolFromMemory
	p.setPages(p.AvailableBytes / p.PageBytes)
	return p, nil
}

// budget fills UsableBytes and AvailableBytes from the device memory.
func (p *PoolSize) budget(cfg SizingConfig) error {
	total := p.Device.MemoryTotalBytes
	if total <= 0 {
		return &UnknownMemoryError{Device: p.Device}
	}
	total = min(total, bytesMax)
	usable := int64(math.Floor(float64(total) * cfg.MemoryFraction))
	p.UsableBytes = usable
	if cfg.WeightBytes+cfg.ReserveBytes > usable {
		return &MemoryBudgetError{Device: p.Device, TotalBytes: total, MemoryFraction: cfg.MemoryFraction,
			UsableBytes: usable, WeightBytes: cfg.WeightBytes, ReserveBytes: cfg.ReserveBytes}
	}
	p.AvailableBytes = usable - cfg.WeightBytes - cfg.ReserveBytes
	return nil
}

func (p *PoolSize) setPages(pages int64) {
	p.Pages = pages
	p.Tokens = pages * p.PageTokens
	p.Bytes = pages * p.PageBytes
}

// MemoryForPool is the least device memory, in bytes, whose MemoryFraction
// share holds poolBytes of KV pool plus cfg's weights and reserve, i.e. the
// least m with floor(m × MemoryFraction) ≥ poolBytes + WeightBytes +
// ReserveBytes. cfg must validate and poolBytes must be in [0, 2^50].
func MemoryForPool(poolBytes int64, cfg SizingConfig) int64 {
	need := poolBytes + cfg.WeightBytes + cfg.ReserveBytes
	m := int64(math.Ceil(float64(need) / cfg.MemoryFraction))
	// float64 division can land one byte short or long; walk to the exact
	// least value. Both loops run at most a few steps because need ≤ 3×2^50
	// keeps the float error far below one byte per step.
	for int64(math.Floor(float64(m)*cfg.MemoryFraction)) < need {
		m++
	}
	for m > 0 && int64(math.Floor(float64(m-1)*cfg.MemoryFraction)) >= need {
		m--
	}
	return m
}

// UnknownMemoryError is memory-derived sizing on a device whose memory is
// not known (a CPU device without a configured budget).
type UnknownMemoryError struct {
	Device Device
}

func (e *UnknownMemoryError) Error() string {
	return fmt.Sprintf("gpu: device %s (%s) reports %d bytes of memory, so no pool can be derived from it: "+
		"configure the CPU memory budget (CPUMemoryBytes) or an explicit pool (KVPoolTokens)",
		e.Device, e.Device.Name, e.Device.MemoryTotalBytes)
}

// MemoryBudgetError is weights plus reserve exceeding the usable memory.
type MemoryBudgetError struct {
	Device         Device
	TotalBytes     int64
	MemoryFraction float64
	UsableBytes    int64
	WeightBytes    int64
	ReserveBytes   int64
}

func (e *MemoryBudgetError) Error() string {
	return fmt.Sprintf("gpu: device %s (%s): WeightBytes (%d) + ReserveBytes (%d) = %d bytes exceed the %d usable bytes "+
		"(MemoryFraction %g of %d bytes)", e.Device, e.Device.Name, e.WeightBytes, e.ReserveBytes,
		e.WeightBytes+e.ReserveBytes, e.UsableBytes, e.MemoryFraction, e.TotalBytes)
}
