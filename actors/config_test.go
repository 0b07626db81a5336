package actors

import (
	"strings"
	"testing"
)

// TestConfigNeverServable: settings no request could ever be served under
// are refused with their numbers.
func TestConfigNeverServable(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"the defaults", func(*Config) {}, ""},
		{"max tokens filling the window", func(c *Config) { c.MaxTokensMax = c.ContextTokens },
			"MaxTokensMax (2048) leaves no room for a prompt in the ContextTokens (2048) window; want at most 2047"},
		{"max tokens past the window", func(c *Config) { c.MaxTokensMax = 5000 }, "MaxTokensMax (5000) leaves no room"},
		{"a window below one page", func(c *Config) { c.ContextTokens, c.PageTokens, c.MaxTokensMax = 8, 16, 4 },
			"ContextTokens (8) is below one page of PageTokens (16)"},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
