//go:build cgo && nvml

package gpu

import (
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
)

// discoverLibrary picks the nvml.Interface for cfg's source and discovers
// through it; real NVML and the mocks share every line after this choice.
func discoverLibrary(cfg DiscoveryConfig) (Discovery, error) {
	return discover(library(cfg.source()), cfg.devicesMax())
}

func library(src DeviceSource) nvml.Interface {
	switch src {
	case SourceMockDGXA100:
		return dgxa100.New()
	case SourceMockDGXH100:
		return dgxh100.New()
	case SourceMockDGXH200:
		return dgxh200.New()
	case SourceMockDGXB200:
		return dgxb200.New()
	}
	return nvml.New()
}

// DiscoverFrom is Discover with the NVML library supplied by the caller, so
// tests can inject a mock or a failing library and still exercise the auto
// fallback. cfg.Source must not be SourceCPU or a mock source: the library
// argument replaces that choice.
func DiscoverFrom(lib nvml.Interface, cfg DiscoveryConfig) (Discovery, error) {
	if err := cfg.Validate(); err != nil {
		return Discovery{}, err
	}
	found, err := discover(lib, cfg.devicesMax())
	return resolve(cfg, found, err)
}

func (c DiscoveryConfig) devicesMax() int {
	if c.DevicesMax == 0 {
		return DefaultDevicesMax
	}
	return c.DevicesMax
}

// DiscoverNVML lists the devices lib reports, at most devicesMax of them
// (zero means DefaultDevicesMax). It calls Init first and, if Init fails,
// returns an *NVMLInitError without calling anything else: the real library
// aborts the process on any call after a failed Init.
func DiscoverNVML(lib nvml.Interface, devicesMax int) ([]Device, error) {
	if devicesMax == 0 {
		devicesMax = DefaultDevicesMax
	}
	d, err := discover(lib, devicesMax)
	return d.Devices, err
}

func discover(lib nvml.Interface, devicesMax int) (Discovery, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return Discovery{}, &NVMLInitError{Code: int(ret), Name: ret.Error()}
	}
	// Shutdown pairs with the successful Init (NVML reference-counts
	// them). Its result is ignored: the devices have been read, and a
	// failing Shutdown changes nothing the node can act on.
	defer lib.Shutdown()

	out := Discovery{}
	// The driver version is informational (printed by preflight), so a
	// failure to read it does not stop discovery.
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		out.DriverVersion = v
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Discovery{}, callError("DeviceGetCount", -1, ret)
	}
	if count > devicesMax {
		return Discovery{}, &TooManyDevicesError{Count: count, Max: devicesMax}
	}
	out.Devices = make([]Device, 0, count)
	for i := 0; i < count; i++ {
		d, err := nvmlDevice(lib, i)
		if err != nil {
			return Discovery{}, err
		}
		out.Devices = append(out.Devices, d)
	}
	return out, nil
}

func nvmlDevice(lib nvml.Interface, i int) (Device, error) {
	h, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return Device{}, callError("DeviceGetHandleByIndex", i, ret)
	}
	name, ret := h.GetName()
	if ret != nvml.SUCCESS {
		return Device{}, callError("DeviceGetName", i, ret)
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return Device{}, callError("DeviceGetUUID", i, ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Device{}, callError("DeviceGetMemoryInfo", i, ret)
	}
	if mem.Total > math.MaxInt64 {
		return Device{}, &BadMemoryInfoError{Index: i, TotalBytes: mem.Total, FreeBytes: mem.Free,
			Explanation: "total does not fit in int64 bytes"}
	}
	if mem.Free > mem.Total {
		return Device{}, &BadMemoryInfoError{Index: i, TotalBytes: mem.Total, FreeBytes: mem.Free,
			Explanation: "free exceeds total"}
	}
	return Device{
		Index:            i,
		Name:             name,
		UUID:             uuid,
		MemoryTotalBytes: int64(mem.Total),
		MemoryFreeBytes:  int64(mem.Free),
		Kind:             KindNVML,
	}, nil
}

// callError captures ret's text at once: after Shutdown the library's
// error strings are no longer reachable.
func callError(op string, index int, ret nvml.Return) error {
	return &NVMLCallError{Op: op, Index: index, Code: int(ret), Name: ret.Error()}
}
