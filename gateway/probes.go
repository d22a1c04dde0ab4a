package gateway

import (
	"context"
	"encoding/json"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/vmshelf/vmshelf/internal/apierr"
	"github.com/vmshelf/vmshelf/internal/readiness"
)

// The data plane's own probes, on its own port: a probe of the control
// plane's port cannot tell a data plane that stopped serving. They are the
// control plane's paths and answers, for the data plane's part: alive, and
// ready when the record store and the image storage answer (the disk's
// room and the machines are the control plane's to report).
const (
	healthzPath = "/healthz"
	readyzPath  = "/readyz"
	// probeTimeout bounds a readiness check, so that a hung store or disk
	// makes the probe fail instead of hang.
	probeTimeout = 2 * time.Second
)

// probePaths are the paths of the probes.
var probePaths = []string{healthzPath, readyzPath}

// readyAnswer and notReadyAnswer are the control plane's /readyz bodies.
type readyAnswer struct {
	Status string `json:"status"`
}

type notReadyAnswer struct {
	Error   string   `json:"error"`
	Reason  string   `json:"reason"`
	Reasons []string `json:"reasons"`
}

// handleProbe answers GET and HEAD of a probe path.
func (g *Gateway) handleProbe(ctx *fasthttp.RequestCtx, path string) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "GET, HEAD")
		return
	}
	ctx.Response.Header.Set("Cache-Control", "no-store")
	if path == healthzPath {
		writeJSON(ctx, fasthttp.StatusOK, readyAnswer{Status: "ok"})
		return
	}
	asked := time.Now()
	problems := g.notReady()
	g.readiness.Note(asked, problems)
	if len(problems) == 0 {
		writeJSON(ctx, fasthttp.StatusOK, readyAnswer{Status: "ok"})
		return
	}
	ans := notReadyAnswer{Error: problems[0].Msg, Reason: problems[0].Reason}
	for _, p := range problems {
		ans.Reasons = append(ans.Reasons, p.Reason)
	}
	writeJSON(ctx, fasthttp.StatusServiceUnavailable, ans)
}

// notReady asks the record store and the image storage at once, each
// within probeTimeout, and returns why the data plane is not ready, the
// store's problem first; none when it is.
func (g *Gateway) notReady() []*apierr.Error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	storeErr, blobErr := readiness.Ask(ctx, g.store.Ping, g.blobs.Ping)
	var out []*apierr.Error
	for _, p := range []*apierr.Error{readiness.Store(storeErr), readiness.Blobs(blobErr)} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// writeJSON answers status with v as JSON.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, _ := json.Marshal(v) // the probes' answers always encode
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
