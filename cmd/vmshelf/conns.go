package main

import (
	"flag"
	"log/slog"
	"net"
	"syscall"

	"github.com/vmshelf/vmshelf/internal/connlimit"
)

// The data plane's connection cap. Its transfers are few (--max-transfers,
// plus fetches queued for a slot), but a client that opens connections and
// sends nothing costs a descriptor and a goroutine each; with no cap, a
// flood from one address used every descriptor the process had, and a
// process out of descriptors can open neither an image nor the store.
const (
	// descriptorReserve is what the data plane's default leaves aside for
	// everything that is not one of its connections: images being written
	// or read, the store, S3, the log, the listeners.
	descriptorReserve = 128
	// maxDefaultDataConns bounds the default where descriptors abound: at
	// about 20 KiB each, 4 096 idle connections are some 80 MiB.
	maxDefaultDataConns = 4096
	// minDefaultDataConns is the default's floor on a tiny limit.
	minDefaultDataConns = 16
)

// defaultDataMaxConns is --data-max-conns when it is not given: half the
// descriptors left after descriptorReserve (the other half is for the
// control plane), within [minDefaultDataConns, maxDefaultDataConns].
// nofile is the process's RLIMIT_NOFILE soft limit, which Go raises to
// the hard limit at start-up.
func defaultDataMaxConns(nofile uint64) int {
	if nofile <= descriptorReserve+2*minDefaultDataConns {
		return minDefaultDataConns
	}
	return int(min((nofile-descriptorReserve)/2, maxDefaultDataConns))
}

// noFileLimit is the process's descriptor limit (soft), or 0 if unknown.
func noFileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return lim.Cur
}

// resolveDataMaxConns fills f.dataMaxConns from the descriptor limit when
// neither the flag nor its variable was given (a given 0 stays, and
// validate refuses it).
func (f *serveFlags) resolveDataMaxConns(fs *flag.FlagSet) {
	given := false
	fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == "data-max-conns" })
	if given {
		return
	}
	if n := noFileLimit(); n > 0 {
		f.dataMaxConns = defaultDataMaxConns(n)
		return
	}
	f.dataMaxConns = maxDefaultDataConns
}

// connLimits wraps both planes' listeners in their connection caps,
// counting each plane's evictions, and warns when the caps together do
// not fit the descriptor limit (the accept retry keeps serve alive then,
// but a new client waits for a descriptor).
func connLimits(dataLn, ctlLn net.Listener, f *serveFlags, evicted *connlimit.Evictions, log *slog.Logger) (data, ctl *connlimit.Listener) {
	data = connlimit.New(dataLn, f.dataMaxConns, evicted.Counted("data"), connlimit.WithLog(log.With("plane", "data")))
	ctl = connlimit.New(ctlLn, f.controlMaxConns, evicted.Counted("control"), connlimit.WithLog(log.With("plane", "control")))
	if n := noFileLimit(); n > 0 && uint64(f.dataMaxConns+f.controlMaxConns+descriptorReserve) > n {
		log.Warn("the connection caps do not fit the descriptor limit: at the limit new clients wait",
			"data_max_conns", f.dataMaxConns, "control_max_conns", f.controlMaxConns, "reserve", descriptorReserve, "nofile", n)
	}
	return data, ctl
}
