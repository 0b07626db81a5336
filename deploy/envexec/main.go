// Command envexec runs a command with each $(NAME) in its arguments
// replaced by the value of the environment variable NAME: the expansion
// the kubelet gives a container's command and args, and not the exec
// command of a lifecycle hook. The kvwarden image has no shell, so its
// preStop hook needs this to name the pod's own address:
//
//	/envexec /node drain --endpoint=$(POD_IP):7070 --wait
//
// As with the kubelet, $$ is a literal $ and a $ before anything but ( or
// $ stays as it is. Unlike the kubelet, which leaves a reference to an
// unset variable unexpanded, envexec refuses it (exit 127) before running
// anything: "$(POD_IP):7070" would only fail later, less clearly.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// exitNotRun is envexec's exit status when it runs nothing: a shell's for
// a command that cannot be run.
const exitNotRun = 127

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: envexec COMMAND [ARG...]  (each $(NAME) replaced by $NAME)")
		os.Exit(exitNotRun)
	}
	args, err := expandAll(os.Args[1:], os.LookupEnv)
	if err == nil {
		var path string
		if path, err = exec.LookPath(args[0]); err == nil {
			err = syscall.Exec(path, args, os.Environ())
		}
	}
	fmt.Fprintln(os.Stderr, "envexec:", err)
	os.Exit(exitNotRun)
}

// UnsetError is a $(NAME) whose variable is not set.
type UnsetError struct {
	Arg  int // index of the argument, 0 for the command
	Name string
}

func (e *UnsetError) Error() string {
	return fmt.Sprintf("argument %d names $(%s), which is not set", e.Arg, e.Name)
}

// expandAll expands every argument with lookup.
func expandAll(args []string, lookup func(string) (string, bool)) ([]string, error) {
	out := make([]string, len(args))
	for i, a := range args {
		s, name, ok := expand(a, lookup)
		if !ok {
			return nil, &UnsetError{Arg: i, Name: name}
		}
		out[i] = s
	}
	return out, nil
}

// expand replaces each $(NAME) in s; ok is false, with the name, at the
// first variable lookup does not find. A "$(" without a closing ")" is
// kept as written, as the kubelet keeps it.
func expand(s string, lookup func(string) (string, bool)) (out, unset string, ok bool) {
	var b []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b = append(b, s[i])
			continue
		}
		switch next := s[i+1]; {
		case next == '$':
			b = append(b, '$')
			i++
		case next == '(':
			n := strings.IndexByte(s[i+2:], ')')
			if n < 0 {
				b = append(b, s[i])
				continue
			}
			name := s[i+2 : i+2+n]
			v, found := lookup(name)
			if !found {
				return "", name, false
			}
			b = append(b, v...)
			i += 2 + n
		default:
			b = append(b, s[i])
		}
	}
	return string(b), "", true
}
