package kubetest

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/catalogue"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/sqlite"
	"github.com/vmshelf/vmshelf/provisioner"
	"github.com/vmshelf/vmshelf/provisioner/kubetest/guestimage"
)

// webUserData is a #cloud-config that writes a page and serves it on port
// 80, saying what the guest sees: its disk's size (512-byte sectors) and
// its firmware.
const webUserData = `#cloud-config
write_files:
  - path: /srv/www/index.html
    content: |
      vmshelf boot test: cloud-config
runcmd:
  - [sh, -c, 'echo "disk-sectors $(cat /sys/block/vda/size) firmware $(test -d /sys/firmware/efi && echo efi || echo bios)" >> /srv/www/index.html']
  - [systemd-run, --unit=vmshelf-web, python3, -m, http.server, "80", --directory, /srv/www]
`

// TestBootNode: the provisioner's objects for a catalogue cloud image
// (the BIOS guest, served over https), through KubeVirt's virt-controller
// and the test node, boot: cloud-init runs the user data, and the guest
// answers through the order's Service.
func TestBootNode(t *testing.T) {
	needBoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	imgs := guestImages(t, ctx)
	files := httptest.NewTLSServer(http.FileServer(http.Dir(imgs.Dir)))
	defer files.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: files.Certificate().Raw})
	c := startBootCluster(t, ctx, caPEM)

	cat, err := catalogue.Parse([]byte(fmt.Sprintf(`{"catalogue":[{"id":"bookworm-bios","name":"Debian 12 (boot test)",
		"source":"cloud","url":%q,"format":"qcow2","efi":false,"min_memory_mib":0,"min_disk_gib":3}]}`, files.URL+"/bios.qcow2")))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "vmshelf.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	host, err := st.CreateTenant(ctx, imagestore.Tenant{Name: "box1", InMesh: true, Sharing: true, HostsVMs: true,
		Appliance: testAppliance, StripeAccount: "acct_box1", CreatedAt: now}, imagestore.HashSecret(imagestore.NewSecret()))
	if err != nil {
		t.Fatal(err)
	}
	buyer, err := st.CreateTenant(ctx, imagestore.Tenant{Name: "buyer", InMesh: true, CreatedAt: now}, imagestore.HashSecret(imagestore.NewSecret()))
	if err != nil {
		t.Fatal(err)
	}
	l, err := st.CreateListing(ctx, imagestore.Listing{ID: imagestore.NewListingID(), HostID: host.ID, UnitPrice: 600,
		Currency: "eur", Capacity: 5, CreatedAt: now})
	if err != nil {
		t.Fatal(err)
	}
	o := paidOrder(t, ctx, st, l, buyer, host, imagestore.ImageCatalogue, "bookworm-bios", 1, webUserData, now, now.AddDate(0, 1, 0))
	cluster, err := provisioner.ClusterFromConfig(c.js.srv.AsServiceAccount(vmshelfNamespace, vmshelfSA))
	if err != nil {
		t.Fatal(err)
	}
	p, err := provisioner.New(provisioner.Config{
		CPU: 1, MemoryMiB: 1024, DiskGiB: 1, StorageClass: vmStorageClass, FetchBase: testFetchBase,
		Catalogue: cat, Every: 30 * time.Second, Now: time.Now, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, st, cluster, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ReconcileOnce(ctx); err != nil {
		t.Fatalf("ReconcileOnce: %v", err)
	}
	ordered := time.Now()
	ns, vm := fmt.Sprintf("market-%d", buyer.ID), fmt.Sprintf("vm-%s-0", o.ID)
	log := c.serialUntil(t, ctx, ns, vm, "login:")
	started, accel, ok := c.node.Started(ns, vm)
	if !ok {
		t.Fatalf("%s/%s shows a login prompt but the node runs no domain for it", ns, vm)
	}
	t.Logf("%s: QEMU runs it under %s; the domain started %s after the objects were written (CDI's import, scheduling, KubeVirt's converter)",
		vm, accel, started.Sub(ordered).Round(time.Second))
	t.Logf("%s: login prompt %s after the domain started", vm, time.Since(started).Round(time.Second))
	log = c.serialUntil(t, ctx, ns, vm, "finished at")
	done := cloudInitDone.FindString(log)
	if done == "" {
		t.Fatalf("%s's serial console has no line of cloud-init's end:\n%s", vm, tailOf(log, 3000))
	}
	t.Logf("%s: %s (%s after the domain started)", vm, done, time.Since(started).Round(time.Second))
	body := c.httpThroughService(t, ctx, ns, "vm-"+o.ID)
	t.Logf("%s: GET / through the order's Service: %q (%s after the domain started)", vm, body, time.Since(started).Round(time.Second))
	if !strings.Contains(body, "vmshelf boot test: cloud-config") || !strings.Contains(body, "firmware bios") {
		t.Errorf("the guest's page %q, want the cloud-config's page from a BIOS guest", body)
	}
	// The guest sees the disk the DataVolume asked for (the catalogue's
	// 3 GiB), which holds the whole image.
	if want := fmt.Sprintf("disk-sectors %d ", 3<<30/512); !strings.Contains(body, want) || 3<<30 < guestimage.VirtualSize {
		t.Errorf("the guest's page %q, want %q: the 3 GiB the DataVolume asked for, at least the image's %d bytes", body, want, guestimage.VirtualSize)
	}
	vmi := c.vmi(t, ctx, ns, vm)
	if vmi.Status.Phase != kubevirtv1.Running || vmi.Status.NodeName != nodeName {
		t.Errorf("VMI %s/%s in the API server: phase %s on node %q, want Running on %s", ns, vm, vmi.Status.Phase, vmi.Status.NodeName, nodeName)
	}
	var dv cdiv1beta1.DataVolume
	u, err := c.js.dyn.Resource(dvGVR).Namespace(ns).Get(ctx, vm+"-disk", metav1.GetOptions{})
	if err == nil {
		err = fromUnstructured(u, &dv)
	}
	if err != nil || dv.Status.Phase != cdiv1beta1.Succeeded {
		t.Errorf("DataVolume %s/%s-disk: phase %q (%v), want Succeeded", ns, vm, dv.Status.Phase, err)
	}
}
