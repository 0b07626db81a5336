package gpu

import (
	"errors"
	"fmt"
)

// ContextTokensMax bounds PreflightConfig.ContextTokens (2^32 tokens, far
// above any model) so that the pages and bytes a full context needs stay in
// int64 range for every valid geometry.
const ContextTokensMax = int64(1) << 32

// PreflightConfig is what a node checks before it starts.
type PreflightConfig struct {
	// ContextTokens is the context window, in tokens, the node would
	// advertise: the longest prompt plus output one request may have. Must
	// be in [1, ContextTokensMax]; zero is refused because a node that
	// advertises nothing cannot be checked against anything.
	ContextTokens int64
	// Sizing decides each device's pool.
	Sizing SizingConfig
}

// Validate reports the first field out of range, with its value.
func (c PreflightConfig) Validate() error {
	if c.ContextTokens < 1 || c.ContextTokens > ContextTokensMax {
		return &ContextTokensError{ContextTokens: c.ContextTokens, Max: ContextTokensMax}
	}
	if err := c.Sizing.Validate(); err != nil {
		return err
	}
	// The pool one full context needs must stay within the byte bound the
	// memory arithmetic (MemoryForPool) is exact for.
	g := c.Sizing.Geometry
	pages := (c.ContextTokens + int64(g.PageTokens) - 1) / int64(g.PageTokens)
	if pagesMax := bytesMax / int64(g.PageBytes()); pages > pagesMax {
		return fmt.Errorf("gpu: ContextTokens (%d) needs %d pages of %d bytes, more than the %d bytes a pool may have",
			c.ContextTokens, pages, g.PageBytes(), bytesMax)
	}
	return nil
}

// PreflightReport is the verdict for one device.
type PreflightReport struct {
	Device Device
	// Pool is the device's pool; zero-valued when sizing itself failed.
	Pool PoolSize
	// ContextTokens is the advertised context window, in tokens, and
	// ContextPages the pages one full-context request occupies.
	ContextTokens, ContextPages int64
	// FullContextRequests is how many full-context requests the pool holds
	// at once: Pool.Pages / ContextPages. Counting whole pages (not tokens)
	// is what admission will do, since a request never shares a page; the
	// two agree whenever the context is a multiple of the page size.
	FullContextRequests int64
	// Err is why the node must not start on this device; nil means it may.
	Err error
	// Warning is a doubt that does not stop the node: a configured pool
	// larger than the memory budget the sizing flags describe.
	Warning error
}

// OK reports whether the device passed.
func (r PreflightReport) OK() bool { return r.Err == nil }

// Preflight checks one device. cfg should have been validated; an invalid
// cfg is reported in Err like any other failure.
func Preflight(dev Device, cfg PreflightConfig) PreflightReport {
	r := PreflightReport{Device: dev, ContextTokens: cfg.ContextTokens}
	if err := cfg.Validate(); err != nil {
		r.Err = err
		return r
	}
	pool, err := SizePool(dev, cfg.Sizing)
	if err != nil {
		r.Err = err
		return r
	}
	r.Pool = pool
	r.ContextPages = (cfg.ContextTokens + pool.PageTokens - 1) / pool.PageTokens
	r.FullContextRequests = pool.Pages / r.ContextPages
	r.Warning = overcommit(pool, cfg.Sizing)
	switch {
	case pool.Pages == 0:
		r.Err = &EmptyPoolError{Pool: pool, KVPoolTokens: cfg.Sizing.KVPoolTokens}
	case pool.Pages < r.ContextPages:
		r.Err = tooSmall(pool, cfg, r.ContextPages)
	}
	return r
}

// PreflightAll checks every device. It returns an error when cfg is invalid
// (and then no reports) or when any device fails (joining every device's
// error, so the caller can print them all at once).
func PreflightAll(devs []Device, cfg PreflightConfig) ([]PreflightReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reports := make([]PreflightReport, len(devs))
	var errs []error
	for i, d := range devs {
		reports[i] = Preflight(d, cfg)
		if reports[i].Err != nil {
			errs = append(errs, reports[i].Err)
		}
	}
	return reports, errors.Join(errs...)
}

func tooSmall(pool PoolSize, cfg PreflightConfig, contextPages int64) *PoolTooSmallError {
	needBytes := contextPages * pool.PageBytes
	return &PoolTooSmallError{
		Device:          pool.Device,
		Source:          pool.Source,
		ContextTokens:   cfg.ContextTokens,
		PoolTokens:      pool.Tokens,
		PoolPages:       pool.Pages,
		PoolBytes:       pool.Bytes,
		NeedPages:       contextPages,
		NeedTokens:      contextPages * pool.PageTokens,
		NeedPoolBytes:   needBytes,
		NeedMemoryBytes: MemoryForPool(needBytes, cfg.Sizing),
		MemoryFraction:  cfg.Sizing.MemoryFraction,
		WeightBytes:     cfg.Sizing.WeightBytes,
		ReserveBytes:    cfg.Sizing.ReserveBytes,
	}
}

// overcommit doubts a configured pool that the device's memory budget, as
// the sizing fields describe it, cannot hold. It is a warning rather than a
// failure because a measured pool is evidence and the geometry or weight
// fields may be the ones that are off.
func overcommit(pool PoolSize, cfg SizingConfig) error {
	if pool.Source != PoolConfigured || pool.UsableBytes == 0 || pool.Bytes <= pool.AvailableBytes {
		return nil
	}
	return &PoolExceedsMemoryError{Pool: pool, WeightBytes: cfg.WeightBytes, ReserveBytes: cfg.ReserveBytes}
}

// PoolTooSmallError is a pool that cannot hold one request of the
// advertised context window: the misconfiguration behind a public
// cross-tenant leak, where a 1,048,576-token window was advertised over a
// 681,280-token pool and too-long prompts reached a reject path that
// handed decode another tenant's stale KV.
type PoolTooSmallError struct {
	Device Device
	Source PoolSource
	// ContextTokens is the advertised window; PoolTokens, PoolPages and
	// PoolBytes the pool's size.
	ContextTokens, PoolTokens, PoolPages, PoolBytes int64
	// NeedPages, NeedTokens and NeedPoolBytes are the pool one full-context
	// request needs; NeedMemoryBytes the device memory that pool needs at
	// MemoryFraction with WeightBytes and ReserveBytes.
	NeedPages, NeedTokens, NeedPoolBytes, NeedMemoryBytes int64
	MemoryFraction                                        float64
	WeightBytes, ReserveBytes                             int64
}

func (e *PoolTooSmallError) Error() string {
	grow := fmt.Sprintf("give the pool at least %d tokens (%d pages, %d bytes), which needs %d bytes of device memory "+
		"at MemoryFraction %g with WeightBytes %d and ReserveBytes %d",
		e.NeedTokens, e.NeedPages, e.NeedPoolBytes, e.NeedMemoryBytes, e.MemoryFraction, e.WeightBytes, e.ReserveBytes)
	if e.Source == PoolConfigured {
		grow = fmt.Sprintf("raise KVPoolTokens to at least %d after giving the device a pool that large (%d pages, "+
			"%d bytes; %d bytes of device memory at MemoryFraction %g with WeightBytes %d and ReserveBytes %d)",
			e.NeedTokens, e.NeedPages, e.NeedPoolBytes, e.NeedMemoryBytes, e.MemoryFraction, e.WeightBytes, e.ReserveBytes)
	}
	return fmt.Sprintf("gpu: device %s (%s): the KV pool holds %d tokens (%d pages, %d bytes) but the advertised "+
		"context window is %d tokens, so a full-context prompt cannot fit; fix one of: advertise a context window of "+
		"at most %d tokens, or %s",
		e.Device, e.Device.Name, e.PoolTokens, e.PoolPages, e.PoolBytes, e.ContextTokens, e.PoolTokens, grow)
}

// EmptyPoolError is a pool of zero pages.
type EmptyPoolError struct {
	Pool PoolSize
	// KVPoolTokens is the configured pool, or 0 for a memory-derived one.
	KVPoolTokens int64
}

func (e *EmptyPoolError) Error() string {
	p := e.Pool
	if p.Source == PoolConfigured {
		return fmt.Sprintf("gpu: device %s (%s): KVPoolTokens (%d) is less than one page of %d tokens, so the pool has 0 pages",
			p.Device, p.Device.Name, e.KVPoolTokens, p.PageTokens)
	}
	return fmt.Sprintf("gpu: device %s (%s): the %d bytes left for the KV pool after weights and reserve "+
		"hold 0 pages of %d bytes", p.Device, p.Device.Name, p.AvailableBytes, p.PageBytes)
}

// PoolExceedsMemoryError is a configured pool larger than the bytes the
// device's memory budget leaves for it.
type PoolExceedsMemoryError struct {
	Pool                      PoolSize
	WeightBytes, ReserveBytes int64
}

func (e *PoolExceedsMemoryError) Error() string {
	p := e.Pool
	return fmt.Sprintf("gpu: device %s (%s): the configured pool of %d tokens takes %d bytes, more than the %d bytes "+
		"left of %d usable bytes after WeightBytes %d and ReserveBytes %d; check the geometry and memory settings",
		p.Device, p.Device.Name, p.Tokens, p.Bytes, p.AvailableBytes, p.UsableBytes, e.WeightBytes, e.ReserveBytes)
}

// ContextTokensError is an advertised context window out of range.
type ContextTokensError struct {
	ContextTokens, Max int64
}

func (e *ContextTokensError) Error() string {
	if e.ContextTokens < 1 {
		return fmt.Sprintf("gpu: ContextTokens (%d) must be at least 1: a node must advertise the context window "+
			"its pool is checked against", e.ContextTokens)
	}
	return fmt.Sprintf("gpu: ContextTokens (%d) must be at most %d", e.ContextTokens, e.Max)
}
