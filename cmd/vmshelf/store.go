package main

import (
	"context"

	"github.com/vmshelf/vmshelf/gateway"
	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/market"
	"github.com/vmshelf/vmshelf/provisioner"
)

// devTenants is what serve --dev asks of the records to keep the dev
// tenant and its token file (ensureDevTenant).
type devTenants interface {
	Tenant(ctx context.Context, name string) (imagestore.Tenant, error)
	CreateTenant(ctx context.Context, t imagestore.Tenant, token imagestore.Hash) (imagestore.Tenant, error)
	SetTenantToken(ctx context.Context, name string, token imagestore.Hash) error
	TenantByToken(ctx context.Context, token imagestore.Hash) (imagestore.Tenant, error)
}

// quarantineBlobs is what 'vmshelf quarantine' asks of the image files:
// listing the ones set aside, and removing one on the operator's word.
type quarantineBlobs interface {
	Quarantined(ctx context.Context) ([]imagestore.QuarantinedBlob, error)
	RemoveQuarantined(ctx context.Context, id string) error
}

// Each part of the service declares the records and blob methods it calls;
// serve hands every one of them the whole store and blob store, which must
// keep answering all of them.
var (
	_ gateway.Store               = imagestore.Store(nil)
	_ gateway.Blobs               = imagestore.Blobs(nil)
	_ market.Store                = imagestore.Store(nil)
	_ market.Blobs                = imagestore.Blobs(nil)
	_ provisioner.Store           = imagestore.Store(nil)
	_ imagestore.ReconcileRecords = imagestore.Store(nil)
	_ imagestore.ReconcileBlobs   = imagestore.Blobs(nil)
	_ imagestore.RemovalRecords   = imagestore.Store(nil)
	_ imagestore.RemovalBlobs     = imagestore.Blobs(nil)
	_ devTenants                  = imagestore.Store(nil)
	_ quarantineBlobs             = imagestore.Blobs(nil)
)
