package kubetest

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The kit's Traefik settings are HelmChartConfigs of k3s-io/helm-controller
// (helm.cattle.io/v1), which k3s and rke2 run. Its Go module is not taken
// in for one small type: these mirror pkg/apis/helm.cattle.io/v1's
// HelmChartConfig and HelmChartConfigSpec field for field (values,
// valuesContent, valuesSecrets, failurePolicy), so that the strict decoder
// refuses a field helm-controller does not know.

var helmChartConfigGVK = schema.GroupVersionKind{Group: "helm.cattle.io", Version: "v1", Kind: "HelmChartConfig"}

type helmChartConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec helmChartConfigSpec `json:"spec,omitempty"`
}

type helmChartConfigSpec struct {
	Values        *apiextensionsv1.JSON `json:"values,omitempty"`
	ValuesContent string                `json:"valuesContent,omitempty"`
	ValuesSecrets []helmSecretSpec      `json:"valuesSecrets,omitempty"`
	FailurePolicy string                `json:"failurePolicy,omitempty"`
}

type helmSecretSpec struct {
	Name          string   `json:"name,omitempty"`
	Keys          []string `json:"keys,omitempty"`
	IgnoreUpdates bool     `json:"ignoreUpdates,omitempty"`
}

func (h *helmChartConfig) DeepCopyObject() runtime.Object {
	c := *h
	h.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	if h.Spec.Values != nil {
		c.Spec.Values = h.Spec.Values.DeepCopy()
	}
	c.Spec.ValuesSecrets = nil
	for _, s := range h.Spec.ValuesSecrets {
		s.Keys = append([]string(nil), s.Keys...)
		c.Spec.ValuesSecrets = append(c.Spec.ValuesSecrets, s)
	}
	return &c
}

// addHelmChartConfig registers the type with the kit's scheme.
func addHelmChartConfig(s *runtime.Scheme) error {
	s.AddKnownTypeWithName(helmChartConfigGVK, &helmChartConfig{})
	metav1.AddToGroupVersion(s, helmChartConfigGVK.GroupVersion())
	return nil
}
