//go:build !cgo

package gpu

import (
	"errors"
	"testing"
)

func TestDiscoverWithoutCgo(t *testing.T) {
	got, err := Discover(DiscoveryConfig{Source: SourceAuto, CPUMemoryBytes: gib})
	var unavail *NVMLUnavailableError
	if err != nil || len(got.Devices) != 1 || got.Devices[0] != CPUDevice(gib) || !errors.As(got.Fallback, &unavail) {
		t.Fatalf("Discover(auto) without cgo = %+v, %v; want CPU fallback", got, err)
	}
	for _, src := range []DeviceSource{SourceNVML, SourceMockDGXA100} {
		if _, err := Discover(DiscoveryConfig{Source: src}); !errors.As(err, &unavail) {
			t.Errorf("Discover(%s) without cgo: err = %v, want *NVMLUnavailableError", src, err)
		}
	}
}
