// Command mkimage is `make image`: it builds the static vmshelf and writes
// its container image as one archive (internal/tools/ociimage), with no
// container engine. Run from the repository's top:
//
//	go run ./internal/tools/ociimage/mkimage [-o bin/vmshelf-image.tar] [-go go]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmshelf/vmshelf/internal/imagespec"
	"github.com/vmshelf/vmshelf/internal/tools/ociimage"
)

func main() {
	out := flag.String("o", "bin/vmshelf-image.tar", "the archive to write")
	goCmd := flag.String("go", "go", "the go command that builds the binary")
	ca := flag.String("ca", imagespec.CABundlePath, "the CA bundle to put into the image")
	flag.Parse()
	if err := run(*out, *goCmd, *ca); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(out, goCmd, ca string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	bin := strings.TrimSuffix(out, ".tar") + ".bin"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	fmt.Printf("CGO_ENABLED=0 GOOS=linux %s %s\n", goCmd, strings.Join(ociimage.GoBuildArgs(bin), " "))
	if err := ociimage.BuildBinary(ctx, goCmd, ".", bin); err != nil {
		return err
	}
	img, st, err := ociimage.Load(ociimage.Source{
		Bin: bin, CA: ca,
		SourceDateEpoch: os.Getenv("SOURCE_DATE_EPOCH"), CommitTime: commitTime,
	})
	if err != nil {
		return err
	}
	refs := ociimage.Refs(st)
	if err := ociimage.WriteArchiveFile(out, img, refs); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	report(out, refs, st, digest.String())
	return nil
}

// commitTime is HEAD's commit time, for a binary that carries none.
func commitTime() (time.Time, error) {
	b, err := exec.Command("git", "log", "-1", "--format=%ct").Output()
	if err != nil {
		return time.Time{}, err
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(sec, 0), nil
}

func report(out string, refs []string, st ociimage.Stamp, digest string) {
	fmt.Printf("wrote %s: %s (%s/%s), version %s, image %s\n", out, strings.Join(refs, " and "), st.GOOS, st.GOARCH, st.Version, digest)
	if st.Revision == "" {
		fmt.Println("warning: the binary names no commit (the go command found no git repository: none here, or a git worktree, whose .git file it does not follow): the image has no revision label")
	} else {
		fmt.Println("commit", st.Revision)
	}
	fmt.Printf("load it with one of: docker load -i %s; podman load -i %s; sudo k3s ctr images import %s (docs/deploy/README.md)\n", out, out, out)
}
