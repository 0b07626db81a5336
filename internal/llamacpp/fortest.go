package llamacpp

import (
	"errors"
	"os"
	"testing"
)

// EnvRequire names the variable under which a missing installation fails
// the tests that need llama.cpp instead of skipping them (CI sets it to 1).
const EnvRequire = "KVWARDEN_REQUIRE_LLAMACPP"

// ForTest finds the installation for a test or benchmark, or skips it
// with the install command (fails it when EnvRequire is "1").
func ForTest(tb testing.TB) *Harness {
	tb.Helper()
	h, err := Find()
	var missing *NotInstalledError
	if errors.As(err, &missing) && os.Getenv(EnvRequire) != "1" {
		tb.Skipf("%v (%s=1 makes this a failure)", err, EnvRequire)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return h
}
