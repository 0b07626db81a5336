package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvwarden/kvwarden/trust"
)

// certsEnv names the credentials directory when --certs is not given.
const certsEnv = "KVWARDEN_CERTS"

// localMarker is the file "node up" leaves in the credentials directory it
// makes: such a directory holds a throwaway CA that the commands may issue
// a tenant's certificate from, for a local cluster's own requests.
const localMarker = "node-up"

// localCertsDir is where "node up" keeps the credentials of a cluster
// whose router serves on listen, so that generate, status and drain find
// them with no flags.
func localCertsDir(listen string) string {
	return filepath.Join(os.TempDir(), "kvwarden-up-"+strings.NewReplacer(":", "-", "[", "", "]", "").Replace(listen))
}

// credFlags are the credential flags every command that talks to nodes
// has. Endpoint is the node the command talks to, if any: the credentials
// of a "node up" cluster there are found without flags.
type credFlags struct {
	Dir      string
	Cert     string
	Insecure bool
	Endpoint string
}

// bind registers --certs, --cert and --insecure; cert is what --cert
// means when not given.
func (f *credFlags) bind(fs *pflag.FlagSet, cert string) {
	fs.StringVar(&f.Dir, "certs", f.Dir, "directory of the cluster's credentials (made by node certs; default $"+certsEnv+
		", else the cluster node up runs)")
	fs.StringVar(&f.Cert, "cert", f.Cert, "base name of this process's certificate and key in --certs (<role>-<name>; default "+cert+")")
	fs.BoolVar(&f.Insecure, "insecure", f.Insecure, "authenticate nobody: plaintext, no certificates (never on a network others reach)")
}

// dir is the credentials directory to use: --certs; else that of a "node
// up" cluster whose router serves at the endpoint; else $KVWARDEN_CERTS;
// else that of a "node up" cluster on the default endpoint (drain names a
// node, not the router). "" when none is known.
func (f credFlags) dir() string {
	if f.Dir != "" {
		return f.Dir
	}
	if d := localCertsDir(f.Endpoint); f.Endpoint != "" && isLocalDir(d) {
		return d
	}
	if d := os.Getenv(certsEnv); d != "" {
		return d
	}
	if d := localCertsDir(defaultEndpoint); isLocalDir(d) {
		return d
	}
	return ""
}

// isLocalDir says whether d is a credentials directory "node up" made: a
// directory (not a link) of this user's, not open to others.
func isLocalDir(d string) bool {
	st, err := os.Lstat(d)
	if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		return false
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Getuid() {
		return false
	}
	_, err = os.Stat(filepath.Join(d, localMarker))
	return err == nil
}

// errNoCredentials is a command without credentials or --insecure.
var errNoCredentials = errors.New("no credentials: give --certs DIR (node certs makes one) and --cert NAME, set " +
	certsEnv + ", or run --insecure to authenticate nobody")

// authority loads the credentials named by the flags as the process's
// trust authority; an identity of role want is required (any role when
// want is empty). cert is the certificate's base name when --cert is not
// given. With --insecure it warns, loudly, and authenticates nobody.
func (f credFlags) authority(log *slog.Logger, want trust.Role, cert string) (*trust.Authority, error) {
	if f.Insecure {
		log.Warn("INSECURE: authenticating nobody; anyone who reaches this process's ports can forge answers, " +
			"read prompts and inject KV")
		return trust.Insecure(log), nil
	}
	dir := f.dir()
	if dir == "" {
		return nil, usageError{errNoCredentials}
	}
	if f.Cert != "" {
		cert = f.Cert
	}
	if cert == "" {
		var err error
		if cert, err = onlyCert(dir, want); err != nil {
			return nil, usageError{err}
		}
	}
	b, err := trust.LoadFiles(dir, cert)
	if errors.Is(err, os.ErrNotExist) && want == trust.RoleTenant && isLocalDir(dir) {
		b, err = issueLocalTenant(dir, strings.TrimPrefix(cert, string(trust.RoleTenant)+"-"))
	}
	if err != nil {
		return nil, fmt.Errorf("credentials %s in %s: %w", cert, dir, err)
	}
	if want != "" && b.Self.Role != want {
		return nil, usageError{fmt.Errorf("certificate %s in %s is a %s's (%s), this needs a %s's", cert, dir,
			b.Self.Role, b.Self, want)}
	}
	return trust.New(b, trust.DefaultConfig(), log)
}

// operator is the authority of an operator's command (status, drain),
// warnings to stderr.
func (f credFlags) operator(stderr io.Writer) (*trust.Authority, error) {
	return f.authority(slog.New(slog.NewTextHandler(stderr, nil)), trust.RoleOperator, "")
}

// onlyCert is the base name of the one certificate of role in dir.
func onlyCert(dir string, role trust.Role) (string, error) {
	found, err := filepath.Glob(filepath.Join(dir, string(role)+"-*.crt"))
	if err != nil {
		return "", err
	}
	if len(found) != 1 {
		return "", fmt.Errorf("%s holds %d certificates of role %s (%v): name one with --cert", dir, len(found), role, found)
	}
	return strings.TrimSuffix(filepath.Base(found[0]), ".crt"), nil
}

// issueLocalTenant issues a tenant's certificate, kept in memory, from the
// throwaway CA of a "node up" cluster: its requests need one per tenant.
func issueLocalTenant(dir, tenant string) (*trust.Bundle, error) {
	ca, err := trust.LoadCA(dir)
	if err != nil {
		return nil, err
	}
	return ca.Bundle(trust.Identity{Cluster: ca.Cluster, Role: trust.RoleTenant, Name: tenant}, nil, localValidFor, time.Now(), nil)
}

// localValidFor is how long what "node up" issues stays valid.
const localValidFor = 7 * 24 * time.Hour
