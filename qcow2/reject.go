package qcow2

import "fmt"

// Reasons a Reject carries; the upload gateway maps them to API errors.
const (
	ReasonNotQcow2            = "notQcow2"
	ReasonBackingFile         = "backingFile"
	ReasonExternalDataFile    = "externalDataFile"
	ReasonEncrypted           = "encrypted"
	ReasonCorrupt             = "corrupt"
	ReasonBadHeader           = "badHeader"
	ReasonVirtualSizeTooLarge = "virtualSizeTooLarge"
)

// Reject is the refusal of an image: Reason is one of the Reason*
// constants, Msg says what in the bytes decided it (safe to show to the
// uploader: it names fields and numbers, never file contents). Match it
// with errors.As.
type Reject struct {
	Reason string
	Msg    string
}

func (r *Reject) Error() string { return "qcow2: " + r.Reason + ": " + r.Msg }

func reject(reason, format string, args ...any) *Reject {
	return &Reject{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}
