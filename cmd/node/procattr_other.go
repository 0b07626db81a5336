//go:build !linux

package main

import "syscall"

// childProcAttr puts each node up starts in its own process group, so that
// a Ctrl-C in the terminal reaches up alone and up stops the nodes in
// order. Without Linux's Pdeathsig, a node outlives an up that is killed
// with SIGKILL.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// hostMemoryBytes is the machine's physical memory: unknown (0) here, so
// only --memory-budget-bytes bounds the pools.
func hostMemoryBytes() int64 { return 0 }
