package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// messageCache keeps the encoded push of recent messages, so that the 50
// chunks of a message read and encode its payload once per process, not once
// per chunk.
type messageCache struct {
	pool *pgxpool.Pool
	size int

	mu    sync.Mutex
	items map[messageKey]*push.Message
	order []messageKey // oldest first
}

// messageKey names one encoding: a local-time message has a lifetime per
// wave, so its waves differ in expiry.
type messageKey struct {
	id        int64
	expiresAt int64
}

func newMessageCache(pool *pgxpool.Pool, size int) *messageCache {
	return &messageCache{pool: pool, size: size, items: make(map[messageKey]*push.Message, size)}
}

func (c *messageCache) get(ctx context.Context, a FanOutArgs) (*push.Message, error) {
	key := messageKey{id: a.MessageID, expiresAt: a.ExpiresAt.UnixNano()}
	c.mu.Lock()
	m, ok := c.items[key]
	c.mu.Unlock()
	if ok {
		return m, nil
	}

	raw, err := db.New(c.pool).GetPayload(ctx, a.PayloadID)
	if err != nil {
		return nil, fmt.Errorf("read payload %d: %w", a.PayloadID, db.Translate(err))
	}
	var content push.Content
	if err := json.Unmarshal(raw, &content); err != nil {
		return nil, fmt.Errorf("decode payload %d: %w", a.PayloadID, err)
	}
	m, err = push.NewMessage(push.FormatMessageID(a.MessageID), a.Priority == PriorityUrgent, content, a.ExpiresAt)
	if err != nil {
		return nil, fmt.Errorf("encode payload %d: %w", a.PayloadID, err)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[key]; !ok {
		c.items[key] = m
		c.order = append(c.order, key)
		if len(c.order) > c.size {
			delete(c.items, c.order[0])
			c.order = c.order[1:]
		}
	}
	return m, nil
}
