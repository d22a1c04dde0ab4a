package main

// Every answer a test receives from a serve it started, through httpClient or
// curlTo, is checked against docs/openapi.yaml: its status must be documented
// for the operation, its headers and JSON body must match, and an error's
// reason must be in the enum of that status. Mismatches fail the test that
// started the server, in its cleanup. What does not go through those two
// (raw connections that send broken HTTP on purpose, the vmshelf upload
// command, the browser tests' page) is not checked here.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// apiSpec is docs/openapi.yaml with one router per plane, loaded once.
var apiSpec struct {
	once     sync.Once
	err      error
	doc      *openapi3.T
	unrouted map[int]*openapi3.Response
	router   map[string]routers.Router // by plane
	mu       sync.Mutex                // one validation at a time: kin-openapi caches compiled schemas
}

func loadAPISpec() error {
	apiSpec.once.Do(func() {
		doc, err := loadAPIDoc()
		if err == nil {
			apiSpec.unrouted, err = unroutedAnswers(doc)
		}
		if err != nil {
			apiSpec.err = err
			return
		}
		apiSpec.doc = doc
		apiSpec.router = map[string]routers.Router{}
		for _, plane := range []string{dataPlane, controlPlane} {
			if apiSpec.router[plane], err = planeRouter(doc, plane); err != nil {
				apiSpec.err = fmt.Errorf("%s router: %w", plane, err)
				return
			}
		}
	})
	return apiSpec.err
}

// planeRouter matches paths of one plane only, whatever the host: the
// tests' servers listen on ports of their own.
func planeRouter(doc *openapi3.T, plane string) (routers.Router, error) {
	cp := *doc
	cp.Servers = nil
	cp.Paths = openapi3.NewPaths()
	for path, item := range doc.Paths.Map() {
		if p, err := planeOf(item); err != nil || (p != plane && p != bothPlanes) {
			continue
		}
		it := *item
		it.Servers = nil
		cp.Paths.Set(path, &it)
	}
	return gorillamux.NewRouter(&cp)
}

// apiWatch collects the mismatches of one server's plane for the test that
// started it.
type apiWatch struct {
	plane    string
	mu       sync.Mutex
	problems []string
}

// apiWatches are the watched servers by host:port.
var apiWatches = struct {
	sync.Mutex
	byHost map[string]*apiWatch
}{byHost: map[string]*apiWatch{}}

// watchAPI checks every answer from dataAddr and ctlAddr until t ends, and
// fails t in its cleanup with the answers the document does not describe.
func watchAPI(t *testing.T, dataAddr, ctlAddr string) {
	t.Helper()
	if err := loadAPISpec(); err != nil {
		t.Fatal(err)
	}
	watches := map[string]*apiWatch{dataAddr: {plane: dataPlane}, ctlAddr: {plane: controlPlane}}
	apiWatches.Lock()
	for host, w := range watches {
		apiWatches.byHost[host] = w
	}
	apiWatches.Unlock()
	t.Cleanup(func() {
		apiWatches.Lock()
		for host, w := range watches {
			if apiWatches.byHost[host] == w {
				delete(apiWatches.byHost, host)
			}
		}
		apiWatches.Unlock()
		for _, w := range watches {
			w.mu.Lock()
			for _, p := range w.problems {
				t.Errorf("the %s answered what docs/openapi.yaml does not describe: %s", w.plane, p)
			}
			w.mu.Unlock()
		}
	})
}

func apiWatchOf(host string) *apiWatch {
	apiWatches.Lock()
	defer apiWatches.Unlock()
	return apiWatches.byHost[host]
}

// apiTransport validates the answers of the watched servers.
type apiTransport struct{ next http.RoundTripper }

func (a apiTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := a.next.RoundTrip(req)
	w := apiWatchOf(req.URL.Host)
	if err != nil || w == nil {
		return resp, err
	}
	// Only JSON bodies are read here, and given back to the caller as
	// they were: the bytes of an image stay a stream.
	var body []byte
	if req.Method != http.MethodHead && isJSONType(resp.Header.Get("Content-Type")) {
		var rerr error
		body, rerr = io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{rerr}))
		if rerr != nil {
			return resp, nil // a body cut off is the test's to see, not a mismatch
		}
	}
	w.check(req.Method, req.URL, req.Header, resp.StatusCode, resp.Header, body)
	return resp, nil
}

// errReader ends a replayed body as the original ended.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}

func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// checkCurlAnswer validates an answer curlTo received (curlWriteOut).
func checkCurlAnswer(method, rawURL string, status int, header http.Header, body []byte) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return
	}
	w := apiWatchOf(u.Host)
	if w == nil {
		return
	}
	if method == http.MethodHead || !isJSONType(header.Get("Content-Type")) {
		body = nil
	}
	w.check(method, u, nil, status, header, body)
}

var (
	// capabilityRun hides capabilities (and upload ids) in the messages.
	capabilityRun = regexp.MustCompile(`[0-9a-f]{16,}`)
	// reasonField names an error's reason in the messages.
	reasonField = regexp.MustCompile(`"reason":"([^"]*)"`)
)

func (w *apiWatch) check(method string, u *url.URL, reqHeader http.Header, status int, header http.Header, body []byte) {
	problem := validateAnswer(w.plane, method, u, reqHeader, status, header, body)
	if m := reasonField.FindSubmatch(body); problem == "" && status >= 400 && m != nil {
		// The reference a person reads lists it too.
		if table, err := documentedError(); err != nil {
			problem = err.Error()
		} else if !table[answer{status, string(m[1])}] {
			problem = fmt.Sprintf("docs/api.md's Errors table does not list %d %s", status, m[1])
		}
	}
	if problem == "" {
		return
	}
	if len(problem) > 1200 {
		problem = problem[:1200] + " …"
	}
	reason := ""
	if m := reasonField.FindSubmatch(body); m != nil {
		reason = " " + string(m[1])
	}
	w.mu.Lock()
	w.problems = append(w.problems, capabilityRun.ReplaceAllString(
		fmt.Sprintf("%s %s → %d%s: %s", method, u.EscapedPath(), status, reason, problem), "[id]"))
	w.mu.Unlock()
}

// validateAnswer returns what is wrong with an answer, or "".
func validateAnswer(plane, method string, u *url.URL, reqHeader http.Header, status int, header http.Header, body []byte) string {
	apiSpec.mu.Lock()
	defer apiSpec.mu.Unlock()
	// A CORS preflight is answered on any path of the data plane.
	if plane == dataPlane && method == http.MethodOptions && reqHeader.Get("Access-Control-Request-Method") != "" && reqHeader.Get("Origin") != "" {
		if status != http.StatusNoContent || header.Get("Access-Control-Allow-Methods") == "" {
			return "a CORS preflight is answered 204 with Access-Control-Allow-Methods"
		}
		return ""
	}
	req := &http.Request{Method: method, URL: &url.URL{Path: u.Path, RawPath: u.RawPath}, Header: reqHeader}
	if req.Header == nil {
		req.Header = http.Header{}
	}
	route, params, err := apiSpec.router[plane].FindRoute(req)
	headOnly := method == http.MethodHead
	if errors.Is(err, routers.ErrMethodNotAllowed) && headOnly && plane == controlPlane {
		// Every GET route of the control plane answers HEAD.
		get := req.Clone(context.Background())
		get.Method = http.MethodGet
		route, params, err = apiSpec.router[plane].FindRoute(get)
	}
	if err != nil {
		// Matches no operation: one of the unrouted answers.
		resp := apiSpec.unrouted[status]
		if resp == nil {
			return fmt.Sprintf("matches no operation (%v), and %d is not among x-unrouted-answers", err, status)
		}
		return validateUnrouted(resp, status, header, body, headOnly)
	}
	if route.Operation.Responses.Status(status) == nil {
		return fmt.Sprintf("%d is not a documented status of %s %s", status, route.Method, route.Path)
	}
	// ValidateResponse skips HEAD altogether; with the body excluded, the
	// status and the headers of a HEAD answer are still checked.
	vreq := req
	if headOnly {
		vreq = req.Clone(context.Background())
		vreq.Method = http.MethodGet
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: headOnly},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return err.Error()
	}
	return ""
}

// validateUnrouted checks an answer against one of x-unrouted-answers.
func validateUnrouted(resp *openapi3.Response, status int, header http.Header, body []byte, headOnly bool) string {
	for name, h := range resp.Headers {
		if h.Value.Required && header.Get(name) == "" {
			return fmt.Sprintf("%d without its %s header", status, name)
		}
	}
	if headOnly {
		return ""
	}
	mt := resp.Content.Get(header.Get("Content-Type"))
	if mt == nil {
		return fmt.Sprintf("%d with Content-Type %q", status, header.Get("Content-Type"))
	}
	v, err := decodeJSONValue(body)
	if err != nil {
		return fmt.Sprintf("%d with a body that is not JSON: %v", status, err)
	}
	if err := mt.Schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		return err.Error()
	}
	return ""
}

func decodeJSONValue(b []byte) (any, error) {
	var v any
	err := json.Unmarshal(b, &v)
	return v, err
}

// curlHeaders reads curl's %{header_json}: lower-case names, each with its
// values.
func curlHeaders(b []byte) (http.Header, error) {
	var m map[string][]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	h := http.Header{}
	for k, vs := range m {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	return h, nil
}

// curlWriteOut is the -w format curlTo uses: status, method and URL on the
// first line, the answer's headers as JSON after it.
const curlWriteOut = "%{http_code} %{method} %{url_effective}\n%{header_json}"

// parseCurlWriteOut splits curl's output of curlWriteOut.
func parseCurlWriteOut(out string) (status int, method, rawURL string, header http.Header, err error) {
	first, rest, _ := strings.Cut(out, "\n")
	f := strings.Fields(first)
	if len(f) != 3 {
		return 0, "", "", nil, fmt.Errorf("curl wrote %q, want status, method and URL", first)
	}
	if status, err = strconv.Atoi(f[0]); err != nil {
		return 0, "", "", nil, err
	}
	if header, err = curlHeaders([]byte(rest)); err != nil {
		header = http.Header{} // no answer (status 000) has no headers
	}
	return status, f[1], f[2], header, nil
}
