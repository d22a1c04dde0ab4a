// Package testguest is a virtual machine for tests: a guest that this
// package builds at run time, and a real QEMU (Debian's qemu-system-x86,
// software emulation) that boots it with its screen on a VNC socket and its
// first serial port on another. The console tests bridge those
// two sockets to a browser the way KubeVirt's vnc and console subresources
// do, and need a guest that shows something and answers something.
//
// The guest is one 512-byte x86 boot sector, hand-assembled here (asm.go,
// each instruction's bytes beside its GNU as text, checked against binutils
// where it is installed). It paints the VGA text screen blue, with a red bar
// across the middle that reads "vmshelf test guest" in yellow, so a
// framebuffer that shows it is plainly not blank; on COM1 it prints
// "guest ready\r\n", then answers every line it receives (ended by CR, LF or
// CR LF) with "echo: <line>\r\n", and an empty line with the prompt again.
// It waits for input with HLT, woken by the serial port's interrupt, so an
// idle guest costs the host next to no CPU.
//
// It is built here, not downloaded, because the tests reach no network and
// a distribution's image would be hundreds of megabytes and a minute of
// software-emulated boot for what 512 bytes show in milliseconds.
package testguest

import (
	"errors"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
)

// What the guest shows and says.
const (
	// Banner is the text on the screen's red bar, centred on row 12.
	Banner = "vmshelf test guest"
	// Prompt is the line the guest prints on COM1 when it starts, and again
	// for every empty line it receives.
	Prompt = "guest ready\r\n"
	// EchoPrefix starts the guest's answer to a line: EchoPrefix, the line,
	// "\r\n".
	EchoPrefix = "echo: "
	// MaxLine is the longest line the guest keeps; the bytes past it are
	// dropped until the line ends.
	MaxLine = 200
	// ImageSize is the size of the disk image Image writes.
	ImageSize = 1 << 20
)

// The colours of the guest's screen as QEMU's standard VGA renders them
// (the VGA BIOS's palette, 6-bit DAC values widened to 8 bits): Background
// fills the screen outside the bar, Bar is the bar's background and Text the
// banner's letters.
var (
	Background = color.RGBA{R: 0x00, G: 0x00, B: 0xA8, A: 0xFF} // VGA blue, attribute 1
	Bar        = color.RGBA{R: 0xA8, G: 0x00, B: 0x00, A: 0xFF} // VGA red, attribute 4
	Text       = color.RGBA{R: 0xFF, G: 0xFF, B: 0x57, A: 0xFF} // VGA yellow, attribute 14
)

// Screen geometry of text mode 3 and where the guest paints.
const (
	cols, rows = 80, 25
	barRow     = 11 // the bar covers rows 11, 12 and 13
	barRows    = 3
	bannerRow  = 12
	bufAddr    = 0x0600 // the line buffer: free conventional memory below the IVT's users
)

// BootSector returns the guest: 512 bytes, the boot signature 0x55 0xAA in
// the last two.
func BootSector() ([]byte, error) {
	code, _, err := program()
	if err != nil {
		return nil, err
	}
	if len(code) > 510 {
		return nil, fmt.Errorf("testguest: the guest is %d bytes, more than the 510 a boot sector holds", len(code))
	}
	sector := make([]byte, 512)
	copy(sector, code)
	sector[510], sector[511] = 0x55, 0xAA
	return sector, nil
}

// Image writes the guest as a raw disk image of ImageSize bytes (the boot
// sector, then zeros) in dir and returns its path. QEMU's IDE disk wants
// whole sectors, and a megabyte looks like a disk to every BIOS.
func Image(dir string) (string, error) {
	sector, err := BootSector()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "guest.img")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("testguest: write image: %w", err)
	}
	_, werr := f.Write(sector)
	if werr == nil {
		werr = f.Truncate(ImageSize)
	}
	if err := errors.Join(werr, f.Close()); err != nil {
		return "", fmt.Errorf("testguest: write image %s: %w", path, err)
	}
	return path, nil
}

// program assembles the guest and returns its code and its GNU as source.
func program() (code []byte, source string, err error) {
	a := newAsm(0x7C00)
	a.label("_start")

	// Segments: the BIOS jumps to 0:7C00 (or 7C0:0) with only DL known;
	// all data is addressed from segment 0, and the jumps are relative, so
	// CS does not matter. The stack grows down from below the sector.
	a.op("cli", 0xFA)
	a.op("xor ax, ax", 0x31, 0xC0)
	a.op("mov ds, ax", 0x8E, 0xD8)
	a.op("mov ss, ax", 0x8E, 0xD0)
	a.op("mov sp, 0x7C00", 0xBC, 0x00, 0x7C)
	a.op("cld", 0xFC) // string instructions count up

	// COM1's interrupt (IRQ 4, vector 0x0C, its far pointer at 0x30) goes
	// to isr, which only acknowledges it: it is there to end the HLT in
	// getc the moment a byte arrives.
	a.immLabel("mov word ptr [0x30], offset isr", "isr", 0xC7, 0x06, 0x30, 0x00)
	a.op("mov word ptr [0x32], 0", 0xC7, 0x06, 0x32, 0x00, 0x00, 0x00)
	a.op("sti", 0xFB)

	// Screen: text mode 3 (80x25, 16 colours; setting it clears what the
	// BIOS printed), cursor hidden so that no blinking cell changes the
	// picture between two looks.
	a.op("mov ax, 0x0003", 0xB8, 0x03, 0x00) // AH=0 set mode, AL=3
	a.op("int 0x10", 0xCD, 0x10)
	a.op("mov ah, 0x01", 0xB4, 0x01)         // set cursor shape
	a.op("mov cx, 0x2000", 0xB9, 0x00, 0x20) // bit 5 of CH: cursor off
	a.op("int 0x10", 0xCD, 0x10)
	a.op("mov ax, 0xB800", 0xB8, 0x00, 0xB8) // the text screen's segment
	a.op("mov es, ax", 0x8E, 0xC0)
	// Every cell a space, white on blue (attribute 0x1F).
	a.op("xor di, di", 0x31, 0xFF)
	a.op("mov ax, 0x1F20", 0xB8, 0x20, 0x1F)
	a.op(fmt.Sprintf("mov cx, %d", cols*rows), 0xB9, lo(cols*rows), hi(cols*rows))
	a.op("rep stosw", 0xF3, 0xAB)
	// The bar: rows 11 to 13, spaces on red (attribute 0x4E: yellow on red).
	barAt := barRow * cols * 2
	a.op(fmt.Sprintf("mov di, %d", barAt), 0xBF, lo(barAt), hi(barAt))
	a.op("mov ax, 0x4E20", 0xB8, 0x20, 0x4E)
	a.op(fmt.Sprintf("mov cx, %d", barRows*cols), 0xB9, lo(barRows*cols), hi(barRows*cols))
	a.op("rep stosw", 0xF3, 0xAB)
	// The banner, centred on row 12, its letters yellow on red.
	textAt := (bannerRow*cols + (cols-len(Banner))/2) * 2
	a.op(fmt.Sprintf("mov di, %d", textAt), 0xBF, lo(textAt), hi(textAt))
	a.immLabel("mov si, offset banner", "banner", 0xBE)
	a.op("mov ah, 0x4E", 0xB4, 0x4E) // the attribute beside each letter
	a.label("paint")
	a.op("lodsb", 0xAC)
	a.op("test al, al", 0x84, 0xC0)
	a.jshort("jz painted", 0x74, "painted")
	a.op("stosw", 0xAB) // letter and attribute
	a.jshort("jmp paint", 0xEB, "paint")
	a.label("painted")

	// COM1 (0x3F8): 115200 8N1, the receive interrupt on, DTR, RTS and
	// OUT2 (which gates the UART's interrupt line on a PC) set. DH stays
	// 0x03 from here on: the port's registers differ only in DL.
	a.op("mov dx, 0x3FB", 0xBA, 0xFB, 0x03) // line control
	a.op("mov al, 0x80", 0xB0, 0x80)        // DLAB: the next two are the divisor
	a.op("out dx, al", 0xEE)
	a.op("mov dl, 0xF8", 0xB2, 0xF8)
	a.op("mov al, 0x01", 0xB0, 0x01) // divisor 1: 115200 baud
	a.op("out dx, al", 0xEE)
	a.op("mov dl, 0xF9", 0xB2, 0xF9)
	a.op("xor al, al", 0x30, 0xC0) // divisor's high byte
	a.op("out dx, al", 0xEE)
	a.op("mov dl, 0xFB", 0xB2, 0xFB)
	a.op("mov al, 0x03", 0xB0, 0x03) // 8 bits, no parity, 1 stop; DLAB off
	a.op("out dx, al", 0xEE)
	a.op("mov dl, 0xF9", 0xB2, 0xF9)
	a.op("mov al, 0x01", 0xB0, 0x01) // interrupt enable: received data
	a.op("out dx, al", 0xEE)
	a.op("mov dl, 0xFC", 0xB2, 0xFC)
	a.op("mov al, 0x0B", 0xB0, 0x0B) // modem control: DTR, RTS, OUT2
	a.op("out dx, al", 0xEE)
	// Unmask IRQ 4 at the master PIC.
	a.op("in al, 0x21", 0xE4, 0x21)
	a.op("and al, 0xEF", 0x24, 0xEF)
	a.op("out 0x21, al", 0xE6, 0x21)

	// ES back to 0 for the line buffer; BL holds the last byte received,
	// so that the LF of a CR LF ends no second line.
	a.op("push ds", 0x1E)
	a.op("pop es", 0x07)
	a.op("xor bl, bl", 0x30, 0xDB)
	a.immLabel("mov si, offset ready", "ready", 0xBE)
	a.call("puts")

	a.label("line")
	a.op(fmt.Sprintf("mov di, 0x%04X", bufAddr), 0xBF, lo(bufAddr), hi(bufAddr))
	a.label("read")
	a.call("getc")
	a.op("cmp al, 0x0A", 0x3C, 0x0A)
	a.jshort("jne notlf", 0x75, "notlf")
	a.op("cmp bl, 0x0D", 0x80, 0xFB, 0x0D) // an LF right after a CR ...
	a.op("mov bl, al", 0x88, 0xC3)         // (MOV leaves the flags alone)
	a.jshort("je read", 0x74, "read")      // ... is that CR's, and ignored
	a.jshort("jmp eol", 0xEB, "eol")
	a.label("notlf")
	a.op("mov bl, al", 0x88, 0xC3)
	a.op("cmp al, 0x0D", 0x3C, 0x0D)
	a.jshort("je eol", 0x74, "eol")
	end := bufAddr + MaxLine
	a.op(fmt.Sprintf("cmp di, 0x%04X", end), 0x81, 0xFF, lo(end), hi(end))
	a.jshort("jae read", 0x73, "read") // full: drop the byte
	a.op("stosb", 0xAA)
	a.jshort("jmp read", 0xEB, "read")

	a.label("eol")
	a.op(fmt.Sprintf("cmp di, 0x%04X", bufAddr), 0x81, 0xFF, lo(bufAddr), hi(bufAddr))
	a.jshort("jne answer", 0x75, "answer")
	a.immLabel("mov si, offset ready", "ready", 0xBE) // an empty line: the prompt again
	a.call("puts")
	a.jshort("jmp read", 0xEB, "read")
	a.label("answer")
	a.op("xor al, al", 0x30, 0xC0) // end the line with a zero for puts
	a.op("stosb", 0xAA)
	a.immLabel("mov si, offset echo", "echo", 0xBE)
	a.call("puts")
	a.op(fmt.Sprintf("mov si, 0x%04X", bufAddr), 0xBE, lo(bufAddr), hi(bufAddr))
	a.call("puts")
	a.immLabel("mov si, offset crlf", "crlf", 0xBE)
	a.call("puts")
	a.jshort("jmp line", 0xEB, "line")

	// puts: write the zero-terminated string at DS:SI to COM1.
	a.label("puts")
	a.op("lodsb", 0xAC)
	a.op("test al, al", 0x84, 0xC0)
	a.jshort("jz putsdone", 0x74, "putsdone")
	a.call("putc")
	a.jshort("jmp puts", 0xEB, "puts")
	a.label("putsdone")
	a.op("ret", 0xC3)

	// putc: write AL to COM1 once its transmit register is empty.
	a.label("putc")
	a.op("mov ah, al", 0x88, 0xC4)
	a.op("mov dx, 0x3FD", 0xBA, 0xFD, 0x03) // line status
	a.label("putcwait")
	a.op("in al, dx", 0xEC)
	a.op("test al, 0x20", 0xA8, 0x20) // transmit holding register empty
	a.jshort("jz putcwait", 0x74, "putcwait")
	a.op("mov al, ah", 0x88, 0xE0)
	a.op("mov dl, 0xF8", 0xB2, 0xF8) // data
	a.op("out dx, al", 0xEE)
	a.op("ret", 0xC3)

	// getc: AL = the next byte from COM1. Between bytes the CPU halts
	// until an interrupt (COM1's, or the BIOS timer's 18 a second): CLI
	// before the look and STI right before HLT (STI takes effect after the
	// next instruction) so that a byte arriving in between still wakes it.
	a.label("getc")
	a.op("mov dx, 0x3FD", 0xBA, 0xFD, 0x03) // line status
	a.label("getcwait")
	a.op("cli", 0xFA)
	a.op("in al, dx", 0xEC)
	a.op("test al, 0x01", 0xA8, 0x01) // data ready
	a.jshort("jnz getcread", 0x75, "getcread")
	a.op("sti", 0xFB)
	a.op("hlt", 0xF4)
	a.jshort("jmp getcwait", 0xEB, "getcwait")
	a.label("getcread")
	a.op("sti", 0xFB)
	a.op("mov dl, 0xF8", 0xB2, 0xF8) // data
	a.op("in al, dx", 0xEC)
	a.op("ret", 0xC3)

	// isr: COM1's interrupt. Reading the byte (in getc) clears the UART's
	// request; here only the PIC is told the interrupt is done.
	a.label("isr")
	a.op("push ax", 0x50)
	a.op("mov al, 0x20", 0xB0, 0x20) // end of interrupt
	a.op("out 0x20, al", 0xE6, 0x20)
	a.op("pop ax", 0x58)
	a.op("iret", 0xCF)

	a.label("banner")
	a.asciz(Banner)
	a.label("ready")
	a.asciz(Prompt)
	a.label("echo")
	a.asciz(EchoPrefix)
	a.label("crlf")
	a.asciz("\r\n")

	code, err = a.finish()
	if err != nil {
		return nil, "", fmt.Errorf("testguest: assemble: %w", err)
	}
	src := ".intel_syntax noprefix\n.code16\n.text\n.globl _start\n"
	for _, l := range a.src {
		src += l + "\n"
	}
	return code, src, nil
}

// lo and hi are the little-endian bytes of a 16-bit immediate.
func lo(v int) byte { return byte(v) }
func hi(v int) byte { return byte(v >> 8) }
