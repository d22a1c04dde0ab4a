// Package ociimage builds vmshelf's container image without a container
// engine: the static binary and the build machine's CA certificates in one
// layer on an empty base, a non-root user, vmshelf as the entrypoint, and
// OCI labels read from the binary's own build information, so that the
// labels and `vmshelf version` can never disagree. WriteArchive writes it
// as one tar file that is both a `docker save` archive (manifest.json) and
// an OCI image layout (oci-layout, index.json, blobs/), as `docker save`
// writes since Docker 25: docker load, podman load and containerd's import
// (k3s ctr images import) take it. The Dockerfile at the repository's top
// builds the same image with a container engine; its test keeps the two
// in step through internal/imagespec, which says what the image is.
//
// The image is reproducible: every file in the layer has the image's
// creation time as its mtime, the owners and modes are fixed, and the
// creation time is SOURCE_DATE_EPOCH or the commit's time, never the
// clock; so one binary gives one digest.
package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"github.com/vmshelf/vmshelf/internal/imagespec"
	"io"
	"regexp"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The OCI annotation keys the image's labels use.
const (
	LabelTitle       = "org.opencontainers.image.title"
	LabelDescription = "org.opencontainers.image.description"
	LabelVersion     = "org.opencontainers.image.version"
	LabelRevision    = "org.opencontainers.image.revision"
	LabelSource      = "org.opencontainers.image.source"
	LabelCreated     = "org.opencontainers.image.created"
)

// Stamp is what the binary says of itself (its build information): the
// image's labels and tag come from it and nothing else.
type Stamp struct {
	Version  string // the main module's version: v1.2.3, a pseudo-version (+dirty), or (devel)
	Revision string // the commit; empty when the build had no VCS information
	Time     string // the commit's time (RFC 3339); empty as Revision
	Source   string // https:// and the main module's path
	GOOS     string
	GOARCH   string
}

// StampOf reads a binary's build information (debug/buildinfo.ReadFile's).
func StampOf(bi *debug.BuildInfo) Stamp {
	s := Stamp{Version: bi.Main.Version, Source: "https://" + bi.Main.Path}
	if s.Version == "" {
		s.Version = "(devel)"
	}
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			s.Revision = kv.Value
		case "vcs.time":
			s.Time = kv.Value
		case "GOOS":
			s.GOOS = kv.Value
		case "GOARCH":
			s.GOARCH = kv.Value
		}
	}
	return s
}

var tagInvalid = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// VersionTag is a version as an image tag: characters a tag may not hold
// ("+dirty", the parentheses of "(devel)") become "-", at most 128.
func VersionTag(version string) string {
	t := strings.Trim(tagInvalid.ReplaceAllString(version, "-"), "-.")
	if len(t) > 128 {
		t = t[:128]
	}
	if t == "" {
		return "devel"
	}
	return t
}

// Created is the image's creation time: SOURCE_DATE_EPOCH (sourceDateEpoch,
// seconds) when set, else the commit's time, else zero (the Unix epoch);
// never the clock, so that a second build of one commit is the same image.
func Created(sourceDateEpoch string, s Stamp) (time.Time, error) {
	if sourceDateEpoch != "" {
		sec, err := strconv.ParseInt(sourceDateEpoch, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: not a count of seconds: %w", sourceDateEpoch, err)
		}
		return time.Unix(sec, 0).UTC(), nil
	}
	if s.Time != "" {
		t, err := time.Parse(time.RFC3339, s.Time)
		if err != nil {
			return time.Time{}, fmt.Errorf("the binary's vcs.time %q: %w", s.Time, err)
		}
		return t.UTC(), nil
	}
	return time.Unix(0, 0).UTC(), nil
}

// Labels are the image's OCI labels. No licence label: the repository
// states none.
func Labels(s Stamp, created time.Time) map[string]string {
	l := map[string]string{
		LabelTitle:       "vmshelf",
		LabelDescription: "QCOW2 image gateway and VM market edge",
		LabelVersion:     s.Version,
		LabelSource:      s.Source,
		LabelCreated:     created.UTC().Format(time.RFC3339),
	}
	if s.Revision != "" {
		l[LabelRevision] = s.Revision
	}
	return l
}

// Input is what an image is made of.
type Input struct {
	Binary   []byte // the static vmshelf
	CABundle []byte // PEM certificates
	Stamp    Stamp  // the binary's, from StampOf
	Created  time.Time
}

// Build makes the image: one layer on an empty base, OCI media types.
func Build(in Input) (v1.Image, error) {
	if in.Stamp.GOOS != "linux" || in.Stamp.GOARCH == "" {
		return nil, fmt.Errorf("the binary is for %q/%q, not linux: build it with GOOS=linux", in.Stamp.GOOS, in.Stamp.GOARCH)
	}
	layerTar, err := layerTar(in)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer),
		// The compressed layer is kept once made: go-containerregistry
		// otherwise gzips the whole binary again for every reader of the
		// layer (its digest, the archive's blob, each validation), which
		// was most of make image's time and of its tests' (under -race,
		// minutes). It costs the compressed size in memory, a few tens of MB.
		tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer, History: v1.History{
		Created:   v1.Time{Time: in.Created},
		CreatedBy: "internal/tools/ociimage: " + imagespec.BinaryPath + ", " + imagespec.CABundlePath + ", user " + imagespec.UserName,
	}})
	if err != nil {
		return nil, fmt.Errorf("append the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = in.Stamp.GOOS, in.Stamp.GOARCH, v1.Time{Time: in.Created}
	cf.Config = v1.Config{
		User: imagespec.User(), Entrypoint: imagespec.Entrypoint(), Cmd: imagespec.Cmd(), Env: imagespec.Env(), WorkingDir: "/",
		ExposedPorts: map[string]struct{}{}, Labels: Labels(in.Stamp, in.Created),
	}
	for _, p := range imagespec.ExposedPorts() {
		cf.Config.ExposedPorts[p] = struct{}{}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set the config: %w", err)
	}
	return img, nil
}

// passwdFile is /etc/passwd: root and the user, so that tools show a name.
func passwdFile() string {
	return fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:%s:/sbin/nologin\n", imagespec.UserName, imagespec.UID, imagespec.GID, imagespec.UserName, imagespec.DataDir)
}

// groupFile is /etc/group.
func groupFile() string {
	return fmt.Sprintf("root:x:0:\n%s:x:%d:\n", imagespec.UserName, imagespec.GID)
}

// layerEntry is one file or directory of the layer.
type layerEntry struct {
	name     string // no leading /; a directory ends in /
	mode     int64
	uid, gid int
	body     []byte
}

// layerTar is the layer's tar: the files sorted by name, each with fixed
// owners, modes and mtime.
func layerTar(in Input) ([]byte, error) {
	entries := []layerEntry{
		{name: "data/", mode: 0o700, uid: imagespec.UID, gid: imagespec.GID},
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, body: []byte(groupFile())},
		{name: "etc/passwd", mode: 0o644, body: []byte(passwdFile())},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: strings.TrimPrefix(imagespec.CABundlePath, "/"), mode: 0o644, body: in.CABundle},
		{name: "tmp/", mode: 0o1777},
		{name: "usr/", mode: 0o755},
		{name: "usr/local/", mode: 0o755},
		{name: "usr/local/bin/", mode: 0o755},
		{name: strings.TrimPrefix(imagespec.BinaryPath, "/"), mode: 0o755, body: in.Binary},
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := writeEntry(tw, e, in.Created); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

func writeEntry(tw *tar.Writer, e layerEntry, mtime time.Time) error {
	h := &tar.Header{
		Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mtime,
		Uname: "root", Gname: "root",
	}
	if e.uid == imagespec.UID {
		h.Uname, h.Gname = imagespec.UserName, imagespec.UserName
	}
	if strings.HasSuffix(e.name, "/") {
		h.Typeflag = tar.TypeDir
	} else {
		h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
	}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("layer: %s: %w", e.name, err)
	}
	if _, err := tw.Write(e.body); err != nil {
		return fmt.Errorf("layer: %s: %w", e.name, err)
	}
	return nil
}
