//go:build !cgo || !nvml

package gpu

// discoverLibrary reports NVML as unavailable: go-nvml (and NVIDIA's mocks,
// which import it) is compiled in only with the nvml build tag, and needs
// cgo. Without it the build needs no C compiler and prints none of the
// warnings NVML's header draws from gcc. In auto mode Discover then falls
// back to the CPU device.
func discoverLibrary(cfg DiscoveryConfig) (Discovery, error) {
	return Discovery{}, &NVMLUnavailableError{Source: cfg.source(),
		Reason: "this binary was built without NVML: build it with -tags nvml (and cgo, which NVML needs)"}
}
