package httpapi

import (
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
)

// The process's series, as client_golang's process collector names them,
// written straight into the scrape: that collector rereads, at every
// scrape, files whose content is fixed for the process's life (the host's
// boot time, in all of /proc/stat) or that a system call gives (the limits)
// and the network namespace's counters, and builds its objects again, which
// tripled a scrape's cost (BenchmarkScrape). Here a scrape reads
// /proc/self/stat and counts /proc/self/fd; the start time is read once.
// process_network_*_bytes_total are left out: they count the whole network
// namespace (the pod's, the host's), not the process, which the kubelet
// exports per pod anyway.

var (
	famProcessCPU      = family{"process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds."}
	famProcessFDs      = family{"process_open_fds", "gauge", "Number of open file descriptors."}
	famProcessFDsMax   = family{"process_max_fds", "gauge", "Maximum number of open file descriptors."}
	famProcessVirtual  = family{"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes."}
	famProcessVirtMax  = family{"process_virtual_memory_max_bytes", "gauge", "Maximum amount of virtual memory available in bytes."}
	famProcessResident = family{"process_resident_memory_bytes", "gauge", "Resident memory size in bytes."}
	famProcessStart    = family{"process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds."}
)

// addProcess has h write the process's series. A series whose source
// cannot be read is left out of that scrape, as client_golang leaves it.
func (h *metricsHandler) addProcess(prometheus.Registerer) error {
	p, err := procfs.Self()
	if err != nil {
		return err
	}
	st, err := p.Stat()
	if err != nil {
		return err
	}
	start, err := st.StartTime()
	if err != nil {
		return err
	}
	h.process = func(t *exposition) { processSeries(t, p, start) }
	return nil
}

// processSeries writes the series of process p, started at start (Unix
// seconds).
func processSeries(t *exposition, p procfs.Proc, start float64) {
	if st, err := p.Stat(); err == nil {
		t.one(famProcessCPU, st.CPUTime())
		t.one(famProcessVirtual, float64(st.VirtualMemory()))
		t.one(famProcessResident, float64(st.ResidentMemory()))
	}
	t.one(famProcessStart, start)
	if fds, err := p.FileDescriptorsLen(); err == nil {
		t.one(famProcessFDs, float64(fds))
	}
	for _, l := range []struct {
		f        family
		resource int
	}{{famProcessFDsMax, syscall.RLIMIT_NOFILE}, {famProcessVirtMax, syscall.RLIMIT_AS}} {
		var lim syscall.Rlimit
		if syscall.Getrlimit(l.resource, &lim) == nil {
			t.one(l.f, float64(lim.Cur))
		}
	}
}
