// Package catalogue is the list of systems a buyer can start without
// uploading a disk: cloud images from their own projects' download
// addresses, the LosOS demo disk from a container registry, and
// installation ISOs, offered only where the edge has a browser console to
// install with (WithConsole). One list is
// built in (vm-images.json); an operator replaces it with a file of the same
// shape (vmshelf serve --vm-catalogue), checked just as strictly, so that a
// mistake stops start-up instead of surfacing as a failed import days later.
//
// The file's shape is the public answer of GET /market/vm-images:
//
//	{"catalogue": [{"id", "name", "source", "url", "format", "efi",
//	                "min_memory_mib", "min_disk_gib"}, ...],
//	 "not_offered": [{"name", "reason"}, ...]}
package catalogue

import (
	"bytes"
	"crypto/sha256"
	_ "embed" // the built-in catalogue
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/distribution/reference"
)

// Where an entry's disk comes from.
const (
	// SourceCloud is a cloud image a CDI importer downloads over https.
	SourceCloud = "cloud"
	// SourceLosOS is the LosOS demo disk, a KubeVirt containerDisk in a
	// registry (a docker:// reference).
	SourceLosOS = "losos"
	// SourceISO is an installation ISO a CDI importer downloads over
	// https into the replica's CD-ROM; the installer writes the system to
	// a blank disk. Installing needs a console in the browser, so an ISO
	// entry is offered only by a catalogue told the console exists
	// (WithConsole); otherwise it is listed as not offered.
	SourceISO = "iso"
)

// ReasonNeedsConsole is why an ISO entry is not offered by an edge without
// a browser console: its not_offered reason in the public answer (the
// market's needsConsole refusal says the same).
const ReasonNeedsConsole = "This system installs from an ISO and needs the browser console, which this edge does not offer yet."

// Formats of a cloud image file: the format of the disk inside, also when
// the file is compressed. CDI's http source reads a plain qcow2 or raw
// file, and also one compressed with xz or gzip (it unpacks it on the way,
// a qcow2 through scratch space as large as the disk); it reads no
// archive. Plain files are preferred where a project publishes both, and
// some (FreeBSD) publish only xz.
const (
	FormatQCOW2 = "qcow2"
	FormatRaw   = "raw"
)

// Limits of a catalogue. They are far beyond a real list and only catch
// typos and wrong files.
const (
	maxFileSize  = 1 << 20   // bytes of a catalogue file
	maxEntries   = 500       // systems in each list
	maxMemoryMiB = 256 << 10 // 256 GiB: more than any box has
	maxDiskGiB   = 4 << 10   // 4 TiB
	maxNameLen   = 80        // characters of a name
	maxReasonLen = 400       // characters of a not_offered reason
	maxURLLen    = 2048      // bytes of a url
)

// Entry is one system of the catalogue. The JSON names are those of
// docs/catalogue.md "Fields" and of the public GET /market/vm-images.
type Entry struct {
	// ID names the entry in an order's "image"; a DNS label.
	ID string `json:"id"`
	// Name is what the machines page shows.
	Name string `json:"name"`
	// Source is SourceCloud, SourceLosOS or SourceISO.
	Source string `json:"source"`
	// URL is an https address of the image file (cloud), of the ISO
	// (iso), or a docker://registry/path:tag reference (losos).
	URL string `json:"url"`
	// Format is FormatQCOW2 or FormatRaw for a cloud image; empty for a
	// registry disk, which carries its own, and for an ISO.
	Format string `json:"format,omitempty"`
	// EFI: the image boots with UEFI firmware only (secure boot off).
	// Images that boot both ways say false and get the default BIOS.
	EFI bool `json:"efi"`
	// MinMemoryMiB and MinDiskGiB are what the image needs at least (for
	// an ISO, what its installer needs and what it installs onto); a
	// replica gets max(the edge's size, these). 0: no more than the edge's.
	MinMemoryMiB int `json:"min_memory_mib"`
	MinDiskGiB   int `json:"min_disk_gib"`
}

// NotOffered is a system users ask for that the catalogue does not carry,
// with the reason in words a box owner understands.
type NotOffered struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Catalogue is a validated list of entries. It is immutable and safe for
// concurrent use; build it with Builtin, Load or Parse. As built, it
// offers no ISO entry (the edge has no browser console to install with):
// Lookup does not find one, Withheld does, and the public answer lists it
// under not_offered with ReasonNeedsConsole. WithConsole offers them.
type Catalogue struct {
	all        []Entry        // every entry of the file, ISOs included
	entries    []Entry        // the entries offered
	notOffered []NotOffered   // the file's not_offered
	answered   []NotOffered   // not_offered of the answer: the file's and the ISOs withheld
	byID       map[string]int // id -> index in all
	console    bool           // ISO entries are offered
	body       []byte         // the public answer, built once
	etag       string         // strong ETag of body
}

// answer is the file's and the public answer's shape.
type answer struct {
	Catalogue  []Entry      `json:"catalogue"`
	NotOffered []NotOffered `json:"not_offered"`
}

//go:embed vm-images.json
var builtinFile []byte

// Builtin returns the built-in catalogue. The embedded file is checked by
// the package's tests; a build whose file is invalid panics here, at start.
func Builtin() *Catalogue {
	c, err := Parse(builtinFile)
	if err != nil {
		panic("catalogue: the built-in vm-images.json is invalid: " + err.Error())
	}
	return c
}

// Load reads and validates the catalogue file at path. Its errors are one
// line naming the file, the entry and the problem.
func Load(path string) (*Catalogue, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("catalogue file %s: %w", path, withoutPath(err))
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("catalogue file %s: %w", path, withoutPath(err))
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("catalogue file %s is larger than %d KiB; a catalogue is a short list (is it the right file?)",
			path, maxFileSize>>10)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("catalogue file %s: %w", path, err)
	}
	return c, nil
}

// withoutPath drops the path an *fs.PathError repeats, keeping what was
// done and why it failed.
func withoutPath(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return fmt.Errorf("cannot %s it: %w", pe.Op, pe.Err)
	}
	return err
}

// Parse validates a catalogue document. An error names where the problem
// is (catalogue[i] with its id, not_offered[i] with its name) and what it
// is, in one line.
func Parse(b []byte) (*Catalogue, error) {
	// encoding/json would quietly turn invalid UTF-8 into U+FFFD.
	if !utf8.Valid(b) {
		return nil, errors.New("not valid UTF-8")
	}
	var doc struct {
		Catalogue  []json.RawMessage `json:"catalogue"`
		NotOffered []json.RawMessage `json:"not_offered"`
	}
	if err := decodeObject(b, &doc, "catalogue", "not_offered"); err != nil {
		return nil, fmt.Errorf("the catalogue %w", err)
	}
	switch {
	case len(doc.Catalogue) == 0:
		return nil, errors.New(`"catalogue" lists no system; it needs at least one entry`)
	case len(doc.Catalogue) > maxEntries || len(doc.NotOffered) > maxEntries:
		return nil, fmt.Errorf("more than %d entries in a list; is it the right file?", maxEntries)
	}

	c := &Catalogue{byID: make(map[string]int, len(doc.Catalogue)), notOffered: []NotOffered{}}
	names := map[string]int{} // lower-cased entry name -> index
	for i, raw := range doc.Catalogue {
		var e Entry
		if err := decodeObject(raw, &e, "id", "name", "source", "url", "format", "efi", "min_memory_mib", "min_disk_gib"); err != nil {
			return nil, fmt.Errorf("catalogue[%d]%s %w", i, idHint(raw), err)
		}
		where := fmt.Sprintf("catalogue[%d] (id %q)", i, e.ID)
		if e.ID == "" {
			where = fmt.Sprintf("catalogue[%d]", i)
		}
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if j, dup := c.byID[e.ID]; dup {
			return nil, fmt.Errorf("%s: catalogue[%d] has the same id; ids must be unique", where, j)
		}
		if j, dup := names[strings.ToLower(e.Name)]; dup {
			return nil, fmt.Errorf("%s: catalogue[%d] has the same name %q; a buyer could not tell them apart", where, j, e.Name)
		}
		c.byID[e.ID] = i
		names[strings.ToLower(e.Name)] = i
		c.all = append(c.all, e)
	}
	refused := map[string]int{}
	for i, raw := range doc.NotOffered {
		var n NotOffered
		if err := decodeObject(raw, &n, "name", "reason"); err != nil {
			return nil, fmt.Errorf("not_offered[%d] %w", i, err)
		}
		where := fmt.Sprintf("not_offered[%d] (name %q)", i, n.Name)
		if err := n.validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		key := strings.ToLower(n.Name)
		if j, dup := refused[key]; dup {
			return nil, fmt.Errorf("%s: not_offered[%d] has the same name", where, j)
		}
		if j, offered := names[key]; offered {
			return nil, fmt.Errorf("%s: the same system is offered as catalogue[%d] (id %q)", where, j, c.all[j].ID)
		}
		refused[key] = i
		c.notOffered = append(c.notOffered, n)
	}

	if err := c.build(); err != nil {
		return nil, err
	}
	return c, nil
}

// build derives what c offers from all and console: the offered entries,
// and the public answer with its ETag. Without the console an ISO entry
// joins not_offered (after the file's own) with ReasonNeedsConsole, so the
// page says why it cannot be had here.
func (c *Catalogue) build() error {
	c.entries = []Entry{}
	var withheld []NotOffered
	for _, e := range c.all {
		if e.Source == SourceISO && !c.console {
			withheld = append(withheld, NotOffered{Name: e.Name, Reason: ReasonNeedsConsole})
			continue
		}
		c.entries = append(c.entries, e)
	}
	c.answered = append(slices.Clone(c.notOffered), withheld...)
	body, err := json.Marshal(answer{Catalogue: c.entries, NotOffered: c.answered})
	if err != nil {
		return fmt.Errorf("encoding the catalogue: %w", err)
	}
	c.body = append(body, '\n')
	sum := sha256.Sum256(c.body)
	c.etag = `"` + hex.EncodeToString(sum[:16]) + `"`
	return nil
}

// WithConsole returns the catalogue as offered by an edge that has a
// browser console: its ISO entries are offered like the others. c itself
// is unchanged.
func (c *Catalogue) WithConsole() *Catalogue {
	d := &Catalogue{all: c.all, notOffered: c.notOffered, byID: c.byID, console: true}
	if err := d.build(); err != nil {
		panic("catalogue: re-encoding a catalogue that encoded before: " + err.Error())
	}
	return d
}

// Entries returns the entries offered, in the file's order (a copy).
func (c *Catalogue) Entries() []Entry { return slices.Clone(c.entries) }

// NotOffered returns the systems not offered, as the public answer lists
// them (a copy): the file's, in its order, then the ISO entries withheld
// for lack of a console, with ReasonNeedsConsole.
func (c *Catalogue) NotOffered() []NotOffered { return slices.Clone(c.answered) }

// Lookup returns the offered entry with id: never an ISO entry of a
// catalogue without the console.
func (c *Catalogue) Lookup(id string) (Entry, bool) {
	i, ok := c.byID[id]
	if !ok || c.all[i].Source == SourceISO && !c.console {
		return Entry{}, false
	}
	return c.all[i], true
}

// Withheld reports whether id is an entry of the file that c does not
// offer because it installs from an ISO and the edge has no console: an
// order for it is refused with ReasonNeedsConsole, not as unknown.
func (c *Catalogue) Withheld(id string) bool {
	i, ok := c.byID[id]
	return ok && c.all[i].Source == SourceISO && !c.console
}

// JSON returns the public answer, {"catalogue": [...], "not_offered":
// [...]} and a newline, the same bytes on every call (a copy). It is itself
// a valid catalogue file.
func (c *Catalogue) JSON() []byte { return bytes.Clone(c.body) }

// ETag returns the strong entity tag of JSON(), quoted as in an ETag header.
func (c *Catalogue) ETag() string { return c.etag }

func (e *Entry) validate() error {
	if err := checkID(e.ID); err != nil {
		return err
	}
	if err := checkText("name", e.Name, maxNameLen); err != nil {
		return err
	}
	switch e.Source {
	case SourceCloud:
		if err := checkCloudURL(e.URL); err != nil {
			return err
		}
		if err := checkFormat(e.Format, e.URL); err != nil {
			return err
		}
	case SourceLosOS:
		if err := checkRegistryRef(e.URL); err != nil {
			return err
		}
		if e.Format != "" {
			return fmt.Errorf("format %q is for cloud images; a registry disk carries its own, leave it out", e.Format)
		}
	case SourceISO:
		if err := checkISOURL(e.URL); err != nil {
			return err
		}
		if e.Format != "" {
			return fmt.Errorf("format %q is for cloud images; an ISO is read as it is, leave it out", e.Format)
		}
		if e.MinDiskGiB < 1 {
			return errors.New("min_disk_gib is missing: an ISO installs onto a blank disk, say how large it must be at least")
		}
	case "":
		return fmt.Errorf(`source is missing: %q (an https image), %q (a registry disk) or %q (an https installation ISO)`, SourceCloud, SourceLosOS, SourceISO)
	default:
		return fmt.Errorf("source %q is none of %q, %q and %q", e.Source, SourceCloud, SourceLosOS, SourceISO)
	}
	switch {
	case e.MinMemoryMiB < 0:
		return fmt.Errorf("min_memory_mib %d is negative", e.MinMemoryMiB)
	case e.MinMemoryMiB > maxMemoryMiB:
		return fmt.Errorf("min_memory_mib %d is more than any box has (at most %d MiB); a typo?", e.MinMemoryMiB, maxMemoryMiB)
	case e.MinDiskGiB < 0:
		return fmt.Errorf("min_disk_gib %d is negative", e.MinDiskGiB)
	case e.MinDiskGiB > maxDiskGiB:
		return fmt.Errorf("min_disk_gib %d is more than any box has (at most %d GiB); a typo?", e.MinDiskGiB, maxDiskGiB)
	}
	return nil
}

func (n *NotOffered) validate() error {
	if err := checkText("name", n.Name, maxNameLen); err != nil {
		return err
	}
	return checkText("reason", n.Reason, maxReasonLen)
}

// checkID accepts a DNS label (RFC 1123) that starts with a letter: an id
// ends up in Kubernetes names and labels.
func checkID(id string) error {
	if id == "" {
		return errors.New("id is missing")
	}
	ok := len(id) <= 63 && id[0] >= 'a' && id[0] <= 'z' && id[len(id)-1] != '-'
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-'
	}
	if !ok {
		return fmt.Errorf("id %q is not a DNS label: lower-case letters, digits and '-', at most 63, starting with a letter and not ending with '-'", id)
	}
	return nil
}

// checkText accepts a non-empty line of at most max characters without
// control characters or surrounding spaces: names and reasons are shown
// as they are.
func checkText(field, s string, max int) error {
	switch {
	case strings.TrimSpace(s) == "":
		return fmt.Errorf("%s is missing", field)
	case strings.TrimSpace(s) != s:
		return fmt.Errorf("%s %q has spaces at its start or end", field, s)
	case utf8.RuneCountInString(s) > max:
		return fmt.Errorf("%s is longer than %d characters", field, max)
	case strings.ContainsFunc(s, unicode.IsControl):
		return fmt.Errorf("%s %q has a control character (a line break?)", field, s)
	}
	return nil
}

// archiveSuffixes are the endings of files a cloud image URL must not
// have, longest first so that the message names the whole ending: CDI
// cannot read an archive as a disk, nor a compression other than xz and
// gzip.
var archiveSuffixes = []string{
	".tar.gz", ".tar.xz", ".tar.bz2", ".tar.zst",
	".tgz", ".txz", ".tbz2", ".tar", ".zip", ".7z", ".rar", ".ova",
	".bz2", ".zst", ".lz4",
}

// compressionSuffixes are the compressions CDI's http source unpacks.
var compressionSuffixes = []string{".xz", ".gz"}

// checkCloudURL accepts the https address of a plain image file. The URL
// is shown in errors only once it is known to carry no user info.
func checkCloudURL(s string) error {
	if err := checkHTTPSFile(s, "image"); err != nil {
		return err
	}
	p := strings.ToLower(mustPath(s))
	if strings.HasSuffix(p, ".iso") {
		return fmt.Errorf("url %q is an installer ISO: give it with source %q (offered where the edge has a browser console), or give a cloud image", s, SourceISO)
	}
	for _, suf := range archiveSuffixes {
		if strings.HasSuffix(p, suf) {
			return fmt.Errorf("url %q ends in %s, an archive or a compression CDI cannot read: the edge imports a qcow2 or raw image, plain or compressed with xz or gzip", s, suf)
		}
	}
	return nil
}

// checkISOURL accepts the https address of an ISO file, by the cloud
// source's rules: CDI downloads it as it is, so it must not be an archive
// or a compression either. A name not ending in .iso is accepted (some
// projects' permanent download URLs redirect to the file), but not one
// naming a disk image, which belongs to the cloud source.
func checkISOURL(s string) error {
	if err := checkHTTPSFile(s, "ISO"); err != nil {
		return err
	}
	p := strings.ToLower(mustPath(s))
	for _, suf := range append(slices.Clone(archiveSuffixes), compressionSuffixes...) {
		if strings.HasSuffix(p, suf) {
			return fmt.Errorf("url %q ends in %s, an archive or a compression: the edge imports an ISO as it is, give the plain .iso", s, suf)
		}
	}
	for _, suf := range []string{".qcow2", ".raw", ".img", ".vmdk", ".vhdx"} {
		if strings.HasSuffix(p, suf) {
			return fmt.Errorf("url %q names a disk image (%s), not an ISO: give it with source %q", s, suf, SourceCloud)
		}
	}
	return nil
}

// mustPath is the path of a URL checkHTTPSFile accepted.
func mustPath(s string) string {
	u, _ := url.Parse(s)
	return u.Path
}

// checkHTTPSFile accepts an https URL of a file (what: "image" or
// "ISO"), without user info or a fragment. The URL is shown in errors
// only once it is known to carry no user info.
func checkHTTPSFile(s, what string) error {
	if s == "" {
		return fmt.Errorf("url is missing: the https address of the %s file", what)
	}
	if len(s) > maxURLLen {
		return fmt.Errorf("url is longer than %d bytes", maxURLLen)
	}
	u, err := url.Parse(s)
	if err != nil {
		// url.Error repeats the URL, user info and all: only its cause.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return fmt.Errorf("url is not a valid URL: %v", err)
	}
	if u.User != nil {
		return errors.New("url carries user info (user:password@): the catalogue is public, and no credential belongs in it")
	}
	switch {
	case u.Scheme == "http":
		return fmt.Errorf("url %q is http: the %s crosses the internet, and only https keeps it from being altered on the way", s, what)
	case u.Scheme != "https":
		return fmt.Errorf("url %q is not an https address", s)
	case u.Host == "":
		return fmt.Errorf("url %q has no host", s)
	case u.Fragment != "" || strings.Contains(s, "#"):
		return fmt.Errorf("url %q has a #fragment, which a download never sends", s)
	}
	if p := u.Path; p == "" || strings.HasSuffix(p, "/") {
		return fmt.Errorf("url %q names a directory, not an %s file", s, what)
	}
	return nil
}

// checkFormat accepts the two plain formats and refuses one the file name
// contradicts.
func checkFormat(format, rawURL string) error {
	switch format {
	case FormatQCOW2, FormatRaw:
	case "":
		return fmt.Errorf("format is missing: %q or %q", FormatQCOW2, FormatRaw)
	default:
		return fmt.Errorf("format %q is neither %q nor %q", format, FormatQCOW2, FormatRaw)
	}
	u, _ := url.Parse(rawURL) // checked by checkCloudURL
	p := strings.ToLower(u.Path)
	for _, c := range compressionSuffixes {
		p = strings.TrimSuffix(p, c) // the disk inside names the format
	}
	for suffix, named := range map[string]string{".qcow2": FormatQCOW2, ".raw": FormatRaw} {
		if strings.HasSuffix(p, suffix) && format != named {
			return fmt.Errorf("format %q, but the url names a %s file", format, named)
		}
	}
	return nil
}

// checkRegistryRef accepts docker://<fully qualified reference> with a tag
// or a digest: which disk is meant must not depend on a registry default.
func checkRegistryRef(s string) error {
	const scheme = "docker://"
	ref, ok := strings.CutPrefix(s, scheme)
	if !ok {
		return fmt.Errorf("url %q is not a registry reference: a LosOS disk comes from a registry, %shost/path:tag", s, scheme)
	}
	named, err := reference.ParseNamed(ref)
	if err != nil {
		return fmt.Errorf("url %q is not a fully qualified registry reference (%shost/path:tag): %v", s, scheme, err)
	}
	_, tagged := named.(reference.Tagged)
	_, digested := named.(reference.Digested)
	if !tagged && !digested {
		return fmt.Errorf("url %q names no tag or digest; say which disk, e.g. :stable", s)
	}
	return nil
}

// idHint names an entry that did not decode by its id, if it has one.
func idHint(raw json.RawMessage) string {
	var e struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(raw, &e) == nil {
		if id, ok := e.ID.(string); ok && id != "" {
			return fmt.Sprintf(" (id %q)", id)
		}
	}
	return ""
}

// decodeObject decodes b, which must be exactly one JSON object, into dst.
// Only the fields named are allowed, each spelt exactly so and given once:
// encoding/json would match "ID" to "id" and keep the last of two "url"s,
// and what it decoded would not be what the file says.
func decodeObject(b []byte, dst any, fields ...string) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return errors.New("is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return describe(err, b, fields)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("has data after the JSON object")
	}
	// The keys, as written. b is known to be valid JSON now.
	dec = json.NewDecoder(bytes.NewReader(b))
	_, _ = dec.Token() // {
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return describe(err, b, fields)
		}
		key, _ := tok.(string)
		if !slices.Contains(fields, key) {
			return unknownField(key, fields)
		}
		if seen[key] {
			return fmt.Errorf("has the field %q more than once", key)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return describe(err, b, fields)
		}
	}
	return nil
}

// unknownField says which field is unknown and, for one in another case,
// how it is spelt.
func unknownField(key string, fields []string) error {
	for _, f := range fields {
		if strings.EqualFold(f, key) {
			return fmt.Errorf("has the field %q; field names are case-sensitive: write %q", key, f)
		}
	}
	return fmt.Errorf("has an unknown field %q (the fields are %s)", key, strings.Join(fields, ", "))
}

// describe turns a decoding error into the problem, with the line and
// column of a syntax error.
func describe(err error, b []byte, fields []string) error {
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		before := b[:min(int(se.Offset), len(b))]
		line := bytes.Count(before, []byte("\n")) + 1
		col := len(before) - bytes.LastIndexByte(before, '\n')
		return fmt.Errorf("is not valid JSON: %v (line %d, column %d)", se, line, col)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("is not valid JSON: it ends in the middle")
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
		return fmt.Errorf("field %q must be %s, not %s", te.Field, kind(te.Type.Kind().String()), te.Value)
	}
	// DisallowUnknownFields has no typed error; its text is stable API.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return unknownField(strings.Trim(name, `"`), fields)
	}
	return fmt.Errorf("is not the JSON expected: %v", err)
}

// kind names a Go kind as the file's author knows it.
func kind(k string) string {
	switch k {
	case "bool":
		return "true or false"
	case "string":
		return "a string"
	case "int", "int64":
		return "a whole number"
	case "slice":
		return "an array"
	}
	return "an object"
}
