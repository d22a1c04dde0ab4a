package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"image"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/vmshelf/vmshelf/internal/testkit/testguest"
	"github.com/vmshelf/vmshelf/provisioner/kubetest/guestimage"
	"github.com/vmshelf/vmshelf/provisioner/kubetest/testnode"
)

// scriptUserData is the second order's user data: a shell script, not a
// #cloud-config; cloud-init runs it once, as root, at the end of boot.
const scriptUserData = `#!/bin/sh
mkdir -p /srv/www
echo "vmshelf boot test: shell script" > /srv/www/index.html
echo "disk-sectors $(cat /sys/block/vda/size) firmware $(test -d /sys/firmware/efi && echo efi || echo bios)" >> /srv/www/index.html
systemd-run --unit=vmshelf-web python3 -m http.server 80 --directory /srv/www
`

// bootTimeout bounds the whole boot test: a cold guest build (about ten
// minutes on two cores), the cluster, and the guests' boots in software
// emulation.
const bootTimeout = 45 * time.Minute

// TestBoot: the whole way of a machine, through the binary, to a guest
// that booted. A Debian cloud image built from Debian's packages is
// uploaded to vmshelf serve (a BIOS one with one PUT, a UEFI one
// resumably with tus) and also offered as a cloud catalogue entry served
// over https; the buyer orders, the stand-in Stripe takes the payment
// and the signed webhook says so; serve's provisioner writes its objects
// into the real API server, KubeVirt's own virt-controller makes VMIs and
// launcher pods of them, and the test node schedules, imports (CDI's
// method) and boots them (KubeVirt's converter, libvirt, QEMU). Each
// replica ran its user data (a #cloud-config, and a shell script),
// answers on port 80 through its order's Service, shows its login prompt
// on the serial console and its screen on VNC through serve's console
// WebSocket, and sees a disk of the size the DataVolume asked, at least
// the image's. A UEFI image boots only with the EFI box ticked, a BIOS one
// only without. What cannot work says why: an import whose checksum does
// not match fails with CDI's reason and is refunded; an image needing
// more memory than the box has is unschedulable; a disk with no boot
// loader, or one that starts only with the other firmware, is refused
// when ordered, from what the edge read in its first sectors. At the month's
// end the provisioner halts the machine, KubeVirt deletes its VMI, the
// node stops the domain, and the disk stays, byte for byte.
func TestBoot(t *testing.T) {
	needBoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	start := time.Now()
	imgs := guestImages(t, ctx)

	// The catalogue's download site: https, a certificate the node's
	// importer is given to trust.
	files := httptest.NewTLSServer(catalogueSite(imgs.Dir))
	defer files.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: files.Certificate().Raw})
	c := startBootCluster(t, ctx, caPEM)
	cat := filepath.Join(t.TempDir(), "catalogue.json")
	if err := os.WriteFile(cat, []byte(fmt.Sprintf(`{"catalogue":[
		{"id":"bookworm","name":"Debian 12 (boot test)","source":"cloud","url":%q,"format":"qcow2","efi":false,"min_memory_mib":0,"min_disk_gib":3},
		{"id":"bookworm-big","name":"Debian 12 (needs 16 GiB)","source":"cloud","url":%q,"format":"qcow2","efi":false,"min_memory_mib":16384,"min_disk_gib":3}
	]}`, files.URL+"/slow/bios.qcow2", files.URL+"/bios.qcow2")), 0o600); err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, c, "--vm-catalogue", cat, "--vm-cpu", "1", "--vm-memory-mib", "1024", "--vm-disk-gib", "1",
		"--images-per-tenant", "10", "--refund-deadline", "1s", "--refund-every", "2s")
	host := e.addHost(t)
	listing := e.listing(t, host, 10)
	t.Logf("cluster and edge up %s after the start", time.Since(start).Round(time.Second))

	bios := e.putImage(t, "bios", false, imgs.Path(guestimage.BIOS))
	efi := e.tusImage(t, "efi", true, imgs.Path(guestimage.EFI))
	for _, img := range []uploaded{bios, efi} {
		if img.VirtualSize != guestimage.VirtualSize {
			t.Fatalf("image %s: virtual size %d, want the guest's %d", img.UploadID, img.VirtualSize, int64(guestimage.VirtualSize))
		}
	}
	if bios.Boot != "bios" || efi.Boot != "uefi" {
		t.Errorf("the edge read boot %q from the BIOS disk and %q from the UEFI one, want bios and uefi", bios.Boot, efi.Boot)
	}

	// First round, side by side: three guests boot, a BIOS and a UEFI
	// upload from #cloud-config and the catalogue's image with a shell
	// script (whose slow download overlaps the others' boots). Two guests
	// keep both cores busy under emulation; one alone, as the catalogue's
	// was after the uploads', leaves one idle.
	b := &booting{t: t, ctx: ctx, c: c, e: e, listing: listing}
	var biosOrder *bootOrder
	t.Run("first round", func(t *testing.T) {
		b := b.sub(t)
		t.Run("BIOS and UEFI uploads", func(t *testing.T) {
			t.Parallel()
			b := b.sub(t)
			bo := b.order("bios", bios.UploadID, webUserData)
			efiOrder := b.order("efi", efi.UploadID, webUserData)
			for _, o := range []*bootOrder{bo, efiOrder} {
				b.waitRunning(o, false)
			}
			for _, o := range []*bootOrder{bo, efiOrder} {
				b.cloudInitRan(o)
			}
			b.answers(bo, "vmshelf boot test: cloud-config", "bios", bios.VirtualSize)
			b.answers(efiOrder, "vmshelf boot test: cloud-config", "efi", efi.VirtualSize)
			b.consoles(bo)
			b.consoles(efiOrder)
			// The buyer stops the UEFI machine and starts it again
			// (KubeVirt's own virt-api handlers, its virt-controller, the
			// node): it boots again from the same disk.
			b.stop(efiOrder)
			b.startAgain(efiOrder)
			b.stop(efiOrder)
			biosOrder = bo // the second round ends its month
			t.Logf("BIOS and UEFI uploads done %s after the start", time.Since(start).Round(time.Second))
		})
		t.Run("the catalogue's image with a shell script", func(t *testing.T) {
			t.Parallel()
			b := b.sub(t)
			cloud := b.order("cloud", "bookworm", scriptUserData)
			// Its download is slower than a pass of the provisioner: the page
			// must show the disk copying, with CDI's progress, before it runs.
			b.waitRunning(cloud, true)
			b.cloudInitRan(cloud)
			b.answers(cloud, "vmshelf boot test: shell script", "bios", 3<<30)
			b.stop(cloud)
			t.Logf("catalogue image done %s after the start", time.Since(start).Round(time.Second))
		})
	})
	if biosOrder == nil {
		t.Fatal("the BIOS machine did not run: no second round")
	}

	// Second round, side by side (the guests wait on an import, a
	// firmware's refusal or a pass of the provisioner, and one after the
	// other they took twice as long): what must not work, and the first
	// BIOS machine's month's end.
	t.Run("second round", func(t *testing.T) {
		b := b.sub(t)
		b.failures(imgs)
		t.Run("the month ends", func(t *testing.T) {
			t.Parallel()
			b.sub(t).monthEnds(biosOrder)
		})
	})
	e.assertNoSecrets(t)
	t.Logf("TestBoot took %s", time.Since(start).Round(time.Second))
}

// failures runs, each in a parallel subtest of b's test, the orders that
// must not work and must say why.
func (b *booting) failures(imgs *guestimage.Set) {
	e, ctx := b.e, b.ctx
	b.t.Run("firmware follows the EFI box", func(t *testing.T) {
		t.Parallel()
		// A UEFI image with the box unticked: its protective MBR has no
		// boot code, and SeaBIOS would say "Booting from Hard Disk..." and
		// stop. A BIOS image with the box ticked: no FAT file system, and
		// OVMF would end in its shell. A file system with no partition
		// table and no boot loader: "No bootable device". The edge reads
		// that from the disk at upload (TestBootFirmwareAgreesWithCheck
		// holds its verdicts to SeaBIOS's and OVMF's own) and refuses
		// the order before checkout: nothing reserved, nobody pays for a
		// machine that KubeVirt would call running.
		for _, c := range []struct {
			name, file   string
			efi          bool
			boot, reason string
		}{
			{"efi-as-bios", imgs.Path(guestimage.EFI), false, "uefi", "wrongFirmware"},
			{"bios-as-efi", imgs.Path(guestimage.BIOS), true, "bios", "wrongFirmware"},
			{"noboot", imgs.Path(guestimage.NoBootLoader), false, "none", "noBootLoader"},
		} {
			img := e.putImage(t, c.name, c.efi, c.file)
			if img.Boot != c.boot {
				t.Errorf("%s: the upload says boot %q, want %q", c.name, img.Boot, c.boot)
			}
			words := e.orderRefused(t, b.listing, img.UploadID, c.name, http.StatusUnprocessableEntity, c.reason)
			t.Logf("%s (boot %s, EFI box %v): refused, %s: %s", c.name, img.Boot, c.efi, c.reason, words)
		}
	})

	b.t.Run("an import whose checksum does not match", func(t *testing.T) {
		t.Parallel()
		b := b.sub(t)
		img := e.putImage(t, "rotten", false, imgs.Path(guestimage.BIOS))
		// The stored file changes after the upload (bit rot, a tamperer):
		// the fetch route serves it as it is, and CDI's checksum, the
		// image's SHA-256 at upload, catches it.
		flipByte(t, filepath.Join(e.dataDir, "vm-images", img.UploadID+".qcow2"), img.Size/2)
		o := b.order("rotten", img.UploadID, webUserData)
		m, seen := e.waitMachine(t, ctx, o.id, "failed with the import", func(m machine) bool {
			return len(m.Replicas) == 1 && m.Replicas[0].State == "failed"
		})
		t.Logf("the page showed: %v", seen)
		// KubeVirt's virt-controller reports the VM as DataVolumeError; the
		// provisioner names the DataVolume's failure, the cause the market
		// refunds.
		if m.Replicas[0].Detail != "DataVolumeFailed" {
			t.Errorf("the failed replica's detail %q, want DataVolumeFailed", m.Replicas[0].Detail)
		}
		dv := b.dataVolume(o)
		running := findCondition(dv.Status.Conditions, cdiv1beta1.DataVolumeRunning)
		if dv.Status.Phase != cdiv1beta1.Failed || running == nil || running.Reason != "ChecksumError" ||
			!strings.Contains(running.Message, "checksum mismatch: expected sha256:"+img.SHA256) {
			t.Errorf("DataVolume %s: phase %s, running condition %+v; want Failed with CDI's ChecksumError", dv.Name, dv.Status.Phase, running)
		}
		// The market's rule: an import that failed for a machine that
		// never ran is refunded, once.
		_, seen = e.waitMachine(t, ctx, o.id, "refunded", func(m machine) bool { return m.State == "refunded" })
		t.Logf("then: %v", seen)
		refunds := 0
		for _, r := range e.stripe.Refunds() {
			if r.OrderID == o.id {
				refunds++
			}
		}
		if refunds != 1 {
			t.Errorf("the stand-in Stripe has %d refunds of order %s, want 1", refunds, o.id)
		}
	})

	b.t.Run("an image needing more memory than the box has", func(t *testing.T) {
		t.Parallel()
		b := b.sub(t)
		o := b.order("big", "bookworm-big", webUserData)
		m, seen := e.waitMachine(t, ctx, o.id, "failed as unschedulable", func(m machine) bool {
			return len(m.Replicas) == 1 && m.Replicas[0].State == "failed"
		})
		t.Logf("the page showed: %v", seen)
		if m.State != "active" || m.Replicas[0].Detail != "ErrorUnschedulable" {
			t.Errorf("order %s %s, replica %+v; want active with a failed replica, ErrorUnschedulable", o.id, m.State, m.Replicas[0])
		}
	})

}

// booting is the test's view of orders and their machines.
type booting struct {
	t       *testing.T
	ctx     context.Context
	c       *bootCluster
	e       *edge
	listing string
}

func (b *booting) sub(t *testing.T) *booting {
	nb := *b
	nb.t = t
	return &nb
}

// bootOrder is a paid order of one replica.
type bootOrder struct {
	id, ns, vm string
}

// order places and pays an order of one replica of image.
func (b *booting) order(name, image, userData string) *bootOrder {
	b.t.Helper()
	id := b.e.order(b.t, b.listing, image, name, userData)
	b.e.pay(b.t, id)
	return &bootOrder{id: id, ns: b.namespace(), vm: "vm-" + id + "-0"}
}

// namespace is the buyer's namespace, market-<its id>: the one the
// provisioner makes (it waits, bounded, for the first payment's).
func (b *booting) namespace() string {
	b.t.Helper()
	for {
		l, err := b.c.js.srv.kube(b.t).CoreV1().Namespaces().List(b.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=vmshelf"})
		if err != nil {
			b.t.Fatal(err)
		}
		if len(l.Items) == 1 {
			return l.Items[0].Name
		}
		if len(l.Items) > 1 {
			b.t.Fatalf("%d namespaces of vmshelf, want the one buyer's", len(l.Items))
		}
		select {
		case <-b.ctx.Done():
			b.t.Fatal("the provisioner never made the buyer's namespace")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitRunning waits until the page shows the replica running, logging
// what it showed on the way (importing with CDI's progress, starting).
// The page shows what the provisioner read at its last pass (every 30
// s): an import shorter than that may pass unseen, so only an import
// known to be longer (importing) must be seen.
func (b *booting) waitRunning(o *bootOrder, importing bool) {
	b.t.Helper()
	_, seen := b.e.waitMachine(b.t, b.ctx, o.id, "running", func(m machine) bool {
		return m.State == "active" && len(m.Replicas) == 1 && m.Replicas[0].State == "running"
	})
	b.t.Logf("order %s: the page showed %v", o.id, seen)
	if importing && !contains(seen, "importing") {
		b.t.Errorf("order %s: the page never showed the disk importing: %v", o.id, seen)
	}
}

// slowRate is the catalogue site's pace under /slow/: the guest's 400 MiB
// take about 40 s, longer than a pass of the provisioner.
const slowRate = 10 << 20

// catalogueSite serves the guest's disks in dir as a download site does,
// those under /slow/ at slowRate bytes a second.
func catalogueSite(dir string) http.Handler {
	files := http.FileServer(http.Dir(dir))
	mux := http.NewServeMux()
	mux.Handle("/", files)
	mux.Handle("/slow/", http.StripPrefix("/slow", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lim := rate.NewLimiter(rate.Limit(slowRate), 1<<20)
		files.ServeHTTP(&pacedWriter{ResponseWriter: w, lim: lim, ctx: r.Context()}, r)
	})))
	return mux
}

// pacedWriter writes its body at the pace of lim.
type pacedWriter struct {
	http.ResponseWriter
	lim *rate.Limiter
	ctx context.Context
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		n := min(len(b), p.lim.Burst())
		if err := p.lim.WaitN(p.ctx, n); err != nil {
			return written, err
		}
		m, err := p.ResponseWriter.Write(b[:n])
		written += m
		if err != nil {
			return written, err
		}
		b = b[n:]
	}
	return written, nil
}

func contains(seen []string, word string) bool {
	for _, s := range seen {
		if strings.Contains(s, word) {
			return true
		}
	}
	return false
}

// cloudInitRan: the serial console shows cloud-init's final line.
func (b *booting) cloudInitRan(o *bootOrder) {
	b.t.Helper()
	log := b.c.serialUntil(b.t, b.ctx, o.ns, o.vm, "finished at")
	b.t.Logf("%s: %s", o.vm, cloudInitDone.FindString(log))
}

// answers: the order's Service on port 80 is answered by the guest with
// the page its user data wrote, from the firmware it booted with, and the
// guest's disk is the size the DataVolume asked for, at least the
// image's virtual size.
func (b *booting) answers(o *bootOrder, page, firmware string, virtualSize int64) {
	b.t.Helper()
	body := b.c.httpThroughService(b.t, b.ctx, o.ns, "vm-"+o.id)
	b.t.Logf("%s: GET / through Service vm-%s: %q", o.vm, o.id, body)
	if !strings.Contains(body, page) || !strings.Contains(body, "firmware "+firmware) {
		b.t.Errorf("%s answered %q, want %q from a %s guest", o.vm, body, page, firmware)
	}
	m := regexp.MustCompile(`disk-sectors (\d+)`).FindStringSubmatch(body)
	if m == nil {
		b.t.Fatalf("%s's page does not say its disk size: %q", o.vm, body)
	}
	sectors, _ := strconv.ParseInt(m[1], 10, 64)
	dv := b.dataVolume(o)
	q := dv.Spec.Storage.Resources.Requests["storage"]
	if sectors*512 != q.Value() || q.Value() < virtualSize {
		b.t.Errorf("%s sees a disk of %d bytes; its DataVolume asked %d, the image is %d", o.vm, sectors*512, q.Value(), virtualSize)
	}
}

// consoles: through serve's console WebSocket (the page's way: a ticket,
// then the socket), the serial console shows the login prompt, and the
// VNC screen is not blank.
func (b *booting) consoles(o *bootOrder) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()
	serial := b.console(ctx, o, "serial")
	if _, err := serial.Write([]byte("\r")); err != nil {
		b.t.Fatal(err)
	}
	got, err := testguest.Expect(ctx, serial, "login:")
	if err != nil {
		b.t.Fatalf("%s: the serial console through serve never showed the login prompt: %v; got %q", o.vm, err, got)
	}
	b.t.Logf("%s: serial console through serve: %q", o.vm, strings.TrimSpace(lastLine(got)))
	_ = serial.Close()

	screen := b.console(ctx, o, "vnc")
	img, err := testguest.ReadScreen(ctx, screen, func(img *image.RGBA) bool { return colours(img) > 1 })
	if err != nil {
		b.t.Fatalf("%s: the VNC screen through serve: %v", o.vm, err)
	}
	b.t.Logf("%s: VNC screen %dx%d with %d colours", o.vm, img.Bounds().Dx(), img.Bounds().Dy(), colours(img))
	_ = screen.Close()
}

// console opens replica 0's console of kind through serve.
func (b *booting) console(ctx context.Context, o *bootOrder, kind string) net.Conn {
	b.t.Helper()
	var a struct {
		URL string `json:"url"`
	}
	b.e.must(b.t, "/market/vms/console/ticket", b.e.token, fmt.Sprintf(`{"order_id":%q,"replica":0,"kind":%q}`, o.id, kind),
		http.StatusCreated, &a)
	ws, _, err := websocket.Dial(ctx, a.URL, nil)
	if err != nil {
		b.t.Fatalf("%s: the %s console's WebSocket: %v", o.vm, kind, err)
	}
	return websocket.NetConn(context.WithoutCancel(ctx), ws, websocket.MessageBinary)
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\r\n ")
	if i := strings.LastIndexAny(s, "\r\n"); i >= 0 {
		return s[i+1:]
	}
	return s
}

// colours counts the distinct colours of img (up to 16).
func colours(img *image.RGBA) int {
	seen := map[[4]byte]bool{}
	for i := 0; i+3 < len(img.Pix) && len(seen) < 16; i += 4 {
		seen[[4]byte(img.Pix[i:i+4])] = true
	}
	return len(seen)
}

// stop halts the replica as virtctl stop does (runStrategy Halted, the
// cluster operator's way: the market has no stop route yet): KubeVirt
// deletes its VMI and the node stops its domain, which frees the CPU for
// the next boots. The page then shows it stopped.
func (b *booting) stop(o *bootOrder) {
	b.t.Helper()
	b.power(o, "stop")
	b.e.waitMachine(b.t, b.ctx, o.id, "stopped", func(m machine) bool {
		return len(m.Replicas) == 1 && m.Replicas[0].State == "stopped"
	})
	// KubeVirt's virt-controller deletes the VMI; the node stops the domain.
	for b.c.node.SerialLog(o.ns, o.vm) != "" {
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("%s's domain still runs after its stop", o.vm)
		case <-time.After(time.Second):
		}
	}
}

// power is the buyer's action on replica 0 of o through serve's power
// route, as the CLI and the page send it: KubeVirt's own virt-api handler
// (the node's virt-api) takes it.
func (b *booting) power(o *bootOrder, action string) {
	b.t.Helper()
	b.e.must(b.t, "/market/vms/orders/power", b.e.token,
		// A request id of its own each time: a second stop with the
		// first's id would get the first's answer, and stop nothing.
		fmt.Sprintf(`{"order_id":%q,"replica":0,"action":%q,"request_id":%q}`, o.id, action, rand.Text()),
		http.StatusAccepted, nil)
}

// startAgain starts the stopped o through serve's power route: the guest
// boots again from its own disk (the same DataVolume, not a new one) and
// cloud-init finishes again.
func (b *booting) startAgain(o *bootOrder) {
	b.t.Helper()
	before := b.dataVolume(o).UID
	b.power(o, "start")
	b.waitRunning(o, false)
	b.cloudInitRan(o)
	if after := b.dataVolume(o).UID; after != before {
		b.t.Errorf("%s started again on DataVolume %s, was %s: a new disk", o.vm, after, before)
	}
}

func (b *booting) dataVolume(o *bootOrder) cdiv1beta1.DataVolume {
	b.t.Helper()
	u, err := b.c.js.dyn.Resource(dvGVR).Namespace(o.ns).Get(b.ctx, o.vm+"-disk", metav1.GetOptions{})
	if err != nil {
		b.t.Fatal(err)
	}
	var dv cdiv1beta1.DataVolume
	if err := fromUnstructured(u, &dv); err != nil {
		b.t.Fatal(err)
	}
	return dv
}

func findCondition(cs []cdiv1beta1.DataVolumeCondition, t cdiv1beta1.DataVolumeConditionType) *cdiv1beta1.DataVolumeCondition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

// monthEnds moves the order's end into the past in serve's store (as
// time would) and waits for the provisioner's next pass: the VM halted,
// its VMI gone, the domain stopped, the order expired; the disk file
// stays and no longer changes.
func (b *booting) monthEnds(o *bootOrder) {
	b.t.Helper()
	disk, err := b.c.node.Disk(o.ns, o.vm+"-disk")
	if err != nil {
		b.t.Fatal(err)
	}
	// serve writes the same database meanwhile (other orders run beside
	// this one): wait for its write lock as serve's own connections do.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(b.e.dataDir, "vmshelf.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		b.t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(b.ctx, `UPDATE orders SET expires_at = ? WHERE id = ?`, time.Now().Add(-time.Second).UnixNano(), o.id); err != nil {
		b.t.Fatalf("moving the month's end: %v", err)
	}
	_, seen := b.e.waitMachine(b.t, b.ctx, o.id, "expired and stopped", func(m machine) bool {
		return m.State == "expired" && len(m.Replicas) == 1 && m.Replicas[0].State == "stopped"
	})
	b.t.Logf("order %s at the month's end: %v", o.id, seen)
	// KubeVirt deletes the VMI; the node stops the domain.
	for b.c.node.SerialLog(o.ns, o.vm) != "" {
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("%s's domain still runs after the month", o.vm)
		case <-time.After(time.Second):
		}
	}
	before := fileSum(b.t, disk)
	// Two more passes of the provisioner (every 30 s) change nothing.
	runs := b.e.metric(b.t, "vmshelf_reconcile_runs_total")
	for b.e.metric(b.t, "vmshelf_reconcile_runs_total") < runs+2 {
		select {
		case <-b.ctx.Done():
			b.t.Fatal("the provisioner made no further pass")
		case <-time.After(time.Second):
		}
	}
	if after := fileSum(b.t, disk); after != before {
		b.t.Errorf("the disk %s changed after the machine was halted", disk)
	}
	if _, err := b.c.node.Disk(o.ns, o.vm+"-disk"); err != nil {
		b.t.Errorf("the disk's claim after the month: %v", err)
	}
	b.t.Logf("%s's disk stays: sha256 %s", o.vm, before[:16])
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatalf("the disk: %v", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// flipByte inverts the byte at off of file p.
func flipByte(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// needBoot fails t under CI=true, and skips it elsewhere, when a tool of
// the guest's build or of the node is missing; under -short it skips.
func needBoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the boot tests build a guest and boot it in QEMU (minutes)")
	}
	if missing := append(guestimage.Missing(), testnode.Missing()...); len(missing) > 0 {
		msg := fmt.Sprintf("the boot tests need %s (.ci/deps installs them)", strings.Join(missing, ", "))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}
