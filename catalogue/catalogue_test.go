package catalogue

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCatalogueBuiltin: the embedded file is a valid catalogue that carries every
// system it offers, each from its own project's host, and the systems it says are
// not offered.
func TestCatalogueBuiltin(t *testing.T) {
	c := Builtin().WithConsole()
	for _, w := range []struct {
		name, source, host string
		efi                bool
	}{
		{"LosOS demo disk", SourceLosOS, "", true},
		{"Ubuntu Server 26.04", SourceCloud, "cloud-images.ubuntu.com", false},
		{"Ubuntu Server 24.04", SourceCloud, "cloud-images.ubuntu.com", false},
		{"Debian 13", SourceCloud, "cloud.debian.org", false},
		{"Debian 12", SourceCloud, "cloud.debian.org", false},
		{"Fedora 43 Cloud", SourceCloud, "download.fedoraproject.org", false},
		{"AlmaLinux 10", SourceCloud, "repo.almalinux.org", false},
		{"Rocky Linux 10", SourceCloud, "dl.rockylinux.org", false},
		{"CentOS Stream 10", SourceCloud, "cloud.centos.org", false},
		{"Arch Linux", SourceCloud, "geo.mirror.pkgbuild.com", false},
		{"openSUSE Tumbleweed", SourceCloud, "download.opensuse.org", true},
		{"Alpine Linux", SourceCloud, "dl-cdn.alpinelinux.org", false},
		{"FreeBSD", SourceCloud, "download.freebsd.org", false},
		{"NixOS 26.05", SourceISO, "channels.nixos.org", false},
		{"Slackware 15.0", SourceISO, "mirrors.slackware.com", false},
	} {
		t.Run(w.name, func(t *testing.T) {
			var e *Entry
			for _, got := range c.Entries() {
				if got.Name == w.name {
					e = &got
				}
			}
			if e == nil {
				t.Fatalf("the built-in catalogue has no %q", w.name)
			}
			if e.Source != w.source || e.EFI != w.efi {
				t.Errorf("%+v: want source %s, efi %v", *e, w.source, w.efi)
			}
			if got, ok := c.Lookup(e.ID); !ok || got != *e {
				t.Errorf("Lookup(%q) = %+v, %v", e.ID, got, ok)
			}
			if w.source == SourceLosOS {
				if e.URL != "docker://ghcr.io/vmshelf/vmshelf-demo-containerdisk:stable" || e.MinMemoryMiB != 4096 {
					t.Errorf("the demo disk is %+v, want the :stable registry disk with 4096 MiB", *e)
				}
				return
			}
			u, err := url.Parse(e.URL)
			if err != nil || u.Scheme != "https" || u.Host != w.host {
				t.Errorf("url %q is not on %s over https", e.URL, w.host)
			}
			if !strings.Contains(e.URL, "x86_64") && !strings.Contains(e.URL, "amd64") && !strings.Contains(e.URL, "slackware64") {
				t.Errorf("url %q names no x86_64/amd64 image", e.URL)
			}
			if e.MinDiskGiB < 1 {
				t.Errorf("%s has no min_disk_gib; a replica's disk must hold the image's virtual size", e.ID)
			}
		})
	}
	refused := map[string]string{}
	for _, n := range c.NotOffered() {
		refused[n.Name] = n.Reason
	}
	// Each system not offered with its real reason: none is refused for
	// the console any more (an ISO with a fixed address is an entry, kept
	// out by the switch, TestCatalogueConsoleSwitch).
	want := map[string]string{
		"Kali Linux":     ".tar.xz archive",
		"Gentoo":         "weekly builds",
		"Windows":        "licence",
		"Windows Server": "licence",
		"macOS":          "Apple hardware",
		"Linux Mint":     "third-party mirrors",
		"Pop!_OS":        "build number",
		"elementary OS":  "links that expire",
		"Zorin OS":       "point release",
		"Manjaro":        "build date",
		"EndeavourOS":    "release date",
		"OpenBSD":        "leaves the project's mirrors",
	}
	for name, why := range want {
		if !strings.Contains(refused[name], why) {
			t.Errorf("not_offered %s: reason %q, want one that says %q", name, refused[name], why)
		}
	}
	for name, reason := range refused {
		if _, ok := want[name]; !ok {
			t.Errorf("not_offered %s (%q) is not checked here", name, reason)
		}
		if strings.Contains(reason, "console") {
			t.Errorf("not_offered %s: reason %q still blames the console; an ISO with a fixed address is an iso entry", name, reason)
		}
	}
}

// TestCatalogueISOEntries: every built-in ISO entry is an https address of
// a .iso file on its project's own host, says what its installer needs,
// and is documented in docs/catalogue.md with the source of its address.
func TestCatalogueISOEntries(t *testing.T) {
	docs, err := os.ReadFile(filepath.Join("..", "docs", "catalogue.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range Builtin().WithConsole().Entries() {
		if e.Source != SourceISO {
			continue
		}
		n++
		u, err := url.Parse(e.URL)
		switch {
		case err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
			t.Errorf("%s: url %q is not a plain https address", e.ID, e.URL)
		case !strings.HasSuffix(u.Path, ".iso"):
			t.Errorf("%s: url %q does not name a .iso file", e.ID, e.URL)
		case !strings.Contains(e.URL, "x86_64") && !strings.Contains(e.URL, "amd64") && !strings.Contains(e.URL, "slackware64"):
			t.Errorf("%s: url %q names no 64-bit x86 ISO", e.ID, e.URL)
		}
		if e.Format != "" || e.MinDiskGiB < 1 || e.MinMemoryMiB < 1 {
			t.Errorf("%s: %+v: an ISO has no format and says the memory and disk its installer needs", e.ID, e)
		}
		if !strings.Contains(string(docs), "| `"+e.ID+"` | `"+e.URL+"` |") {
			t.Errorf("%s: docs/catalogue.md has no row for it with its address %s", e.ID, e.URL)
		}
	}
	if n < 2 {
		t.Errorf("the built-in catalogue has %d ISO entries, want NixOS and Slackware", n)
	}
}

// TestCatalogueConsoleSwitch: without the console an ISO entry is not
// offered (not an entry, not found, listed under not_offered with
// ReasonNeedsConsole, Withheld); WithConsole offers it, and changes the
// answer and its ETag, not the catalogue it came from.
func TestCatalogueConsoleSwitch(t *testing.T) {
	iso := entry(map[string]any{"id": "nixos", "name": "NixOS", "source": "iso", "format": nil,
		"url": "https://channels.nixos.org/nixos-26.05/latest-nixos-minimal-x86_64-linux.iso", "min_disk_gib": 10})
	without, err := Parse([]byte(doc(iso)))
	if err != nil {
		t.Fatal(err)
	}
	with := without.WithConsole()
	for _, tc := range []struct {
		name    string
		c       *Catalogue
		offered bool
	}{{"without the console", without, false}, {"with the console", with, true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			_, found := c.Lookup("nixos")
			inEntries := false
			for _, e := range c.Entries() {
				inEntries = inEntries || e.ID == "nixos"
			}
			if found != tc.offered || inEntries != tc.offered || c.Withheld("nixos") == tc.offered {
				t.Errorf("Lookup %v, in Entries %v, Withheld %v; want offered %v", found, inEntries, c.Withheld("nixos"), tc.offered)
			}
			if _, ok := c.Lookup("first"); !ok || c.Withheld("first") || c.Withheld("nope") {
				t.Errorf("a cloud entry is not offered as before")
			}
			var ans answer
			if err := json.Unmarshal(c.JSON(), &ans); err != nil {
				t.Fatal(err)
			}
			listed := false
			for _, n := range ans.NotOffered {
				if n.Name == "NixOS" {
					listed = n.Reason == ReasonNeedsConsole
				}
			}
			if listed == tc.offered || len(ans.Catalogue) != len(c.Entries()) {
				t.Errorf("the answer %s lists NixOS as not offered: %v; want %v", c.JSON(), listed, !tc.offered)
			}
			if _, err := Parse(c.JSON()); err != nil {
				t.Errorf("the answer is not a valid catalogue: %v", err)
			}
			if n := len(c.NotOffered()); n != len(ans.NotOffered) || n != 1 && tc.offered || n != 2 && !tc.offered {
				t.Errorf("NotOffered() = %v, want what the answer lists", c.NotOffered())
			}
		})
	}
	if with.ETag() == without.ETag() {
		t.Errorf("the answers with and without the console have the same ETag")
	}
	if _, ok := without.Lookup("nixos"); ok {
		t.Errorf("WithConsole changed the catalogue it came from")
	}
	if b := Builtin(); b.Withheld("nixos-26-05") != true || strings.Contains(string(b.JSON()), "channels.nixos.org") {
		t.Errorf("the built-in catalogue offers its ISOs without the console: %s", b.JSON())
	}
}

// TestCatalogueJSON: the public answer has the documented shape, built once, and is itself
// a catalogue file that parses to the same answer; the ETag is strong and
// follows the content.
func TestCatalogueJSON(t *testing.T) {
	c := Builtin()
	body := c.JSON()
	var got map[string][]map[string]any
	if err := json.Unmarshal(body, &got); err != nil || len(got) != 2 {
		t.Fatalf("JSON() = %s (%v), want {catalogue, not_offered}", body, err)
	}
	for i, e := range got["catalogue"] {
		for _, k := range []string{"id", "name", "source", "url", "efi", "min_memory_mib", "min_disk_gib"} {
			if _, ok := e[k]; !ok {
				t.Errorf("catalogue[%d] has no %q: %v", i, k, e)
			}
		}
	}
	again, err := Parse(body)
	if err != nil {
		t.Fatalf("the public answer is not a valid catalogue: %v", err)
	}
	if !bytes.Equal(again.JSON(), body) || again.ETag() != c.ETag() {
		t.Errorf("parsing the answer changed it")
	}
	if !regexp.MustCompile(`^"[0-9a-f]{32}"$`).MatchString(c.ETag()) {
		t.Errorf("ETag %s is not a strong quoted tag", c.ETag())
	}
	body[0] = 'X'
	if c.JSON()[0] != '{' {
		t.Errorf("JSON() hands out its own buffer")
	}
	es := c.Entries()
	es[0].URL = "changed"
	if c.Entries()[0].URL == "changed" {
		t.Errorf("Entries() hands out its own slice")
	}

	small, err := Parse([]byte(`{"catalogue": [` + entry(nil) + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	if small.ETag() == c.ETag() {
		t.Errorf("two different catalogues have the same ETag %s", c.ETag())
	}
	if want := `"not_offered":[]`; !strings.Contains(string(small.JSON()), want) {
		t.Errorf("JSON() without not_offered = %s, want %s", small.JSON(), want)
	}
	if _, ok := small.Lookup("nope"); ok {
		t.Errorf("Lookup found an id that is not there")
	}
}

// entry is a valid cloud entry, as JSON, with mods applied: a key set to
// nil is left out.
func entry(mods map[string]any) string {
	e := map[string]any{
		"id": "debian-13", "name": "Debian 13", "source": "cloud",
		"url":    "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2",
		"format": "qcow2", "efi": false, "min_memory_mib": 0, "min_disk_gib": 3,
	}
	for k, v := range mods {
		if v == nil {
			delete(e, k)
		} else {
			e[k] = v
		}
	}
	b, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// doc wraps entries, after a first valid one, in a catalogue document
// with one not_offered system.
func doc(entries ...string) string {
	first := entry(map[string]any{"id": "first", "name": "First"})
	return `{"catalogue": [` + strings.Join(append([]string{first}, entries...), ",") +
		`], "not_offered": [{"name": "Windows", "reason": "licence"}]}`
}

func losos(url string) map[string]any {
	return map[string]any{"source": "losos", "format": nil, "url": url}
}

func cloudURL(u string) map[string]any { return map[string]any{"url": u} }

func isoURL(u string) map[string]any { return map[string]any{"source": "iso", "format": nil, "url": u} }

// TestCatalogueParseRefuses: every problem is refused with one line that names the
// entry (index and id, or name) and the problem.
func TestCatalogueParseRefuses(t *testing.T) {
	const at = `catalogue[1] (id "debian-13")`
	type tc struct {
		name, doc string
		want      []string
	}
	cases := []tc{
		{"not UTF-8", "{\"catalogue\": [\xff]}", []string{"UTF-8"}},
		{"not JSON", "{\"catalogue\": [\n  {\"id\": }]}", []string{"not valid JSON", "line 2"}},
		{"cut short", `{"catalogue": [`, []string{"not valid JSON"}},
		{"not an object", `[]`, []string{"the catalogue ", "not a JSON object"}},
		{"data after it", doc(entry(nil)) + `{}`, []string{"the catalogue ", "data after"}},
		{"unknown top-level field", `{"catalog": []}`, []string{"the catalogue ", `unknown field "catalog"`, "catalogue, not_offered"}},
		{"top-level field twice", `{"catalogue": [], "catalogue": [` + entry(nil) + `]}`, []string{"the catalogue ", `"catalogue" more than once`}},
		{"catalogue not an array", `{"catalogue": {}}`, []string{`field "catalogue" must be an array`}},
		{"no catalogue", `{"not_offered": []}`, []string{"at least one entry"}},
		{"empty catalogue", `{"catalogue": []}`, []string{"at least one entry"}},
		{"entry not an object", doc(`"debian"`), []string{"catalogue[1]", "not a JSON object"}},
		{"unknown field", doc(entry(map[string]any{"checksum": "abc"})), []string{at, `unknown field "checksum"`}},
		{"field in another case", doc(strings.Replace(entry(nil), `"url"`, `"URL"`, 1)), []string{at, `"URL"`, `write "url"`}},
		{"field twice", doc(strings.Replace(entry(nil), `{`, `{"url":"https://example.org/a.qcow2",`, 1)), []string{at, `"url" more than once`}},
		{"wrong type", doc(entry(map[string]any{"efi": "yes"})), []string{at, `field "efi" must be true or false, not string`}},
		{"number not whole", doc(entry(map[string]any{"min_disk_gib": 2.5})), []string{at, `field "min_disk_gib" must be a whole number`}},

		{"no id", doc(entry(map[string]any{"id": nil})), []string{"catalogue[1]: id is missing"}},
		{"id upper case", doc(entry(map[string]any{"id": "Debian"})), []string{`catalogue[1] (id "Debian")`, "not a DNS label"}},
		{"id starts with a digit", doc(entry(map[string]any{"id": "13-debian"})), []string{`(id "13-debian")`, "not a DNS label"}},
		{"id with a dot", doc(entry(map[string]any{"id": "ubuntu-24.04"})), []string{"not a DNS label"}},
		{"id ends with a dash", doc(entry(map[string]any{"id": "debian-"})), []string{"not a DNS label"}},
		{"id too long", doc(entry(map[string]any{"id": "d" + strings.Repeat("x", 63)})), []string{"not a DNS label"}},
		{"id twice", doc(entry(nil), entry(map[string]any{"name": "Other"})), []string{`catalogue[2] (id "debian-13")`, "catalogue[1] has the same id"}},
		{"name twice", doc(entry(nil), entry(map[string]any{"id": "other", "name": "debian 13"})), []string{`catalogue[2] (id "other")`, "catalogue[1] has the same name"}},

		{"no name", doc(entry(map[string]any{"name": nil})), []string{at, "name is missing"}},
		{"blank name", doc(entry(map[string]any{"name": "   "})), []string{at, "name is missing"}},
		{"name with a line break", doc(entry(map[string]any{"name": "Debian\n13"})), []string{at, "control character"}},
		{"name with spaces around", doc(entry(map[string]any{"name": " Debian"})), []string{at, "spaces at its start or end"}},
		{"name too long", doc(entry(map[string]any{"name": strings.Repeat("n", 81)})), []string{at, "longer than 80"}},

		{"no source", doc(entry(map[string]any{"source": nil})), []string{at, "source is missing"}},
		{"unknown source", doc(entry(map[string]any{"source": "vhd"})), []string{at, `source "vhd" is none of`, `"iso"`}},

		{"no url", doc(entry(map[string]any{"url": nil})), []string{at, "url is missing"}},
		{"http", doc(entry(cloudURL("http://cloud.debian.org/d.qcow2"))), []string{at, "is http", "https"}},
		{"ftp", doc(entry(cloudURL("ftp://cloud.debian.org/d.qcow2"))), []string{at, "not an https address"}},
		{"no host", doc(entry(cloudURL("https:///d.qcow2"))), []string{at, "has no host"}},
		{"not a URL", doc(entry(cloudURL("https://[::1/d.qcow2"))), []string{at, "not a valid URL"}},
		{"fragment", doc(entry(cloudURL("https://cloud.debian.org/d.qcow2#x"))), []string{at, "#fragment"}},
		{"directory", doc(entry(cloudURL("https://cloud.debian.org/images/"))), []string{at, "names a directory"}},
		{"host only", doc(entry(cloudURL("https://cloud.debian.org"))), []string{at, "names a directory"}},
		{"installer ISO", doc(entry(cloudURL("https://cdimage.debian.org/debian-13-netinst.iso"))), []string{at, "installer ISO", `source "iso"`}},

		{"iso over http", doc(entry(isoURL("http://cdimage.debian.org/netinst.iso"))), []string{at, "is http", "the ISO crosses"}},
		{"iso without host", doc(entry(isoURL("https:///netinst.iso"))), []string{at, "has no host"}},
		{"iso with user info", doc(entry(isoURL("https://u:p@cdimage.debian.org/netinst.iso"))), []string{at, "user info"}},
		{"iso directory", doc(entry(isoURL("https://cdimage.debian.org/iso/"))), []string{at, "names a directory, not an ISO file"}},
		{"iso compressed", doc(entry(isoURL("https://cdimage.debian.org/netinst.iso.xz"))), []string{at, "ends in .xz", "plain .iso"}},
		{"iso archive", doc(entry(isoURL("https://cdimage.debian.org/netinst.zip"))), []string{at, "ends in .zip"}},
		{"iso names a disk", doc(entry(isoURL("https://cdimage.debian.org/disk.qcow2"))), []string{at, "names a disk image (.qcow2)", `source "cloud"`}},
		{"iso with format", doc(entry(map[string]any{"source": "iso", "url": "https://cdimage.debian.org/netinst.iso"})), []string{at, "format", "leave it out"}},
		{"iso without disk", doc(entry(map[string]any{"source": "iso", "format": nil, "min_disk_gib": 0, "url": "https://cdimage.debian.org/netinst.iso"})), []string{at, "min_disk_gib is missing", "blank disk"}},
		{"archive, upper case", doc(entry(cloudURL("https://cloud.debian.org/D.QCOW2.TAR.XZ"))), []string{at, "ends in .tar.xz", "archive or a compression"}},
		{"compressed, format contradicts the file", doc(entry(map[string]any{"format": "raw", "url": "https://cloud.debian.org/d.qcow2.xz"})), []string{at, `format "raw", but the url names a qcow2 file`}},

		{"no format", doc(entry(map[string]any{"format": nil})), []string{at, "format is missing"}},
		{"unknown format", doc(entry(map[string]any{"format": "vmdk"})), []string{at, `format "vmdk" is neither`}},
		{"format contradicts the file", doc(entry(map[string]any{"format": "raw"})), []string{at, `format "raw", but the url names a qcow2 file`}},

		{"losos over https", doc(entry(losos("https://ghcr.io/vmshelf/disk:stable"))), []string{at, "not a registry reference"}},
		{"losos not qualified", doc(entry(losos("docker://losos-demo:stable"))), []string{at, "not a fully qualified registry reference"}},
		{"losos upper case", doc(entry(losos("docker://ghcr.io/VMSHELF/disk:stable"))), []string{at, "not a fully qualified registry reference"}},
		{"losos without tag", doc(entry(losos("docker://ghcr.io/vmshelf/disk"))), []string{at, "no tag or digest"}},
		{"losos with format", doc(entry(map[string]any{"source": "losos", "url": "docker://ghcr.io/vmshelf/disk:stable"})), []string{at, "format", "leave it out"}},

		{"negative memory", doc(entry(map[string]any{"min_memory_mib": -1})), []string{at, "min_memory_mib -1 is negative"}},
		{"absurd memory", doc(entry(map[string]any{"min_memory_mib": 4 << 20})), []string{at, "min_memory_mib 4194304 is more than"}},
		{"negative disk", doc(entry(map[string]any{"min_disk_gib": -2})), []string{at, "min_disk_gib -2 is negative"}},
		{"absurd disk", doc(entry(map[string]any{"min_disk_gib": 100000})), []string{at, "min_disk_gib 100000 is more than"}},

		{"not_offered not an object", `{"catalogue": [` + entry(nil) + `], "not_offered": [1]}`, []string{"not_offered[0]", "not a JSON object"}},
		{"not_offered unknown field", `{"catalogue": [` + entry(nil) + `], "not_offered": [{"name": "Windows", "reason": "licence", "url": "x"}]}`,
			[]string{"not_offered[0]", `unknown field "url"`}},
		{"not_offered no name", `{"catalogue": [` + entry(nil) + `], "not_offered": [{"reason": "licence"}]}`, []string{`not_offered[0] (name "")`, "name is missing"}},
		{"not_offered no reason", `{"catalogue": [` + entry(nil) + `], "not_offered": [{"name": "Windows"}]}`, []string{`not_offered[0] (name "Windows")`, "reason is missing"}},
		{"not_offered twice", `{"catalogue": [` + entry(nil) + `], "not_offered": [{"name": "Windows", "reason": "licence"}, {"name": "windows", "reason": "again"}]}`,
			[]string{`not_offered[1] (name "windows")`, "not_offered[0] has the same name"}},
		{"offered and not", `{"catalogue": [` + entry(nil) + `], "not_offered": [{"name": "Debian 13", "reason": "no"}]}`,
			[]string{`not_offered[0] (name "Debian 13")`, `offered as catalogue[0] (id "debian-13")`}},
	}
	for _, suf := range []string{".tar", ".tar.gz", ".tgz", ".tar.xz", ".zip", ".7z", ".ova", ".bz2", ".zst"} {
		cases = append(cases, tc{"archive " + suf, doc(entry(cloudURL("https://cloud.debian.org/images/debian-13" + suf))),
			[]string{at, "ends in " + suf + ",", "archive or a compression"}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cat, err := Parse([]byte(c.doc))
			if err == nil {
				t.Fatalf("accepted: %s", cat.JSON())
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("the error is more than one line: %q", msg)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
		})
	}
}

// TestCatalogueParseURLCredentialsNotShown: a URL with a password is refused
// without the password in the error (it would reach the log).
func TestCatalogueParseURLCredentialsNotShown(t *testing.T) {
	for _, u := range []string{"https://user:s3cr3tpw@cloud.debian.org/d.qcow2", "https://user:s3cr3tpw@[::1/d.qcow2", "http://user:s3cr3tpw@x/d"} {
		_, err := Parse([]byte(doc(entry(cloudURL(u)))))
		if err == nil || strings.Contains(err.Error(), "s3cr3tpw") {
			t.Errorf("%s: error %v, want a refusal without the password", u, err)
		}
	}
}

// TestCatalogueParseAccepts: what a valid file may say.
func TestCatalogueParseAccepts(t *testing.T) {
	for _, c := range []struct{ name, doc string }{
		{"minimal", `{"catalogue": [` + entry(nil) + `]}`},
		{"raw image", doc(entry(map[string]any{"format": "raw", "url": "https://example.org/disk.img"}))},
		{"url with port and query", doc(entry(cloudURL("https://example.org:8443/d.qcow2?mirror=eu")))},
		{"iso", doc(entry(isoURL("https://cdimage.debian.org/debian-cd/current/amd64/iso-cd/netinst.iso")))},
		{"iso by a download URL", doc(entry(isoURL("https://example.org/download?os=linux")))},
		{"losos by digest", doc(entry(losos("docker://ghcr.io/vmshelf/disk@sha256:" + strings.Repeat("ab", 32))))},
		{"losos on a registry with a port", doc(entry(losos("docker://registry.example.org:5000/losos/demo:v1.2")))},
		{"id of 63", doc(entry(map[string]any{"id": "d" + strings.Repeat("x", 62)}))},
		{"unicode name", doc(entry(map[string]any{"name": "Débian 13 « trixie »"}))},
		{"spaces around", " \n" + doc(entry(nil)) + "\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := Parse([]byte(c.doc)); err != nil {
				t.Errorf("refused: %v", err)
			}
		})
	}
}

// TestCatalogueLoad reads files the way serve does: the error names the file.
func TestCatalogueLoad(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "small.json"))
	if err != nil {
		t.Fatalf("Load(testdata/small.json): %v", err)
	}
	if e, ok := c.Lookup("debian-13"); !ok || e.Name != "Debian 13" || len(c.Entries()) != 2 || len(c.NotOffered()) != 1 {
		t.Errorf("testdata/small.json loaded as %s", c.JSON())
	}

	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, bytes.Repeat([]byte(" "), maxFileSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		want       []string
		is         error
	}{
		{"missing", filepath.Join(dir, "nope.json"), []string{"nope.json", "cannot open it", "no such file"}, fs.ErrNotExist},
		{"a directory", dir, []string{dir, "is a directory"}, nil},
		{"too large", big, []string{big, "larger than 1024 KiB"}, nil},
		{"archive", filepath.Join("testdata", "archive.json"), []string{
			"testdata/archive.json", `catalogue[1] (id "kali")`, "ends in .tar.xz"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.path)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
		})
	}
}
