package main

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/vmshelf/vmshelf/internal/headwatch"
)

// Limits of the control plane's HTTP server. Its requests are small (JSON
// bodies capped at 64 KiB, /metrics, probes), so every phase of a
// connection is bounded: a client that stalls, or keeps a connection open
// and idle, cannot hold it for long, and no more than --control-max-conns
// connections are held at once (internal/connlimit: at the cap, of the
// connections with no request in progress or still waiting for their
// body, the one longest without a sign of life makes room for a new one).
const (
	// defaultControlHeaderTimeout bounds the reading of a request's header.
	defaultControlHeaderTimeout = 10 * time.Second
	// defaultControlIdleTimeout closes a keep-alive connection with no
	// request for this long.
	defaultControlIdleTimeout = 60 * time.Second
	// defaultControlMaxConns is the number of control-plane connections
	// held at once. Beyond it a new client takes the place of one longest
	// without a sign of life among those sending nothing, a header still
	// arriving, an idle keep-alive or a body still arriving; when all are
	// busy it waits in the kernel's accept backlog.
	defaultControlMaxConns = 512
	// controlReadTimeout bounds the reading of a whole request, body
	// included (a 64 KiB body needs far less).
	controlReadTimeout = 30 * time.Second
	// controlWriteTimeout bounds a request from the end of its header to
	// the end of its answer (a /metrics scrape included).
	controlWriteTimeout = 60 * time.Second
	// controlMaxHeaderBytes caps a request's header (431 beyond it).
	controlMaxHeaderBytes = 16 << 10
)

// controlServer is the control plane's http.Server with the limits above.
// It serves a headwatch listener (serve wraps it), so that its handler
// reads each request's head as it came (headwatch.Judge).
func controlServer(h http.Handler, f *serveFlags, log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           closeAfterTransferEncoding(h),
		ReadHeaderTimeout: f.controlHeaderTimeout,
		ReadTimeout:       controlReadTimeout,
		WriteTimeout:      controlWriteTimeout,
		IdleTimeout:       f.controlIdleTimeout,
		MaxHeaderBytes:    controlMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	headwatch.Configure(srv)
	return srv
}

// closeAfterTransferEncoding closes the connection after any request that
// came with a Transfer-Encoding. One that also has a Content-Length is
// the shape of request smuggling (the handler refuses it: headwatch sees
// the Content-Length net/http drops): a proxy in front that framed it by
// the length sees the rest as the next request's, we by the chunks, so
// nothing after it on that connection can be trusted to be what the proxy
// sent. A chunked body alone is framed one way, but headwatch, which
// follows each connection's framing to judge every head, does not follow
// chunks: after one, nothing more is read. The data plane (fasthttp)
// closes after such a request too.
func closeAfterTransferEncoding(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 {
			// Set before the handler runs, so that net/http closes after
			// this answer and never reads the next request.
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}
