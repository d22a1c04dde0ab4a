package s3

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// S3's own limits on a multipart upload.
const (
	minPartSize = 5 << 20 // every part but the last
	maxParts    = 10000
)

// DefaultPartFloor is the smallest part size Open chooses by itself. A
// writer holds one part in memory (see writer), plus what spare buffers
// it gets, so the part size is the memory each running upload costs; 8 MiB keeps that small while a part
// request still carries enough bytes that its round trip does not
// dominate (see the package documentation for the measurements).
const DefaultPartFloor = 8 << 20

// Defaults for the Config fields left zero.
const (
	// One upload sends a full part while the next one fills: the part's
	// hash and PUT overlap the filling, and the S3 server works on one
	// part while the next arrives. The spare bounds what that costs the
	// whole process: 1 part buffer (8 MiB at the floor) beyond one per
	// running upload, whatever the number of uploads; one upload alone
	// holds 2 parts of memory, 4 uploads 5. Measured (bench, s3_rss, a
	// fresh serve taking 4 uploads of 256 MiB at once): 83 MiB peak RSS
	// with no spare, 97 MiB with 2 spares and 2 parts in flight, over
	// the 96 MiB the issue allows; hence 1 and 1. A bigger box can give
	// more of both.
	DefaultPartsInFlight = 1
	DefaultSpareParts    = 1

	DefaultPartialGrace = time.Hour
	DefaultUsageTTL     = 5 * time.Second
	DefaultMaxRetries   = 3
	// A readiness probe's write (a probe object put and removed) gets
	// DefaultPingTimeout, and its verdict is kept for DefaultPingTTL.
	DefaultPingTimeout = 2 * time.Second
	DefaultPingTTL     = time.Second
)

// Secret is a credential: it prints as [redacted] in every format and log
// line, so a Config can be logged or wrapped into an error without
// leaking it.
type Secret string

func (Secret) String() string               { return "[redacted]" }
func (Secret) GoString() string             { return `"[redacted]"` }
func (Secret) LogValue() slog.Value         { return slog.StringValue("[redacted]") }
func (Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// Config says where the blobs live and how much they may hold.
type Config struct {
	// Endpoint is the S3 server's URL (http:// or https://, host and
	// port); empty is AWS itself. A custom endpoint is addressed
	// path-style (http://host/bucket/key): S3-compatible servers rarely
	// have a DNS name per bucket.
	Endpoint string
	// Region signs the requests; empty is us-east-1.
	Region string
	// AccessKeyID, SecretAccessKey and SessionToken (optional) are the
	// static credentials. None of them ever appears in an error.
	AccessKeyID     Secret
	SecretAccessKey Secret
	SessionToken    Secret

	// Bucket must exist; Prefix (may be empty) is the folder of the
	// store inside it, without leading or trailing slash.
	Bucket string
	Prefix string

	// MaxImageBytes is the largest blob a writer must be able to take
	// (the service's --upload-max-gib): the part size is chosen so that
	// it fits in S3's 10 000 parts.
	MaxImageBytes int64
	// PartsInFlight is how many full parts one upload may send at once
	// while the next one fills; 1 sends them one by one (still while the
	// next fills), and a writer holds at most 1 + PartsInFlight parts.
	// SpareParts is how many part buffers the whole store may hold beyond
	// one per running upload; a negative number: none, every upload
	// sends one part at a time and holds one part of memory.
	// Zero: DefaultPartsInFlight, DefaultSpareParts.
	PartsInFlight int
	SpareParts    int

	// PartSize overrides the chosen part size (tests use S3's minimum,
	// 5 MiB, to cross boundaries with little data). Zero: chosen.
	PartSize int64
	// CapacityBytes is what the store may hold (--blob-capacity-gib);
	// Available is this less what is stored.
	CapacityBytes int64

	// PartialGrace is how long an unfinished write must have been idle
	// before RemovePartials may remove it: other replicas start up while
	// this one writes, and their start-up cleanup must not take its
	// upload away. Zero: DefaultPartialGrace.
	PartialGrace time.Duration
	// UsageTTL is how old the listing behind Available may be; bytes
	// written by this process's writers since are added to it. Zero:
	// DefaultUsageTTL.
	UsageTTL time.Duration
	// MaxRetries bounds minio-go's retries of one request (with backoff).
	// Zero: DefaultMaxRetries.
	MaxRetries int

	// CallTimeout bounds a call that moves no image bytes, its retries
	// included; IdleTimeout fails a transfer of image bytes that made no
	// progress for that long (see DefaultCallTimeout). PingTimeout and
	// PingTTL are Ping's. Zero: the defaults.
	CallTimeout time.Duration
	IdleTimeout time.Duration
	PingTimeout time.Duration
	PingTTL     time.Duration

	// PayloadSigning says how a part's bytes are protected on the way
	// (see PayloadSigning); zero: PayloadAuto.
	PayloadSigning PayloadSigning

	// RootCAs, if set, are the only authorities an https endpoint's
	// certificate may chain to; nil: the system's (SSL_CERT_FILE and
	// SSL_CERT_DIR, if set, name where they are). Unused when Transport
	// is set.
	RootCAs *x509.CertPool

	// Now is the clock RemovePartials compares ages with; nil: time.Now.
	Now func() time.Time
	// Transport, if set, carries the HTTP requests (tests count them).
	Transport http.RoundTripper
}

// PayloadSigning is how each multipart part's bytes are protected.
//
// Signed: the part's SHA-256 goes in the signed x-amz-content-sha256
// header, and the server refuses a body that does not match it; nobody
// without the secret key can alter the bytes, even over plain http. It
// costs a SHA-256 pass over every byte, on top of the image's own hash
// (21 % of an upload's CPU, measured).
//
// Unsigned: the header says UNSIGNED-PAYLOAD and the part carries its
// CRC32C in x-amz-checksum-crc32c (signed, as every header is), which the
// server checks: a byte damaged on the way is still refused, at the cost
// of a CRC (in hardware: 11.8 GB/s on the 2-core bench box, against
// SHA-256's 0.95 GB/s with SHA-NI). A CRC is no defence against
// someone who alters the bytes on purpose (they recompute it), so this is
// for https, where TLS does that. (minio-go's own PutObject sends
// UNSIGNED-PAYLOAD over https too, with no checksum unless asked for one.)
//
// Auto (the zero value): unsigned over https, signed over http.
//
// An upload keeps what it was created with: S3 wants a CRC32C with every
// part of an upload created for one, and none on another; a replica
// that resumes an upload created with the other setting follows it (it
// signs the parts of a signed upload, and sends the CRC32C of an
// unsigned one's, signed if it signs).
type PayloadSigning string

const (
	PayloadAuto     PayloadSigning = ""
	PayloadSigned   PayloadSigning = "signed"
	PayloadUnsigned PayloadSigning = "unsigned"
)

// PayloadSigningEnv is the environment variable ConfigFromEnv reads
// Config.PayloadSigning from: auto, signed or unsigned.
const PayloadSigningEnv = "VMSHELF_S3_PAYLOAD_SIGNING"

// ParsePayloadSigning reads auto (or ""), signed or unsigned.
func ParsePayloadSigning(s string) (PayloadSigning, error) {
	switch PayloadSigning(s) {
	case "auto", PayloadAuto:
		return PayloadAuto, nil
	case PayloadSigned, PayloadUnsigned:
		return PayloadSigning(s), nil
	}
	return "", fmt.Errorf("s3: payload signing %q: want auto, signed or unsigned", s)
}

// unsigned says whether parts go with UNSIGNED-PAYLOAD and a CRC32C, for
// an endpoint over https (secure) or not.
func (p PayloadSigning) unsigned(secure bool) bool {
	switch p {
	case PayloadSigned:
		return false
	case PayloadUnsigned:
		return true
	}
	return secure
}

// ParseURL reads --blobs s3://bucket/prefix. The prefix may be empty and
// loses its surrounding slashes.
func ParseURL(s string) (bucket, prefix string, err error) {
	u, err := url.Parse(s)
	if err != nil {
		// url's errors quote the input, which might hold a key.
		return "", "", errors.New("s3: --blobs is not a URL: want s3://bucket/prefix")
	}
	if u.User != nil {
		return "", "", errors.New("s3: the --blobs URL must not carry credentials: they come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	if u.Scheme != "s3" {
		return "", "", fmt.Errorf("s3: %q: want s3://bucket/prefix", s)
	}
	if u.Host == "" {
		return "", "", fmt.Errorf("s3: %q: no bucket", s)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.Port() != "" {
		return "", "", fmt.Errorf("s3: %q: want s3://bucket/prefix, nothing else", s)
	}
	prefix = strings.Trim(u.Path, "/")
	if strings.Contains(prefix, "//") {
		return "", "", fmt.Errorf("s3: %q: empty folder in the prefix", s)
	}
	return u.Host, prefix, nil
}

// ConfigFromEnv reads the endpoint, region and credentials the way the AWS
// tools do: AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL), AWS_REGION (or
// AWS_DEFAULT_REGION), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
// AWS_SESSION_TOKEN, and vmshelf's own PayloadSigningEnv. Bucket, prefix
// and sizes are the caller's to fill in. Only static credentials are
// read: both keys must be set.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	c.Endpoint = getenv("AWS_ENDPOINT_URL_S3")
	if c.Endpoint == "" {
		c.Endpoint = getenv("AWS_ENDPOINT_URL")
	}
	c.Region = getenv("AWS_REGION")
	if c.Region == "" {
		c.Region = getenv("AWS_DEFAULT_REGION")
	}
	c.AccessKeyID = Secret(getenv("AWS_ACCESS_KEY_ID"))
	c.SecretAccessKey = Secret(getenv("AWS_SECRET_ACCESS_KEY"))
	c.SessionToken = Secret(getenv("AWS_SESSION_TOKEN"))
	if c.AccessKeyID == "" || c.SecretAccessKey == "" {
		return Config{}, errors.New("s3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must both be set")
	}
	var err error
	if c.PayloadSigning, err = ParsePayloadSigning(getenv(PayloadSigningEnv)); err != nil {
		return Config{}, fmt.Errorf("%w (%s)", err, PayloadSigningEnv)
	}
	if c.Endpoint != "" {
		if _, _, err := endpointHost(c.Endpoint); err != nil {
			return Config{}, err
		}
	}
	return c, nil
}

// endpointHost splits an endpoint URL into minio-go's host and TLS flag.
func endpointHost(endpoint string) (host string, secure bool, err error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", false, errors.New("s3: the endpoint is not a URL: want http(s)://host[:port]")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", false, fmt.Errorf("s3: endpoint %q: want http:// or https://", endpoint)
	case u.Host == "":
		return "", false, fmt.Errorf("s3: endpoint %q: no host", endpoint)
	case u.User != nil:
		// Never echo it: the user part may hold a key.
		return "", false, errors.New("s3: the endpoint URL must not carry credentials")
	case strings.Trim(u.Path, "/") != "" || u.RawQuery != "":
		return "", false, fmt.Errorf("s3: endpoint %q: want scheme://host[:port] only", endpoint)
	}
	return u.Host, u.Scheme == "https", nil
}

// partSizeFor is the part size for blobs of at most maxBytes: the floor,
// or more where maxBytes would need more than 9 999 parts of it (one part
// of the 10 000 is kept spare), rounded up to a MiB.
func partSizeFor(maxBytes, floor int64) int64 {
	const mib = 1 << 20
	need := (maxBytes + maxParts - 2) / (maxParts - 1)
	need = (need + mib - 1) / mib * mib
	return max(floor, need, minPartSize)
}
