package testguest

import "fmt"

// asm is a two-pass assembler of the smallest kind: each instruction is
// written as its hand-encoded bytes beside its GNU as text (Intel syntax,
// .code16), and the only thing it computes is where labels land: short and
// near jumps, calls and absolute addresses of data. Keeping the text beside
// the bytes is what lets TestBootSectorMatchesGNUAs assemble the same program
// with binutils, where it is installed, and compare every byte.
type asm struct {
	org    uint16 // where the BIOS loads the sector: 0x7C00
	code   []byte
	src    []string // the GNU as text, one line per instruction or label
	labels map[string]int
	fixups []fixup
}

type fixupKind int

const (
	rel8  fixupKind = iota // a short jump's displacement, from the next instruction
	rel16                  // a near call's or jump's displacement
	abs16                  // a label's address, org-based, as an immediate
)

type fixup struct {
	at    int // offset of the field in code
	end   int // offset of the next instruction (rel8, rel16)
	kind  fixupKind
	label string
}

func newAsm(org uint16) *asm {
	return &asm{org: org, labels: map[string]int{}}
}

// op emits an instruction with no label operand.
func (a *asm) op(text string, b ...byte) {
	a.src = append(a.src, "\t"+text)
	a.code = append(a.code, b...)
}

// label marks where the next instruction or datum lands.
func (a *asm) label(name string) {
	if _, dup := a.labels[name]; dup {
		panic("testguest: label defined twice: " + name)
	}
	a.labels[name] = len(a.code)
	a.src = append(a.src, name+":")
}

// jshort emits a short jump (EB) or conditional jump (7x) to label: the
// opcode and a rel8 filled in by finish. text is the as line, e.g. "jz done".
func (a *asm) jshort(text string, opcode byte, label string) {
	a.src = append(a.src, "\t"+text)
	a.code = append(a.code, opcode, 0)
	a.fixups = append(a.fixups, fixup{at: len(a.code) - 1, end: len(a.code), kind: rel8, label: label})
}

// call emits a near call (E8 rel16) to label.
func (a *asm) call(label string) {
	a.src = append(a.src, "\tcall "+label)
	a.code = append(a.code, 0xE8, 0, 0)
	a.fixups = append(a.fixups, fixup{at: len(a.code) - 2, end: len(a.code), kind: rel16, label: label})
}

// immLabel emits an instruction whose last field is a label's absolute
// address as a 16-bit immediate ("mov si, offset banner"): the bytes before
// that field, then the address.
func (a *asm) immLabel(text, label string, opcode ...byte) {
	a.src = append(a.src, "\t"+text)
	a.code = append(a.code, opcode...)
	a.code = append(a.code, 0, 0)
	a.fixups = append(a.fixups, fixup{at: len(a.code) - 2, kind: abs16, label: label})
}

// asciz emits a string's bytes and a terminating zero.
func (a *asm) asciz(s string) {
	a.src = append(a.src, fmt.Sprintf("\t.asciz %q", s))
	a.code = append(a.code, s...)
	a.code = append(a.code, 0)
}

// finish resolves the labels and returns the code.
func (a *asm) finish() ([]byte, error) {
	for _, f := range a.fixups {
		at, ok := a.labels[f.label]
		if !ok {
			return nil, fmt.Errorf("label %q is used but never defined", f.label)
		}
		switch f.kind {
		case rel8:
			d := at - f.end
			if d < -128 || d > 127 {
				return nil, fmt.Errorf("short jump to %q is %d bytes away, more than a rel8 reaches", f.label, d)
			}
			a.code[f.at] = byte(int8(d))
		case rel16:
			d := uint16(int16(at - f.end))
			a.code[f.at], a.code[f.at+1] = byte(d), byte(d>>8)
		case abs16:
			v := a.org + uint16(at)
			a.code[f.at], a.code[f.at+1] = byte(v), byte(v>>8)
		}
	}
	return a.code, nil
}
