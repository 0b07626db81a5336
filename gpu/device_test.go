package gpu

import (
	"errors"
	"strings"
	"testing"
)

func TestDiscoverCPU(t *testing.T) {
	got, err := Discover(DiscoveryConfig{Source: SourceCPU, CPUMemoryBytes: 64 * gib})
	if err != nil {
		t.Fatal(err)
	}
	want := Device{Index: 0, Name: "cpu", UUID: "cpu", MemoryTotalBytes: 64 * gib, Kind: KindCPU}
	if len(got.Devices) != 1 || got.Devices[0] != want || got.Fallback != nil {
		t.Fatalf("Discover(cpu) = %+v, want only %+v", got, want)
	}
	if s := got.Devices[0].String(); s != "cpu:0" {
		t.Fatalf("String() = %q", s)
	}
}

func TestDiscoveryConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  DiscoveryConfig
		want string
	}{
		{DefaultDiscoveryConfig(), ""},
		{DiscoveryConfig{}, ""}, // zero source means auto
		{DiscoveryConfig{Source: "mock:dgx1"}, `device source "mock:dgx1" is not one of auto, nvml, cpu, mock:dgxa100`},
		{DiscoveryConfig{CPUMemoryBytes: -1}, "CPUMemoryBytes (-1)"},
		{DiscoveryConfig{DevicesMax: -2}, "DevicesMax (-2)"},
	}
	for _, tc := range tests {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
		if tc.want != "" {
			if _, derr := Discover(tc.cfg); derr == nil {
				t.Errorf("Discover(%+v) accepted an invalid config", tc.cfg)
			}
		}
	}
}

func TestResolveFallbackRules(t *testing.T) {
	cpu := DiscoveryConfig{Source: SourceAuto, CPUMemoryBytes: gib}
	for _, err := range []error{
		&NVMLInitError{Code: 12, Name: "ERROR_LIBRARY_NOT_FOUND"},
		&NVMLUnavailableError{Source: SourceAuto, Reason: "no cgo"},
		&NoDevicesError{Source: SourceAuto},
	} {
		got, rerr := resolve(cpu, Discovery{}, err)
		if rerr != nil || !errors.Is(got.Fallback, err) || got.Devices[0] != CPUDevice(gib) {
			t.Errorf("auto with %v: %+v, %v; want CPU fallback", err, got, rerr)
		}
		if _, rerr := resolve(DiscoveryConfig{Source: SourceNVML}, Discovery{}, err); !errors.Is(rerr, err) {
			t.Errorf("nvml with %v: err = %v, want it returned", err, rerr)
		}
	}
	// A driver that initialised and then failed is not hidden behind the CPU.
	call := &NVMLCallError{Op: "DeviceGetCount", Index: -1, Code: 999, Name: "ERROR_UNKNOWN"}
	if _, rerr := resolve(cpu, Discovery{}, call); !errors.Is(rerr, call) {
		t.Errorf("auto with %v: err = %v, want it returned", call, rerr)
	}
	many := &TooManyDevicesError{Count: 100, Max: 64}
	if _, rerr := resolve(cpu, Discovery{}, many); !errors.Is(rerr, many) || !strings.Contains(rerr.Error(), "100 devices, more than DevicesMax (64)") {
		t.Errorf("auto with %v: err = %v", many, rerr)
	}
}
