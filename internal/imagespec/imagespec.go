// Package imagespec is what vmshelf's container image is: its name, user,
// paths, ports, entrypoint, command and environment. internal/tools/ociimage
// builds the image from it, and the tests of the Dockerfile and of
// docs/deploy's manifests (provisioner/kubetest) read it, so that all
// three say the same. It imports nothing beyond the standard library:
// provisioner/kubetest takes it in without go-containerregistry's
// dependencies, which would move the Kubernetes API server's.
package imagespec

import "fmt"

// What the image is.
const (
	// Repository is the image's name: localhost/ because it is imported,
	// never pulled; a pull of it fails at once instead of fetching some
	// other vmshelf from Docker Hub.
	Repository = "localhost/vmshelf"
	// KitTag is the tag docs/deploy's Deployments run (with
	// imagePullPolicy IfNotPresent); every archive carries it beside its
	// version's tag.
	KitTag = "latest"
	// BinaryPath is on the image's PATH, so that `kubectl exec … --
	// vmshelf tenant add` finds it by name.
	BinaryPath = "/usr/local/bin/vmshelf"
	// CABundlePath is where Go's crypto/x509 looks first on Linux (Stripe,
	// S3 and the Kubernetes API are reached over TLS).
	CABundlePath = "/etc/ssl/certs/ca-certificates.crt"
	UID          = 65532
	GID          = 65532
	UserName     = "vmshelf"
	// DataDir is the volume's mount point, owned by the user; the store is
	// DataDir/vmshelf (StoreDir), a directory serve makes itself 0700.
	DataDir  = "/data"
	StoreDir = DataDir + "/vmshelf"
	// The planes' ports inside the container.
	DataPort    = 8480
	ControlPort = 8481
	// Path is the image's PATH.
	Path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Entrypoint is the binary itself: `docker run IMAGE tenant list` and the
// Deployment's `args: [serve, …]` give vmshelf its command.
func Entrypoint() []string { return []string{BinaryPath} }

// Cmd is what runs with no arguments: serve on every interface of the
// container (its own loopback is unreachable from outside). The store's
// place comes from Env, so that every command run in the container (serve,
// and the tenant commands an operator runs through kubectl exec) uses the
// same one.
func Cmd() []string {
	return []string{"serve", fmt.Sprintf("--data-addr=0.0.0.0:%d", DataPort), fmt.Sprintf("--control-addr=0.0.0.0:%d", ControlPort)}
}

// Env is the image's environment.
func Env() []string { return []string{"PATH=" + Path, "VMSHELF_DATA_DIR=" + StoreDir} }

// User is the image's user, numeric so that Kubernetes' runAsNonRoot can
// check it without reading /etc/passwd.
func User() string { return fmt.Sprintf("%d:%d", UID, GID) }

// ExposedPorts are the two planes'.
func ExposedPorts() []string {
	return []string{fmt.Sprintf("%d/tcp", DataPort), fmt.Sprintf("%d/tcp", ControlPort)}
}
