package boundedread

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, err := File(path, 5); err != nil || string(data) != "12345" {
		t.Fatalf("a file of its bound: %q, %v", data, err)
	}
	_, err := File(path, 4)
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Limit != 4 || tl.Path != path || err.Error() != path+" is larger than 4 bytes" {
		t.Fatalf("a file one byte over its bound: %v", err)
	}
	if _, err := File(filepath.Join(dir, "none"), 4); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v, want os.ErrNotExist", err)
	}
}
