package main

import (
	"encoding/json"
	"net/http"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// TestE2EISOOrder: through the binary, an edge with the console in its
// page offers the catalogue's installation ISOs: ordering one with user
// data is refused in words, without it is made into a VM that boots its
// blank disk first and the ISO second, and its buyer gets a console of
// it (the only way to install it).
func TestE2EISOOrder(t *testing.T) {
	t.Parallel()
	const account = "acct_e2eISOOrder"
	m := startKubeMarket(t, account)
	s, kube := m.s, m.kube

	code, body := curl(t, s.ctlBase+"/market/vm-images")
	var c struct {
		Catalogue []struct {
			ID, Source, URL string
		} `json:"catalogue"`
		NotOffered []struct{ Name, Reason string } `json:"not_offered"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &c) != nil {
		t.Fatalf("GET /market/vm-images: %d %s", code, body)
	}
	isoURL := ""
	for _, e := range c.Catalogue {
		if e.ID == "nixos-26-05" && e.Source == "iso" {
			isoURL = e.URL
		}
	}
	if isoURL == "" {
		t.Fatalf("the catalogue does not offer NixOS's installation ISO: %s", body)
	}
	for _, n := range c.NotOffered {
		if n.Name == "NixOS 26.05" || n.Name == "Slackware 15.0" {
			t.Errorf("%s is offered and also listed as not offered (%q)", n.Name, n.Reason)
		}
	}

	l := s.listing(t, addHost(t, s, "host", account), `{"unit_price":600,"capacity":2}`)
	code, body = s.ctl(t, "/market/vms/orders", s.token,
		`{"listing_id":"`+l.ListingID+`","quantity":1,"image":"nixos-26-05","name":"nix","user_data":"#cloud-config\n"}`)
	wantError(t, "an ISO order with user data", code, body, http.StatusUnprocessableEntity, "userDataNotForInstaller")

	o, vm := m.runningOrder(t, l.ListingID, "nixos-26-05", "nix", "evt_e2e_iso", nil)

	nss := kube.objects("Namespace")
	if len(nss) != 1 {
		t.Fatalf("the cluster has %d namespaces, want the buyer's one", len(nss))
	}
	ns := kubeStr(kubeMeta(nss[0]), "name")
	iso := kubeObject[cdiv1.DataVolume](t, kube, "DataVolume", ns, vm+"-iso")
	if iso.Spec.Source == nil || iso.Spec.Source.HTTP == nil || iso.Spec.Source.HTTP.URL != isoURL {
		t.Errorf("DataVolume %s-iso: %s; want imported over http from %s", vm, mustJSON(iso.Spec), isoURL)
	}
	disk := kubeObject[cdiv1.DataVolume](t, kube, "DataVolume", ns, vm+"-disk")
	if disk.Spec.Source == nil || disk.Spec.Source.Blank == nil {
		t.Errorf("DataVolume %s-disk: %s; want a blank disk", vm, mustJSON(disk.Spec))
	}
	v := kubeObject[kubevirtv1.VirtualMachine](t, kube, "VirtualMachine", ns, vm)
	boot := map[string]uint{} // disk or cdrom → its boot order
	if v.Spec.Template != nil {
		for _, d := range v.Spec.Template.Spec.Domain.Devices.Disks {
			kind := "disk"
			if d.CDRom != nil {
				kind = "cdrom"
			}
			if d.BootOrder != nil {
				boot[kind] = *d.BootOrder
			}
		}
	}
	if boot["disk"] != 1 || boot["cdrom"] != 2 {
		t.Errorf("VirtualMachine %s boots %v; want its disk first and the ISO's CD-ROM second", vm, boot)
	}

	if code, _, body := consoleTicket(t, s, s.token, o.OrderID, "vnc"); code != http.StatusCreated {
		t.Errorf("a console of the installer: %d %s, want 201", code, body)
	}
	kube.assertClean(t)
}
