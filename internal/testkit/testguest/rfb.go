package testguest

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"io"
	"net"
	"slices"
	"strings"
	"time"
)

// RFB (RFC 6143) encodings this client asks for: Raw pixels, and the
// DesktopSize pseudo-encoding, so that a mode switch of the guest while the
// client looks resizes the picture instead of leaving stale rows.
const (
	encRaw         = 0
	encDesktopSize = -223
)

// ReadScreen speaks RFB 3.8 over c (a VNC server such as QEMU's, with no
// password): the handshake, a 32-bit true-colour pixel format and Raw
// encoding, then framebuffer updates, each applied to the picture it
// returns, until done says the picture is what the caller waits for (done
// nil: the first full update). Every read is bounded by ctx: the deadline
// of c follows it. It leaves c open; the caller closes it.
func ReadScreen(ctx context.Context, c net.Conn, done func(*image.RGBA) bool) (*image.RGBA, error) {
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(d); err != nil {
			return nil, fmt.Errorf("rfb: set deadline: %w", err)
		}
	}
	img, err := readScreen(bufio.NewReader(c), c, done)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	return img, err
}

func readScreen(r *bufio.Reader, w io.Writer, done func(*image.RGBA) bool) (*image.RGBA, error) {
	// ProtocolVersion: the server's 12 bytes, then ours.
	var version [12]byte
	if _, err := io.ReadFull(r, version[:]); err != nil {
		return nil, fmt.Errorf("rfb: read protocol version: %w", err)
	}
	if !strings.HasPrefix(string(version[:]), "RFB 003.") {
		return nil, fmt.Errorf("rfb: not an RFB server: it began with %q", version[:])
	}
	if _, err := io.WriteString(w, "RFB 003.008\n"); err != nil {
		return nil, fmt.Errorf("rfb: write protocol version: %w", err)
	}
	// Security: the server's list of types; we take None (1).
	n, err := r.ReadByte()
	if err != nil {
		return nil, fmt.Errorf("rfb: read security types: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("rfb: server refused the connection: %s", readReason(r))
	}
	types := make([]byte, n)
	if _, err := io.ReadFull(r, types); err != nil {
		return nil, fmt.Errorf("rfb: read security types: %w", err)
	}
	if !strings.ContainsRune(string(types), 1) {
		return nil, fmt.Errorf("rfb: server offers security types %v, not None (1)", types)
	}
	if _, err := w.Write([]byte{1}); err != nil {
		return nil, fmt.Errorf("rfb: choose security type: %w", err)
	}
	var result uint32
	if err := binary.Read(r, binary.BigEndian, &result); err != nil {
		return nil, fmt.Errorf("rfb: read security result: %w", err)
	}
	if result != 0 {
		return nil, fmt.Errorf("rfb: security handshake failed: %s", readReason(r))
	}
	// ClientInit: shared, so that other viewers stay connected.
	if _, err := w.Write([]byte{1}); err != nil {
		return nil, fmt.Errorf("rfb: write ClientInit: %w", err)
	}
	// ServerInit: size, pixel format (replaced below), name.
	var si struct {
		Width, Height uint16
		PixelFormat   [16]byte
		NameLength    uint32
	}
	if err := binary.Read(r, binary.BigEndian, &si); err != nil {
		return nil, fmt.Errorf("rfb: read ServerInit: %w", err)
	}
	if si.NameLength > 1<<16 {
		return nil, fmt.Errorf("rfb: ServerInit names a desktop of %d bytes", si.NameLength)
	}
	if _, err := r.Discard(int(si.NameLength)); err != nil {
		return nil, fmt.Errorf("rfb: read desktop name: %w", err)
	}
	img := image.NewRGBA(image.Rect(0, 0, int(si.Width), int(si.Height)))

	// SetPixelFormat: 32 bits a pixel, depth 24, little-endian, true
	// colour, 8 bits a channel, red at bit 16, green 8, blue 0.
	setPF := []byte{0, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0}
	setEnc := binary.BigEndian.AppendUint16([]byte{2, 0}, 2)
	for _, enc := range []int32{encRaw, encDesktopSize} {
		setEnc = binary.BigEndian.AppendUint32(setEnc, uint32(enc))
	}
	if _, err := w.Write(append(setPF, setEnc...)); err != nil {
		return nil, fmt.Errorf("rfb: set pixel format and encodings: %w", err)
	}
	request := func(incremental bool) error {
		msg := []byte{3, 0, 0, 0, 0, 0}
		if incremental {
			msg[1] = 1
		}
		b := img.Bounds()
		msg = binary.BigEndian.AppendUint16(msg, uint16(b.Dx()))
		msg = binary.BigEndian.AppendUint16(msg, uint16(b.Dy()))
		if _, err := w.Write(msg); err != nil {
			return fmt.Errorf("rfb: request an update: %w", err)
		}
		return nil
	}
	if err := request(false); err != nil {
		return nil, err
	}
	for {
		typ, err := r.ReadByte()
		if err != nil {
			return img, fmt.Errorf("rfb: read server message: %w", err)
		}
		switch typ {
		case 0: // FramebufferUpdate
			resized, err := readUpdate(r, &img)
			if err != nil {
				return img, err
			}
			if !resized && (done == nil || done(img)) {
				return img, nil
			}
			// After a resize only a full update shows the whole picture.
			if err := request(!resized); err != nil {
				return img, err
			}
		case 1: // SetColourMapEntries: not used in true colour; skip it
			var h struct {
				Pad          byte
				First, Count uint16
			}
			if err := binary.Read(r, binary.BigEndian, &h); err != nil {
				return img, fmt.Errorf("rfb: read SetColourMapEntries: %w", err)
			}
			if _, err := r.Discard(6 * int(h.Count)); err != nil {
				return img, fmt.Errorf("rfb: read SetColourMapEntries: %w", err)
			}
		case 2: // Bell
		case 3: // ServerCutText
			var h struct {
				Pad    [3]byte
				Length uint32
			}
			if err := binary.Read(r, binary.BigEndian, &h); err != nil {
				return img, fmt.Errorf("rfb: read ServerCutText: %w", err)
			}
			if _, err := io.CopyN(io.Discard, r, int64(h.Length)); err != nil {
				return img, fmt.Errorf("rfb: read ServerCutText: %w", err)
			}
		default:
			return img, fmt.Errorf("rfb: server message of unknown type %d", typ)
		}
	}
}

// readUpdate reads one FramebufferUpdate (after its type byte) into *img,
// replacing *img by a new picture on a DesktopSize rectangle.
func readUpdate(r *bufio.Reader, img **image.RGBA) (resized bool, err error) {
	var h struct {
		Pad   byte
		Count uint16
	}
	if err := binary.Read(r, binary.BigEndian, &h); err != nil {
		return false, fmt.Errorf("rfb: read FramebufferUpdate: %w", err)
	}
	row := []byte(nil)
	for range h.Count {
		var rect struct {
			X, Y, W, H uint16
			Encoding   int32
		}
		if err := binary.Read(r, binary.BigEndian, &rect); err != nil {
			return resized, fmt.Errorf("rfb: read rectangle: %w", err)
		}
		switch rect.Encoding {
		case encDesktopSize:
			*img = image.NewRGBA(image.Rect(0, 0, int(rect.W), int(rect.H)))
			resized = true
		case encRaw:
			if cap(row) < 4*int(rect.W) {
				row = make([]byte, 4*int(rect.W))
			}
			row = row[:4*int(rect.W)]
			for y := int(rect.Y); y < int(rect.Y)+int(rect.H); y++ {
				if _, err := io.ReadFull(r, row); err != nil {
					return resized, fmt.Errorf("rfb: read raw pixels: %w", err)
				}
				for i := range int(rect.W) {
					p := row[4*i:]
					// Little-endian 32-bit: blue, green, red, unused.
					(*img).SetRGBA(int(rect.X)+i, y, color.RGBA{R: p[2], G: p[1], B: p[0], A: 0xFF})
				}
			}
		default:
			return resized, fmt.Errorf("rfb: rectangle in encoding %d, which was not asked for", rect.Encoding)
		}
	}
	return resized, nil
}

// readReason reads an RFB failure reason (a length and text), for an error.
func readReason(r io.Reader) string {
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil || n > 4096 {
		return "(no reason given)"
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "(no reason given)"
	}
	return string(b)
}

// CheckScreen says whether img shows the guest's screen: Background covers
// more than half of it, the Bar more than a twentieth, the banner's Text
// some pixels, and nothing else more than a tenth. Each colour is matched
// within a small distance, so that a scaled browser screenshot of the
// screen passes too. nil means it does; the error says what it shows.
func CheckScreen(img image.Image) error {
	b := img.Bounds()
	total := b.Dx() * b.Dy()
	if total == 0 {
		return errors.New("the picture is empty (0 pixels)")
	}
	var bg, bar, text, other int
	distinct := map[color.RGBA]int{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			distinct[c]++
			switch {
			case near(c, Background):
				bg++
			case near(c, Bar):
				bar++
			case near(c, Text):
				text++
			default:
				other++
			}
		}
	}
	var problems []string
	if 2*bg <= total {
		problems = append(problems, fmt.Sprintf("background %v on %d of %d pixels, not more than half", Background, bg, total))
	}
	if 20*bar <= total {
		problems = append(problems, fmt.Sprintf("bar %v on %d pixels, not more than a twentieth", Bar, bar))
	}
	if text == 0 {
		problems = append(problems, fmt.Sprintf("no banner text %v", Text))
	}
	if 10*other > total {
		problems = append(problems, fmt.Sprintf("%d pixels of other colours, more than a tenth", other))
	}
	if problems == nil {
		return nil
	}
	return fmt.Errorf("not the guest's screen (%dx%d, %d distinct colours, most common %s): %s",
		b.Dx(), b.Dy(), len(distinct), mostCommon(distinct), strings.Join(problems, "; "))
}

func near(a, b color.RGBA) bool {
	d := func(x, y uint8) bool { return int(x)-int(y) < 24 && int(y)-int(x) < 24 }
	return d(a.R, b.R) && d(a.G, b.G) && d(a.B, b.B)
}

// mostCommon names up to three colours of a histogram, most pixels first.
func mostCommon(h map[color.RGBA]int) string {
	type kv struct {
		c color.RGBA
		n int
	}
	var top []kv
	for c, n := range h {
		top = append(top, kv{c, n})
	}
	slices.SortFunc(top, func(a, b kv) int { return b.n - a.n })
	var s []string
	for i := 0; i < len(top) && i < 3; i++ {
		s = append(s, fmt.Sprintf("#%02x%02x%02x×%d", top[i].c.R, top[i].c.G, top[i].c.B, top[i].n))
	}
	return strings.Join(s, ", ")
}
