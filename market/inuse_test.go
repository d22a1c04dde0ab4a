package market

import (
	"net/http"
	"testing"

	"github.com/vmshelf/vmshelf/imagestore"
)

// TestRemoveImageInUseOnceRunning: the buyer's own image stays while its
// order is paid (the provisioner is about to import it) and while it is
// active (CDI restarts a failed import from the image), not only while the
// order awaits payment; its file stays with it. Once the month is over
// the image may go: the replicas' disks are their own copies.
func TestRemoveImageInUseOnceRunning(t *testing.T) {
	m := newMarket(t)
	e := m.e
	ctx := t.Context()
	img := e.image(m.buyerT, "buyer's disk")
	r := e.order(m.buyer, m.listing, 1, img.UploadID, "mine", "")
	if r.status != http.StatusCreated {
		t.Fatalf("order: %d %s", r.status, r.body)
	}
	var a orderAnswer
	decode(t, r, &a)
	if err := e.stripe.Pay(e.sessionOf(a.OrderID)); err != nil {
		t.Fatal(err)
	}
	wantResult(t, e.event("evt_1", eventCompleted, e.sessionOf(a.OrderID), e.clock.Now()), resultPaid)
	remove := `{"upload_id":"` + img.UploadID + `"}`
	refused := func(state imagestore.OrderState) {
		t.Helper()
		if o := e.storedOrder(a.OrderID); o.State != state {
			t.Fatalf("order %s, want %s", o.State, state)
		}
		wantError(t, e.post("/market/vm-images/remove", m.buyer, remove), http.StatusConflict, "imageInUse")
		if _, err := e.st.Image(ctx, img.UploadID); err != nil {
			t.Errorf("the record of an image a %s order runs: %v", state, err)
		}
		if _, err := e.blobs.Open(ctx, img.UploadID); err != nil {
			t.Errorf("the file of an image a %s order runs is gone: %v", state, err)
		}
	}
	refused(imagestore.OrderPaid)
	if err := e.st.MarkOrderActive(ctx, a.OrderID); err != nil {
		t.Fatal(err)
	}
	refused(imagestore.OrderActive)

	o := e.storedOrder(a.OrderID)
	e.clock.Advance(o.ExpiresAt.Sub(e.clock.Now()))
	if err := e.st.ExpireOrder(ctx, a.OrderID, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if r := e.post("/market/vm-images/remove", m.buyer, remove); r.status != http.StatusOK {
		t.Errorf("remove after the order's month ended: %d %s", r.status, r.body)
	}
}
