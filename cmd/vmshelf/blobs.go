package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/blobfs"
	"github.com/vmshelf/vmshelf/imagestore/s3"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/market"
)

// s3Vars are the environment variables the S3 blobs read, the standard
// ones of AWS's tools, so that a Secret mounted for those works for
// vmshelf. Never flags: the keys are secrets.
var s3Vars = []cli.EnvVar{
	{Name: "AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3", About: "with --blobs s3://…: the S3 server " +
		"(http(s)://host[:port], addressed path-style); unset is AWS itself."},
	{Name: "AWS_REGION or AWS_DEFAULT_REGION", About: "with --blobs s3://…: the region requests are signed for (default us-east-1)."},
	{Name: "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY", About: "with --blobs s3://…: the static credentials, both required."},
	{Name: "AWS_SESSION_TOKEN", About: "with --blobs s3://…: the session token of temporary credentials, if any."},
	{Name: "SSL_CERT_FILE", About: "with --blobs s3://… over https: a PEM bundle of authorities to trust " +
		"for the S3 server's certificate (a private CA, a self-signed one), in place of the system's bundle file."},
	{Name: s3.PayloadSigningEnv, About: "with --blobs s3://…: how each part is protected on the way, " +
		"auto (default), signed or unsigned. Signed: its SHA-256, signed with the key, a second hash pass over every byte; " +
		"unsigned: its CRC32C, which the server checks, with TLS keeping it from tampering. Auto is unsigned over https, signed over http."},
}

// blobsFlagS3 says whether --blobs names a bucket rather than the default
// image directory.
func blobsFlagS3(v string) bool { return strings.HasPrefix(v, "s3://") }

// validateBlobs checks --blobs and --blob-capacity-gib before any port is
// opened: "" (the images in <data-dir>/vm-images) or s3://bucket/prefix,
// which needs a capacity (an object store has no free space to ask).
func (f *serveFlags) validateBlobs() error {
	switch {
	case f.blobs == "": // --blob-capacity-gib is refused with settingModes
		return nil
	case !blobsFlagS3(f.blobs):
		return usagef("--blobs %q: want s3://bucket/prefix (or leave it empty for <data-dir>/%s)", f.blobs, imagesDir)
	}
	if _, _, err := s3.ParseURL(f.blobs); err != nil {
		return usagef("--blobs %q: %v", f.blobs, err)
	}
	var err error
	if f.blobCapacity, err = cli.GiB(f.blobCapacityGiB, "blob-capacity-gib"); err != nil {
		return usagef("--blobs s3://… needs --blob-capacity-gib, what the bucket may hold for vmshelf, in GiB")
	}
	return nil
}

// openedBlobs are the image bytes serve opened.
type openedBlobs struct {
	imagestore.Blobs
	where string // for messages: the directory or the --blobs URL
	// part is the S3 part size (0 for the directory): a resumable upload
	// makes its progress durable at each part's end, so a replica killed
	// mid-PATCH loses at most the part in flight.
	part int64
	// unfinished reports the bucket's unfinished uploads (nil for the
	// directory, whose partial files start-up removes).
	unfinished market.UnfinishedWrites
}

// openBlobs opens the image bytes of serve: the directory under the data
// dir, or the S3 bucket of --blobs with the endpoint and credentials from
// getenv.
func openBlobs(ctx context.Context, f *serveFlags, getenv func(string) string) (*openedBlobs, error) {
	if !blobsFlagS3(f.blobs) {
		dir := filepath.Join(f.dataDir, imagesDir)
		b, err := blobfs.Open(dir)
		if err != nil {
			return nil, fmt.Errorf("open image directory: %w", err)
		}
		return &openedBlobs{Blobs: b, where: dir}, nil
	}
	b, err := openBucket(ctx, f.blobs, f.uploadMax, f.blobCapacity, getenv)
	if err != nil {
		return nil, err
	}
	return &openedBlobs{Blobs: b, where: f.blobs, part: b.PartSize(), unfinished: b.Unfinished}, nil
}

// openBucket opens the S3 blobs of blobsURL (s3://bucket/prefix).
func openBucket(ctx context.Context, blobsURL string, maxImage, capacity int64, getenv func(string) string) (*s3.Store, error) {
	cfg, err := s3.ConfigFromEnv(getenv)
	if err != nil {
		return nil, usagef("--blobs %s: %v", blobsURL, err)
	}
	if cfg.Bucket, cfg.Prefix, err = s3.ParseURL(blobsURL); err != nil {
		return nil, usagef("--blobs %q: %v", blobsURL, err)
	}
	cfg.MaxImageBytes, cfg.CapacityBytes = maxImage, capacity
	b, err := s3.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open the image bucket (--blobs %s): %w", blobsURL, err)
	}
	return b, nil
}
