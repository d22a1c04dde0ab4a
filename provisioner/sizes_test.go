package provisioner

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestReplicaSizesFromConfig: a replica gets the edge's configured size
// (--vm-cpu, --vm-memory-mib, --vm-disk-gib, --vm-storage-class), here
// none of them serve's defaults (the other tests run at 2048 MiB, 20 GiB
// and losos-vm-local, where a size that ignored its setting looks
// right), or what its image needs when that is more. An own image of
// exactly N GiB needs N GiB, not N+1; one byte more needs N+1.
func TestReplicaSizesFromConfig(t *testing.T) {
	const (
		cpu, memoryMiB, diskGiB = 3, 3000, 25
		class                   = "fast-nvme"
	)
	h := newHarness(t, func(c *Config) {
		c.CPU, c.MemoryMiB, c.DiskGiB, c.StorageClass = cpu, memoryMiB, diskGiB, class
	})
	const gib = 1 << 30
	cases := []struct {
		name         string
		order        imagestore.Order
		memory, disk string
	}{
		{"catalogue, edge sizes", h.order(1, imagestore.ImageCatalogue, "debian-13", ""), "3000Mi", "25Gi"},
		{"catalogue needing more memory", h.order(1, imagestore.ImageCatalogue, "losos-demo", ""), "4Gi", "25Gi"},
		{"own image of exactly the edge's disk", h.order(1, imagestore.ImageUpload, h.image(diskGiB*gib, false).UploadID, ""), "3000Mi", "25Gi"},
		{"own image of exactly 30 GiB", h.order(1, imagestore.ImageUpload, h.image(30*gib, false).UploadID, ""), "3000Mi", "30Gi"},
		{"own image a byte over 30 GiB", h.order(1, imagestore.ImageUpload, h.image(30*gib+1, false).UploadID, ""), "3000Mi", "31Gi"},
	}
	h.reconcile()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vm := h.vm(namespaceName(c.order.BuyerID), vmName(c.order.ID, 0))
			name := fmt.Sprintf("%s (%s)", vm.Name, c.name)
			if got := vm.Spec.Template.Spec.Domain.CPU; got == nil || got.Cores != cpu {
				t.Errorf("%s: cpu %+v, want %d cores", name, got, cpu)
			}
			quantityIs(t, name+" memory request", vm.Spec.Template.Spec.Domain.Resources.Requests[corev1.ResourceMemory], c.memory)
			st := h.dataVolume(vm.Namespace, diskName(c.order.ID, 0)).Spec.Storage
			if st.StorageClassName == nil {
				t.Errorf("%s: no storage class, want %s", name, class)
			} else if *st.StorageClassName != class {
				t.Errorf("%s: storage class %s, want %s", name, *st.StorageClassName, class)
			}
			quantityIs(t, name+" disk request", st.Resources.Requests[corev1.ResourceStorage], c.disk)
		})
	}
}
