//go:build !linux

package httpapi

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// addProcess registers client_golang's process collector, which reads
// what each system offers (process_linux.go writes Linux's itself).
func (h *metricsHandler) addProcess(reg prometheus.Registerer) error {
	return reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}
