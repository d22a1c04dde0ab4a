// Package traefiktest runs a real Traefik for the tests of docs/deploy's
// Traefik settings: Traefik started with the static arguments its Helm
// chart makes of the kit's values (Values), routing as Traefik's Ingress
// provider routes the kit's Ingresses (Routes), on loopback, over TLS with
// a certificate made for the test.
//
// The Traefik is the one .ci/deps builds (Version); no container, no
// cluster: what is tried is Traefik's own reading of the settings and of
// the requests.
package traefiktest

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Values are the values of Traefik's Helm chart that the kit's
// HelmChartConfigs set (traefik/traefik-helm-chart's values.yaml:
// ports.<entry point>.transport.respondingTimeouts, persistence,
// service.spec, additionalArguments), read strictly by ParseValues: a key
// misspelt, or one this reading does not know, is an error rather than a
// value the chart never reads or the tests never try. service.spec is
// merged into the spec of the chart's Service, so it is read as a
// ServiceSpec, strictly too.
type Values struct {
	Ports struct {
		Websecure struct {
			Transport struct {
				RespondingTimeouts struct {
					ReadTimeout string `json:"readTimeout"`
				} `json:"respondingTimeouts"`
			} `json:"transport"`
		} `json:"websecure"`
	} `json:"ports"`
	Persistence struct {
		Enabled bool   `json:"enabled"`
		Path    string `json:"path"`
		Size    string `json:"size"`
	} `json:"persistence"`
	Service *struct {
		Spec *corev1.ServiceSpec `json:"spec"`
	} `json:"service,omitempty"`
	AdditionalArguments []string `json:"additionalArguments"`
}

// ParseValues reads a HelmChartConfig's valuesContent.
func ParseValues(content string) (Values, error) {
	var v Values
	if err := yaml.UnmarshalStrict([]byte(content), &v); err != nil {
		return Values{}, fmt.Errorf("traefik chart values: %w", err)
	}
	return v, nil
}

// Args are the static arguments Traefik's chart starts Traefik with for
// v, beyond the chart's own (entry points' addresses, providers, ping):
// websecure's read timeout, as the chart's pod template writes it, then
// the additional arguments as they are. service.spec makes none (it is the
// Service's). The chart mounts Traefik's volume (persistence) at
// persistence.path; volume is that directory here: an argument whose
// value lies under persistence.path gets volume in its place.
func (v Values) Args(volume string) []string {
	var args []string
	if rt := v.Ports.Websecure.Transport.RespondingTimeouts.ReadTimeout; rt != "" {
		args = append(args, "--entryPoints.websecure.transport.respondingTimeouts.readTimeout="+rt)
	}
	mount := strings.TrimSuffix(v.Persistence.Path, "/")
	for _, a := range v.AdditionalArguments {
		name, value, ok := strings.Cut(a, "=")
		if v.Persistence.Enabled && mount != "" && ok && (value == mount || strings.HasPrefix(value, mount+"/")) {
			a = name + "=" + volume + strings.TrimPrefix(value, mount)
		}
		args = append(args, a)
	}
	return args
}
