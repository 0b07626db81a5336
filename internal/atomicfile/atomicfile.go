// Package atomicfile replaces a file whole: a reader (a node reading its
// keys or tenants' shares again on SIGHUP) sees the old content or the
// new, never a part.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to path with mode: to a temporary file beside it,
// then renamed over it. On any error path is as it was.
func Write(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
