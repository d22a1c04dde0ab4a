package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/vmshelf/vmshelf/internal/imagespec"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The annotation containerd names an imported image by (its import reads
// it before the OCI one); the OCI one is what podman, skopeo and umoci
// read. Both carry the full reference: Docker 25's bare tag in the OCI one
// made podman name the image localhost/<tag>.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// Refs are the references an archive of a binary with this stamp carries:
// the kit's (imagespec.Repository:KitTag) and the version's.
func Refs(s Stamp) []string {
	return []string{imagespec.Repository + ":" + imagespec.KitTag, imagespec.Repository + ":" + VersionTag(s.Version)}
}

// WriteArchive writes img as one tar that is a `docker save` archive and
// an OCI image layout at once (as Docker 25's docker save): the blobs
// under blobs/sha256/, index.json with one entry per reference,
// manifest.json naming the same blobs with every reference as a RepoTag,
// and oci-layout. Every entry has a fixed mtime, so the archive's bytes
// depend on the image and the references only.
func WriteArchive(w io.Writer, img v1.Image, refs []string) error {
	blobs, docker, err := archiveBlobs(img, refs)
	if err != nil {
		return err
	}
	index, err := archiveIndex(img, refs)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	files := append(blobs,
		archiveFile{"index.json", index},
		archiveFile{"manifest.json", docker},
		archiveFile{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
	)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return fmt.Errorf("archive: %w", err)
		}
	}
	for _, f := range files {
		h := &tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("archive: %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.body); err != nil {
			return fmt.Errorf("archive: %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	return nil
}

type archiveFile struct {
	name string
	body []byte
}

func blobName(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// archiveBlobs are the config, the layers and the manifest as blobs, and
// the docker-save manifest.json that names them.
func archiveBlobs(img v1.Image, refs []string) ([]archiveFile, []byte, error) {
	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, nil, fmt.Errorf("archive: config digest: %w", err)
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return nil, nil, fmt.Errorf("archive: config: %w", err)
	}
	files := []archiveFile{{blobName(cfgName), cfg}}
	docker := tarball.Descriptor{Config: blobName(cfgName), RepoTags: refs}
	layers, err := img.Layers()
	if err != nil {
		return nil, nil, fmt.Errorf("archive: layers: %w", err)
	}
	for _, l := range layers {
		f, err := layerBlob(l)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, f)
		docker.Layers = append(docker.Layers, f.name)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, nil, fmt.Errorf("archive: manifest digest: %w", err)
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, nil, fmt.Errorf("archive: manifest: %w", err)
	}
	files = append(files, archiveFile{blobName(digest), manifest})
	dm, err := json.Marshal(tarball.Manifest{docker})
	if err != nil {
		return nil, nil, fmt.Errorf("archive: manifest.json: %w", err)
	}
	return files, dm, nil
}

func layerBlob(l v1.Layer) (archiveFile, error) {
	d, err := l.Digest()
	if err != nil {
		return archiveFile{}, fmt.Errorf("archive: layer digest: %w", err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return archiveFile{}, fmt.Errorf("archive: layer: %w", err)
	}
	defer rc.Close()
	var b bytes.Buffer
	if _, err := io.Copy(&b, rc); err != nil {
		return archiveFile{}, fmt.Errorf("archive: layer: %w", err)
	}
	return archiveFile{blobName(d), b.Bytes()}, nil
}

// archiveIndex is index.json: the manifest once per reference, each with
// its platform and its full reference in both annotations.
func archiveIndex(img v1.Image, refs []string) ([]byte, error) {
	mt, err := img.MediaType()
	if err != nil {
		return nil, fmt.Errorf("archive: media type: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("archive: manifest digest: %w", err)
	}
	size, err := img.Size()
	if err != nil {
		return nil, fmt.Errorf("archive: manifest size: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("archive: config: %w", err)
	}
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for _, r := range refs {
		tag, err := name.NewTag(r, name.StrictValidation)
		if err != nil {
			return nil, fmt.Errorf("archive: reference %q: %w", r, err)
		}
		idx.Manifests = append(idx.Manifests, v1.Descriptor{
			MediaType: mt, Digest: digest, Size: size,
			Platform:    &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
			Annotations: map[string]string{annotationContainerdName: tag.Name(), annotationRefName: tag.Name()},
		})
	}
	b, err := json.Marshal(idx)
	if err != nil {
		return nil, fmt.Errorf("archive: index.json: %w", err)
	}
	return b, nil
}

// WriteArchiveFile writes the archive to path through a temporary file in
// the same directory, renamed into place once complete: a failed build
// never leaves half an archive under the name an import would take.
func WriteArchiveFile(path string, img v1.Image, refs []string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".vmshelf-image-*.tar")
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing is there
	if err := WriteArchive(tmp, img, refs); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("archive: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	return nil
}
