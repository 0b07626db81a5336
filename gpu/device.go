package gpu

import (
	"errors"
	"fmt"
	"strings"
)

// DeviceKind says where a Device came from.
type DeviceKind string

const (
	// KindNVML is a device reported by NVML (a real GPU or NVIDIA's mock).
	KindNVML DeviceKind = "nvml"
	// KindCPU is the host, used when no NVML device is available; its memory
	// is a budget taken from configuration, not a measurement.
	KindCPU DeviceKind = "cpu"
)

// Device describes one device a node can place a KV pool on.
type Device struct {
	// Index is the NVML device index, or 0 for the CPU device.
	Index int
	// Name is the product name NVML reports, or "cpu".
	Name string
	// UUID is NVML's device UUID ("GPU-…"), or "cpu" for the CPU device.
	UUID string
	// MemoryTotalBytes is the device's total memory in bytes. For the CPU
	// device it is DiscoveryConfig.CPUMemoryBytes; zero means unknown, and
	// memory-derived sizing refuses such a device.
	MemoryTotalBytes int64
	// MemoryFreeBytes is the free memory NVML reported at discovery, in
	// bytes. It is informational only: sizing uses the total, because the
	// pool is allocated once at start and other tenants of the device are
	// accounted for by ReserveBytes. Zero means unknown (NVIDIA's mocks leave
	// it at 0, and the CPU device does not measure it).
	MemoryFreeBytes int64
	// Kind says whether the device came from NVML or is the CPU fallback.
	Kind DeviceKind
}

// String names the device the way the preflight table does: "nvml:3".
func (d Device) String() string { return fmt.Sprintf("%s:%d", d.Kind, d.Index) }

// DeviceSource selects how Discover finds devices.
type DeviceSource string

const (
	// SourceAuto uses NVML when Init succeeds and reports at least one
	// device, and falls back to the CPU device otherwise.
	SourceAuto DeviceSource = "auto"
	// SourceNVML requires NVML; a failed Init is an error.
	SourceNVML DeviceSource = "nvml"
	// SourceCPU skips NVML entirely and returns the CPU device.
	SourceCPU DeviceSource = "cpu"
	// SourceMockDGXA100 is NVIDIA's mock of a DGX A100 (8 × A100-SXM4-40GB).
	SourceMockDGXA100 DeviceSource = "mock:dgxa100"
	// SourceMockDGXH100 is NVIDIA's mock of a DGX H100 (8 × H100 80GB).
	SourceMockDGXH100 DeviceSource = "mock:dgxh100"
	// SourceMockDGXH200 is NVIDIA's mock of a DGX H200 (8 × H200 141GB).
	SourceMockDGXH200 DeviceSource = "mock:dgxh200"
	// SourceMockDGXB200 is NVIDIA's mock of a DGX B200 (8 × B200 180GB).
	SourceMockDGXB200 DeviceSource = "mock:dgxb200"
)

// DeviceSources lists every valid DeviceSource, in the order help text shows
// them.
var DeviceSources = []DeviceSource{SourceAuto, SourceNVML, SourceCPU,
	SourceMockDGXA100, SourceMockDGXH100, SourceMockDGXH200, SourceMockDGXB200}

// DefaultDevicesMax bounds the devices one discovery returns when
// DiscoveryConfig.DevicesMax is zero. The largest NVLink domains today have
// 72 GPUs per node group and single hosts have at most 16.
const DefaultDevicesMax = 64

// DiscoveryConfig says where to look for devices.
type DiscoveryConfig struct {
	// Source selects NVML, the CPU device, auto (NVML, else CPU) or one of
	// NVIDIA's mock machines. Zero ("") means SourceAuto.
	Source DeviceSource
	// CPUMemoryBytes is the memory budget, in bytes, of the CPU device used
	// when no NVML device is available. Zero means no budget is configured:
	// the CPU device then reports 0 bytes and memory-derived sizing refuses
	// it, so only an explicit KVPoolTokens can size its pool.
	CPUMemoryBytes int64
	// DevicesMax is the most devices one discovery may return; NVML
	// reporting more is an error rather than a silent truncation. Zero means
	// DefaultDevicesMax.
	DevicesMax int
}

// DefaultDiscoveryConfig is auto discovery with no CPU budget.
func DefaultDiscoveryConfig() DiscoveryConfig {
	return DiscoveryConfig{Source: SourceAuto, DevicesMax: DefaultDevicesMax}
}

func (c DiscoveryConfig) source() DeviceSource {
	if c.Source == "" {
		return SourceAuto
	}
	return c.Source
}

// Validate reports the first field out of range, with its value.
func (c DiscoveryConfig) Validate() error {
	if !validSource(c.source()) {
		names := make([]string, len(DeviceSources))
		for i, s := range DeviceSources {
			names[i] = string(s)
		}
		return fmt.Errorf("gpu: device source %q is not one of %s", c.Source, strings.Join(names, ", "))
	}
	if c.CPUMemoryBytes < 0 {
		return fmt.Errorf("gpu: CPUMemoryBytes (%d) must not be negative", c.CPUMemoryBytes)
	}
	if c.DevicesMax < 0 {
		return fmt.Errorf("gpu: DevicesMax (%d) must not be negative", c.DevicesMax)
	}
	return nil
}

func validSource(s DeviceSource) bool {
	for _, v := range DeviceSources {
		if s == v {
			return true
		}
	}
	return false
}

// CPUDevice is the device used when no NVML device is available.
func CPUDevice(memoryBytes int64) Device {
	return Device{Index: 0, Name: "cpu", UUID: "cpu", MemoryTotalBytes: memoryBytes, Kind: KindCPU}
}

// Discovery is the outcome of Discover.
type Discovery struct {
	// Devices are the devices found, in NVML index order; never empty when
	// Discover returns no error.
	Devices []Device
	// Source is the source that was asked for.
	Source DeviceSource
	// DriverVersion is the NVML driver version, or "" without NVML.
	DriverVersion string
	// Fallback is why auto discovery used the CPU device (a failed NVML
	// Init, NVML not compiled in, or no NVML devices); nil otherwise.
	Fallback error
}

// Discover finds the node's devices as cfg says. In auto mode any reason
// NVML cannot be used at all (Init failed, built without cgo, no devices)
// becomes a CPU fallback recorded in Discovery.Fallback; an NVML call that
// fails after a successful Init is returned as an error instead, because a
// driver that is present but misbehaving should stop the node, not hide
// behind the CPU.
func Discover(cfg DiscoveryConfig) (Discovery, error) {
	if err := cfg.Validate(); err != nil {
		return Discovery{}, err
	}
	if cfg.source() == SourceCPU {
		return Discovery{Devices: []Device{CPUDevice(cfg.CPUMemoryBytes)}, Source: SourceCPU}, nil
	}
	found, err := discoverLibrary(cfg)
	return resolve(cfg, found, err)
}

// resolve applies the auto-fallback rule to what an NVML discovery
// returned.
func resolve(cfg DiscoveryConfig, found Discovery, err error) (Discovery, error) {
	src := cfg.source()
	found.Source = src
	if err == nil && len(found.Devices) == 0 {
		err = &NoDevicesError{Source: src}
	}
	if err == nil {
		return found, nil
	}
	if src == SourceAuto && fallbackAllowed(err) {
		return Discovery{Devices: []Device{CPUDevice(cfg.CPUMemoryBytes)}, Source: src, Fallback: err}, nil
	}
	return Discovery{}, err
}

func fallbackAllowed(err error) bool {
	var initErr *NVMLInitError
	var unavail *NVMLUnavailableError
	var none *NoDevicesError
	return errors.As(err, &initErr) || errors.As(err, &unavail) || errors.As(err, &none)
}

// NVMLInitError is a failed nvml.Init. After it no other NVML function is
// called.
type NVMLInitError struct {
	// Code is the nvml.Return value, e.g. 12 for ERROR_LIBRARY_NOT_FOUND.
	Code int
	// Name is NVML's text for Code.
	Name string
}

func (e *NVMLInitError) Error() string {
	return fmt.Sprintf("gpu: nvml Init failed: %s (return code %d)", e.Name, e.Code)
}

// NVMLCallError is an NVML call that failed after a successful Init.
type NVMLCallError struct {
	// Op is the NVML function, e.g. "DeviceGetMemoryInfo".
	Op string
	// Index is the device index the call was about, or -1 for none.
	Index int
	// Code is the nvml.Return value.
	Code int
	// Name is NVML's text for Code.
	Name string
}

func (e *NVMLCallError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("gpu: nvml %s failed: %s (return code %d)", e.Op, e.Name, e.Code)
	}
	return fmt.Sprintf("gpu: nvml %s on device %d failed: %s (return code %d)", e.Op, e.Index, e.Name, e.Code)
}

// NVMLUnavailableError says NVML cannot be used by this binary at all.
type NVMLUnavailableError struct {
	// Source is the source that was asked for.
	Source DeviceSource
	// Reason says why, e.g. that the binary was built without the nvml tag.
	Reason string
}

func (e *NVMLUnavailableError) Error() string {
	return fmt.Sprintf("gpu: device source %s is unavailable: %s", e.Source, e.Reason)
}

// NoDevicesError is an NVML that initialised but reported no device.
type NoDevicesError struct {
	Source DeviceSource
}

func (e *NoDevicesError) Error() string {
	return fmt.Sprintf("gpu: device source %s reported 0 devices", e.Source)
}

// TooManyDevicesError is an NVML that reported more devices than
// DiscoveryConfig.DevicesMax allows.
type TooManyDevicesError struct {
	Count, Max int
}

func (e *TooManyDevicesError) Error() string {
	return fmt.Sprintf("gpu: nvml reported %d devices, more than DevicesMax (%d)", e.Count, e.Max)
}

// BadMemoryInfoError is a memory report that cannot be true: a total that
// does not fit in int64 bytes, or more free memory than total.
type BadMemoryInfoError struct {
	Index       int
	TotalBytes  uint64
	FreeBytes   uint64
	Explanation string
}

func (e *BadMemoryInfoError) Error() string {
	return fmt.Sprintf("gpu: device %d reports total %d bytes, free %d bytes: %s",
		e.Index, e.TotalBytes, e.FreeBytes, e.Explanation)
}
