package qcow2

import "encoding/binary"

type phase int

const (
	phaseFixed phase = iota // buffering the fixed header
	phaseSkip               // skipping to skipTo (header tail, extension data)
	phaseExt                // reading an 8-byte extension header
	phaseDone               // accepted
	phaseRejected
)

// Inspector checks a QCOW2 header as the bytes stream in. It buffers at
// most the first 105 bytes; the rest of the first cluster (header tail
// and header extensions, at most 2 MiB) is parsed on the fly and never
// stored. An Inspector is for one stream and one goroutine.
type Inspector struct {
	limits Limits
	phase  phase
	pos    uint64 // bytes consumed
	fixed  [fixedMax]byte
	need   int // phaseFixed: prefix length parseFixed wants next
	hdr    *Header
	skipTo uint64  // phaseSkip: offset where skipping ends
	ext    [8]byte // phaseExt: the extension header being read
	extN   int     // bytes of ext read
	rej    *Reject // set once rejected; returned from then on
}

// NewInspector returns an Inspector enforcing l.
func NewInspector(l Limits) *Inspector {
	return &Inspector{limits: l, need: 1}
}

// Write consumes the next bytes of the stream. It returns a *Reject as
// soon as the bytes seen decide against the image, and the same *Reject
// on every later call. Once the header is accepted, writes are no-ops
// that return len(p), nil, so the gateway can tee the whole body here.
func (in *Inspector) Write(p []byte) (int, error) {
	n := 0
	for {
		switch in.phase {
		case phaseDone:
			return len(p), nil
		case phaseRejected:
			return n, in.rej
		}
		if n == len(p) {
			return n, nil
		}
		n += in.consume(p[n:])
	}
}

// consume takes bytes of p for the current phase, acts on them once the
// phase has what it needs, and returns how many it took.
func (in *Inspector) consume(p []byte) int {
	switch in.phase {
	case phaseFixed:
		k := copy(in.fixed[in.pos:in.need], p)
		in.pos += uint64(k)
		if int(in.pos) == in.need {
			in.stepFixed()
		}
		return k
	case phaseSkip:
		k := len(p)
		if left := in.skipTo - in.pos; uint64(k) > left {
			k = int(left)
		}
		in.pos += uint64(k)
		if in.pos == in.skipTo {
			in.startExt()
		}
		return k
	case phaseExt:
		k := copy(in.ext[in.extN:], p)
		in.extN += k
		in.pos += uint64(k)
		if in.extN == len(in.ext) {
			in.stepExt()
		}
		return k
	}
	return 0
}

func (in *Inspector) stepFixed() {
	h, need, rej := parseFixed(in.fixed[:in.pos], in.limits)
	switch {
	case rej != nil:
		in.fail(rej)
	case need > 0:
		in.need = need // parseFixed only ever asks for more than it had
	default:
		in.hdr = h
		// Extensions start right after the header; a v3 header_length
		// beyond what we buffered is skipped.
		in.phase = phaseSkip
		in.skipTo = uint64(h.HeaderLength)
		if in.pos == in.skipTo {
			in.startExt()
		}
	}
}

// startExt begins the next header extension at in.pos.
func (in *Inspector) startExt() {
	cs := in.hdr.ClusterSize()
	switch {
	case in.pos == cs:
		// The list filled the cluster exactly; QEMU stops there without
		// an end marker, and so do we.
		in.phase = phaseDone
	case cs-in.pos < uint64(len(in.ext)):
		in.fail(reject(ReasonBadHeader, "header extensions run past the first cluster (%d bytes)", cs))
	default:
		in.phase = phaseExt
		in.extN = 0
	}
}

// stepExt acts on a complete extension header; in.pos is just past it.
func (in *Inspector) stepExt() {
	typ := binary.BigEndian.Uint32(in.ext[0:])
	length := binary.BigEndian.Uint32(in.ext[4:])
	switch typ {
	case extEnd:
		in.phase = phaseDone
		return
	case extBackingFormat:
		in.fail(reject(ReasonBackingFile, "image has a backing file format extension"))
		return
	case extDataFile:
		in.fail(reject(ReasonExternalDataFile, "image names an external data file"))
		return
	case extLUKS:
		in.fail(reject(ReasonEncrypted, "image has a LUKS encryption header extension"))
		return
	}
	// Unknown extensions may be ignored (qcow2.txt); they must still fit.
	padded := (uint64(length) + 7) &^ 7 // length < 2^32: no overflow
	if padded > in.hdr.ClusterSize()-in.pos {
		in.fail(reject(ReasonBadHeader, "header extension %#08x of %d bytes at offset %d overruns the first cluster", typ, length, in.pos-uint64(len(in.ext))))
		return
	}
	in.phase = phaseSkip
	in.skipTo = in.pos + padded
	if in.pos == in.skipTo {
		in.startExt()
	}
}

func (in *Inspector) fail(r *Reject) {
	in.rej = r
	in.phase = phaseRejected
}

// Header returns the accepted header, once the bytes have decided for it.
func (in *Inspector) Header() (*Header, bool) {
	if in.phase != phaseDone {
		return nil, false
	}
	h := *in.hdr
	return &h, true
}

// Finish ends the stream. A stream that ended before the header was
// decided is rejected: notQcow2 if it did not even hold the magic and
// version, badHeader otherwise.
func (in *Inspector) Finish() (*Header, error) {
	switch {
	case in.phase == phaseDone:
		h, _ := in.Header()
		return h, nil
	case in.phase == phaseRejected:
		return nil, in.rej
	case in.pos < 8:
		in.fail(reject(ReasonNotQcow2, "not a QCOW2 image: only %d bytes", in.pos))
	default:
		in.fail(reject(ReasonBadHeader, "file ends at byte %d, inside the QCOW2 header", in.pos))
	}
	return nil, in.rej
}
