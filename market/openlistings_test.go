package market

import (
	"net/http"
	"testing"
)

// TestOpenListingLimitCountsOnlyOpen: the limit of 10 is on open
// listings. A host that closed one of its ten lists again, exactly up to
// ten open, and the eleventh open one is refused. TestCreateListing's
// limit never closed a listing, so a limit that counted closed listings
// too passed it, and a host could never list again after ten listings in
// its life.
func TestOpenListingLimitCountsOnlyOpen(t *testing.T) {
	e := newEnv(t)
	_, host := e.host("host", "acct_1HostActive000001")
	var ids []string
	for range maxOpenListings {
		ids = append(ids, e.listing(host, 600, 1))
	}
	wantError(t, e.post("/market/vms/listings", host, `{"unit_price":600,"capacity":1}`), http.StatusConflict, "tooManyListings")
	for _, id := range ids[:2] {
		if r := e.post("/market/vms/listings/close", host, `{"listing_id":"`+id+`"}`); r.status != http.StatusOK {
			t.Fatalf("close: %d %s", r.status, r.body)
		}
	}
	e.listing(host, 600, 1)
	e.listing(host, 600, 1) // ten open again
	wantError(t, e.post("/market/vms/listings", host, `{"unit_price":600,"capacity":1}`), http.StatusConflict, "tooManyListings")
}
