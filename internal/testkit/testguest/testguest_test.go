package testguest

import (
	"bufio"
	"bytes"
	"context"
	"image"
	"image/color"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBootSector holds the sector's shape: the code fits, the signature
// closes it, and the image is the sector and zeros.
func TestBootSector(t *testing.T) {
	code, _, err := program()
	if err != nil {
		t.Fatal(err)
	}
	sector, err := BootSector()
	if err != nil {
		t.Fatal(err)
	}
	if len(sector) != 512 || sector[510] != 0x55 || sector[511] != 0xAA {
		t.Fatalf("sector of %d bytes ending % x, want 512 ending 55 aa", len(sector), sector[len(sector)-2:])
	}
	if !bytes.Equal(sector[:len(code)], code) || len(code) > 510 {
		t.Fatalf("sector does not begin with the %d bytes of code", len(code))
	}
	for _, s := range []string{Banner, Prompt, EchoPrefix} {
		if !bytes.Contains(sector, append([]byte(s), 0)) {
			t.Errorf("sector lacks %q", s)
		}
	}
	path, err := Image(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	disk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(disk) != ImageSize || !bytes.Equal(disk[:512], sector) || bytes.ContainsFunc(disk[512:], func(r rune) bool { return r != 0 }) {
		t.Fatalf("image of %d bytes is not the sector and %d zeros", len(disk), ImageSize-512)
	}
}

// TestBootSectorMatchesGNUAs assembles the guest's source text with
// binutils and compares it with the hand-encoded bytes, byte for byte: the
// comments next to the bytes are what the bytes do. It needs as and ld,
// which the Go toolchain does not: where they are missing it skips (CI
// included; the bytes do not change without a commit that this test ran on).
func TestBootSectorMatchesGNUAs(t *testing.T) {
	for _, tool := range []string{"as", "ld"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s missing: apt-get install binutils (%v)", tool, err)
		}
	}
	code, src, err := program()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	run := func(name string, args ...string) {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s\nsource:\n%s", name, strings.Join(args, " "), err, out, src)
		}
	}
	s, o, bin := filepath.Join(dir, "g.s"), filepath.Join(dir, "g.o"), filepath.Join(dir, "g.bin")
	if err := os.WriteFile(s, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	run("as", "--32", "-o", o, s)
	run("ld", "-m", "elf_i386", "-Ttext=0x7C00", "--oformat", "binary", "-o", bin, o)
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(code, want) {
		for i := range min(len(code), len(want)) {
			if code[i] != want[i] {
				t.Fatalf("hand-assembled byte %d (0x%X) is %02x, as says %02x; source:\n%s", i, 0x7C00+i, code[i], want[i], src)
			}
		}
		t.Fatalf("hand-assembled %d bytes, as %d", len(code), len(want))
	}
}

// TestVNC looks at the guest's screen through QEMU's VNC server, as the
// console bridge's viewer will: the blue screen, red bar and yellow banner,
// not a blank or the BIOS's text.
func TestVNC(t *testing.T) {
	g := Start(t, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := g.DialVNC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	// The banner is painted last: once its letters show, the screen is
	// what the guest painted, and it must pass CheckScreen as it is.
	img, err := ReadScreen(ctx, c, func(img *image.RGBA) bool {
		b := img.Bounds()
		rowH := b.Dy() / rows
		for y := bannerRow * rowH; y < (bannerRow+1)*rowH && y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				if near(img.RGBAAt(x, y), Text) {
					return true
				}
			}
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckScreen(img); err != nil {
		t.Fatal(err)
	}
	t.Logf("screen %v shown after %v", img.Bounds().Size(), time.Since(start))
	// The bar's middle row holds the banner: yellow pixels there, and only
	// there.
	b := img.Bounds()
	rowH := b.Dy() / rows
	for y := b.Min.Y; y < b.Max.Y; y++ {
		yellow := false
		for x := b.Min.X; x < b.Max.X; x++ {
			if near(img.RGBAAt(x, y), Text) {
				yellow = true
				break
			}
		}
		if yellow && y/rowH != bannerRow {
			t.Fatalf("banner text on pixel row %d (text row %d), want only on text row %d", y, y/rowH, bannerRow)
		}
	}
}

// TestSerial types a line on the guest's COM1 and reads its answer, as the
// serial console will.
func TestSerial(t *testing.T) {
	g := Start(t, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := g.DialSerial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(d); err != nil {
			t.Fatal(err)
		}
	}
	r := bufio.NewReader(c)
	// readAnswer reads lines until one that is not the Prompt.
	readAnswer := func() string {
		t.Helper()
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("reading the guest's answer: %v (got %q)", err, line)
			}
			if line != Prompt {
				return line
			}
		}
	}
	// The boot's prompt may have gone to nobody: an empty line asks again.
	if _, err := c.Write([]byte("\r")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != Prompt {
		t.Fatalf("after an empty line: %q, %v; want the prompt %q", line, err, Prompt)
	}
	for _, tc := range []struct{ send, want string }{
		{"hello vmshelf\r", EchoPrefix + "hello vmshelf\r\n"},
		{"crlf too\r\n", EchoPrefix + "crlf too\r\n"}, // and no answer to an empty line after it
		{"lf alone\n", EchoPrefix + "lf alone\r\n"},
		{strings.Repeat("x", MaxLine+50) + "\r", EchoPrefix + strings.Repeat("x", MaxLine) + "\r\n"},
	} {
		if _, err := c.Write([]byte(tc.send)); err != nil {
			t.Fatal(err)
		}
		if got := readAnswer(); got != tc.want {
			t.Fatalf("sent %q, the guest answered %q, want %q", tc.send, got, tc.want)
		}
	}
}

// TestCheckScreen holds what counts as the guest's screen, on pictures
// drawn here: blanks and look-alikes fail, a scaled screenshot's blur
// passes.
func TestCheckScreen(t *testing.T) {
	// paint draws a 720x400 text-mode-like screen: fill everywhere, bar on
	// rows 11-13 (16 pixels each), text in the bar's middle row.
	paint := func(fill, bar, text color.RGBA) *image.RGBA {
		img := image.NewRGBA(image.Rect(0, 0, 720, 400))
		for y := range 400 {
			for x := range 720 {
				c := fill
				if y/16 >= barRow && y/16 < barRow+barRows {
					c = bar
					if y/16 == bannerRow && x >= 280 && x < 440 && (x+y)%3 == 0 {
						c = text
					}
				}
				img.SetRGBA(x, y, c)
			}
		}
		return img
	}
	black := color.RGBA{A: 0xFF}
	grey := color.RGBA{R: 0xA8, G: 0xA8, B: 0xA8, A: 0xFF}
	// blur moves each channel 10 towards the middle, as scaling mixes
	// neighbours.
	blur := func(c color.RGBA) color.RGBA {
		for _, v := range []*uint8{&c.R, &c.G, &c.B} {
			if *v < 0x80 {
				*v += 10
			} else {
				*v -= 10
			}
		}
		return c
	}
	for _, tc := range []struct {
		name string
		img  image.Image
		ok   bool
	}{
		{"guest", paint(Background, Bar, Text), true},
		{"guest blurred a little", paint(blur(Background), blur(Bar), blur(Text)), true},
		{"black", paint(black, black, black), false},
		{"empty", image.NewRGBA(image.Rect(0, 0, 0, 0)), false},
		{"BIOS text on black", paint(black, black, grey), false},
		{"blue alone", paint(Background, Background, Background), false},
		{"no banner", paint(Background, Bar, Bar), false},
		{"bar black", paint(Background, black, Text), false},
		{"colours far off", paint(color.RGBA{B: 0x70, A: 0xFF}, Bar, Text), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckScreen(tc.img)
			if (err == nil) != tc.ok {
				t.Fatalf("CheckScreen = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
