package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

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

// selfExecutable is the path to start this binary again by, and the name
// to give it as argv[0]: /proc/self/exe is this process's own file even
// when its path has gone (the temporary binary of "go run") or holds
// another build by now, so a node restarted later runs the same code.
func selfExecutable() (path, name string, err error) {
	name, err = os.Executable()
	return "/proc/self/exe", name, err
}

// processStart is when process pid started, in clock ticks after boot
// (/proc/PID/stat's 22nd field), or 0 when that cannot be read.
func processStart(pid int) uint64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name's closing parenthesis are the
	// third on: the start is the 20th of them.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 {
		return 0
	}
	start, _ := strconv.ParseUint(fields[19], 10, 64)
	return start
}

// processIsUp says whether pid is a live "node up" process: not ended,
// not a zombie, and its arguments those of up.
func processIsUp(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name's closing parenthesis.
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(string(cmdline), "\x00")
	return len(args) > 1 && args[1] == "up"
}

// stopWithGoRun has the kernel send this process SIGTERM when its parent
// ends, if that parent is the go command: "go run" forwards Ctrl-C but no
// other signal, so "kill $!" after "go run ./cmd/node up &" would end the
// go command alone and leave this process and its nodes holding their
// ports. Call it once SIGTERM is handled.
func stopWithGoRun() error {
	ppid := os.Getppid()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", ppid))
	if err != nil || filepath.Base(exe) != "go" {
		return nil
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_PDEATHSIG): %w", errno)
	}
	if os.Getppid() != ppid {
		// The go command ended before the call took effect.
		return syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
	return nil
}

// openFilesLimit is the process's limit of open files: RLIMIT_NOFILE's
// soft limit, which the Go runtime raised to the hard one as the process
// started; 0 when it cannot be read.
func openFilesLimit() uint64 {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return l.Cur
}
