package traefiktest

import (
	"fmt"
	"strconv"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
)

// The annotations of Traefik's Ingress provider that Routes reads. Any
// other of its annotations is an error, so that a setting the kit adds to
// its Ingresses is not left out of the tests without a word.
const (
	annotationPrefix = "traefik.ingress.kubernetes.io/"
	entryPointsKey   = annotationPrefix + "router.entrypoints"
	tlsKey           = annotationPrefix + "router.tls"
	// The certificate resolver is read and left out: the test's own
	// certificate stands for what Let's Encrypt would issue.
	certResolverKey = annotationPrefix + "router.tls.certresolver"
)

// Router is one router of Traefik's dynamic configuration, as its file
// provider reads it.
type Router struct {
	EntryPoints []string  `json:"entryPoints,omitempty"`
	Rule        string    `json:"rule"`
	Service     string    `json:"service"`
	TLS         *struct{} `json:"tls,omitempty"`
}

// Service is a load balancer over its servers.
type Service struct {
	LoadBalancer struct {
		Servers []Server `json:"servers"`
	} `json:"loadBalancer"`
}

// Server is one server of a Service.
type Server struct {
	URL string `json:"url"`
}

// HTTP is the http part of Traefik's dynamic configuration.
type HTTP struct {
	Routers  map[string]Router  `json:"routers"`
	Services map[string]Service `json:"services"`
}

// Routes makes of ings the routers Traefik's Kubernetes Ingress provider
// (pkg/provider/kubernetes/ingress, loadRouter and buildRule) makes of
// them: per host and path a router with the rule Host("host") &&
// PathPrefix("path") (Path for an Exact path), the annotations' entry
// points and TLS, and a service per backend Service port. backends gives
// each Service port's address here, keyed "name:port".
func Routes(ings []networkingv1.Ingress, backends map[string]string) (HTTP, error) {
	h := HTTP{Routers: map[string]Router{}, Services: map[string]Service{}}
	for _, ing := range ings {
		var base Router
		for k, v := range ing.Annotations {
			switch k {
			case entryPointsKey:
				for _, ep := range strings.Split(v, ",") {
					base.EntryPoints = append(base.EntryPoints, strings.TrimSpace(ep))
				}
			case tlsKey:
				on, err := strconv.ParseBool(v)
				if err != nil {
					return HTTP{}, fmt.Errorf("ingress %s: %s %q: %w", ing.Name, k, v, err)
				}
				if on {
					base.TLS = &struct{}{}
				}
			case certResolverKey:
			default:
				if strings.HasPrefix(k, annotationPrefix) {
					return HTTP{}, fmt.Errorf("ingress %s: annotation %s is not one these tests route by", ing.Name, k)
				}
			}
		}
		for ri, rule := range ing.Spec.Rules {
			if rule.HTTP == nil {
				continue
			}
			for pi, p := range rule.HTTP.Paths {
				b := p.Backend.Service
				if b == nil || b.Port.Name != "" {
					return HTTP{}, fmt.Errorf("ingress %s: path %s: want a Service backend by port number", ing.Name, p.Path)
				}
				key := b.Name + ":" + strconv.Itoa(int(b.Port.Number))
				addr, ok := backends[key]
				if !ok {
					return HTTP{}, fmt.Errorf("ingress %s: path %s goes to %s, which the test does not run", ing.Name, p.Path, key)
				}
				svc := ing.Namespace + "-" + b.Name + "-" + strconv.Itoa(int(b.Port.Number))
				var s Service
				s.LoadBalancer.Servers = []Server{{URL: "http://" + addr}}
				h.Services[svc] = s
				matcher := "PathPrefix"
				if p.PathType != nil && *p.PathType == networkingv1.PathTypeExact {
					matcher = "Path"
				}
				var rules []string
				if rule.Host != "" {
					rules = append(rules, fmt.Sprintf("Host(%q)", rule.Host))
				}
				if p.Path != "" {
					rules = append(rules, fmt.Sprintf("%s(%q)", matcher, p.Path))
				}
				r := base
				r.Rule, r.Service = strings.Join(rules, " && "), svc
				h.Routers[fmt.Sprintf("%s-%s-%d-%d", ing.Namespace, ing.Name, ri, pi)] = r
			}
		}
	}
	return h, nil
}
