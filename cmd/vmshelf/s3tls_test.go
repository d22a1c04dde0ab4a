package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore/s3/s3test"
)

// TestE2EUploadOverHTTPSS3: serve over a bucket on an https endpoint whose
// self-signed certificate it trusts through SSL_CERT_FILE, as docs/scale-
// out.md says: an image of several parts (sent unsigned, with their
// CRC32C, by default over https) is stored, committed and fetched whole.
func TestE2EUploadOverHTTPSS3(t *testing.T) {
	needTool(t, "curl")
	needQemu(t)
	bucket := s3test.StartServerTLS(t)
	env := []string{
		"AWS_ENDPOINT_URL=" + bucket.Config.Endpoint,
		"AWS_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=" + string(bucket.Config.AccessKeyID),
		"AWS_SECRET_ACCESS_KEY=" + string(bucket.Config.SecretAccessKey),
		"SSL_CERT_FILE=" + bucket.Cert.CertFile,
	}
	s := startServe(t, filepath.Join(t.TempDir(), "data"),
		[]string{"--blobs", "s3://" + bucket.Config.Bucket + "/edge", "--blob-capacity-gib", "4"}, env...)
	s.secret(string(bucket.Config.SecretAccessKey))
	// 20 MiB of data: three parts of 8 MiB.
	file, data := makeImageData(t, t.TempDir(), "tls.qcow2", 20)
	img := s.upload(t, s.ticket(t, "tls"), file, data)
	if n, sum := fetchAll(t, s.fetchURL(t, img.UploadID), 20*time.Second); n != int64(len(data)) || sum != sha256hex(data) {
		t.Fatalf("fetch over the https bucket: %d bytes, sha256 %s; want %d, %s", n, sum, len(data), sha256hex(data))
	}
}
