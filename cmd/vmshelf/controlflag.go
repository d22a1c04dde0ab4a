package main

import "flag"

// defaultControlAddr is serve's --control-addr by default: where the
// control plane of `make run` (and of any serve left at its default)
// listens.
const defaultControlAddr = "127.0.0.1:8481"

// defineControl defines --control, the edge's control plane, for the
// commands a box runs against it (upload, images, rm): by default the one
// `make run` serves, so that trying the walk-through needs no flag; from
// VMSHELF_CONTROL like every flag.
func defineControl(fs *flag.FlagSet, control *string) {
	fs.StringVar(control, "control", "http://"+defaultControlAddr,
		"the edge's control plane URL; the default is where 'make run' serves it")
}
