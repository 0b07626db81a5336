package kubernetes

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// kvwarden's own invariants: how the manifests run node run, probe it,
// join it to its cluster, give it credentials and drain it.

// roles are the node roles deployed, each its own Deployment named
// kvwarden-<role> with the label app.kubernetes.io/component=<role>.
var roles = []string{"router", "prefill", "decode"}

const (
	componentLabel = "app.kubernetes.io/component"
	// nodeContainer is the container that runs node run.
	nodeContainer = "node"
	// certsEnv is the variable node run and node drain find the
	// credentials directory in (cmd/node: $KVWARDEN_CERTS).
	certsEnv = "KVWARDEN_CERTS"
	// podIPPath is the downward API field of the pod's address.
	podIPPath = "status.podIP"
	// operatorRole is the role of the certificate node drain presents.
	operatorRole = "operator"
)

// Container port names, by what listens there.
const (
	portRemote    = "remote"     // --listen: protoactor remote, mutual TLS
	portGossipTCP = "gossip-tcp" // --gossip, TCP
	portGossipUDP = "gossip-udp" // --gossip, UDP
	portData      = "data"       // --data: the KV data plane of a node that decodes
	portHTTP      = "http"       // --http: API, probes, metrics
)

// nodePod is one role's Deployment, with what the checks derive from it.
type nodePod struct {
	role  string
	where string
	dep   *appsv1.Deployment
	c     corev1.Container
	run   flagSet // node run's flags
	podIP string  // the env variable holding status.podIP
}

// flagSet is a command line's flags: name → value ("" for a bare --name).
type flagSet map[string]string

// parseFlags reads a command line of --name=value and --name only: a
// value apart from its flag ("--listen X") would be taken for a bare flag
// and a positional argument here, so it is refused, as is a flag given
// twice or a positional argument.
func parseFlags(args []string) (flagSet, error) {
	fs := flagSet{}
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			return nil, fmt.Errorf("%q is not --flag or --flag=value", a)
		}
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if _, dup := fs[name]; dup {
			return nil, fmt.Errorf("--%s is given twice", name)
		}
		fs[name] = value
	}
	return fs, nil
}

// checkNodes checks kvwarden's invariants on every role's Deployment and,
// for every pod template, its security context and resources.
func checkNodes(ms []manifest) []string {
	var p []string
	add := func(where, format string, args ...any) { p = append(p, where+": "+fmt.Sprintf(format, args...)) }
	for _, t := range templates(ms) {
		checkHardening(t, add)
	}
	pods := nodePods(ms, add)
	if len(pods) != len(roles) {
		return p
	}
	image := pods[0].c.Image
	checkImage(pods, add)
	for _, n := range pods {
		if n.c.Image != image {
			add(n.where, "image %q, but %s runs %q: every role runs the one binary", n.c.Image, pods[0].where, image)
		}
		checkRun(n, add)
		checkProbes(n, add)
		checkJoin(n, ms, pods, add)
		checkCredentials(n, add)
		checkModel(n, add)
		checkAPIKeys(n, add)
		checkPreStop(n, add)
	}
	return p
}

// nodePods finds each role's Deployment and its node container, with node
// run's flags parsed.
func nodePods(ms []manifest, add func(string, string, ...any)) []nodePod {
	var out []nodePod
	for _, role := range roles {
		var found []nodePod
		for _, m := range ms {
			d, ok := m.obj.(*appsv1.Deployment)
			if !ok || d.Spec.Template.Labels[componentLabel] != role {
				continue
			}
			found = append(found, nodePod{role: role, where: m.where + " " + m.name(), dep: d})
		}
		if len(found) != 1 {
			add(kustomizationFile, "%d Deployments of role %s (label %s), want one", len(found), role, componentLabel)
			continue
		}
		n := found[0]
		if want := "kvwarden-" + role; n.dep.Name != want {
			add(n.where, "is named %s, want %s", n.dep.Name, want)
		}
		cs := n.dep.Spec.Template.Spec.Containers
		if len(cs) != 1 || cs[0].Name != nodeContainer {
			add(n.where, "has containers %v, want one, named %q", containerNames(cs), nodeContainer)
			continue
		}
		n.c = cs[0]
		for _, e := range n.c.Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == podIPPath {
				n.podIP = e.Name
			}
		}
		if n.podIP == "" {
			add(n.where, "no env variable holds the pod's address (fieldRef %s)", podIPPath)
			continue
		}
		if len(n.c.Command) != 0 || len(n.c.Args) == 0 || n.c.Args[0] != "run" {
			add(n.where, "command %q args %q: want the image's entrypoint with args run --flag=value…", n.c.Command, n.c.Args)
			continue
		}
		var err error
		if n.run, err = parseFlags(n.c.Args[1:]); err != nil {
			add(n.where, "node run: %v", err)
			continue
		}
		out = append(out, n)
	}
	return out
}

func containerNames(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// sampleEnv is the container's environment as the kubelet would give it,
// with a sample address for the pod's.
func sampleEnv(c corev1.Container, podIP string) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == podIPPath:
			env[e.Name] = podIP
		}
	}
	return env
}

// expand replaces $(NAME) in s from env, as the kubelet does in args.
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		sub := varRef.FindStringSubmatch(m)
		if v, ok := env[sub[2]]; ok {
			return sub[1] + v
		}
		return m
	})
}

// parses runs the node binary's subcommand sub on args with --help: it
// parses every flag, and refuses an unknown one or a value its flag cannot
// take, before it prints its help and exits 0. That is the check that
// every flag is a real one of the binary built from this tree.
func parses(sub string, args []string, env map[string]string) error {
	full := []string{sub}
	for _, a := range args {
		full = append(full, expand(a, env))
	}
	cmd := exec.Command(bins.node, append(full, "--help")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("node %s refuses %q: %v: %s", sub, full[1:], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// samplePodIP stands for the pod's address where a check needs one.
const samplePodIP = "10.0.0.7"

// checkRun checks node run's command line: real flags with values it
// takes, its role, and the addresses it serves on: the pod's own, on the
// ports the container declares.
func checkRun(n nodePod, add func(string, string, ...any)) {
	if err := parses("run", n.c.Args[1:], sampleEnv(n.c, samplePodIP)); err != nil {
		add(n.where, "%v", err)
	}
	if n.run["role"] != n.role {
		add(n.where, "--role=%s, want %s", n.run["role"], n.role)
	}
	if _, ok := n.run["insecure"]; ok {
		add(n.where, "--insecure: a deployed node must authenticate its peers")
	}
	addrs := []struct{ flag, port string }{{"listen", portRemote}, {"gossip", portGossipTCP}, {"gossip", portGossipUDP}}
	if n.role == "decode" {
		addrs = append(addrs, struct{ flag, port string }{"data", portData})
	}
	own := "$(" + n.podIP + ")"
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(n.run[a.flag])
		if err != nil || host != own {
			add(n.where, "--%s=%s: want %s:<port>, the pod's own address (peers dial what a node advertises)", a.flag, n.run[a.flag], own)
			continue
		}
		checkPortIs(n, "--"+a.flag, port, a.port, add)
	}
	host, port, err := net.SplitHostPort(n.run["http"])
	if err != nil || (host != own && host != "0.0.0.0") {
		add(n.where, "--http=%s: want 0.0.0.0:<port> or %s:<port>", n.run["http"], own)
		return
	}
	checkPortIs(n, "--http", port, portHTTP, add)
}

// checkPortIs checks that port (a flag's) is the container's port named
// name, of the protocol the name says.
func checkPortIs(n nodePod, flag, port, name string, add func(string, string, ...any)) {
	proto := corev1.ProtocolTCP
	if strings.HasSuffix(name, "-udp") {
		proto = corev1.ProtocolUDP
	}
	got, ok := containerPort(n.c, intstr.FromString(name), proto)
	if !ok || strconv.Itoa(int(got)) != port {
		add(n.where, "%s listens on port %s, but the container's port %s (%s) is %d", flag, port, name, proto, got)
	}
}

// httpPort is the port node run serves --http on.
func httpPort(n nodePod) string {
	_, port, _ := net.SplitHostPort(n.run["http"])
	return port
}

// checkProbes checks that readiness is GET /readyz and liveness GET
// /healthz on the --http port, and that the roles whose readiness needs
// other members (router, decode) have a startup probe on /readyz: a node
// joins once, as it starts, and one that never sees what it needs is
// restarted to join again.
func checkProbes(n nodePod, add func(string, string, ...any)) {
	probes := []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readinessProbe", n.c.ReadinessProbe, "/readyz"}, {"livenessProbe", n.c.LivenessProbe, "/healthz"},
		{"startupProbe", n.c.StartupProbe, "/readyz"}}
	for _, pr := range probes {
		if pr.probe == nil {
			if pr.name != "startupProbe" || n.role != "prefill" {
				add(n.where, "has no %s", pr.name)
			}
			continue
		}
		g := pr.probe.HTTPGet
		if g == nil {
			add(n.where, "%s is not an HTTP GET", pr.name)
			continue
		}
		port, ok := containerPort(n.c, g.Port, corev1.ProtocolTCP)
		if g.Path != pr.path || !ok || strconv.Itoa(int(port)) != httpPort(n) {
			add(n.where, "%s is GET %s on port %s (%d), want GET %s on --http's port %s", pr.name, g.Path, g.Port.String(),
				port, pr.path, httpPort(n))
		}
	}
}

// checkJoin checks that --join names the headless Service of gossip: one
// that lists every role's pods, ready or not, on the gossip port in TCP and
// UDP, so that a node starting or restarting finds the cluster through any
// member.
func checkJoin(n nodePod, ms []manifest, pods []nodePod, add func(string, string, ...any)) {
	joins := strings.Split(n.run["join"], ",")
	if n.run["join"] == "" {
		add(n.where, "no --join: a pod that starts alone makes a cluster of its own")
		return
	}
	_, gossipPort, _ := net.SplitHostPort(n.run["gossip"])
	for _, j := range joins {
		host, port, err := net.SplitHostPort(j)
		if err != nil {
			add(n.where, "--join %q: %v", j, err)
			continue
		}
		svc := serviceNamed(ms, host)
		switch {
		case svc == nil:
			add(n.where, "--join %s: %q names no Service of the manifests", j, host)
			continue
		case svc.Spec.ClusterIP != corev1.ClusterIPNone:
			add(n.where, "--join %s: Service %s is not headless (clusterIP: None): its name would resolve to one virtual IP, not to the members", j, host)
		case !svc.Spec.PublishNotReadyAddresses:
			add(n.where, "--join %s: Service %s lists ready pods only (publishNotReadyAddresses), but a node is ready only after it has joined", j, host)
		}
		for _, other := range pods {
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(other.dep.Spec.Template.Labels)) {
				add(n.where, "--join %s: Service %s does not list the %s pods", j, host, other.role)
			}
		}
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			if !servesGossip(svc, port, proto, gossipPort, n) {
				add(n.where, "--join %s: Service %s has no %s port %s to the pods' --gossip port %s", j, host, proto, port, gossipPort)
			}
		}
	}
}

// serviceNamed is the manifests' Service named host (or host's first
// label, as a name of the form svc.namespace.svc… resolves).
func serviceNamed(ms []manifest, host string) *corev1.Service {
	name, _, _ := strings.Cut(host, ".")
	for _, m := range ms {
		if s, ok := m.obj.(*corev1.Service); ok && s.Name == name {
			return s
		}
	}
	return nil
}

// servesGossip says whether svc has a port numbered port of proto whose
// target is the pod's gossip port.
func servesGossip(svc *corev1.Service, port string, proto corev1.Protocol, gossipPort string, n nodePod) bool {
	for _, sp := range svc.Spec.Ports {
		if strconv.Itoa(int(sp.Port)) != port || (sp.Protocol != proto && !(sp.Protocol == "" && proto == corev1.ProtocolTCP)) {
			continue
		}
		target := sp.TargetPort
		if target.Type == intstr.Int && target.IntVal == 0 {
			target = intstr.FromInt32(sp.Port)
		}
		if got, ok := containerPort(n.c, target, proto); ok && strconv.Itoa(int(got)) == gossipPort {
			return true
		}
	}
	return false
}

// certsDir is the credentials directory node run and node drain read: the
// --certs flag, else $KVWARDEN_CERTS.
func certsDir(n nodePod) string {
	if d, ok := n.run["certs"]; ok {
		return d
	}
	for _, e := range n.c.Env {
		if e.Name == certsEnv {
			return e.Value
		}
	}
	return ""
}

// mountAt is the read-only volume mounted at dir (or above it), with the
// pod's volume.
func mountAt(n nodePod, file string) (corev1.VolumeMount, *corev1.Volume) {
	for _, m := range n.c.VolumeMounts {
		if file == m.MountPath || strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			for i, v := range n.dep.Spec.Template.Spec.Volumes {
				if v.Name == m.Name {
					return m, &n.dep.Spec.Template.Spec.Volumes[i]
				}
			}
			return m, nil
		}
	}
	return corev1.VolumeMount{}, nil
}

// projectedFiles are the file names a projected volume of Secrets holds.
func projectedFiles(v *corev1.Volume) []string {
	var out []string
	if v.Projected == nil {
		return nil
	}
	for _, src := range v.Projected.Sources {
		if src.Secret != nil {
			for _, it := range src.Secret.Items {
				out = append(out, it.Path)
			}
		}
	}
	return out
}

// checkCredentials checks the credentials directory as node certs lays it
// out and node run and node drain read it: ca.crt and gossip.keys, one
// certificate of the node's role and one of an operator's (for the
// drain), each with its key; mounted read-only from Secrets, keys
// readable by the pod's group at most; never the CA's key.
func checkCredentials(n nodePod, add func(string, string, ...any)) {
	dir := certsDir(n)
	if dir == "" {
		add(n.where, "no credentials directory: neither --certs nor $%s", certsEnv)
		return
	}
	m, v := mountAt(n, dir)
	if v == nil || m.MountPath != dir || v.Projected == nil || !m.ReadOnly {
		add(n.where, "credentials directory %s is not a read-only mount of a projected volume of Secrets", dir)
		return
	}
	checkMode(n, v.Name, v.Projected.DefaultMode, add)
	files := projectedFiles(v)
	for _, want := range []string{"ca.crt", "gossip.keys"} {
		if !slices.Contains(files, want) {
			add(n.where, "credentials directory %s has no %s", dir, want)
		}
	}
	if slices.Contains(files, "ca.key") {
		add(n.where, "credentials directory %s holds the CA's key: nodes never need it", dir)
	}
	for _, role := range []string{n.role, operatorRole} {
		var certs []string
		for _, f := range files {
			if strings.HasPrefix(f, role+"-") && strings.HasSuffix(f, ".crt") {
				certs = append(certs, f)
			}
		}
		if len(certs) != 1 {
			add(n.where, "credentials directory %s has %d certificates of role %s (%v), want one", dir, len(certs), role, certs)
			continue
		}
		if key := strings.TrimSuffix(certs[0], ".crt") + ".key"; !slices.Contains(files, key) {
			add(n.where, "credentials directory %s has %s without %s", dir, certs[0], key)
		}
	}
}

// checkMode checks the mode of a volume of secrets: readable by the pod's
// group at most, writable by nobody.
func checkMode(n nodePod, volume string, mode *int32, add func(string, string, ...any)) {
	if mode == nil || *mode&0o337 != 0 {
		add(n.where, "volume %s's defaultMode %s: secrets must be unreadable to others and unwritable (0440 at most)", volume, octal(mode))
	}
}

// octal shows a file mode as the manifests write it.
func octal(mode *int32) string {
	if mode == nil {
		return "unset"
	}
	return fmt.Sprintf("%#o", *mode)
}

// checkModel checks that --model and --tokenizer are files of a read-only
// volume backed by a claim, not of the image or a ConfigMap.
func checkModel(n nodePod, add func(string, string, ...any)) {
	for _, flag := range []string{"model", "tokenizer"} {
		f, ok := n.run[flag]
		if !ok {
			add(n.where, "no --%s: it would serve the built-in model of random weights", flag)
			continue
		}
		m, v := mountAt(n, f)
		if v == nil || v.PersistentVolumeClaim == nil || !m.ReadOnly || path.Dir(f) != path.Clean(m.MountPath) {
			add(n.where, "--%s=%s is not a file of a read-only mount of a PersistentVolumeClaim", flag, f)
		}
	}
}

// checkAPIKeys checks that a router serves the API with a keys file from a
// Secret mounted as a directory: the kubelet updates the files of such a
// mount when the Secret changes (never those of a subPath), so that a
// SIGHUP reads the new keys.
func checkAPIKeys(n nodePod, add func(string, string, ...any)) {
	f, ok := n.run["api-keys"]
	if n.role != "router" {
		if ok {
			add(n.where, "--api-keys on a %s node: only routers serve the API", n.role)
		}
		return
	}
	m, v := mountAt(n, f)
	if !ok || v == nil || v.Secret == nil || !m.ReadOnly || m.SubPath != "" || path.Dir(f) != path.Clean(m.MountPath) {
		add(n.where, "--api-keys=%s is not a file of a read-only directory mount (no subPath) of a Secret", f)
		return
	}
	checkMode(n, v.Name, v.Secret.DefaultMode, add)
}

// preStopCommand is the hook's command up to node drain's flags.
var preStopCommand = []string{"/envexec", "/node", "drain"}

// checkPreStop checks the drain hook: node drain of the pod's own
// --listen address, waiting until the node has left, through envexec
// (hooks get no $(VAR) expansion); its --timeout within the grace period,
// and node run's --drain-timeout within that.
func checkPreStop(n nodePod, add func(string, string, ...any)) {
	l := n.c.Lifecycle
	if l == nil || l.PreStop == nil || l.PreStop.Exec == nil {
		add(n.where, "has no preStop exec hook: SIGTERM alone leaves without draining")
		return
	}
	cmd := l.PreStop.Exec.Command
	if len(cmd) < len(preStopCommand) || !slices.Equal(cmd[:len(preStopCommand)], preStopCommand) {
		add(n.where, "preStop %q does not start with %q", cmd, preStopCommand)
		return
	}
	drain, err := parseFlags(cmd[len(preStopCommand):])
	if err != nil {
		add(n.where, "preStop node drain: %v", err)
		return
	}
	if err := parses("drain", cmd[len(preStopCommand):], sampleEnv(n.c, samplePodIP)); err != nil {
		add(n.where, "preStop: %v", err)
	}
	if drain["endpoint"] != n.run["listen"] {
		add(n.where, "preStop drains --endpoint=%s, but the node listens on %s", drain["endpoint"], n.run["listen"])
	}
	if _, ok := drain["wait"]; !ok {
		add(n.where, "preStop drain has no --wait: the hook would return, and SIGTERM follow, before the node has drained")
	}
	wait, err1 := time.ParseDuration(drain["timeout"])
	drainFor, err2 := time.ParseDuration(n.run["drain-timeout"])
	grace := corev1.DefaultTerminationGracePeriodSeconds * time.Second
	if g := n.dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if err1 != nil || err2 != nil || !(drainFor < wait && wait < grace) {
		add(n.where, "node run --drain-timeout=%s, preStop drain --timeout=%s, terminationGracePeriodSeconds %s: want each shorter than the next",
			n.run["drain-timeout"], drain["timeout"], grace)
	}
}

// checkHardening checks that a pod runs as a non-root user with a
// read-only root filesystem, no privilege escalation and no capabilities,
// no service account token, and resource requests and limits on every
// container.
func checkHardening(t podTemplate, add func(string, string, ...any)) {
	s := t.spec
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		add(t.where, "mounts a service account token (automountServiceAccountToken), which nothing in it uses")
	}
	psc := s.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		add(t.where, "pod securityContext must set runAsNonRoot: true and a runAsUser other than 0")
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		add(t.where, "pod securityContext must set seccompProfile RuntimeDefault")
	}
	for _, c := range append(slices.Clone(s.InitContainers), s.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			add(t.where, "container %s: securityContext must set readOnlyRootFilesystem: true, allowPrivilegeEscalation: false and drop ALL capabilities", c.Name)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; !ok {
				add(t.where, "container %s has no %s request", c.Name, r)
			}
			if _, ok := c.Resources.Limits[r]; !ok {
				add(t.where, "container %s has no %s limit", c.Name, r)
			}
		}
	}
}

// dockerfile is the image's build file, at the repository's root.
const dockerfile = repoRoot + "/Dockerfile"

// dockerfileLine is an instruction of the Dockerfile's final stage that
// checkImage reads.
var dockerfileLine = regexp.MustCompile(`(?m)^(FROM|COPY|USER|ENTRYPOINT)\s+(.*)$`)

// checkImage checks the manifests against the image the Dockerfile builds:
// its entrypoint is node (the manifests give args only), it holds every
// binary the preStop hook runs, and it runs as the manifests' user.
func checkImage(pods []nodePod, add func(string, string, ...any)) {
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		add(dockerfile, "%v", err)
		return
	}
	var copied []string
	var user, entrypoint string
	for _, m := range dockerfileLine.FindAllStringSubmatch(string(b), -1) {
		switch f := strings.Fields(m[2]); m[1] {
		case "FROM":
			copied, user, entrypoint = nil, "", "" // a new stage: only the last one is the image
		case "COPY":
			copied = append(copied, f[len(f)-1])
		case "USER":
			user = m[2]
		case "ENTRYPOINT":
			entrypoint = m[2]
		}
	}
	if want := `["` + preStopCommand[1] + `"]`; entrypoint != want {
		add(dockerfile, "ENTRYPOINT %s, want %s", entrypoint, want)
	}
	for _, bin := range preStopCommand[:2] {
		if !slices.Contains(copied, bin) {
			add(dockerfile, "the final stage does not copy %s, which the preStop hook runs", bin)
		}
	}
	for _, n := range pods {
		sc := n.dep.Spec.Template.Spec.SecurityContext
		if want := fmt.Sprintf("%d:%d", *sc.RunAsUser, *sc.RunAsGroup); user != want {
			add(dockerfile, "USER %s, but %s runs as %s", user, n.where, want)
		}
	}
}
