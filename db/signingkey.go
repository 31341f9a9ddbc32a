package db

import (
	"context"
	"crypto/rand"
	"fmt"
)

// SharedKey is the key every process uses for purpose (signing_keys): the
// first process to ask draws size random bytes and stores them, and every
// later one, racing or not, reads what was stored. It runs outside any
// transaction, so that the read sees a key a racing process committed.
func SharedKey(ctx context.Context, q DBTX, purpose string, size int) ([]byte, error) {
	qs := On(q)
	fresh := make([]byte, size)
	_, _ = rand.Read(fresh)
	if err := qs.InsertSigningKey(ctx, InsertSigningKeyParams{Purpose: purpose, Key: fresh}); err != nil {
		return nil, fmt.Errorf("store the %s key: %w", purpose, err)
	}
	key, err := qs.SigningKey(ctx, purpose)
	if err != nil {
		return nil, fmt.Errorf("read the %s key: %w", purpose, err)
	}
	return key, nil
}
