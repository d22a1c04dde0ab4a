// Package memtrim gives back, once start-up is over, the memory that
// start-up alone needed: the pages of the program's own code and constants
// that the initialisation of its many packages touched (Kubernetes' and
// KubeVirt's type registrations, Stripe's, the flags) and the heap it left
// free.
//
// Why: a Go binary's code and read-only data are mapped from its file.
// Every page start-up touched stays mapped into the process, and counted in
// its resident set, for the life of the process, although most of it is
// never run again (vmshelf's 62 MB binary: about 35 MiB resident right
// after start, of a service sized for 64 MiB). Those pages are clean copies
// of the file: dropping the process's mapping of them loses nothing, and
// the ones the service uses come back from the page cache at their next
// use (a minor fault, no disk read while the file is cached). Pages that
// are no longer mapped by any process are the first the kernel reclaims
// under memory pressure, where mapped code is protected.
//
// Only mappings of the executable without write permission are touched:
// a writable mapping (the program's variables) holds changes that exist
// nowhere else.
package memtrim

import "runtime/debug"

// AfterStartup drops the process's mapping of the resident pages of its
// executable's read-only segments, and returns the heap start-up left free
// to the operating system. It answers how many bytes of mappings it
// advised away (resident or not). Call it once start-up is done, before
// serving: the service's own code faults back as it runs.
func AfterStartup() (int64, error) {
	// The collection first: it walks the goroutines' stacks through the
	// binary's tables, pages that dropping afterwards keeps out.
	debug.FreeOSMemory()
	return dropReadOnly()
}
