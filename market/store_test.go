package market

import "github.com/vmshelf/vmshelf/imagestore"

// The whole store and blob store are what serve passes; they must keep
// answering everything the control plane calls.
var (
	_ Store = imagestore.Store(nil)
	_ Blobs = imagestore.Blobs(nil)
)
