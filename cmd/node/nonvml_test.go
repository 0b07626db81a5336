//go:build !cgo

package main

// haveNVML says whether this build links go-nvml (and so NVIDIA's mocks).
const haveNVML = false
