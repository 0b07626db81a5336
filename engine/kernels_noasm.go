//go:build !amd64

package engine

// fastKernels are the sets this CPU can run besides the generic one: none
// on this architecture, which computes with the generic kernels.
var fastKernels []*kernelSet
