package kubetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// rbacKind is one kind the provisioner may use, with a minimal object of
// it as the provisioner would make one.
type rbacKind struct {
	gvk schema.GroupVersionKind
	obj func(ns string) map[string]any
}

// rbacNamespace is where the ServiceAccount makes its objects, as the
// provisioner makes market-<buyer id>.
const rbacNamespace = "market-7"

var rbacKinds = []rbacKind{
	{schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, func(string) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": rbacNamespace}}
	}},
	{schema.GroupVersionKind{Version: "v1", Kind: "Secret"}, func(ns string) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": "vm-o1-cloudinit", "namespace": ns},
			"stringData": map[string]any{"userdata": "#cloud-config\n"}}
	}},
	{schema.GroupVersionKind{Version: "v1", Kind: "Service"}, func(ns string) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": "vm-o1", "namespace": ns},
			"spec": map[string]any{"selector": map[string]any{"losos.dev/order": "o1"},
				"ports": []any{map[string]any{"port": int64(80), "targetPort": int64(80)}}}}
	}},
	{schema.GroupVersionKind{Group: "networking.k8s.io", Version: "v1", Kind: "Ingress"}, func(ns string) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": "vm-o1", "namespace": ns},
			"spec": map[string]any{"rules": []any{map[string]any{"host": "vm-o1.vms.example.net",
				"http": map[string]any{"paths": []any{map[string]any{"path": "/", "pathType": "Prefix",
					"backend": map[string]any{"service": map[string]any{"name": "vm-o1", "port": map[string]any{"number": int64(80)}}}}}}}}}}
	}},
	{schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"}, func(ns string) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": "vm-o1-0", "namespace": ns},
			"spec": map[string]any{"runStrategy": "Always", "template": map[string]any{"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}}}}}
	}},
	{schema.GroupVersionKind{Group: "cdi.kubevirt.io", Version: "v1beta1", Kind: "DataVolume"}, func(ns string) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": "vm-o1-0-disk", "namespace": ns},
			"spec": map[string]any{"source": map[string]any{"http": map[string]any{"url": "https://images.example.net/disk.qcow2"}},
				"storage": map[string]any{"resources": map[string]any{"requests": map[string]any{"storage": "1Gi"}}}}}
	}},
}

func (k rbacKind) unstructured(ns string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: k.obj(ns)}
	u.SetGroupVersionKind(k.gvk)
	return u
}

// TestRBAC: acting as the ServiceAccount vmshelf:vmshelf, bound to nothing
// but the shipped ClusterRole, on a real API server with RBAC on: it makes,
// reads, lists, watches, patches and updates each kind the provisioner
// uses; every delete is refused and the object stays; every other kind is
// refused.
func TestRBAC(t *testing.T) {
	srv := Start(t)
	registerCRDs(t, srv.Admin, operatorCRDs(t))
	s := kitScheme(t)
	applyKit(t, srv.Admin, s, provisionerIdentity(t, s))

	sa := srv.AsServiceAccount(vmshelfNamespace, vmshelfSA)
	saDyn, err := dynamic.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	saKube, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	adminDyn, err := dynamic.NewForConfig(srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	adminKube, err := kubernetes.NewForConfig(srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The RBAC authorizer reads roles and bindings through its informers:
	// a request right after the kit's binding was written may still be
	// judged without it. Wait, bounded, until the role's first grant is in.
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := saKube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: "create", Resource: "namespaces"}},
		}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("the ServiceAccount may not create namespaces 30 s after its binding: %v", err)
	}

	t.Run("identity", func(t *testing.T) {
		r, err := saKube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Status.UserInfo.Username; got != "system:serviceaccount:vmshelf:vmshelf" {
			t.Fatalf("acting as %q", got)
		}
	})

	t.Run("allowed", func(t *testing.T) {
		for _, k := range rbacKinds {
			t.Run(k.gvk.Kind, func(t *testing.T) {
				ri := resourceFor(t, saDyn, k.gvk, rbacNamespace)
				obj := k.unstructured(rbacNamespace)
				if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
					t.Fatalf("create: %v", err)
				}
				got, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
				if err != nil {
					t.Fatalf("get: %v", err)
				}
				patched, err := ri.Patch(ctx, obj.GetName(), types.MergePatchType,
					[]byte(`{"metadata":{"labels":{"app.kubernetes.io/managed-by":"vmshelf"}}}`), metav1.PatchOptions{})
				if err != nil {
					t.Fatalf("merge patch: %v", err)
				}
				if patched.GetLabels()["app.kubernetes.io/managed-by"] != "vmshelf" || patched.GetResourceVersion() == got.GetResourceVersion() {
					t.Fatalf("patch not stored: labels %v", patched.GetLabels())
				}
				patched.SetAnnotations(map[string]string{"losos.dev/checked": "yes"})
				if _, err := ri.Update(ctx, patched, metav1.UpdateOptions{}); err != nil {
					t.Fatalf("update: %v", err)
				}
				list, err := ri.List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatalf("list: %v", err)
				}
				if len(list.Items) == 0 {
					t.Fatal("list: empty")
				}
				w, err := ri.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
				if err != nil {
					t.Fatalf("watch: %v", err)
				}
				w.Stop()
			})
		}
		// The one change the provisioner makes to a VM it did not just make.
		vm := rbacKinds[4]
		got, err := resourceFor(t, saDyn, vm.gvk, rbacNamespace).Patch(ctx, "vm-o1-0", types.MergePatchType,
			[]byte(`{"spec":{"runStrategy":"Halted"}}`), metav1.PatchOptions{})
		if err != nil {
			t.Fatalf("runStrategy patch: %v", err)
		}
		if s, _, _ := unstructured.NestedString(got.Object, "spec", "runStrategy"); s != "Halted" {
			t.Fatalf("runStrategy %q after the patch", s)
		}
	})

	t.Run("delete refused", func(t *testing.T) {
		// Namespaces last: with the namespace, the server would remove the rest.
		for _, k := range slices.Concat(rbacKinds[1:], rbacKinds[:1]) {
			t.Run(k.gvk.Kind, func(t *testing.T) {
				obj := k.unstructured(rbacNamespace)
				err := resourceFor(t, saDyn, k.gvk, rbacNamespace).Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
				if !apierrors.IsForbidden(err) {
					t.Fatalf("delete: %v, want Forbidden", err)
				}
				err = resourceFor(t, saDyn, k.gvk, rbacNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
				if !apierrors.IsForbidden(err) {
					t.Fatalf("deletecollection: %v, want Forbidden", err)
				}
				still, err := resourceFor(t, adminDyn, k.gvk, rbacNamespace).Get(ctx, obj.GetName(), metav1.GetOptions{})
				if err != nil {
					t.Fatalf("after the refused delete: %v", err)
				}
				if still.GetDeletionTimestamp() != nil {
					t.Fatal("after the refused delete: being deleted")
				}
			})
		}
	})

	t.Run("other kinds refused", func(t *testing.T) {
		tests := []struct {
			name string
			do   func() error
		}{
			{"get configmap", func() error {
				_, err := saKube.CoreV1().ConfigMaps(rbacNamespace).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
				return err
			}},
			{"list configmaps", func() error {
				_, err := saKube.CoreV1().ConfigMaps(rbacNamespace).List(ctx, metav1.ListOptions{})
				return err
			}},
			{"list pods", func() error { _, err := saKube.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err }},
			{"list persistentvolumeclaims", func() error {
				_, err := saKube.CoreV1().PersistentVolumeClaims(rbacNamespace).List(ctx, metav1.ListOptions{})
				return err
			}},
			{"delete persistentvolumeclaim", func() error {
				return saKube.CoreV1().PersistentVolumeClaims(rbacNamespace).Delete(ctx, "vm-o1-0-disk", metav1.DeleteOptions{})
			}},
			{"delete persistentvolume", func() error {
				return saKube.CoreV1().PersistentVolumes().Delete(ctx, "pvc-1", metav1.DeleteOptions{})
			}},
			{"list virtualmachineinstances", func() error {
				_, err := saDyn.Resource(schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}).
					Namespace(rbacNamespace).List(ctx, metav1.ListOptions{})
				return err
			}},
			{"write a VM's status", func() error {
				_, err := resourceFor(t, saDyn, rbacKinds[4].gvk, rbacNamespace).Patch(ctx, "vm-o1-0", types.MergePatchType,
					[]byte(`{"status":{"printableStatus":"Running"}}`), metav1.PatchOptions{}, "status")
				return err
			}},
			{"list nodes", func() error { _, err := saKube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err }},
			{"create a clusterrolebinding", func() error {
				_, err := saDyn.Resource(schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}).
					Create(ctx, &unstructured.Unstructured{Object: map[string]any{
						"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
						"metadata": map[string]any{"name": "vmshelf-admin"},
						"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
						"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": vmshelfSA, "namespace": vmshelfNamespace}},
					}}, metav1.CreateOptions{})
				return err
			}},
			{"create a token for another account", func() error {
				_, err := saKube.CoreV1().ServiceAccounts(vmshelfNamespace).CreateToken(ctx, vmshelfSA, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
				return err
			}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if err := tt.do(); !apierrors.IsForbidden(err) {
					t.Fatalf("%v, want Forbidden", err)
				}
			})
		}
	})

	// Every verb on every resource that matters, as the authorizer decides
	// it: allowed exactly where the design says.
	t.Run("access review", func(t *testing.T) {
		type gr struct{ group, resource, sub string }
		allowed := map[gr][]string{} // the verbs allowed
		for g, rs := range provisionerResources {
			for _, r := range rs {
				allowed[gr{g, r, ""}] = provisionerVerbs
			}
		}
		for g, rs := range consoleResources {
			for _, r := range rs {
				res, sub, _ := strings.Cut(r, "/")
				allowed[gr{g, res, sub}] = consoleVerbs
			}
		}
		for g, rs := range powerResources {
			for _, r := range rs {
				res, sub, _ := strings.Cut(r, "/")
				allowed[gr{g, res, sub}] = powerVerbs
			}
		}
		resources := []gr{
			{"", "configmaps", ""}, {"", "pods", ""}, {"", "pods", "exec"}, {"", "persistentvolumeclaims", ""},
			{"", "persistentvolumes", ""}, {"", "nodes", ""}, {"", "serviceaccounts", ""}, {"", "serviceaccounts", "token"},
			{"", "events", ""}, {"", "endpoints", ""}, {"apps", "deployments", ""}, {"storage.k8s.io", "storageclasses", ""},
			{"rbac.authorization.k8s.io", "roles", ""}, {"rbac.authorization.k8s.io", "clusterroles", ""},
			{"rbac.authorization.k8s.io", "clusterrolebindings", ""}, {"kubevirt.io", "virtualmachineinstances", ""},
			{"kubevirt.io", "virtualmachines", "status"}, {"subresources.kubevirt.io", "virtualmachines", "migrate"},
			{"cdi.kubevirt.io", "datavolumes", "status"}, {"kubevirt.io", "kubevirts", ""}, {"cdi.kubevirt.io", "cdis", ""},
			{"apiextensions.k8s.io", "customresourcedefinitions", ""},
			{"subresources.kubevirt.io", "virtualmachineinstances", "portforward"},
			{"subresources.kubevirt.io", "virtualmachineinstances", "usbredir"},
			{"subresources.kubevirt.io", "virtualmachineinstances", "pause"},
			{"subresources.kubevirt.io", "virtualmachineinstances", ""},
		}
		for r := range allowed {
			resources = append(resources, r)
		}
		verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate", "approve"}
		user := sa.Impersonate
		for _, r := range resources {
			for _, verb := range verbs {
				want := slices.Contains(allowed[r], verb)
				rv, err := adminKube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
					Spec: authorizationv1.SubjectAccessReviewSpec{
						User: user.UserName, Groups: user.Groups,
						ResourceAttributes: &authorizationv1.ResourceAttributes{
							Namespace: rbacNamespace, Verb: verb, Group: r.group, Resource: r.resource, Subresource: r.sub,
						},
					},
				}, metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("access review: %v", err)
				}
				if rv.Status.Allowed != want {
					t.Errorf("%s %s: allowed %v, want %v (%s)", verb, fmt.Sprintf("%s/%s/%s", r.group, r.resource, r.sub), rv.Status.Allowed, want, rv.Status.Reason)
				}
			}
		}
	})
}
