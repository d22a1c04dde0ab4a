package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/vmshelf/vmshelf/internal/bootdisk"
	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/qcow2"
)

// errRefused is check's verdict "bad image": exit code 1, the line is
// already printed.
var errRefused = errors.New("image refused")

// checkHelp is "vmshelf check -h".
var checkHelp = cli.Doc{
	Args:    "FILE [flags]",
	Summary: "run the gateway's QCOW2 checks on a local file, offline",
	About: `Runs the checks the edge runs on an upload on the local FILE, so that a box owner ` +
		`learns before uploading whether the edge will take the image, and prints one verdict ` +
		`line on stdout: "ok: " and the image's figures, or "refused (REASON): " and why. It reads ` +
		`the header and the tables, never the data clusters, so it is fast on large images.`,
	Exits: []string{
		`0  the image passes ("ok: ..." on stdout)`,
		`1  the image is refused ("refused (REASON): ..." on stdout)`,
		"2  FILE cannot be read, or a usage error (a bad flag, value or argument)",
	},
}

// check runs the gateway's QCOW2 checks on a local file, so a box owner
// learns before uploading whether the edge will take the image. It reads
// the header and the tables, never the data clusters, so it is fast on
// large images.
func check(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("check", checkHelp)
	maxVirtualGiB := fs.Float64("max-virtual-gib", 512, "largest virtual disk size accepted, in GiB (as the edge's --max-virtual-gib)")
	file := ""
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		file, args = args[0], args[1:]
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if file == "" && fs.NArg() == 1 {
		file = fs.Arg(0)
	} else if fs.NArg() > 0 || file == "" {
		return usagef("check takes one FILE; see vmshelf check -h")
	}
	maxVirtual, err := cli.GiB(*maxVirtualGiB, "max-virtual-gib")
	if err != nil {
		return err
	}
	f, err := os.Open(file)
	if err != nil {
		return usagef("check: %v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return usagef("check: %v", err)
	}
	if !st.Mode().IsRegular() {
		return usagef("check: %s is not a regular file", file)
	}
	h, stats, err := qcow2.Inspect(f, st.Size(), qcow2.Limits{MaxVirtualSize: uint64(maxVirtual)})
	var rej *qcow2.Reject
	switch {
	case errors.As(err, &rej):
		line := fmt.Sprintf("refused (%s): %s", rej.Reason, rej.Msg)
		if h != nil {
			line += " [" + figures(h, nil) + "]"
		}
		fmt.Fprintln(stdout, line+" — "+file)
		return errRefused
	case err != nil:
		return usagef("check: reading %s: %v", file, err)
	}
	fmt.Fprintln(stdout, "ok: "+figures(h, &stats)+", "+startsWith(f, st.Size(), h)+" — "+file)
	return nil
}

// startsWith says which firmware could start the image's disk, as the
// edge reads it at upload (an order refuses the firmware that cannot):
// whether to tick the EFI box, before the upload.
func startsWith(r io.ReaderAt, size int64, h *qcow2.Header) string {
	f, err := bootdisk.StartsQCOW2(r, size, h)
	switch {
	case err != nil:
		return "firmware unknown (" + err.Error() + ")"
	case f == bootdisk.None:
		return "no boot loader: no firmware starts it"
	case f == bootdisk.UEFI:
		return "starts with UEFI only: tick the EFI box"
	case f == bootdisk.BIOS:
		return "starts with a BIOS only: leave the EFI box unticked"
	}
	return "starts with a BIOS or UEFI"
}

// figures is the one-line summary of an image: format version, virtual
// size, cluster size and, once the tables were walked, allocated bytes.
func figures(h *qcow2.Header, s *qcow2.Stats) string {
	out := fmt.Sprintf("qcow2 v%d, virtual size %s, cluster size %s", h.Version, humanBytes(int64(h.VirtualSize)), humanBytes(int64(h.ClusterSize())))
	if s != nil {
		out += ", allocated " + humanBytes(s.AllocatedBytes)
	}
	return out
}

// humanBytes prints a size in binary units with the exact byte count.
func humanBytes(n int64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	if n < 1024 {
		return fmt.Sprintf("%d bytes", n)
	}
	v, u := float64(n)/1024, 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	return fmt.Sprintf("%.4g %s (%d bytes)", v, units[u], n)
}
