// Package kubernetes holds kvwarden's Kubernetes manifests (the YAML files
// beside this one, listed in kustomization.yaml) and the tests that check
// them offline, with no cluster and no schema download:
//
//   - every document is decoded strictly into the Kubernetes API's own Go
//     types (k8s.io/api), so that an unknown or misspelt field, a duplicate
//     key or a value of the wrong type fails, and the fields the API
//     requires are checked by the same rule its OpenAPI schema is generated
//     by (no omitempty and no +optional marker);
//   - references the API server or the kubelet would only refuse at apply
//     time are resolved: selectors to pod templates, named ports, volume
//     mounts, claims, $(VAR) references to the container's environment;
//   - kvwarden's own invariants hold: probes on node run's --http port,
//     every flag one node run (and, in the preStop hook, node drain) parses,
//     gossip joined through the headless Service, credentials laid out as
//     node certs makes them, non-root and a read-only root filesystem;
//   - the manifests' command lines, run as processes on loopback
//     addresses with the credentials deploy/README.md makes, form a
//     cluster that serves a request, and the preStop hook drains a node.
package kubernetes
