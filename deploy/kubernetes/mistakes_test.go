package kubernetes

import (
	"maps"
	"testing"

	"github.com/kvwarden/kvwarden/deploy/internal/mistake"
)

// mistakes are planted one at a time into the manifests: validate must
// report each, in words containing want. They keep the checks honest: a
// check that stopped looking would pass the manifests as they are.
var mistakes = []struct {
	name, file, old, new, want string
}{
	{"misspelt field", "router.yaml", "readinessProbe:", "readinesProbe:",
		`unknown field "spec.template.spec.containers[0].readinesProbe"`},
	{"field in the wrong case", "prefill.yaml", "replicas: 2", "Replicas: 2", `unknown field "spec.Replicas"`},
	{"wrong type", "prefill.yaml", "replicas: 2", "replicas: two", "cannot unmarshal string"},
	{"duplicate key", "decode.yaml", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n", `"replicas" already set`},
	{"missing required field", "decode.yaml", "              containerPort: 7071\n", "",
		"required field spec.template.spec.containers[0].ports[3].containerPort is missing"},
	{"unknown kind", "serviceaccount.yaml", "kind: ServiceAccount", "kind: ServiceAcount", `no kind "ServiceAcount"`},
	{"unknown flag of node run", "router.yaml", "--drain-timeout=2m", "--drain-timout=2m", "unknown flag: --drain-timout"},
	{"value a flag cannot take", "decode.yaml", "--drain-timeout=2m", "--drain-timeout=2min", `invalid argument "2min"`},
	{"unknown flag of node drain", "prefill.yaml", "- --wait\n", "- --wait-left\n", "unknown flag: --wait-left"},
	{"flag value apart from its flag", "router.yaml", "- --role=router\n", "- --role\n            - router\n",
		`"router" is not --flag or --flag=value`},
	{"insecure node", "router.yaml", "- --drain-timeout=2m\n", "- --drain-timeout=2m\n            - --insecure\n",
		"--insecure: a deployed node must authenticate"},
	{"readiness on another path", "decode.yaml", "readinessProbe:\n            httpGet:\n              path: /readyz",
		"readinessProbe:\n            httpGet:\n              path: /healthz", "readinessProbe is GET /healthz"},
	{"readiness on another port", "router.yaml", "readinessProbe:\n            httpGet:\n              path: /readyz\n              port: http",
		"readinessProbe:\n            httpGet:\n              path: /readyz\n              port: remote", "want GET /readyz on --http's port 8080"},
	{"probe of a port not exposed", "prefill.yaml", "livenessProbe:\n            httpGet:\n              path: /healthz\n              port: http",
		"livenessProbe:\n            httpGet:\n              path: /healthz\n              port: metrics", "probes port metrics, which the container does not expose"},
	{"no startup probe where readiness needs peers", "decode.yaml",
		"          startupProbe:\n            httpGet:\n              path: /readyz\n              port: http\n            periodSeconds: 5\n            failureThreshold: 60\n",
		"", "has no startupProbe"},
	{"join through a Service that is not headless", "prefill.yaml", "--join=kvwarden-gossip:7946", "--join=kvwarden-router:7946",
		"Service kvwarden-router is not headless"},
	{"join through a Service that lists ready pods only", "services.yaml", "publishNotReadyAddresses: true",
		"publishNotReadyAddresses: false", "lists ready pods only"},
	{"join through a name no Service has", "decode.yaml", "--join=kvwarden-gossip:7946", "--join=kvwarden-gosip:7946",
		`"kvwarden-gosip" names no Service`},
	{"gossip Service without UDP", "services.yaml", "      protocol: UDP\n", "      protocol: SCTP\n", "has no UDP port 7946"},
	{"listen on a wildcard address", "decode.yaml", "--listen=$(POD_IP):7070", "--listen=0.0.0.0:7070", "the pod's own address"},
	{"flag on another port than the container's", "router.yaml", "--gossip=$(POD_IP):7946", "--gossip=$(POD_IP):7947",
		"--gossip listens on port 7947, but the container's port gossip-tcp (TCP) is 7946"},
	{"undefined variable", "router.yaml", "--gossip=$(POD_IP):7946", "--gossip=$(POD_ADDR):7946", "references $(POD_ADDR)"},
	{"Service target port no pod has", "services.yaml", "targetPort: http", "targetPort: htp", "targets htp/TCP, which router.yaml#0 Deployment/kvwarden-router does not expose"},
	{"selector that misses the template", "prefill.yaml", "  selector:\n    matchLabels:\n      app.kubernetes.io/name: kvwarden\n      app.kubernetes.io/component: prefill",
		"  selector:\n    matchLabels:\n      app.kubernetes.io/name: kvwarden\n      app.kubernetes.io/component: prefil",
		"does not match the template's labels"},
	{"mount of no volume", "router.yaml", "- name: tmp\n              mountPath: /tmp", "- name: scratch\n              mountPath: /tmp",
		`mounts volume "scratch", which the pod does not define`},
	{"claim no manifest defines", "model-pvc.yaml", "name: kvwarden-model", "name: kvwarden-models", `claims "kvwarden-model"`},
	{"writable root filesystem", "prefill.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem: true"},
	{"root user", "decode.yaml", "runAsUser: 65532", "runAsUser: 0", "runAsUser other than 0"},
	{"no memory limit", "decode.yaml", "            limits:\n              cpu: \"2\"\n              memory: 1Gi\n",
		"            limits:\n              cpu: \"2\"\n", "has no memory limit"},
	{"drain that does not wait", "router.yaml", "                  - --wait\n", "", "no --wait"},
	{"drain of another address", "decode.yaml", "--endpoint=$(POD_IP):7070", "--endpoint=127.0.0.1:7070",
		"preStop drains --endpoint=127.0.0.1:7070"},
	{"grace period shorter than the drain", "decode.yaml", "terminationGracePeriodSeconds: 180", "terminationGracePeriodSeconds: 60",
		"want each shorter than the next"},
	{"no operator certificate for the drain", "prefill.yaml", "path: operator-drain.crt", "path: admin-drain.crt",
		"0 certificates of role operator"},
	{"keys readable by others", "router.yaml", "projected:\n            defaultMode: 0440", "projected:\n            defaultMode: 0444",
		"volume certs's defaultMode 0444"},
	{"API keys writable", "router.yaml", "secretName: kvwarden-api-keys\n            defaultMode: 0440",
		"secretName: kvwarden-api-keys\n            defaultMode: 0660", "volume api-keys's defaultMode 0660"},
	{"keys file mounted by subPath", "router.yaml", "              mountPath: /etc/kvwarden/api-keys\n",
		"              mountPath: /etc/kvwarden/api-keys\n              subPath: keys.json\n", "no subPath"},
	{"model baked into the image", "prefill.yaml", "--model=/models/stories260K.bin", "--model=/stories260K.bin",
		"--model=/stories260K.bin is not a file of a read-only mount of a PersistentVolumeClaim"},
	{"service account token", "tools/model-loader.yaml", "automountServiceAccountToken: false", "automountServiceAccountToken: true",
		"mounts a service account token"},
}

func TestValidationCatchesMistakes(t *testing.T) {
	files, err := readFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mistakes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			planted := maps.Clone(files)
			planted[m.file] = []byte(mistake.Plant(t, string(files[m.file]), m.old, m.new))
			mistake.Caught(t, m.new, m.want, validate(planted))
		})
	}
}
