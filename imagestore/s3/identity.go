package s3

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/vmshelf/vmshelf/imagestore"
)

// identityKey holds the store's identity (imagestore.StoreIdentity) under
// the prefix, beside images/ and committed/.
func (s *Store) identityKey() string { return s.prefix + "store-id" }

// StoreID reads the identity object; "" only when the server says there
// is none. An object that holds anything but an id is an error.
func (s *Store) StoreID(ctx context.Context) (string, error) {
	obj, _, _, err := s.core.GetObject(ctx, s.bucket, s.identityKey(), minio.GetObjectOptions{})
	if isNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", s.errorf(classify(ctx, err), "read store id")
	}
	defer obj.Close()
	b, err := io.ReadAll(io.LimitReader(obj, 128))
	if isNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", s.errorf(classify(ctx, err), "read store id")
	}
	id := strings.TrimSpace(string(b))
	if !imagestore.ValidStoreID(id) {
		return "", fmt.Errorf("s3: %s does not hold a store id", s.identityKey())
	}
	return id, nil
}

// SetStoreID writes the identity object (one PUT: S3 makes it visible
// whole or not at all).
func (s *Store) SetStoreID(ctx context.Context, id string) error {
	if !imagestore.ValidStoreID(id) {
		return fmt.Errorf("s3: %q is not a store id", id)
	}
	if _, err := s.putSmall(ctx, s.identityKey(), []byte(id+"\n"), false); err != nil {
		return s.errorf(err, "write store id")
	}
	return nil
}
