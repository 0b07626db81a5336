//go:build !cgo || !nvml

package gpu

import (
	"errors"
	"testing"
)

func TestDiscoverWithoutNVML(t *testing.T) {
	got, err := Discover(DiscoveryConfig{Source: SourceAuto, CPUMemoryBytes: gib})
	var unavail *NVMLUnavailableError
	if err != nil || len(got.Devices) != 1 || got.Devices[0] != CPUDevice(gib) || !errors.As(got.Fallback, &unavail) {
		t.Fatalf("Discover(auto) without NVML = %+v, %v; want CPU fallback", got, err)
	}
	for _, src := range []DeviceSource{SourceNVML, SourceMockDGXA100} {
		if _, err := Discover(DiscoveryConfig{Source: src}); !errors.As(err, &unavail) {
			t.Errorf("Discover(%s) without NVML: err = %v, want *NVMLUnavailableError", src, err)
		}
	}
}
