package kubernetes

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The checks the API server and the kubelet make only when the manifests
// are applied: names, selectors, and every reference between objects and
// within a pod.

// podTemplate is a pod as a Deployment or a Pod manifest describes it.
type podTemplate struct {
	where  string // the manifest's file#index and kind/name
	file   string
	labels map[string]string
	spec   *corev1.PodSpec
}

// templates are the pods of ms: Deployments' templates and bare Pods.
func templates(ms []manifest) []podTemplate {
	var out []podTemplate
	for _, m := range ms {
		var meta metav1.ObjectMeta
		var spec *corev1.PodSpec
		switch o := m.obj.(type) {
		case *appsv1.Deployment:
			meta, spec = o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
		case *corev1.Pod:
			meta, spec = o.ObjectMeta, &o.Spec
		default:
			continue
		}
		out = append(out, podTemplate{where: m.where + " " + m.name(), file: fileOf(m.where), labels: meta.Labels, spec: spec})
	}
	return out
}

// fileOf is the file of a file#index.
func fileOf(where string) string {
	if i := strings.LastIndexByte(where, '#'); i >= 0 {
		return where[:i]
	}
	return where
}

// selected are the pod templates of the kustomization that sel selects.
func selected(tpls []podTemplate, sel labels.Selector) []podTemplate {
	var out []podTemplate
	for _, p := range tpls {
		if inKustomization(p.file) && sel.Matches(labels.Set(p.labels)) {
			out = append(out, p)
		}
	}
	return out
}

// checkObjects checks names, selectors and references of every object.
func checkObjects(ms []manifest) []string {
	var p []string
	add := func(where, format string, args ...any) { p = append(p, where+": "+fmt.Sprintf(format, args...)) }
	tpls := templates(ms)
	claims := map[string]bool{}
	seen := map[string]string{}
	for _, m := range ms {
		if pvc, ok := m.obj.(*corev1.PersistentVolumeClaim); ok {
			claims[pvc.Name] = true
		}
		if first, dup := seen[m.name()]; dup {
			add(m.where, "%s is also defined at %s", m.name(), first)
		}
		seen[m.name()] = m.where
		checkMeta(m, add)
	}
	for _, m := range ms {
		where := m.where + " " + m.name()
		switch o := m.obj.(type) {
		case *appsv1.Deployment:
			sel, err := metav1.LabelSelectorAsSelector(o.Spec.Selector)
			switch {
			case err != nil || o.Spec.Selector == nil || sel.Empty():
				add(where, "spec.selector %v selects nothing or everything (%v)", o.Spec.Selector, err)
			case !sel.Matches(labels.Set(o.Spec.Template.Labels)):
				add(where, "spec.selector %s does not match the template's labels %v", sel, o.Spec.Template.Labels)
			}
		case *corev1.Service:
			checkService(where, o, tpls, add)
		case *policyv1.PodDisruptionBudget:
			sel, err := metav1.LabelSelectorAsSelector(o.Spec.Selector)
			if err != nil || len(selected(tpls, sel)) == 0 {
				add(where, "spec.selector %v selects no pod template (%v)", o.Spec.Selector, err)
			}
		case *networkingv1.NetworkPolicy:
			sel, err := metav1.LabelSelectorAsSelector(&o.Spec.PodSelector)
			if err != nil || len(selected(tpls, sel)) == 0 {
				add(where, "spec.podSelector %v selects no pod template (%v)", o.Spec.PodSelector, err)
			}
		}
	}
	for _, t := range tpls {
		checkPodSpec(t, claims, add)
	}
	return p
}

// checkMeta checks an object's name and labels as the API server does.
func checkMeta(m manifest, add func(string, string, ...any)) {
	acc, ok := m.obj.(metav1.Object)
	if !ok {
		add(m.where, "has no metadata")
		return
	}
	isName := validation.IsDNS1123Subdomain
	if _, svc := m.obj.(*corev1.Service); svc {
		isName = validation.IsDNS1035Label // a Service's name is a DNS label
	}
	for _, e := range isName(acc.GetName()) {
		add(m.where, "metadata.name %q: %s", acc.GetName(), e)
	}
	checkLabels(m.where, acc.GetLabels(), add)
	if d, ok := m.obj.(*appsv1.Deployment); ok {
		checkLabels(m.where+" template", d.Spec.Template.Labels, add)
	}
}

func checkLabels(where string, l map[string]string, add func(string, string, ...any)) {
	for k, v := range l {
		for _, e := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			add(where, "label %s=%s: %s", k, v, e)
		}
	}
}

// checkService checks that a Service selects pod templates and that each
// of its target ports is a port of every pod it selects.
func checkService(where string, s *corev1.Service, tpls []podTemplate, add func(string, string, ...any)) {
	if len(s.Spec.Selector) == 0 {
		add(where, "has no selector")
		return
	}
	pods := selected(tpls, labels.SelectorFromSet(s.Spec.Selector))
	if len(pods) == 0 {
		add(where, "selector %v selects no pod template", s.Spec.Selector)
	}
	for _, sp := range s.Spec.Ports {
		for _, pod := range pods {
			if _, ok := podPort(pod.spec, sp.TargetPort, sp.Protocol); !ok {
				add(where, "port %s targets %s/%s, which %s does not expose", sp.Name, sp.TargetPort.String(), sp.Protocol, pod.where)
			}
		}
	}
}

// podPort resolves a port (a number, or a container port's name; a
// Service's unset targetPort is its port) among spec's container ports of
// protocol proto (TCP if empty).
func podPort(spec *corev1.PodSpec, port intstr.IntOrString, proto corev1.Protocol) (int32, bool) {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, c := range spec.Containers {
		if n, ok := containerPort(c, port, proto); ok {
			return n, true
		}
	}
	return 0, false
}

// containerPort resolves port among c's ports of protocol proto.
func containerPort(c corev1.Container, port intstr.IntOrString, proto corev1.Protocol) (int32, bool) {
	for _, cp := range c.Ports {
		p := cp.Protocol
		if p == "" {
			p = corev1.ProtocolTCP
		}
		if p != proto {
			continue
		}
		if (port.Type == intstr.String && cp.Name == port.StrVal) || (port.Type == intstr.Int && cp.ContainerPort == port.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// varRef is a $(NAME) the kubelet expands in a container's command and
// args; $$( is an escaped one.
var varRef = regexp.MustCompile(`(^|[^$])\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// refs are the variables s references.
func refs(s string) []string {
	var out []string
	for _, m := range varRef.FindAllStringSubmatch(s, -1) {
		out = append(out, m[2])
	}
	return out
}

// checkPodSpec checks one pod: names, ports, mounts, claims, environment
// references and probes' ports.
func checkPodSpec(t podTemplate, claims map[string]bool, add func(string, string, ...any)) {
	vols := map[string]corev1.Volume{}
	for _, v := range t.spec.Volumes {
		for _, e := range validation.IsDNS1123Label(v.Name) {
			add(t.where, "volume %q: %s", v.Name, e)
		}
		if _, dup := vols[v.Name]; dup {
			add(t.where, "volume %q is defined twice", v.Name)
		}
		vols[v.Name] = v
		if c := v.PersistentVolumeClaim; c != nil && !claims[c.ClaimName] {
			add(t.where, "volume %q claims %q, which no manifest defines", v.Name, c.ClaimName)
		}
		if v.Projected != nil {
			paths := map[string]bool{}
			for _, src := range v.Projected.Sources {
				if src.Secret == nil {
					continue
				}
				for _, it := range src.Secret.Items {
					if paths[it.Path] {
						add(t.where, "volume %q projects %s twice", v.Name, it.Path)
					}
					paths[it.Path] = true
				}
			}
		}
	}
	names := map[string]bool{}
	for _, c := range append(slices.Clone(t.spec.InitContainers), t.spec.Containers...) {
		for _, e := range validation.IsDNS1123Label(c.Name) {
			add(t.where, "container %q: %s", c.Name, e)
		}
		if names[c.Name] {
			add(t.where, "container %q is defined twice", c.Name)
		}
		names[c.Name] = true
		checkContainer(t.where+" container "+c.Name, c, vols, add)
	}
}

// probeNames name a container's probes, in the order checkContainer
// takes them.
var probeNames = []string{"readinessProbe", "livenessProbe", "startupProbe"}

// checkContainer checks one container's ports, environment, mounts,
// $(VAR) references and probes.
func checkContainer(where string, c corev1.Container, vols map[string]corev1.Volume, add func(string, string, ...any)) {
	ports := map[string]bool{}
	for _, p := range c.Ports {
		if p.Name == "" {
			continue
		}
		for _, e := range validation.IsValidPortName(p.Name) {
			add(where, "port %q: %s", p.Name, e)
		}
		if ports[p.Name] {
			add(where, "port %q is defined twice", p.Name)
		}
		ports[p.Name] = true
	}
	env := map[string]bool{}
	for _, e := range c.Env {
		for _, msg := range validation.IsEnvVarName(e.Name) {
			add(where, "env %q: %s", e.Name, msg)
		}
		env[e.Name] = true
	}
	for _, s := range append(slices.Clone(c.Command), c.Args...) {
		for _, r := range refs(s) {
			if !env[r] {
				add(where, "%q references $(%s), which is not in the container's env (the kubelet would pass it on verbatim)", s, r)
			}
		}
	}
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Exec != nil {
		for _, s := range c.Lifecycle.PreStop.Exec.Command {
			for _, r := range refs(s) {
				if !env[r] {
					add(where, "preStop %q references $(%s), which is not in the container's env", s, r)
				}
			}
		}
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		if _, ok := vols[m.Name]; !ok {
			add(where, "mounts volume %q, which the pod does not define", m.Name)
		}
		if mounts[m.MountPath] {
			add(where, "mounts two volumes at %s", m.MountPath)
		}
		mounts[m.MountPath] = true
	}
	for i, pr := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
		if pr == nil || pr.HTTPGet == nil {
			continue
		}
		if _, ok := containerPort(c, pr.HTTPGet.Port, corev1.ProtocolTCP); !ok {
			add(where, "%s probes port %s, which the container does not expose", probeNames[i], pr.HTTPGet.Port.String())
		}
	}
}
