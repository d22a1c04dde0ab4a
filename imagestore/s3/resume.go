package s3

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/vmshelf/vmshelf/imagestore"
)

// Resume reopens the unfinished blob id to continue writing at offset,
// from the state kept in S3 alone, so any replica can resume any upload:
//
//   - The multipart upload of the id is found by ListMultipartUploads; its
//     parts wholly below offset are kept (part k covers
//     [(k-1)·P, k·P)), and each must be there, full.
//   - The bytes from the last part boundary to offset come from that
//     part's tail object (ranged GET) into the new writer's buffer. A
//     part written past offset is never kept: its number is uploaded anew.
//   - offset may not lie past the durable offset (the last Sync's): those
//     bytes may never have arrived.
//   - Anything past offset is cut: the durable offset is moved back, the
//     tail of offset's part shortened to offset and later tails removed,
//     so a later Resume cannot mistake the old bytes for new ones.
//   - A staged blob (completed for its read-back, never committed) is
//     resumed too: at its end as it is; below its end by copying its
//     parts below offset into a new upload on the server (UploadPartCopy).
//
// The error wraps ErrNotFound only if the server says there is no such
// unfinished blob, ErrExists if id is committed. An offset below zero or
// past the durable bytes is refused, and nothing is changed.
//
// Like blobfs, Resume does not lock: the caller serializes the writers of
// one id (the gateway holds a per-session lock; across replicas, the
// session's takeover does).
func (s *Store) Resume(ctx context.Context, id string, offset int64) (imagestore.BlobWriter, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("s3: resume %s: %w", id, err)
	}
	if offset < 0 {
		return nil, fmt.Errorf("s3: resume %s: negative offset %d", id, offset)
	}
	w, err := s.resume(ctx, id, offset)
	if err != nil {
		if errors.Is(err, imagestore.ErrNotFound) || errors.Is(err, imagestore.ErrExists) {
			return nil, fmt.Errorf("s3: resume %s: %w", id, err)
		}
		return nil, s.errorf(err, "resume %s", id)
	}
	return w, nil
}

func (s *Store) resume(ctx context.Context, id string, offset int64) (*writer, error) {
	_, found, err := s.stat(ctx, s.markerKey(id))
	if err != nil {
		return nil, err
	}
	if found {
		return nil, imagestore.ErrExists
	}
	key := s.imageKey(id)
	ups, err := s.uploadsFor(ctx, key)
	if err != nil {
		return nil, err
	}
	staged, isStaged, err := s.stat(ctx, key)
	if err != nil {
		return nil, err
	}
	durable, hasDurable, err := s.getDurable(ctx, id)
	if err != nil {
		return nil, err
	}
	switch {
	case len(ups) > 1:
		return nil, fmt.Errorf("%d unfinished uploads for one id; RemovePartial clears them", len(ups))
	case len(ups) == 1 && isStaged && !hasDurable:
		// A restage (below) that did not get as far as recording its
		// offset: the staged object is still the whole truth.
		if err := s.abortUpload(ctx, key, ups[0].UploadID); err != nil {
			return nil, err
		}
		return s.resumeStaged(ctx, id, staged, offset)
	case len(ups) == 1:
		w, err := s.resumeUpload(ctx, id, ups[0].UploadID, offset, durable)
		if err != nil {
			return nil, err
		}
		if isStaged {
			// A restage that recorded its offset: the upload holds every
			// byte the staged object had below it.
			if err := s.remove(ctx, key); err != nil {
				return nil, err
			}
		}
		return w, nil
	case isStaged:
		return s.resumeStaged(ctx, id, staged, offset)
	}
	return nil, imagestore.ErrNotFound
}

// resumeUpload continues multipart upload uploadID at offset.
func (s *Store) resumeUpload(ctx context.Context, id, uploadID string, offset, durable int64) (*writer, error) {
	if offset > durable {
		return nil, fmt.Errorf("offset %d is past the %d bytes made durable", offset, durable)
	}
	P := s.partSize
	full := int(offset / P) // parts kept
	base := int64(full) * P
	r := offset - base // bytes of part full+1 to take from its tail
	key := s.imageKey(id)
	parts, algo, err := s.listParts(ctx, key, uploadID)
	if isNotFound(err) {
		return nil, fmt.Errorf("the upload ended while resuming: %w", imagestore.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	w := s.newWriter(id, key, uploadID)
	w.base, w.durable = base, offset
	// The upload's own algorithm, not this replica's setting: another
	// replica may have created it, and its parts must all carry the same.
	w.crc = strings.EqualFold(algo, minio.ChecksumCRC32C.String())
	for _, p := range parts {
		if p.PartNumber > full {
			break // written past offset, or cut off before: sent anew
		}
		if p.PartNumber != len(w.parts)+1 || p.Size != P {
			return nil, fmt.Errorf("part %d of the %d below offset %d is missing or short", len(w.parts)+1, full, offset)
		}
		if w.crc && p.ChecksumCRC32C == "" {
			return nil, fmt.Errorf("part %d of an upload created with CRC32C lists none", p.PartNumber)
		}
		w.parts = append(w.parts, minio.CompletePart{PartNumber: p.PartNumber, ETag: p.ETag, ChecksumCRC32C: p.ChecksumCRC32C})
	}
	if len(w.parts) != full {
		return nil, fmt.Errorf("part %d of the %d below offset %d is missing", len(w.parts)+1, full, offset)
	}
	tails, err := s.tails(ctx, id)
	if err != nil {
		return nil, err
	}
	if r > 0 {
		size, ok := tails[full+1]
		if !ok || size < r {
			return nil, fmt.Errorf("the tail of part %d holds %d bytes, not the %d below offset %d", full+1, size, r, offset)
		}
		buf := make([]byte, r, P)
		if _, err := s.readAt(ctx, s.tailKey(id, full+1), "", size, buf, 0); err != nil {
			return nil, fmt.Errorf("read the tail of part %d: %w", full+1, err)
		}
		w.buf = buf
		w.synced = int(r)
	}
	// The cut, durable offset first: from then on nothing past offset is
	// trusted, whatever of the rest a crash leaves undone.
	if offset < durable {
		if err := s.putDurable(ctx, id, offset); err != nil {
			return nil, err
		}
	}
	for part, size := range tails {
		switch {
		case part > full+1, part == full+1 && r == 0:
			if err := s.remove(ctx, s.tailKey(id, part)); err != nil {
				return nil, err
			}
		case part == full+1 && size > r:
			if _, err := s.putSmall(ctx, s.tailKey(id, part), w.buf, false); err != nil {
				return nil, err
			}
		}
	}
	if w.buf != nil {
		w.adoptBuffer(w.buf)
	}
	return w, nil
}

// tails maps part numbers to the sizes of their tail objects.
func (s *Store) tails(ctx context.Context, id string) (map[int]int64, error) {
	objs, err := s.listObjects(ctx, s.partialDir(id)+"tail.")
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(objs))
	for _, o := range objs {
		n, err := strconv.Atoi(strings.TrimPrefix(o.Key, s.partialDir(id)+"tail."))
		if err != nil || n < 1 {
			continue
		}
		out[n] = o.Size
	}
	return out, nil
}

// resumeStaged continues a staged blob at offset. At its end the writer
// is staged already (ReadAt and Commit work, Write refuses). Below it, a
// new upload gets the parts below offset by server-side copy, the bytes
// from the last boundary to offset as its buffer and tail, and the
// durable offset; only then is the staged object removed.
func (s *Store) resumeStaged(ctx context.Context, id string, staged minio.ObjectInfo, offset int64) (*writer, error) {
	key := s.imageKey(id)
	if offset > staged.Size {
		return nil, fmt.Errorf("offset %d is past the %d bytes staged", offset, staged.Size)
	}
	if offset == staged.Size {
		w := s.newWriter(id, key, "")
		w.staged, w.size, w.etag, w.durable = true, staged.Size, staged.ETag, offset
		return w, nil
	}
	if err := s.removeAll(ctx, s.partialDir(id)); err != nil {
		return nil, err
	}
	// No CRC32C declared: the copied parts (UploadPartCopy) would need
	// one each in the completion, and the copy is the server's own.
	uploadID, err := s.newUpload(ctx, key, false)
	if err != nil {
		return nil, err
	}
	P := s.partSize
	full := int(offset / P)
	base := int64(full) * P
	w := s.newWriter(id, key, uploadID)
	w.base, w.durable = base, offset
	for k := 1; k <= full; k++ {
		cctx, cancel := s.copyCall(ctx, P)
		p, err := s.core.CopyObjectPart(cctx, s.bucket, key, s.bucket, key, uploadID, k, int64(k-1)*P, P, nil)
		err = classify(cctx, err)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("copy part %d of the staged blob: %w", k, err)
		}
		w.parts = append(w.parts, minio.CompletePart{PartNumber: k, ETag: p.ETag})
	}
	if r := offset - base; r > 0 {
		w.buf = make([]byte, r, P)
		if _, err := s.readAt(ctx, key, staged.ETag, staged.Size, w.buf, base); err != nil {
			return nil, fmt.Errorf("read the staged blob at %d: %w", base, err)
		}
		if _, err := s.putSmall(ctx, s.tailKey(id, full+1), w.buf, false); err != nil {
			return nil, err
		}
		w.synced = int(r)
	}
	if err := s.putDurable(ctx, id, offset); err != nil {
		return nil, err
	}
	if err := s.remove(ctx, key); err != nil {
		return nil, err
	}
	if w.buf != nil {
		w.adoptBuffer(w.buf)
	}
	return w, nil
}
