//go:build !unix

package engine

import "os"

// mapFile reads the file: this platform maps no files.
func mapFile(path string, _ int64) ([]byte, error) { return os.ReadFile(path) }
