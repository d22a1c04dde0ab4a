package market

import (
	"net/http"
	"strings"
	"testing"
)

// TestOfferSizes: every offer says what one replica of it is, beside its
// price per replica-month: the edge's vCPUs, memory and disk
// (--vm-cpu, --vm-memory-mib, --vm-disk-gib; an image that needs more
// gets more). An edge that was given no sizes leaves them out.
func TestOfferSizes(t *testing.T) {
	m := newMarket(t, func(c *Config) { c.Replica = ReplicaSize{VCPU: 2, MemoryMiB: 3072, DiskGiB: 25} })
	st := m.e.statusOf(m.buyer)
	if len(st.Offers) != 1 {
		t.Fatalf("offers %+v, want the host's listing", st.Offers)
	}
	if o := st.Offers[0]; o.VCPU != 2 || o.MemoryMiB != 3072 || o.DiskGiB != 25 || o.UnitPrice != 600 || o.Currency != "eur" {
		t.Errorf("the offer %+v; want 2 vCPUs, 3072 MiB, 25 GiB at 600 eur a replica-month", o)
	}

	bare := newMarket(t)
	r := bare.e.post("/market/vms/status", bare.buyer, "")
	if r.status != http.StatusOK || strings.Contains(string(r.body), `"vcpu"`) {
		t.Errorf("status of an edge given no sizes: %d %s; want the offers without vcpu", r.status, r.body)
	}
}
