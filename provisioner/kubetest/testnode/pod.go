package testnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// launcherLabel marks the pods KubeVirt's VMI controller makes: the only
// pods this node knows how to run.
const launcherLabel = kubevirtv1.AppLabel + "=virt-launcher"

func isLauncher(pod *corev1.Pod) bool { return pod.Labels[kubevirtv1.AppLabel] == "virt-launcher" }

// podIP is the address the node gives its pods: its pod network is the
// host's loopback (kube-proxy's part forwards Services to it).
const podIP = "127.0.0.1"

// schedule binds a pending launcher pod to this node, as kube-scheduler
// would, when the node fits it: its nodeSelector and required node
// affinity match the node's labels and it tolerates every NoSchedule and
// NoExecute taint. A pod that does not fit stays Pending, with the
// condition kube-scheduler writes, and the reason.
func (n *Node) schedule(ctx context.Context, key string) error {
	pod, err := n.pod(key)
	if err != nil || pod == nil || pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil || !isLauncher(pod) {
		return err
	}
	node, err := n.kube.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if why := fits(pod, node, n.requestedOnNode(pod)); why != "" {
		return n.unschedulable(ctx, pod, why)
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: n.cfg.Name},
	}
	if err := n.kube.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("binding %s: %w", key, err)
	}
	n.logf("testnode: scheduled %s", key)
	return nil
}

// fits says why pod may not run on node, whose pods already request
// used, or "" if it may.
func fits(pod *corev1.Pod, node *corev1.Node, used corev1.ResourceList) string {
	for k, v := range pod.Spec.NodeSelector {
		if node.Labels[k] != v {
			return fmt.Sprintf("node(s) didn't match Pod's node affinity/selector (%s=%s)", k, v)
		}
	}
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); err != nil || !ok {
		return "node(s) didn't match Pod's node affinity/selector"
	}
	noSchedule := func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}
	if t, untolerated := corev1helpers.FindMatchingUntoleratedTaint(node.Spec.Taints, pod.Spec.Tolerations, noSchedule); untolerated {
		return fmt.Sprintf("node(s) had untolerated taint {%s: %s}", t.Key, t.Value)
	}
	var short []string
	for name, q := range podRequests(pod) {
		free := node.Status.Allocatable[name].DeepCopy()
		u := used[name]
		free.Sub(u)
		if q.Cmp(free) > 0 {
			short = append(short, "Insufficient "+string(name))
		}
	}
	if len(short) > 0 {
		sort.Strings(short)
		return strings.Join(short, ", ")
	}
	return ""
}

// podRequests is what a pod requests of its node: its containers' and its
// sidecars' (init containers that keep running) requests together.
func podRequests(pod *corev1.Pod) corev1.ResourceList {
	out := corev1.ResourceList{}
	add := func(rl corev1.ResourceList) {
		for name, q := range rl {
			sum := out[name]
			sum.Add(q)
			out[name] = sum
		}
	}
	for _, c := range pod.Spec.Containers {
		add(c.Resources.Requests)
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c.Resources.Requests)
		}
	}
	return out
}

// requestedOnNode is what the pods bound to this node (but pod) request.
func (n *Node) requestedOnNode(pod *corev1.Pod) corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, obj := range n.pods.GetStore().List() {
		p := obj.(*corev1.Pod)
		if p.UID == pod.UID || p.Spec.NodeName != n.cfg.Name || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for name, q := range podRequests(p) {
			sum := out[name]
			sum.Add(q)
			out[name] = sum
		}
	}
	return out
}

// unschedulable writes the PodScheduled condition kube-scheduler writes
// for a pod no node fits.
func (n *Node) unschedulable(ctx context.Context, pod *corev1.Pod, why string) error {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable && strings.HasSuffix(c.Message, why) {
			return nil
		}
	}
	pod = pod.DeepCopy()
	setPodCondition(pod, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: 1 " + why})
	_, err := n.kube.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	n.logf("testnode: %s/%s does not fit the node: %s", pod.Namespace, pod.Name, why)
	return err
}

func setPodCondition(pod *corev1.Pod, c corev1.PodCondition) {
	c.LastTransitionTime = metav1.Now()
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == c.Type {
			pod.Status.Conditions[i] = c
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, c)
}

func (n *Node) pod(key string) (*corev1.Pod, error) {
	obj, exists, err := n.pods.GetStore().GetByKey(key)
	if err != nil || !exists {
		return nil, err
	}
	return obj.(*corev1.Pod), nil
}

// syncPod is the kubelet: a launcher pod bound here starts once its
// claims are bound (its private folders made, its Secrets written where
// its container mounts them) and is reported Running and ready; the
// launcher's own work, the domain, is virt-handler's (syncVMI), which
// virt-controller hands the VMI once it sees the pod ready. A pod being
// deleted has its domain stopped and is removed, as a kubelet confirms a
// pod's end; a pod whose domain ended is Succeeded or Failed, as the
// launcher's exit makes it.
func (n *Node) syncPod(ctx context.Context, key string) error {
	pod, err := n.pod(key)
	if err != nil || pod == nil || pod.Spec.NodeName != n.cfg.Name || !isLauncher(pod) {
		return err
	}
	if pod.DeletionTimestamp != nil {
		if err := n.stopDomainOf(ctx, pod); err != nil {
			return err
		}
		zero := int64(0)
		err := n.kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
			Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
		n.logf("testnode: pod %s ended", key)
		return nil
	}
	switch pod.Status.Phase {
	case corev1.PodPending:
		return n.startPod(ctx, pod)
	case corev1.PodRunning:
		if d := n.domainOfPod(pod); d != nil {
			if ended, failed := d.ended(); ended {
				return n.endPod(ctx, pod, failed)
			}
		}
	}
	return nil
}

// startPod makes the pod's mounts and reports it running, once every
// claim it mounts is bound.
func (n *Node) startPod(ctx context.Context, pod *corev1.Pod) error {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		pvc, err := n.kube.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, v.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && pvc.Status.Phase != corev1.ClaimBound) {
			return nil // a claim's binding brings the pod back (the DataVolume's event)
		}
		if err != nil {
			return err
		}
	}
	if err := n.mountSecrets(ctx, pod); err != nil {
		return err
	}
	pod = pod.DeepCopy()
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.HostIP, pod.Status.PodIP = podIP, podIP
	pod.Status.HostIPs, pod.Status.PodIPs = []corev1.HostIP{{IP: podIP}}, []corev1.PodIP{{IP: podIP}}
	pod.Status.StartTime = &now
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		setPodCondition(pod, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue})
	}
	running := func(c corev1.Container) corev1.ContainerStatus {
		started := true
		return corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: &started,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}
	}
	pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses = nil, nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, running(c))
	}
	// KubeVirt's init containers are sidecars (restartPolicy Always, the
	// serial console's log): they run beside the launcher.
	for _, c := range pod.Spec.InitContainers {
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, running(c))
	}
	if _, err := n.kube.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return err
	}
	n.logf("testnode: pod %s/%s running", pod.Namespace, pod.Name)
	return nil
}

// endPod reports the launcher's exit once its domain has ended.
func (n *Node) endPod(ctx context.Context, pod *corev1.Pod, failed bool) error {
	pod = pod.DeepCopy()
	phase, reason, code := corev1.PodSucceeded, "Completed", int32(0)
	if failed {
		phase, reason, code = corev1.PodFailed, "Error", 1
	}
	pod.Status.Phase = phase
	for i := range pod.Status.ContainerStatuses {
		cs := &pod.Status.ContainerStatuses[i]
		cs.Ready = false
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, FinishedAt: metav1.Now()}}
	}
	setPodCondition(pod, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "PodCompleted"})
	setPodCondition(pod, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "PodCompleted"})
	_, err := n.kube.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

// mountSecrets writes each Secret a container of pod mounts where the
// mount puts it (below the pod's folders: hostPath), as a kubelet
// projects a Secret volume: one file per key, or the one key a subPath
// names.
func (n *Node) mountSecrets(ctx context.Context, pod *corev1.Pod) error {
	secrets := map[string]*corev1.SecretVolumeSource{}
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret
		}
	}
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			src, ok := secrets[m.Name]
			if !ok {
				continue
			}
			s, err := n.kube.CoreV1().Secrets(pod.Namespace).Get(ctx, src.SecretName, metav1.GetOptions{})
			if err != nil {
				// A kubelet waits for a Secret the pod needs; so does this.
				return fmt.Errorf("secret %s of pod %s: %w", src.SecretName, pod.Name, err)
			}
			// Where the mount point is in the folders of the mounts
			// below it: a kubelet bind-mounts the Secret there, and
			// virt-launcher reads it through its private folder.
			dst, err := n.hostPathOf(pod, m.MountPath, func(v corev1.Volume) bool { return v.Secret == nil })
			if err != nil {
				return err
			}
			files := s.Data
			if m.SubPath != "" {
				files = map[string][]byte{}
				if v, ok := s.Data[m.SubPath]; ok {
					files[""] = v
				}
			}
			for k, v := range files {
				p := filepath.Join(dst, k)
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					return err
				}
				if err := os.WriteFile(p, v, 0o600); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// hostPath is where path, as the pod's compute container sees it, is on
// this host: below the folder of the volume mounted at the longest
// mountPath that holds it (an emptyDir is a folder of the pod's, a claim
// the folder of its PersistentVolume). A path no mount holds is an error:
// the container would not see it either.
func (n *Node) hostPath(pod *corev1.Pod, path string) (string, error) {
	return n.hostPathOf(pod, path, func(corev1.Volume) bool { return true })
}

// hostPathOf is hostPath through the mounts of the volumes use accepts.
func (n *Node) hostPathOf(pod *corev1.Pod, path string, use func(corev1.Volume) bool) (string, error) {
	usable := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		usable[v.Name] = use(v)
	}
	var best *corev1.VolumeMount
	for _, c := range pod.Spec.Containers {
		if c.Name != "compute" {
			continue
		}
		for i, m := range c.VolumeMounts {
			if usable[m.Name] && (path == m.MountPath || strings.HasPrefix(path, m.MountPath+"/")) && (best == nil || len(m.MountPath) > len(best.MountPath)) {
				best = &c.VolumeMounts[i]
			}
		}
	}
	if best == nil {
		return "", fmt.Errorf("no volume of pod %s/%s holds %s", pod.Namespace, pod.Name, path)
	}
	rest := strings.TrimPrefix(path, best.MountPath)
	for _, v := range pod.Spec.Volumes {
		if v.Name != best.Name {
			continue
		}
		if v.PersistentVolumeClaim != nil {
			pvName, err := n.boundVolume(pod.Namespace, v.PersistentVolumeClaim.ClaimName)
			if err != nil {
				return "", err
			}
			return filepath.Join(n.volumeDir(pvName), best.SubPath, rest), nil
		}
		return filepath.Join(n.podVolumeDir(string(pod.UID), v.Name), best.SubPath, rest), nil
	}
	return "", fmt.Errorf("pod %s/%s mounts the unknown volume %s", pod.Namespace, pod.Name, best.Name)
}

// boundVolume is the PersistentVolume a claim is bound to.
func (n *Node) boundVolume(ns, claim string) (string, error) {
	pvc, err := n.kube.CoreV1().PersistentVolumeClaims(ns).Get(n.ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		return "", fmt.Errorf("claim %s/%s is not bound", ns, claim)
	}
	return pvc.Spec.VolumeName, nil
}

// launcherOf is the launcher pod of vmi that runs on this node.
func (n *Node) launcherOf(vmi *kubevirtv1.VirtualMachineInstance) *corev1.Pod {
	for _, obj := range n.pods.GetStore().List() {
		pod := obj.(*corev1.Pod)
		if pod.Namespace != vmi.Namespace || pod.Spec.NodeName != n.cfg.Name || !isLauncher(pod) || pod.DeletionTimestamp != nil {
			continue
		}
		for _, ref := range pod.OwnerReferences {
			if ref.UID == vmi.UID {
				return pod
			}
		}
	}
	return nil
}

// vmiKeyOf is the key of the VMI that owns pod ("" if none).
func vmiKeyOf(pod *corev1.Pod) string {
	for _, ref := range pod.OwnerReferences {
		if ref.Kind == "VirtualMachineInstance" {
			k, _ := cache.MetaNamespaceKeyFunc(&metav1.ObjectMeta{Namespace: pod.Namespace, Name: ref.Name})
			return k
		}
	}
	return ""
}
