// Package gpu finds the devices a node runs on, sizes the KV pool each of
// them can hold, and refuses to start a node whose pool cannot hold the
// context window it would advertise.
//
// # Common path
//
// Discover (with a DiscoveryConfig) returns the node's devices: NVML devices
// when the driver is present, otherwise, in auto mode, one CPU device whose
// memory budget comes from configuration. With the nvml tag, DiscoverNVML and
// DiscoverFrom take any nvml.Interface, so NVIDIA's mocks
// (pkg/nvml/mock/dgxa100, dgxh100, …) run exactly the code that nvml.New()
// runs. SizePool turns a Device and a SizingConfig into a PoolSize in
// pages, tokens and bytes, either from memory or from an explicit
// KVPoolTokens. Preflight (or PreflightAll) compares each pool with the
// advertised context window and returns a report per device; a pool that
// cannot hold one full-context request fails with a PoolTooSmallError that
// names both numbers and both fixes.
//
// NVML is compiled in only with the nvml build tag (go build -tags nvml),
// and reached through cgo; any other build compiles a stub in which NVML is
// unavailable and auto discovery falls back to the CPU device. The tag keeps
// the default build free of a C compiler and of the deprecation warnings
// NVML's header draws from gcc (silence them with CGO_CFLAGS=
// -Wno-deprecated-declarations when building with the tag). No NVML function is called after Init has failed, because the
// library then aborts the whole process.
//
// # Concurrency and ownership
//
// Sizing and preflight are pure functions of their arguments: no I/O, no
// clock, no shared state; call them from any goroutine. Discovery calls into
// NVML, which keeps process-wide state (Init and Shutdown are reference
// counted by the library): run one discovery at a time, at startup. Device,
// PoolSize and PreflightReport are plain values owned by the caller.
package gpu
