package testnode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// The rules the test node plays for kube-scheduler and CDI, each checked
// at its boundary without a cluster or a guest: the boot tests meet them
// only in the few cases a booted order happens to reach.

func TestFits(t *testing.T) {
	node := &corev1.Node{}
	node.Labels = map[string]string{"vmshelf.io/appliance": "box1"}
	node.Spec.Taints = []corev1.Taint{{Key: "vmshelf.io/window", Value: "night", Effect: corev1.TaintEffectNoSchedule}}
	node.Status.Allocatable = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")}
	used := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("3Gi")}
	tolerate := []corev1.Toleration{{Key: "vmshelf.io/window", Operator: corev1.TolerationOpEqual, Value: "night", Effect: corev1.TaintEffectNoSchedule}}
	pod := func(selector string, tol []corev1.Toleration, main, sidecar string) *corev1.Pod {
		p := &corev1.Pod{}
		p.Spec.NodeSelector = map[string]string{"vmshelf.io/appliance": selector}
		p.Spec.Tolerations = tol
		p.Spec.Containers = []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(main)}}}}
		always := corev1.ContainerRestartPolicyAlways
		p.Spec.InitContainers = []corev1.Container{
			{RestartPolicy: &always, Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(sidecar)}}},
			// An init container that ends before the pod runs asks nothing
			// of the node once it has.
			{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("100Gi")}}},
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"exactly the free memory, its sidecar counted", pod("box1", tolerate, "4Gi", "1Gi"), ""},
		{"a byte more than the free memory", pod("box1", tolerate, "4Gi", "1073741825"), "Insufficient memory"},
		{"another box's label", pod("box2", tolerate, "1Gi", "0"), "node(s) didn't match Pod's node affinity/selector (vmshelf.io/appliance=box2)"},
		{"the box's window not tolerated", pod("box1", nil, "1Gi", "0"), "node(s) had untolerated taint {vmshelf.io/window: night}"},
	} {
		if got := fits(tc.pod, node, used); got != tc.want {
			t.Errorf("%s: fits = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestInflate: a claim holds the requested size after the file system's
// 5.5 %, in whole MiB, as CDI sizes a file-system claim.
func TestInflate(t *testing.T) {
	for _, tc := range []struct{ req, want int64 }{
		{945 * mib, 1000 * mib}, // 945 / 0.945 is 1000 exactly
		{945*mib + 1, 1001 * mib},
		{3 << 30, 3251 * mib},
	} {
		got := inflate(*resource.NewQuantity(tc.req, resource.BinarySI))
		if got.Value() != tc.want {
			t.Errorf("inflate(%d) = %d, want %d", tc.req, got.Value(), tc.want)
		}
	}
}

// TestDownload: the importer sends the Secret's header lines, keeps a
// download whose checksum matches, and fails one that does not with CDI's
// ChecksumError (fatal: not retried), leaving no file behind.
func TestDownload(t *testing.T) {
	body := []byte(strings.Repeat("a disk image ", 1000))
	sum := sha256.Sum256(body)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer fetch-token" {
			http.Error(w, "no token", http.StatusForbidden)
			return
		}
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	im := &importer{n: &Node{logf: t.Logf}}
	dir := t.TempDir()
	get := func(checksum string, headers ...string) (string, error) {
		file := filepath.Join(dir, "disk.img")
		src := &cdiv1.DataVolumeSourceHTTP{URL: srv.URL, Checksum: checksum}
		return file, im.download(context.Background(), &cdiv1.DataVolume{}, src, headers, file)
	}

	file, err := get("sha256:"+hex.EncodeToString(sum[:]), "Authorization: Bearer fetch-token")
	if err != nil {
		t.Fatalf("download with the right checksum: %v", err)
	}
	if got, _ := os.ReadFile(file); string(got) != string(body) {
		t.Errorf("downloaded %d bytes, want the %d served", len(got), len(body))
	}

	if _, err := get("", "Authorization: Bearer wrong"); err == nil || !strings.Contains(err.Error(), "expected status code 200, got 403") {
		t.Errorf("download without the Secret's header: %v, want the server's 403", err)
	}

	wrong := strings.Repeat("0", 64)
	file, err = get("sha256:"+wrong, "Authorization: Bearer fetch-token")
	var ie *importError
	if !errors.As(err, &ie) || ie.reason != "ChecksumError" || !ie.fatal ||
		ie.message != "Unable to process data: checksum validation failed: checksum mismatch: expected sha256:"+wrong+", calculated sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("download with a wrong checksum: %#v, want a fatal ChecksumError naming both sums", err)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the download that failed its checksum is still there: %v", err)
	}

	if _, err := get("crc32:00", "Authorization: Bearer fetch-token"); !errors.As(err, &ie) || ie.reason != "Error" || !ie.fatal {
		t.Errorf("download with an unknown checksum algorithm: %#v, want a fatal Error", err)
	}
}

// TestOrphaned: a node's start destroys the domains its own process or a
// dead run left on libvirtd, never a live run's (a demo beside a test)
// nor another node's.
func TestOrphaned(t *testing.T) {
	runs := func(pid int) bool { return pid == 200 }
	for _, tc := range []struct {
		name string
		want bool
	}{
		{domainPrefix("box1-node", 100) + "market-1_vm-o1-0", true},  // this process's
		{domainPrefix("box1-node", 300) + "market-1_vm-o1-0", true},  // a dead run's
		{domainPrefix("box1-node", 200) + "market-1_vm-o1-0", false}, // a live run's
		{domainPrefix("box2-node", 100) + "market-1_vm-o1-0", false}, // another node's
		{"box1-node_market-1_vm-o1-0", false},                        // no run named
		{"guest", false},
	} {
		if got := orphaned(tc.name, "box1-node", 100, runs); got != tc.want {
			t.Errorf("orphaned(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
