package jobs

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/heraldpush/herald/jobs/push"
)

// messageCache keeps the encoded push of recent messages, so that a
// message's chunks encode its payload about once per process, not once per
// chunk: a chunk that finds its message here does not read the payload at
// all.
type messageCache struct {
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

func newMessageCache(size int) *messageCache {
	return &messageCache{size: size, items: make(map[messageKey]*push.Message, size)}
}

func keyOf(a FanOutArgs) messageKey {
	return messageKey{id: a.MessageID, expiresAt: a.ExpiresAt.UnixNano()}
}

// lookup returns a's message if it is cached.
func (c *messageCache) lookup(a FanOutArgs) (*push.Message, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.items[keyOf(a)]
	return m, ok
}

// build encodes a's message from its stored payload and caches it. Chunks
// that started together may each build it; the first one kept is returned
// to all.
func (c *messageCache) build(a FanOutArgs, raw []byte) (*push.Message, error) {
	var content push.Content
	if err := json.Unmarshal(raw, &content); err != nil {
		return nil, fmt.Errorf("decode payload %d: %w", a.PayloadID, err)
	}
	m, err := push.NewMessage(push.FormatMessageID(a.MessageID), a.Priority == PriorityUrgent, content, a.ExpiresAt)
	if err != nil {
		return nil, fmt.Errorf("encode payload %d: %w", a.PayloadID, err)
	}
	key := keyOf(a)
	c.mu.Lock()
	defer c.mu.Unlock()
	if kept, ok := c.items[key]; ok {
		return kept, nil
	}
	c.items[key] = m
	c.order = append(c.order, key)
	if len(c.order) > c.size {
		delete(c.items, c.order[0])
		c.order = c.order[1:]
	}
	return m, nil
}
