package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"golang.org/x/sync/singleflight"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// messageCache keeps the encoded push of recent messages, so that the 50
// chunks of a message read and encode its payload once per process, not once
// per chunk: they start at the same instant, so the first miss is shared.
type messageCache struct {
	size    int
	loading singleflight.Group

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

func newMessageCache(size int) *messageCache {
	return &messageCache{size: size, items: make(map[messageKey]*push.Message, size)}
}

// get returns a's message, reading its payload with q on a miss.
func (c *messageCache) get(ctx context.Context, q *db.Queries, a FanOutArgs) (*push.Message, error) {
	key := messageKey{id: a.MessageID, expiresAt: a.ExpiresAt.UnixNano()}
	c.mu.Lock()
	m, ok := c.items[key]
	c.mu.Unlock()
	if ok {
		return m, nil
	}

	v, err, _ := c.loading.Do(strconv.FormatInt(key.id, 10)+"/"+strconv.FormatInt(key.expiresAt, 10), func() (any, error) {
		return load(ctx, q, a)
	})
	if err != nil {
		return nil, err
	}
	m = v.(*push.Message)

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

// load reads and encodes a's message.
func load(ctx context.Context, q *db.Queries, a FanOutArgs) (*push.Message, error) {
	raw, err := q.GetPayload(ctx, a.PayloadID)
	if err != nil {
		return nil, fmt.Errorf("read payload %d: %w", a.PayloadID, db.Translate(err))
	}
	var content push.Content
	if err := json.Unmarshal(raw, &content); err != nil {
		return nil, fmt.Errorf("decode payload %d: %w", a.PayloadID, err)
	}
	m, err := push.NewMessage(push.FormatMessageID(a.MessageID), a.Priority == PriorityUrgent, content, a.ExpiresAt)
	if err != nil {
		return nil, fmt.Errorf("encode payload %d: %w", a.PayloadID, err)
	}
	return m, nil
}
