//go:build cgo && nvml

package gpu

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

func TestDiscoverNVMLMockMachines(t *testing.T) {
	tests := []struct {
		name       string
		lib        func() nvml.Interface
		deviceName string
		totalBytes int64
	}{
		{"dgxa100", func() nvml.Interface { return dgxa100.New() }, "Mock NVIDIA A100-SXM4-40GB", 40960 * mib},
		{"dgxh100", func() nvml.Interface { return dgxh100.New() }, "NVIDIA H100 80GB HBM3", 81920 * mib},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			devs, err := DiscoverNVML(tc.lib(), 0)
			if err != nil {
				t.Fatalf("DiscoverNVML: %v", err)
			}
			if len(devs) != 8 {
				t.Fatalf("got %d devices, want 8", len(devs))
			}
			seen := map[string]bool{}
			for i, d := range devs {
				if d.Index != i || d.Name != tc.deviceName || d.MemoryTotalBytes != tc.totalBytes || d.Kind != KindNVML {
					t.Errorf("device %d = %+v; want index %d name %q total %d kind nvml", i, d, i, tc.deviceName, tc.totalBytes)
				}
				// The mocks leave Free at 0; it must come through as
				// "unknown" (0), not break anything.
				if d.MemoryFreeBytes != 0 {
					t.Errorf("device %d free = %d, want the mock's 0", i, d.MemoryFreeBytes)
				}
				if !strings.HasPrefix(d.UUID, "GPU-") || seen[d.UUID] {
					t.Errorf("device %d UUID %q is not a fresh GPU- UUID", i, d.UUID)
				}
				seen[d.UUID] = true
			}
		})
	}
}

func TestDiscoverMockSource(t *testing.T) {
	// Discover with a mock source goes through the same discover() as
	// nvml.New(); the driver version proves SystemGetDriverVersion ran.
	got, err := Discover(DiscoveryConfig{Source: SourceMockDGXH100, CPUMemoryBytes: gib})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(got.Devices) != 8 || got.Fallback != nil || got.DriverVersion != "550.54.15" || got.Source != SourceMockDGXH100 {
		t.Fatalf("Discover = %+v", got)
	}
	// And sizing works on what the mock reports: 0.9 × 80 GiB minus 16 GiB
	// of weights and 4 GiB of reserve = 52 GiB = 26,624 pages of 2 MiB.
	cfg := DefaultSizingConfig()
	cfg.WeightBytes, cfg.ReserveBytes = 16*gib, 4*gib
	p, err := SizePool(got.Devices[7], cfg)
	if err != nil || p.Pages != 26624 || p.Tokens != 26624*16 {
		t.Fatalf("SizePool(mock H100) = %+v, %v; want 26624 pages", p, err)
	}
}

func TestDiscoverNVMLReportsFreeMemoryWhenSet(t *testing.T) {
	s := dgxa100.New()
	d := s.Devices[2].(*server.Device)
	d.MemoryInfo.Free = uint64(12345 * mib)
	devs, err := DiscoverNVML(s, 0)
	if err != nil {
		t.Fatal(err)
	}
	if devs[2].MemoryFreeBytes != 12345*mib || devs[1].MemoryFreeBytes != 0 {
		t.Fatalf("free bytes: device 2 = %d, device 1 = %d", devs[2].MemoryFreeBytes, devs[1].MemoryFreeBytes)
	}
	d.MemoryInfo.Free = d.MemoryInfo.Total + 1
	_, err = DiscoverNVML(s, 0)
	var bad *BadMemoryInfoError
	if !errors.As(err, &bad) || bad.Index != 2 || !strings.Contains(err.Error(), "free exceeds total") {
		t.Fatalf("err = %v, want *BadMemoryInfoError for device 2", err)
	}
}

// failedInitLibrary is an NVML whose Init fails like a host without the
// driver. Every other method the discovery could reach fails the test; any
// method not set here panics inside NVIDIA's mock, which the caller turns
// into a failure too. The real library would kill the process instead.
func failedInitLibrary(t *testing.T, ret nvml.Return) *mock.Interface {
	calledAfterInit := func(name string) { t.Errorf("NVML %s called after Init returned %v", name, ret) }
	return &mock.Interface{
		InitFunc: func() nvml.Return { return ret },
		ShutdownFunc: func() nvml.Return {
			calledAfterInit("Shutdown")
			return nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) {
			calledAfterInit("DeviceGetCount")
			return 0, nvml.SUCCESS
		},
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) {
			calledAfterInit("DeviceGetHandleByIndex")
			return nil, nvml.SUCCESS
		},
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			calledAfterInit("SystemGetDriverVersion")
			return "", nvml.SUCCESS
		},
		ErrorStringFunc: func(nvml.Return) string {
			calledAfterInit("ErrorString")
			return ""
		},
	}
}

// noPanic runs f and fails the test if it panics: NVIDIA's mock panics on
// any method it was not given.
func noPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("NVML method called after a failed Init: %v", p)
		}
	}()
	f()
}

func TestDiscoverNoDriverFallsBackWithoutTouchingNVML(t *testing.T) {
	lib := failedInitLibrary(t, nvml.ERROR_LIBRARY_NOT_FOUND)
	var got Discovery
	var err error
	noPanic(t, func() {
		got, err = DiscoverFrom(lib, DiscoveryConfig{Source: SourceAuto, CPUMemoryBytes: 8 * gib})
	})
	if err != nil {
		t.Fatalf("DiscoverFrom(auto): %v", err)
	}
	if n := len(lib.InitCalls()); n != 1 {
		t.Fatalf("Init called %d times, want 1", n)
	}
	want := CPUDevice(8 * gib)
	if len(got.Devices) != 1 || got.Devices[0] != want {
		t.Fatalf("devices = %+v, want only %+v", got.Devices, want)
	}
	var initErr *NVMLInitError
	if !errors.As(got.Fallback, &initErr) || initErr.Code != 12 || initErr.Name != "ERROR_LIBRARY_NOT_FOUND" {
		t.Fatalf("Fallback = %v, want *NVMLInitError for ERROR_LIBRARY_NOT_FOUND (12)", got.Fallback)
	}
}

func TestDiscoverNVMLSourceFailsOnFailedInit(t *testing.T) {
	for _, ret := range []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_NO_PERMISSION} {
		t.Run(fmt.Sprint(int(ret)), func(t *testing.T) {
			lib := failedInitLibrary(t, ret)
			var err error
			noPanic(t, func() { _, err = DiscoverFrom(lib, DiscoveryConfig{Source: SourceNVML}) })
			var initErr *NVMLInitError
			if !errors.As(err, &initErr) || initErr.Code != int(ret) ||
				!strings.Contains(err.Error(), fmt.Sprintf("return code %d", int(ret))) {
				t.Fatalf("err = %v, want *NVMLInitError with code %d", err, int(ret))
			}
			noPanic(t, func() { _, err = DiscoverNVML(lib, 0) })
			if !errors.As(err, &initErr) {
				t.Fatalf("DiscoverNVML err = %v", err)
			}
		})
	}
}

func TestDiscoverCallFailureAfterInitIsNotHidden(t *testing.T) {
	s := dgxa100.New()
	d := s.Devices[3].(*server.Device)
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	_, err := DiscoverFrom(s, DiscoveryConfig{Source: SourceAuto, CPUMemoryBytes: gib})
	var call *NVMLCallError
	if !errors.As(err, &call) || call.Op != "DeviceGetMemoryInfo" || call.Index != 3 || call.Code != int(nvml.ERROR_GPU_IS_LOST) {
		t.Fatalf("err = %v, want *NVMLCallError for device 3", err)
	}
	if n := len(s.ShutdownCalls()); n != 1 {
		t.Fatalf("Shutdown called %d times after a successful Init, want 1", n)
	}
}

func TestDiscoverDeviceCountBounds(t *testing.T) {
	_, err := DiscoverNVML(dgxa100.New(), 4)
	var many *TooManyDevicesError
	if !errors.As(err, &many) || many.Count != 8 || many.Max != 4 || !strings.Contains(err.Error(), "8 devices") {
		t.Fatalf("err = %v, want *TooManyDevicesError{8, 4}", err)
	}

	empty, _ := server.New()
	got, err := DiscoverFrom(empty, DiscoveryConfig{Source: SourceAuto, CPUMemoryBytes: gib})
	var none *NoDevicesError
	if err != nil || len(got.Devices) != 1 || got.Devices[0].Kind != KindCPU || !errors.As(got.Fallback, &none) {
		t.Fatalf("auto with 0 NVML devices = %+v, %v; want CPU fallback", got, err)
	}
	if _, err := DiscoverFrom(empty, DiscoveryConfig{Source: SourceNVML}); !errors.As(err, &none) {
		t.Fatalf("nvml with 0 devices: err = %v, want *NoDevicesError", err)
	}
}

func TestDiscoverAutoOnThisHost(t *testing.T) {
	// Real NVML: on a host without the driver Init fails and nothing else
	// may be called (the process would die here if it were); on a GPU host
	// the devices come back. Either way there is at least one device.
	got, err := Discover(DiscoveryConfig{Source: SourceAuto, CPUMemoryBytes: gib})
	if err != nil {
		t.Fatalf("Discover(auto): %v", err)
	}
	if len(got.Devices) == 0 {
		t.Fatal("no devices")
	}
	if got.Fallback != nil {
		var initErr *NVMLInitError
		var none *NoDevicesError
		if !errors.As(got.Fallback, &initErr) && !errors.As(got.Fallback, &none) {
			t.Fatalf("Fallback = %v", got.Fallback)
		}
		if got.Devices[0] != CPUDevice(gib) {
			t.Fatalf("fallback device = %+v", got.Devices[0])
		}
		t.Logf("no NVML here: %v", got.Fallback)
	}
}
