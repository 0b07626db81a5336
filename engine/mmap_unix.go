//go:build unix

package engine

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps the file read-only: its pages are read from the page cache
// as the model touches them and are shared with every other process that
// maps the file. The mapping lives as long as the process; a model is
// never unloaded.
func mapFile(path string, size int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("engine: mapping %s (%d bytes): %w", path, size, err)
	}
	return b, nil
}
