//go:build !linux

package main

import (
	"os"
	"syscall"
)

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

// selfExecutable is the path to start this binary again by, and the name
// to give it as argv[0].
func selfExecutable() (path, name string, err error) {
	path, err = os.Executable()
	return path, path, err
}

// processStart is when process pid started: unknown (0) without /proc.
func processStart(int) uint64 { return 0 }

// processIsUp says whether pid is a live process: without /proc, whether
// it is "node up" is not known.
func processIsUp(pid int) bool { return syscall.Kill(pid, 0) == nil }

// stopWithGoRun does nothing without Linux's parent-death signal: "kill $!"
// after "go run ./cmd/node up &" ends the go command alone.
func stopWithGoRun() error { return nil }

// openFilesLimit is the process's limit of open files: unknown (0) here,
// so no bound of the HTTP server is checked against it.
func openFilesLimit() uint64 { return 0 }
