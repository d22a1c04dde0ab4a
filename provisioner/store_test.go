package provisioner

import "github.com/vmshelf/vmshelf/imagestore"

// The whole store is what serve passes; it must keep answering everything
// the provisioner calls.
var _ Store = imagestore.Store(nil)
