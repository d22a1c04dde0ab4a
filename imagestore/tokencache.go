package imagestore

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// TokenCacheTTL is how long a fetch token's answer is reused without
// asking the store again, and so the longest a token revoked (or an image
// removed) by another process sharing the store is still served. Revoking
// or removing through the cache itself takes effect at once.
const TokenCacheTTL = time.Second

// tokenCacheMax bounds the cache: past it, lapsed entries are dropped, and
// if none lapsed, all of them (the next lookups refill it).
const tokenCacheMax = 10000

// CacheTokens returns s with ImageForToken answered from memory for up to
// ttl. A CDI importer reads an image in thousands of small ranges, each
// presenting the same token; without the cache every one of them is a
// store transaction, which costs more than the bytes it serves.
//
// What the cache keeps honours the three ways a token stops working:
//   - expiry: an entry holds the token's expiry and is checked against the
//     caller's now on every hit, so a token ends at its exact instant;
//   - RevokeOrderTokens and RemoveImage called through the returned Store
//     empty the cache when they return (a lookup that raced with them is
//     not kept), so this process stops serving at once;
//   - the same done by another process (or directly on the store) is seen
//     once the entry is ttl old: that is the bound.
//
// Misses are never cached: an unknown token is rare, and the gateway's
// miss limiter answers guessers before they reach the store often.
func CacheTokens(s Store, ttl time.Duration) Store {
	return &tokenCache{Store: s, ttl: ttl, entries: make(map[Hash]cachedGrant)}
}

type tokenCache struct {
	Store
	ttl time.Duration

	mu sync.Mutex
	// gen counts the emptyings. A lookup keeps its answer only if gen is
	// unchanged since it asked the store, so an answer read before a
	// revocation is never kept after it.
	gen     uint64
	entries map[Hash]cachedGrant
}

type cachedGrant struct {
	img     Image
	expires time.Time // the token's own expiry
	until   time.Time // when the store must be asked again
}

func (c *tokenCache) ImageForToken(ctx context.Context, token Hash, now time.Time) (Image, time.Time, error) {
	c.mu.Lock()
	e, ok := c.entries[token]
	if ok && now.Before(e.until) {
		c.mu.Unlock()
		if !now.Before(e.expires) {
			return Image{}, time.Time{}, fmt.Errorf("fetch token: expired: %w", ErrNotFound)
		}
		return e.img, e.expires, nil
	}
	gen := c.gen
	c.mu.Unlock()

	img, expires, err := c.Store.ImageForToken(ctx, token, now)
	if err != nil {
		return img, expires, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == gen {
		if len(c.entries) >= tokenCacheMax {
			c.evict(now)
		}
		c.entries[token] = cachedGrant{img: img, expires: expires, until: now.Add(c.ttl)}
	}
	return img, expires, nil
}

// evict drops lapsed entries, or all if none lapsed. Called with mu held.
func (c *tokenCache) evict(now time.Time) {
	for k, e := range c.entries {
		if !now.Before(e.until) {
			delete(c.entries, k)
		}
	}
	if len(c.entries) >= tokenCacheMax {
		clear(c.entries)
	}
}

// forget empties the cache. It runs after a change whatever its error: a
// change that failed may still have been committed.
func (c *tokenCache) forget() {
	c.mu.Lock()
	c.gen++
	clear(c.entries)
	c.mu.Unlock()
}

func (c *tokenCache) RevokeOrderTokens(ctx context.Context, orderID string, now time.Time) (int, error) {
	defer c.forget()
	return c.Store.RevokeOrderTokens(ctx, orderID, now)
}

func (c *tokenCache) RemoveImage(ctx context.Context, tenantID int64, uploadID string) error {
	defer c.forget()
	return c.Store.RemoveImage(ctx, tenantID, uploadID)
}
