//go:build !cgo

package gpu

// discoverLibrary reports NVML as unavailable: go-nvml needs cgo, and a
// binary built with CGO_ENABLED=0 (and NVIDIA's mocks, which import it)
// cannot reach it. In auto mode Discover then falls back to the CPU device.
func discoverLibrary(cfg DiscoveryConfig) (Discovery, error) {
	return Discovery{}, &NVMLUnavailableError{Source: cfg.source(),
		Reason: "this binary was built with CGO_ENABLED=0, and NVML needs cgo"}
}
