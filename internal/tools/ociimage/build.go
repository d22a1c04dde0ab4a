package ociimage

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// GoBuildArgs build the image's binary: static (CGO_ENABLED=0, see
// GoBuildEnv) and stamped as `make build` stamps it (-buildvcs=auto: the
// commit, its time and whether the tree was modified, which `vmshelf
// version` prints and the labels repeat), with -trimpath so that the
// binary (and so the image's digest) does not depend on the checkout's
// path.
func GoBuildArgs(out string) []string {
	return []string{"build", "-buildvcs=auto", "-trimpath", "-o", out, "./cmd/vmshelf"}
}

// GoBuildEnv is the environment of that build: the caller's, with cgo off
// and Linux as the target (the image is a Linux image whatever builds it;
// GOARCH stays the caller's choice).
func GoBuildEnv() []string {
	return append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
}

// BuildBinary runs `go build` in repo, the repository's top, writing the
// static binary to out.
func BuildBinary(ctx context.Context, goCmd, repo, out string) error {
	abs, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("go build: %w", err)
	}
	cmd := exec.CommandContext(ctx, goCmd, GoBuildArgs(abs)...)
	cmd.Dir, cmd.Env = repo, GoBuildEnv()
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", goCmd, strings.Join(GoBuildArgs(abs), " "), err, msg)
	}
	return nil
}

// Source is where an image's parts are read from.
type Source struct {
	Bin string // a static Linux vmshelf (BuildBinary's)
	CA  string // the build machine's bundle, usually imagespec.CABundlePath
	// SourceDateEpoch is $SOURCE_DATE_EPOCH; CommitTime, the commit's
	// time when the binary has none (a build in a git worktree, where the
	// go command finds no repository); see Created.
	SourceDateEpoch string
	CommitTime      func() (time.Time, error)
}

// Load reads the parts and builds the image; it returns the binary's
// stamp too, for the archive's references.
func Load(src Source) (v1.Image, Stamp, error) {
	bin, err := os.ReadFile(src.Bin)
	if err != nil {
		return nil, Stamp{}, fmt.Errorf("the binary: %w", err)
	}
	bi, err := buildinfo.ReadFile(src.Bin)
	if err != nil {
		return nil, Stamp{}, fmt.Errorf("the binary's build information: %w", err)
	}
	if cgo := setting(bi.Settings, "CGO_ENABLED"); cgo != "0" {
		return nil, Stamp{}, fmt.Errorf("%s was built with CGO_ENABLED=%q: the image has no C library, build it with CGO_ENABLED=0", src.Bin, cgo)
	}
	ca, err := os.ReadFile(src.CA)
	if err != nil {
		return nil, Stamp{}, fmt.Errorf("the CA bundle (Debian: apt-get install ca-certificates): %w", err)
	}
	st := StampOf(bi)
	created, err := Created(src.SourceDateEpoch, st)
	if err != nil {
		return nil, Stamp{}, err
	}
	if src.SourceDateEpoch == "" && st.Time == "" && src.CommitTime != nil {
		if t, err := src.CommitTime(); err == nil {
			created = t.UTC()
		}
	}
	img, err := Build(Input{Binary: bin, CABundle: ca, Stamp: st, Created: created})
	return img, st, err
}

func setting(s []debug.BuildSetting, key string) string {
	for _, kv := range s {
		if kv.Key == key {
			return kv.Value
		}
	}
	return ""
}
