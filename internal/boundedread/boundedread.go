// Package boundedread reads a file that an operator names (a keys file, a
// configuration, a prompts or profile file) without letting one larger
// than its bound cost more memory than the bound.
package boundedread

import (
	"fmt"
	"io"
	"os"
)

// TooLargeError is a file over its bound; nothing past the bound was read.
type TooLargeError struct {
	Path  string
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than %d bytes", e.Path, e.Limit)
}

// File reads the file at path, at most limit bytes: a longer file is a
// *TooLargeError after limit+1 bytes were read. Errors opening or reading
// it are os's, so that errors.Is(err, os.ErrNotExist) holds for a missing
// file.
func File(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, &TooLargeError{Path: path, Limit: limit}
	}
	return data, nil
}
