package imagestore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
)

// grantStore is a Store that knows fetch tokens and counts the lookups
// that reach it. Only the methods the cache touches are implemented.
type grantStore struct {
	imagestore.Store // nil: any other call panics

	mu      sync.Mutex
	grants  map[imagestore.Hash]grant
	lookups int
	// block, if set, holds a lookup after it read its answer, until
	// released: a lookup that races with a revocation.
	block   chan struct{}
	reading chan struct{}
	// fail, if set, is every lookup's answer: a store that cannot be asked.
	fail error
}

type grant struct {
	img     imagestore.Image
	order   string
	expires time.Time
}

func (s *grantStore) ImageForToken(_ context.Context, token imagestore.Hash, now time.Time) (imagestore.Image, time.Time, error) {
	s.mu.Lock()
	s.lookups++
	g, ok := s.grants[token]
	block, fail := s.block, s.fail
	s.mu.Unlock()
	if fail != nil {
		return imagestore.Image{}, time.Time{}, fail
	}
	if block != nil {
		s.reading <- struct{}{}
		<-block
	}
	if !ok || !now.Before(g.expires) {
		return imagestore.Image{}, time.Time{}, imagestore.ErrNotFound
	}
	return g.img, g.expires, nil
}

func (s *grantStore) revoke(order string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, g := range s.grants {
		if g.order == order {
			delete(s.grants, k)
			n++
		}
	}
	return n
}

func (s *grantStore) RevokeOrderTokens(_ context.Context, order string, _ time.Time) (int, error) {
	return s.revoke(order), nil
}

func (s *grantStore) RemoveImage(_ context.Context, _ int64, uploadID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, g := range s.grants {
		if g.img.UploadID == uploadID {
			delete(s.grants, k)
		}
	}
	return nil
}

func (s *grantStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups
}

var (
	t0      = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tokenA  = imagestore.HashSecret("a")
	imageA  = imagestore.Image{UploadID: "u-a", Name: "a"}
	expiryA = t0.Add(time.Hour)
)

func newGrantStore() *grantStore {
	return &grantStore{grants: map[imagestore.Hash]grant{
		tokenA: {img: imageA, order: "o1", expires: expiryA},
	}}
}

// lookup asks c for token A at now and reports whether it was served.
func lookup(t *testing.T, c imagestore.Store, now time.Time) bool {
	t.Helper()
	img, exp, err := c.ImageForToken(t.Context(), tokenA, now)
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		return false
	case err != nil:
		t.Fatalf("ImageForToken at %v: %v", now, err)
	case img != imageA || !exp.Equal(expiryA):
		t.Fatalf("ImageForToken at %v = %+v, %v; want %+v, %v", now, img, exp, imageA, expiryA)
	}
	return true
}

func TestTokenCacheServesFromMemory(t *testing.T) {
	s := newGrantStore()
	c := imagestore.CacheTokens(s, imagestore.TokenCacheTTL)
	for i := range 1000 {
		if !lookup(t, c, t0.Add(time.Duration(i)*time.Microsecond)) {
			t.Fatal("a valid token was refused")
		}
	}
	if n := s.count(); n != 1 {
		t.Errorf("1000 lookups within the TTL asked the store %d times, want 1", n)
	}
	lookup(t, c, t0.Add(imagestore.TokenCacheTTL))
	if n := s.count(); n != 2 {
		t.Errorf("a lookup at the TTL asked the store %d times in all, want 2", n)
	}
}

// TestTokenCacheHonoursEnds: each way a token stops working, and how soon
// the cache follows it.
func TestTokenCacheHonoursEnds(t *testing.T) {
	ttl := imagestore.TokenCacheTTL
	tests := []struct {
		name string
		end  func(s *grantStore, c imagestore.Store) // what ends the token, right after a cached hit at t0
		// servedUntil: the last instant it is still served (zero: not
		// served at all after end).
		servedUntil time.Duration
	}{
		{"revoked through the cache", func(s *grantStore, c imagestore.Store) {
			if _, err := c.RevokeOrderTokens(context.Background(), "o1", t0); err != nil {
				panic(err)
			}
		}, 0},
		{"image removed through the cache", func(s *grantStore, c imagestore.Store) {
			if err := c.RemoveImage(context.Background(), 0, imageA.UploadID); err != nil {
				panic(err)
			}
		}, 0},
		{"another order revoked through the cache", func(s *grantStore, c imagestore.Store) {
			if _, err := c.RevokeOrderTokens(context.Background(), "o2", t0); err != nil {
				panic(err)
			}
		}, time.Hour - time.Nanosecond},
		// Another process sharing the store: only the TTL bounds it.
		{"revoked by another process", func(s *grantStore, c imagestore.Store) { s.revoke("o1") }, ttl - time.Nanosecond},
		{"nothing: expires at its instant", func(s *grantStore, c imagestore.Store) {}, time.Hour - time.Nanosecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newGrantStore()
			c := imagestore.CacheTokens(s, ttl)
			if !lookup(t, c, t0) {
				t.Fatal("a valid token was refused")
			}
			tc.end(s, c)
			for _, at := range []time.Duration{0, ttl / 2, ttl - time.Nanosecond, ttl, time.Hour - time.Nanosecond, time.Hour} {
				want := at <= tc.servedUntil && tc.servedUntil > 0
				if got := lookup(t, c, t0.Add(at)); got != want {
					t.Errorf("at t0+%v: served %v, want %v", at, got, want)
				}
			}
		})
	}
}

// TestTokenCacheRevocationRace: a lookup that read its answer before a
// revocation and returns after it must not leave that answer cached.
func TestTokenCacheRevocationRace(t *testing.T) {
	s := newGrantStore()
	held := make(chan struct{})
	s.block, s.reading = held, make(chan struct{})
	c := imagestore.CacheTokens(s, imagestore.TokenCacheTTL)
	// The held lookup runs on its own goroutine, which must not call
	// t.Fatal: it sends its answer, and the test goroutine judges it.
	served := make(chan error)
	go func() {
		_, _, err := c.ImageForToken(context.Background(), tokenA, t0)
		served <- err
	}()
	<-s.reading // the lookup has read the grant and not yet returned
	s.mu.Lock()
	s.block = nil // later lookups go straight through
	s.mu.Unlock()
	if _, err := c.RevokeOrderTokens(t.Context(), "o1", t0); err != nil {
		t.Fatal(err)
	}
	close(held) // the held lookup returns only now, after the revocation
	if err := <-served; err != nil {
		t.Fatalf("the raced lookup: %v; it read its answer before the revocation", err)
	}
	if lookup(t, c, t0) {
		t.Error("after the revocation the token is still served: the raced answer was cached")
	}
}

// TestTokenCacheStoreFails: a store that cannot be asked is an error, not
// an unknown token, and is never remembered: the next lookup asks again
// and serves once the store answers.
func TestTokenCacheStoreFails(t *testing.T) {
	s := newGrantStore()
	down := errors.New("store down")
	s.fail = down
	c := imagestore.CacheTokens(s, imagestore.TokenCacheTTL)
	for i := range 2 {
		_, _, err := c.ImageForToken(t.Context(), tokenA, t0)
		if !errors.Is(err, down) || errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("lookup %d with the store down: %v, want the store's error", i, err)
		}
	}
	s.mu.Lock()
	s.fail = nil
	s.mu.Unlock()
	if !lookup(t, c, t0) {
		t.Fatal("once the store answers, the token is refused")
	}
	if n := s.count(); n != 3 {
		t.Errorf("the store was asked %d times, want 3 (failures are not cached)", n)
	}
}
