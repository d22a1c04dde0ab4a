package web

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
)

// thirdParty is static/third_party/manifest.json: the page's vendored
// libraries, one folder each.
type thirdParty struct {
	Libraries []struct {
		Folder       string   `json:"folder"`
		Package      string   `json:"package"`
		Version      string   `json:"version"`
		Licence      string   `json:"licence"`
		LicenceFiles []string `json:"licence_files"`
		NPMIntegrity string   `json:"npm_integrity"`
		SHA256       string   `json:"sha256"`
	} `json:"libraries"`
}

// folderSum is the checksum the manifest gives a folder, as the shell
// computes it there: `find . -type f | LC_ALL=C sort | xargs sha256sum |
// sha256sum` (lines "<hex>  ./<path>", sorted bytewise).
func folderSum(fsys fs.FS) (string, error) {
	var names []string
	err := fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, "./"+name)
		}
		return err
	})
	if err != nil {
		return "", err
	}
	slices.Sort(names)
	var list strings.Builder
	for _, n := range names {
		b, err := fs.ReadFile(fsys, strings.TrimPrefix(n, "./"))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&list, "%x  %s\n", sha256.Sum256([]byte(b)), n)
	}
	sum := sha256.Sum256([]byte(list.String()))
	return hex.EncodeToString(sum[:]), nil
}

// TestThirdPartyManifest: every vendored library is in the manifest with
// its version, licence and checksum, and its folder holds exactly what the
// checksum says; the manifest names every folder under third_party and
// each is served; nothing else in static/ but the page's own files and
// its README.
func TestThirdPartyManifest(t *testing.T) {
	b, err := os.ReadFile("static/third_party/manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	var m thirdParty
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	var listed []string
	for _, lib := range m.Libraries {
		listed = append(listed, lib.Folder)
		if lib.Package == "" || lib.Version == "" || lib.Licence == "" || !strings.HasPrefix(lib.NPMIntegrity, "sha512-") {
			t.Errorf("%s: package, version, licence and npm integrity must all be given: %+v", lib.Folder, lib)
		}
		dir := os.DirFS(path.Join("static/third_party", lib.Folder))
		for _, l := range append([]string{}, lib.LicenceFiles...) {
			if _, err := fs.Stat(dir, l); err != nil {
				t.Errorf("%s: licence file %s: %v", lib.Folder, l, err)
			}
		}
		if len(lib.LicenceFiles) == 0 {
			t.Errorf("%s: no licence file named", lib.Folder)
		}
		got, err := folderSum(dir)
		if err != nil {
			t.Fatalf("%s: %v", lib.Folder, err)
		}
		if got != lib.SHA256 {
			t.Errorf("%s: the folder's checksum is %s, the manifest says %s: a file changed, or the manifest was not updated with it", lib.Folder, got, lib.SHA256)
		}
		if !slices.Contains(vendored, "third_party/"+lib.Folder) {
			t.Errorf("%s: in the manifest but not served (vendored)", lib.Folder)
		}
	}
	entries, err := os.ReadDir("static/third_party")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !slices.Contains(listed, e.Name()) {
			t.Errorf("third_party/%s is not in the manifest", e.Name())
		}
	}
	for _, v := range vendored {
		if !slices.Contains(listed, strings.TrimPrefix(v, "third_party/")) {
			t.Errorf("%s is served but not in the manifest", v)
		}
	}

	own := []string{"README.md"}
	for _, f := range files {
		own = append(own, f.file)
	}
	err = fs.WalkDir(os.DirFS("static"), ".", func(name string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case name == "third_party":
			return fs.SkipDir
		case !d.IsDir() && !slices.Contains(own, name):
			t.Errorf("static/%s is neither one of the page's own files nor under third_party/", name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
