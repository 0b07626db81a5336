//go:build cgo && nvml

package main

// haveNVML says whether this build links go-nvml (and so NVIDIA's mocks):
// only with the nvml build tag.
const haveNVML = true
