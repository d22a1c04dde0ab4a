package testnode

import (
	"context"
	"crypto/md5"  //nolint:gosec // CDI's checksum algorithms are the DataVolume's choice
	"crypto/sha1" //nolint:gosec // as above
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// The importer plays CDI v1.66 for a DataVolume: its DataVolume
// controller (pkg/controller/datavolume: the claim of a DataVolume, and
// the DataVolume's phase, progress and conditions from the import's
// state, as conditions.go writes them), a local provisioner (the claim's
// PersistentVolume on this node), and its importer pod (cmd/cdi-importer
// and pkg/importer: http-datasource.go's phases and data-processor.go's).
// CDI's own module cannot be built here (the Go module proxy does not
// serve it), so this is CDI's method in this package's code; each step
// names the file it follows.

// filesystemOverhead is CDI's default share of a file-system claim that
// the file system itself takes (CDIConfig's filesystemOverhead, 5.5%):
// the storage API asks the claim for that much more than the DataVolume
// requests (pkg/util/storage: InflateSizeWithOverhead), and the importer
// may fill only the rest (data-processor.go: getUsableSpace).
const filesystemOverhead = 0.055

// importRetryMax bounds the wait between two attempts of a failed import,
// as the kubelet's back-off bounds an importer pod's restarts.
const importRetryMax = 5 * time.Minute

type importer struct {
	n *Node
	q *queue

	mu      sync.Mutex
	running map[types.UID]bool
}

func newImporter(n *Node) *importer {
	im := &importer{n: n, running: map[types.UID]bool{}}
	im.q = newQueue("cdi", im.sync, n.logf)
	return im
}

// sync makes sure a DataVolume not yet done has its claim, bound to a
// volume of this node, and an import running into it.
func (im *importer) sync(ctx context.Context, key string) error {
	obj, exists, err := im.n.dvs.GetStore().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	var dv cdiv1.DataVolume
	if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, &dv); err != nil {
		return err
	}
	if dv.DeletionTimestamp != nil || dv.Status.Phase == cdiv1.Succeeded || dv.Status.Phase == cdiv1.Failed {
		return nil
	}
	pvc, err := im.ensureClaim(ctx, &dv)
	if err != nil {
		return err
	}
	if pvc.Status.Phase != corev1.ClaimBound {
		return im.setStatus(ctx, &dv, func(s *cdiv1.DataVolumeStatus) {
			s.Phase, s.ClaimName = cdiv1.Pending, pvc.Name
			s.Conditions = updateCondition(s.Conditions, cdiv1.DataVolumeBound, corev1.ConditionFalse, fmt.Sprintf("PVC %s Pending", pvc.Name), "Pending")
			s.Conditions = updateCondition(s.Conditions, cdiv1.DataVolumeReady, corev1.ConditionFalse, "", "")
		})
	}
	im.mu.Lock()
	started := im.running[dv.UID]
	im.running[dv.UID] = true
	im.mu.Unlock()
	if started {
		return nil
	}
	if err := im.setStatus(ctx, &dv, func(s *cdiv1.DataVolumeStatus) {
		s.Phase, s.ClaimName = cdiv1.ImportScheduled, pvc.Name
		s.Conditions = updateCondition(s.Conditions, cdiv1.DataVolumeBound, corev1.ConditionTrue, fmt.Sprintf("PVC %s Bound", pvc.Name), "Bound")
		s.Conditions = updateCondition(s.Conditions, cdiv1.DataVolumeReady, corev1.ConditionFalse, "", "")
		s.Conditions = updateCondition(s.Conditions, cdiv1.DataVolumeRunning, corev1.ConditionFalse, "", "")
	}); err != nil {
		im.mu.Lock()
		delete(im.running, dv.UID)
		im.mu.Unlock()
		return err
	}
	im.n.wg.Add(1)
	go func() {
		defer im.n.wg.Done()
		im.importWithRestarts(im.n.ctx, dv.DeepCopy(), pvc.Spec.VolumeName)
	}()
	return nil
}

// ensureClaim makes the DataVolume's claim as CDI's storage API renders
// it (datavolume/util.go: the claim named after the DataVolume, owned by
// it, ReadWriteOnce file system, the requested size inflated by the file
// system's overhead) and, for a class this node provisions, binds it to a
// new PersistentVolume of this node, as a local provisioner does. A claim
// of another class stays Pending: nothing provisions it.
func (im *importer) ensureClaim(ctx context.Context, dv *cdiv1.DataVolume) (*corev1.PersistentVolumeClaim, error) {
	claims := im.n.kube.CoreV1().PersistentVolumeClaims(dv.Namespace)
	pvc, err := claims.Get(ctx, dv.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pvc, err = claims.Create(ctx, claimOf(dv), metav1.CreateOptions{})
	}
	if err != nil || pvc.Status.Phase == corev1.ClaimBound {
		return pvc, err
	}
	class := ""
	if pvc.Spec.StorageClassName != nil {
		class = *pvc.Spec.StorageClassName
	}
	provisioned := false
	for _, c := range im.n.cfg.StorageClasses {
		provisioned = provisioned || c == class
	}
	if !provisioned {
		return pvc, nil
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	pvName := "pvc-" + string(pvc.UID)
	if err := os.MkdirAll(im.n.volumeDir(pvName), 0o755); err != nil {
		return nil, err
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			VolumeMode:                    pvc.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: pvc.Namespace,
				Name: pvc.Name, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: im.n.volumeDir(pvName)}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn,
					Values: []string{im.n.cfg.Name}}}}}}},
		},
	}
	created, err := im.n.kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = im.n.kube.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, err
	}
	created.Status.Phase = corev1.VolumeBound
	if _, err := im.n.kube.CoreV1().PersistentVolumes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := claims.Get(ctx, pvc.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.Spec.VolumeName == "" {
			cur.Spec.VolumeName = pvName
			if cur, err = claims.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		cur.Status.Phase = corev1.ClaimBound
		cur.Status.AccessModes = cur.Spec.AccessModes
		cur.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
		pvc, err = claims.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	return pvc, err
}

// claimOf is the claim CDI makes for dv.
func claimOf(dv *cdiv1.DataVolume) *corev1.PersistentVolumeClaim {
	yes := true
	size := requested(dv)
	fsMode := corev1.PersistentVolumeFilesystem
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: dv.Name, Namespace: dv.Namespace,
			Labels: map[string]string{"app": "containerized-data-importer", "app.kubernetes.io/component": "storage"},
			Annotations: map[string]string{
				"cdi.kubevirt.io/storage.contentType":    string(cdiv1.DataVolumeKubeVirt),
				"cdi.kubevirt.io/storage.requested.size": size.String(),
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume",
				Name: dv.Name, UID: dv.UID, Controller: &yes, BlockOwnerDeletion: &yes}}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:  &fsMode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: inflate(size)}},
		},
	}
	if dv.Spec.Storage != nil {
		pvc.Spec.StorageClassName = dv.Spec.Storage.StorageClassName
		if len(dv.Spec.Storage.AccessModes) > 0 {
			pvc.Spec.AccessModes = dv.Spec.Storage.AccessModes
		}
	}
	if dv.Spec.PVC != nil {
		pvc.Spec.StorageClassName = dv.Spec.PVC.StorageClassName
	}
	return pvc
}

// requested is the size the DataVolume asks for.
func requested(dv *cdiv1.DataVolume) resource.Quantity {
	switch {
	case dv.Spec.Storage != nil:
		return dv.Spec.Storage.Resources.Requests[corev1.ResourceStorage]
	case dv.Spec.PVC != nil:
		return dv.Spec.PVC.Resources.Requests[corev1.ResourceStorage]
	}
	return resource.Quantity{}
}

// inflate is the claim's size for a requested size: the file system's
// overhead on top, rounded up to a whole MiB.
func inflate(q resource.Quantity) resource.Quantity {
	b := int64(math.Ceil(float64(q.Value()) / (1 - filesystemOverhead)))
	b = (b + mib - 1) / mib * mib
	return *resource.NewQuantity(b, resource.BinarySI)
}

const mib = 1 << 20

// importError is an import's failure as the importer's termination
// message says it; fatal ones (a checksum mismatch) end the DataVolume
// Failed, the others are retried, as CDI's import controller decides
// (pkg/controller/import-controller.go: updatePvcFromPod).
type importError struct {
	reason  string
	message string
	fatal   bool
}

func (e *importError) Error() string { return e.message }

// importWithRestarts runs the import until it succeeds or fails for good,
// waiting longer after each failure (10 s doubling to importRetryMax), as
// the kubelet restarts a failing importer pod; each failure is written
// to the DataVolume as CDI writes it.
func (im *importer) importWithRestarts(ctx context.Context, dv *cdiv1.DataVolume, pvName string) {
	wait := 10 * time.Second
	for restarts := int32(0); ; restarts++ {
		start := time.Now()
		err := im.importOnce(ctx, dv, pvName)
		if ctx.Err() != nil {
			return
		}
		var ie *importError
		if err != nil && !errors.As(err, &ie) {
			ie = &importError{reason: "Error", message: "Unable to process data: " + err.Error()}
		}
		if err := im.setStatus(ctx, dv, func(s *cdiv1.DataVolumeStatus) {
			if ie == nil {
				s.Phase, s.Progress = cdiv1.Succeeded, "100.0%"
				s.Conditions = updateCondition(s.Conditions, cdiv1.DataVolumeReady, corev1.ConditionTrue, "", "")
				s.Conditions = updateCondition(s.Conditions, cdiv1.DataVolumeRunning, corev1.ConditionFalse, "Import Complete", "Completed")
				return
			}
			s.RestartCount = restarts + 1
			s.Conditions = updateCondition(s.Conditions, cdiv1.DataVolumeRunning, corev1.ConditionFalse, ie.message, ie.reason)
			if ie.fatal {
				s.Phase = cdiv1.Failed
			}
		}); err != nil {
			im.n.logf("testnode: DataVolume %s/%s status: %v", dv.Namespace, dv.Name, err)
		}
		if ie == nil {
			im.n.logf("testnode: imported %s/%s in %s", dv.Namespace, dv.Name, time.Since(start).Round(100*time.Millisecond))
			return
		}
		im.n.logf("testnode: import of %s/%s failed (%s): %s", dv.Namespace, dv.Name, ie.reason, ie.message)
		if ie.fatal {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, importRetryMax)
	}
}

// importOnce is one run of CDI's importer (cmd/cdi-importer: handleImport)
// into the claim's volume pvName: disk.img, raw, of the DataVolume's size.
func (im *importer) importOnce(ctx context.Context, dv *cdiv1.DataVolume, pvName string) error {
	dir := im.n.volumeDir(pvName)
	dataFile := filepath.Join(dir, "disk.img")
	size := requested(dv)
	// data-processor.go's getUsableSpace: the volume less the overhead.
	claimSize := inflate(size)
	usable := int64(float64(claimSize.Value()) * (1 - filesystemOverhead))
	src := dv.Spec.Source
	switch {
	case src != nil && src.Blank != nil:
		// cmd/cdi-importer: handleEmptyImage, createBlankImage.
		return qemuImg(ctx, "create", "-f", "raw", dataFile, fmt.Sprint(min(size.Value(), usable)))
	case src == nil || src.HTTP == nil:
		return &importError{reason: "Error", message: "the test node imports http and blank sources only"}
	}
	if err := im.setStatus(ctx, dv, func(s *cdiv1.DataVolumeStatus) {
		s.Phase, s.Progress = cdiv1.ImportInProgress, "N/A"
		s.Conditions = updateCondition(s.Conditions, cdiv1.DataVolumeRunning, corev1.ConditionTrue, "", "Pod is running")
	}); err != nil {
		return err
	}
	headers, err := im.secretHeaders(ctx, dv)
	if err != nil {
		return err
	}
	scratch, err := os.MkdirTemp(im.n.cfg.Dir, "scratch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)

	// http-datasource.go: Info → ValidatePreScratch: nbdkit's curl plugin
	// serves the source over NBD, and qemu-img reads its header through it
	// (data-processor.go: validate) before a byte is copied: an image
	// larger than the volume fails here.
	if err := im.validateRemote(ctx, src.HTTP.URL, headers, scratch, usable); err != nil {
		return err
	}
	// http-datasource.go: TransferScratch: the body downloaded to scratch
	// space through the checksum's hash (checksum.go), and verified.
	tmp := filepath.Join(scratch, "tmpimage")
	if err := im.download(ctx, dv, src.HTTP, headers, tmp); err != nil {
		return err
	}
	// data-processor.go: convert (validate again, qemu-img convert to raw)
	// and resize (to the requested size, within the usable space).
	if err := validateSize(ctx, tmp, usable); err != nil {
		return err
	}
	if err := os.RemoveAll(dataFile); err != nil {
		return err
	}
	if err := qemuImg(ctx, "convert", "-t", "writeback", "-p", "-O", "raw", tmp, dataFile); err != nil {
		return fmt.Errorf("Conversion to Raw failed: %w", err)
	}
	want := min(size.Value(), usable)
	if info, err := imageInfo(ctx, dataFile); err != nil {
		return err
	} else if info.VirtualSize < want {
		if err := qemuImg(ctx, "resize", "-f", "raw", dataFile, fmt.Sprint(want)); err != nil {
			return fmt.Errorf("Resize of image failed: %w", err)
		}
	}
	return os.Chmod(dataFile, 0o660)
}

// secretHeaders reads the headers of the DataVolume's secretExtraHeaders
// Secrets, each value one header line, in the order the importer reads
// its mounted files (http-datasource.go: getExtraHeadersFromSecrets walks
// them by name). A missing Secret keeps the importer pod from starting:
// an error, retried.
func (im *importer) secretHeaders(ctx context.Context, dv *cdiv1.DataVolume) ([]string, error) {
	var headers []string
	for _, name := range dv.Spec.Source.HTTP.SecretExtraHeaders {
		s, err := im.n.kube.CoreV1().Secrets(dv.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("secretExtraHeaders %s: %w", name, err)
		}
		keys := make([]string, 0, len(s.Data))
		for k := range s.Data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			headers = append(headers, string(s.Data[k]))
		}
	}
	return headers, nil
}

// validateRemote starts nbdkit's curl plugin on url with headers
// (pkg/image/nbdkit.go: NewNbdkitCurl, with its readahead and retry
// filters) and has qemu-img read the image's size through it. CDI puts
// the Secret's headers on nbdkit's command line (redacting them from its
// own log); here they come from a file of the scratch space through
// header-script, so that no process listing shows them.
func (im *importer) validateRemote(ctx context.Context, url string, headers []string, scratch string, usable int64) error {
	sock := filepath.Join(scratch, "nbdkit.sock")
	headerFile := filepath.Join(scratch, "headers")
	if err := os.WriteFile(headerFile, []byte(strings.Join(headers, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	args := []string{"--exit-with-parent", "--foreground", "-r", "-U", sock, "--filter=readahead", "--filter=retry",
		"curl", "url=" + url, "retry-exponential=no", "header-script=cat " + headerFile}
	if im.n.caFile != "" {
		args = append(args, "cainfo="+im.n.caFile)
	}
	cmd := exec.CommandContext(ctx, "nbdkit", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("nbdkit: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// nbdkit answers once its socket exists; qemu-img retries nothing, so
	// wait for the socket (bounded).
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nbdkit did not listen within 30 s: %s", stderr.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return validateSize(ctx, "nbd+unix:///?socket="+sock, usable)
}

// validateSize is qemu's part of data-processor.go's validate
// (pkg/image/qemu.go: Validate): the image's virtual size must fit the
// usable space, in CDI's words if not.
func validateSize(ctx context.Context, image string, usable int64) error {
	info, err := imageInfo(ctx, image)
	if err != nil {
		return err
	}
	if info.VirtualSize > usable {
		return &importError{reason: "Error", message: fmt.Sprintf(
			"Unable to process data: Virtual image size %d is larger than the reported available storage %d. A larger PVC is required.",
			info.VirtualSize, usable)}
	}
	return nil
}

// checksumOf parses a DataVolume's checksum ("algorithm:hex", as CDI's
// checksum.go reads it): the hash to compute, or none for "". An unknown
// algorithm fails the import for good, as CDI's does.
func checksumOf(checksum string) (h hash.Hash, algo, want string, err error) {
	if checksum == "" {
		return nil, "", "", nil
	}
	algo, want, ok := strings.Cut(checksum, ":")
	switch algo {
	case "md5":
		h = md5.New() //nolint:gosec
	case "sha1":
		h = sha1.New() //nolint:gosec
	case "sha256":
		h = sha256.New()
	case "sha512":
		h = sha512.New()
	default:
		ok = false
	}
	if !ok {
		return nil, "", "", &importError{reason: "Error", message: "Unable to process data: invalid checksum " + checksum, fatal: true}
	}
	return h, algo, want, nil
}

// download copies the source's body to file through the hash of the
// DataVolume's checksum, reporting progress as CDI's controller reads it
// from the importer, and verifies the sum (checksum.go: Validate). A
// mismatch is fatal, as the import controller reads it: the file is
// removed and the DataVolume fails with reason ChecksumError.
func (im *importer) download(ctx context.Context, dv *cdiv1.DataVolume, src *cdiv1.DataVolumeSourceHTTP, headers []string, file string) error {
	h, algo, want, err := checksumOf(src.Checksum)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src.URL, nil)
	if err != nil {
		return err
	}
	for _, line := range headers {
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			return fmt.Errorf("a secretExtraHeaders value is no header line")
		}
		req.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	resp, err := im.n.httpClient().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("expected status code 200, got %d. Status: %s", resp.StatusCode, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	var w io.Writer = f
	if h != nil {
		w = io.MultiWriter(f, h)
	}
	total := resp.ContentLength
	var copied int64
	last := time.Now()
	buf := make([]byte, mib)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			copied += int64(n)
		}
		if total > 0 && time.Since(last) >= time.Second {
			last = time.Now()
			p := fmt.Sprintf("%.2f%%", 100*float64(copied)/float64(total))
			if err := im.setStatus(ctx, dv, func(s *cdiv1.DataVolumeStatus) { s.Progress = cdiv1.DataVolumeProgress(p) }); err != nil {
				im.n.logf("testnode: progress of %s/%s: %v", dv.Namespace, dv.Name, err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if h != nil {
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			_ = os.Remove(file)
			return &importError{reason: "ChecksumError", fatal: true, message: fmt.Sprintf(
				"Unable to process data: checksum validation failed: checksum mismatch: expected %s:%s, calculated %s:%s", algo, want, algo, got)}
		}
	}
	return nil
}

// setStatus applies change to the DataVolume's status as stored and
// writes it through the status subresource.
func (im *importer) setStatus(ctx context.Context, dv *cdiv1.DataVolume, change func(*cdiv1.DataVolumeStatus)) error {
	dvs := im.n.dyn.Resource(dvGVR).Namespace(dv.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, err := dvs.Get(ctx, dv.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var cur cdiv1.DataVolume
		if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cur); err != nil {
			return err
		}
		if cur.UID != dv.UID {
			return apierrors.NewNotFound(dvGVR.GroupResource(), dv.Name)
		}
		change(&cur.Status)
		obj, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(&cur)
		if err != nil {
			return err
		}
		_, err = dvs.UpdateStatus(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{})
		return err
	})
}

// updateCondition is CDI's (datavolume/conditions.go): the transition
// time moves only when the status does.
func updateCondition(conditions []cdiv1.DataVolumeCondition, t cdiv1.DataVolumeConditionType, status corev1.ConditionStatus, message, reason string) []cdiv1.DataVolumeCondition {
	now := metav1.Now()
	for i := range conditions {
		c := &conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status != status {
			c.LastTransitionTime = now
		}
		c.Status, c.Message, c.Reason, c.LastHeartbeatTime = status, message, reason, now
		return conditions
	}
	return append(conditions, cdiv1.DataVolumeCondition{Type: t, Status: status, Message: message, Reason: reason,
		LastTransitionTime: now, LastHeartbeatTime: now})
}

// imageInfo is qemu-img info's answer for image.
func imageInfo(ctx context.Context, image string) (struct {
	Format      string `json:"format"`
	VirtualSize int64  `json:"virtual-size"`
}, error) {
	var info struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "--output=json", image).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return info, fmt.Errorf("qemu-img info: %w: %s", err, ee.Stderr)
		}
		return info, err
	}
	return info, json.Unmarshal(out, &info)
}

func qemuImg(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// httpClient trusts the system's roots and the test's.
func (n *Node) httpClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if n.rootCAs != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: n.rootCAs, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr}
}
