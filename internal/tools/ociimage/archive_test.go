package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"github.com/vmshelf/vmshelf/internal/imagespec"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// toolInstall is the one command that brings the tools these tests run.
const toolInstall = "apt-get install skopeo umoci"

// needTool: a tool the test cannot do without; missing, it fails the test
// under CI=true and skips it loudly elsewhere, naming the install.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missing(t, name+" is not installed; install it with: "+toolInstall)
	}
	return p
}

// missing fails the test under CI=true and skips it loudly elsewhere.
func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip("SKIPPED: " + msg)
}

// repoRoot is the main module's top, three levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.HasPrefix(string(b), "module github.com/vmshelf/vmshelf\n") {
		t.Fatalf("%s is not the repository's top: %v", root, err)
	}
	return root
}

// built is one binary and archives of it (two for TestArchive, to
// compare), made as make image makes them.
type built struct {
	bin, archive, again string
	img                 v1.Image
	stamp               Stamp
}

func buildArchives(t *testing.T, n int) built {
	t.Helper()
	if testing.Short() {
		t.Skip("SKIPPED under -short: builds vmshelf and its image")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	b := built{bin: filepath.Join(dir, "vmshelf"), archive: filepath.Join(dir, "a.tar"), again: filepath.Join(dir, "b.tar")}
	if err := BuildBinary(ctx, "go", repoRoot(t), b.bin); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{b.archive, b.again}[:n] {
		img, st, err := Load(Source{Bin: b.bin, CA: imagespec.CABundlePath})
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteArchiveFile(out, img, Refs(st)); err != nil {
			t.Fatal(err)
		}
		b.img, b.stamp = img, st
	}
	return b
}

// TestArchive: the archive make image writes, read back as a docker-save
// archive and as an OCI layout: the same image under both, the config
// (non-root user, entrypoint, ports, labels from the binary), the layer's
// files (owners, modes, fixed mtimes), and a second build of the same
// binary is the same archive, byte for byte.
func TestArchive(t *testing.T) {
	if _, err := os.Stat(imagespec.CABundlePath); err != nil {
		missing(t, imagespec.CABundlePath+", the CA bundle the image takes, is missing; install it with: apt-get install ca-certificates")
	}
	b := buildArchives(t, 2)
	if sumFile(t, b.archive) != sumFile(t, b.again) {
		t.Error("two builds of one binary differ: the image is not reproducible")
	}
	want, err := b.img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	var first v1.Hash
	for i, ref := range Refs(b.stamp) {
		tag, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(b.archive, &tag)
		if err != nil {
			t.Fatalf("docker-save side, %s: %v", ref, err)
		}
		checkConfig(t, img, b.stamp)
		// Every name must lead to the same manifest (the docker-save side
		// makes its own, with Docker's media types); its bytes are then
		// the ones already validated (content addressing), and reading
		// the 60 MB layer again under -race took half a minute each.
		got, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			if got != first {
				t.Errorf("docker-save side, %s: manifest %s, want the first name's %s", ref, got, first)
			}
			continue
		}
		first = got
		if err := validate.Image(img); err != nil {
			t.Errorf("docker-save side, %s: %v", ref, err)
		}
		checkLayer(t, img, b.bin)
	}
	checkLayout(t, b.archive, want, Refs(b.stamp))
}

func sumFile(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func checkConfig(t *testing.T, img v1.Image, st Stamp) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" || strings.HasPrefix(c.User, "0") || c.User == "" || c.User == "root" {
		t.Errorf("user %q, want 65532:65532 (never root)", c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/vmshelf"}) || len(c.Cmd) == 0 || c.Cmd[0] != "serve" {
		t.Errorf("entrypoint %q cmd %q, want vmshelf, serve", c.Entrypoint, c.Cmd)
	}
	if _, ok := c.ExposedPorts["8480/tcp"]; !ok || len(c.ExposedPorts) != 2 {
		t.Errorf("exposed ports %v, want 8480/tcp and 8481/tcp", c.ExposedPorts)
	}
	if _, ok := c.ExposedPorts["8481/tcp"]; !ok {
		t.Errorf("exposed ports %v, want 8480/tcp and 8481/tcp", c.ExposedPorts)
	}
	if !slices.Contains(c.Env, "VMSHELF_DATA_DIR=/data/vmshelf") || !slices.ContainsFunc(c.Env, func(e string) bool {
		return strings.HasPrefix(e, "PATH=") && slices.Contains(strings.Split(strings.TrimPrefix(e, "PATH="), ":"), "/usr/local/bin")
	}) {
		t.Errorf("env %q: want the store on the volume and vmshelf's folder on PATH", c.Env)
	}
	l := c.Labels
	if l[LabelVersion] == "" || l[LabelVersion] != st.Version || l[LabelRevision] != st.Revision || l[LabelTitle] != "vmshelf" {
		t.Errorf("labels %v, want version %q and revision %q (the binary's)", l, st.Version, st.Revision)
	}
	if l[LabelCreated] != cf.Created.UTC().Format(time.RFC3339) || cf.Created.IsZero() {
		t.Errorf("created label %q, config created %v", l[LabelCreated], cf.Created)
	}
	if cf.OS != "linux" || cf.Architecture != st.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, st.GOARCH)
	}
}

// checkLayer reads the image's one layer: the binary and the CA bundle
// byte for byte, the user's entries in /etc/passwd and /etc/group, /data
// the user's, every mtime the image's creation time.
func checkLayer(t *testing.T, img v1.Image, bin string) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v; want one", len(layers), err)
	}
	cf, _ := img.ConfigFile()
	files := readLayer(t, layers[0], cf.Created.Time)
	wantBin, _ := os.ReadFile(bin)
	wantCA, _ := os.ReadFile(imagespec.CABundlePath)
	for path, want := range map[string][]byte{"usr/local/bin/vmshelf": wantBin, "etc/ssl/certs/ca-certificates.crt": wantCA} {
		if f, ok := files[path]; !ok || !bytes.Equal(f.body, want) {
			t.Errorf("%s: not the file put in (%d bytes, want %d)", path, len(f.body), len(want))
		}
	}
	if f := files["usr/local/bin/vmshelf"]; f.h == nil || f.h.Mode != 0o755 || f.h.Uid != 0 {
		t.Errorf("the binary's header %+v, want root's, 0755", f.h)
	}
	if !strings.Contains(string(files["etc/passwd"].body), "\nvmshelf:x:65532:65532:") || !strings.Contains(string(files["etc/group"].body), "\nvmshelf:x:65532:") {
		t.Errorf("passwd %q group %q: want the user vmshelf, 65532", files["etc/passwd"].body, files["etc/group"].body)
	}
	if d := files["data/"]; d.h == nil || d.h.Uid != imagespec.UID || d.h.Gid != imagespec.GID || d.h.Mode != 0o700 || d.h.Typeflag != tar.TypeDir {
		t.Errorf("/data %+v, want a directory of 65532:65532, 0700", d.h)
	}
}

type layerFile struct {
	h    *tar.Header
	body []byte
}

func readLayer(t *testing.T, l v1.Layer, created time.Time) map[string]layerFile {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]layerFile{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(created) {
			t.Errorf("%s: mtime %v, want the image's creation time %v", h.Name, h.ModTime, created)
		}
		files[h.Name] = layerFile{h, body}
	}
}

// checkLayout unpacks the archive and reads it as an OCI image layout:
// one index entry per reference, each the same manifest, each named in
// both annotations.
func checkLayout(t *testing.T, archive string, want v1.Hash, refs []string) {
	t.Helper()
	dir := t.TempDir()
	untar(t, archive, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("OCI layout side: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	validated := map[v1.Hash]bool{}
	for _, m := range im.Manifests {
		if m.Digest != want || m.Platform == nil || m.Platform.OS != "linux" {
			t.Errorf("index entry %+v, want manifest %s with its platform", m, want)
		}
		if m.Annotations[annotationRefName] != m.Annotations[annotationContainerdName] {
			t.Errorf("index entry names %v: the OCI name and containerd's differ", m.Annotations)
		}
		names = append(names, m.Annotations[annotationRefName])
		if validated[m.Digest] { // the same bytes (see TestArchive)
			continue
		}
		validated[m.Digest] = true
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Image(img); err != nil {
			t.Errorf("OCI layout side: %v", err)
		}
	}
	if !slices.Equal(names, refs) {
		t.Errorf("index names %v, want %v", names, refs)
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("archive entry %q leaves the folder", h.Name)
		}
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestArchiveByDebianTools: Debian's skopeo reads the archive both ways
// (docker-archive: and oci-archive:, each reference), copies it to an OCI
// layout that Debian's umoci unpacks as a rootless bundle, whose runtime
// config runs vmshelf as 65532 with serve, and whose binary, run, names
// the version and commit the labels name. umoci unpacks the archive's own
// OCI layout too.
func TestArchiveByDebianTools(t *testing.T) {
	skopeo, umoci := needTool(t, "skopeo"), needTool(t, "umoci")
	b := buildArchives(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var docker struct{ Labels map[string]string }
	runJSON(t, ctx, &docker, skopeo, "inspect", "docker-archive:"+b.archive)
	if docker.Labels[LabelVersion] != b.stamp.Version || docker.Labels[LabelRevision] != b.stamp.Revision {
		t.Errorf("skopeo inspect docker-archive: labels %v, want version %q revision %q", docker.Labels, b.stamp.Version, b.stamp.Revision)
	}
	want, _ := b.img.Digest()
	for _, ref := range Refs(b.stamp) {
		var oci struct{ Digest string }
		runJSON(t, ctx, &oci, skopeo, "inspect", "oci-archive:"+b.archive+":"+ref)
		if oci.Digest != want.String() {
			t.Errorf("skopeo inspect oci-archive:…:%s: digest %s, want %s", ref, oci.Digest, want)
		}
	}
	dir := t.TempDir()
	run(t, ctx, skopeo, "copy", "-q", "docker-archive:"+b.archive, "oci:"+filepath.Join(dir, "oci")+":vmshelf")
	bundle := filepath.Join(dir, "bundle")
	run(t, ctx, umoci, "unpack", "--rootless", "--image", filepath.Join(dir, "oci")+":vmshelf", bundle)
	checkBundle(t, ctx, bundle, docker.Labels)

	untar(t, b.archive, filepath.Join(dir, "layout"))
	run(t, ctx, umoci, "unpack", "--rootless", "--image", filepath.Join(dir, "layout")+":"+Refs(b.stamp)[0], filepath.Join(dir, "bundle2"))
	if _, err := os.Stat(filepath.Join(dir, "bundle2", "rootfs", "usr", "local", "bin", "vmshelf")); err != nil {
		t.Errorf("umoci unpack of the archive's OCI layout: %v", err)
	}
}

// checkBundle: the OCI runtime config umoci made from the image, and the
// unpacked binary's own word on its version.
func checkBundle(t *testing.T, ctx context.Context, bundle string, labels map[string]string) {
	t.Helper()
	var spec struct {
		Process struct {
			User struct{ UID, GID int }
			Args []string
		}
	}
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Process.User.UID != imagespec.UID || spec.Process.User.GID != imagespec.GID || len(spec.Process.Args) < 2 ||
		spec.Process.Args[0] != imagespec.BinaryPath || spec.Process.Args[1] != "serve" {
		t.Errorf("the bundle runs %q as %d:%d, want %s serve as %d:%d", spec.Process.Args, spec.Process.User.UID, spec.Process.User.GID, imagespec.BinaryPath, imagespec.UID, imagespec.GID)
	}
	out := run(t, ctx, filepath.Join(bundle, "rootfs", filepath.FromSlash(strings.TrimPrefix(imagespec.BinaryPath, "/"))), "version")
	lines := strings.Split(out, "\n")
	commit := "commit unknown"
	if r := labels[LabelRevision]; r != "" {
		commit = "commit " + r
	}
	if len(lines) < 2 || lines[0] != "vmshelf "+labels[LabelVersion] || !strings.HasPrefix(lines[1], commit) {
		t.Errorf("the unpacked vmshelf version says %q, want \"vmshelf %s\" and %q as the labels say", out, labels[LabelVersion], commit)
	}
}

func run(t *testing.T, ctx context.Context, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

func runJSON(t *testing.T, ctx context.Context, v any, name string, args ...string) {
	t.Helper()
	if err := json.Unmarshal([]byte(run(t, ctx, name, args...)), v); err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
}
