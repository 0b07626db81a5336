package main

import "syscall"

// childProcAttr puts each node up starts in its own process group, so that
// a Ctrl-C in the terminal reaches up alone and up stops the nodes in
// order, and has the kernel kill the node if up dies without stopping it
// (SIGKILL of up, a crash), so that no node outlives its cluster. Go's
// runtime does not end the thread that started a child while the process
// runs, which Pdeathsig is tied to.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// hostMemoryBytes is the machine's physical memory, 0 if unknown.
func hostMemoryBytes() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}
