package jobs

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/heraldpush/herald/jobs/push"
)

// messageCache keeps the encoded pushes of recent messages, so that a
// message's chunks encode its payload about once per process, not once per
// chunk: a chunk that finds its message here does not read the payload at
// all.
type messageCache struct {
	size int

	mu    sync.Mutex
	items map[messageKey]*encodedMessage
	order []messageKey // oldest first
}

// messageKey names one encoding: a local-time message has a lifetime per
// wave, so its waves differ in expiry.
type messageKey struct {
	id        int64
	expiresAt int64
}

func newMessageCache(size int) *messageCache {
	return &messageCache{size: size, items: make(map[messageKey]*encodedMessage, size)}
}

func keyOf(a FanOutArgs) messageKey {
	return messageKey{id: a.MessageID, expiresAt: a.ExpiresAt.UnixNano()}
}

// lookup returns a's message if it is cached.
func (c *messageCache) lookup(a FanOutArgs) (*encodedMessage, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.items[keyOf(a)]
	return m, ok
}

// build encodes a's message from its stored payload and caches it. Chunks
// that started together may each build it; the first one kept is returned
// to all.
func (c *messageCache) build(a FanOutArgs, raw []byte) (*encodedMessage, error) {
	var content push.Content
	if err := json.Unmarshal(raw, &content); err != nil {
		return nil, fmt.Errorf("decode payload %d: %w", a.PayloadID, err)
	}
	m, err := encode(a, content)
	if err != nil {
		return nil, err
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

// encodedMessage is a message encoded for every channel once per variant:
// its own text and each of its localizations.
type encodedMessage struct {
	own  *push.Message
	byID map[string]*push.Message // by localization key
	// apps are the variants of the apps whose overrides the payload has
	// (push.Content.Apps), by app name and then localization key ("" for
	// the message's own text).
	apps map[string]map[string]*push.Message
}

// encode encodes a's message, content, in each of its variants: the same
// push.NewMessage for each, on a copy of content with the localization's
// text, and with each app's overrides.
func encode(a FanOutArgs, content push.Content) (*encodedMessage, error) {
	id, urgent := push.FormatMessageID(a.MessageID), a.Priority == PriorityUrgent
	own, err := push.NewMessage(id, urgent, content.Localized(""), a.ExpiresAt)
	if err != nil {
		return nil, fmt.Errorf("encode payload %d: %w", a.PayloadID, err)
	}
	m := &encodedMessage{own: own, byID: make(map[string]*push.Message, len(content.Localizations))}
	for key := range content.Localizations {
		if m.byID[key], err = push.NewMessage(id, urgent, content.Localized(key), a.ExpiresAt); err != nil {
			return nil, fmt.Errorf("encode payload %d, localization %q: %w", a.PayloadID, key, err)
		}
	}
	for app := range content.Apps {
		c := content.ForApp(app)
		byKey := make(map[string]*push.Message, len(content.Localizations)+1)
		if byKey[""], err = push.NewMessage(id, urgent, c.Localized(""), a.ExpiresAt); err != nil {
			return nil, fmt.Errorf("encode payload %d for app %q: %w", a.PayloadID, app, err)
		}
		for key := range content.Localizations {
			if byKey[key], err = push.NewMessage(id, urgent, c.Localized(key), a.ExpiresAt); err != nil {
				return nil, fmt.Errorf("encode payload %d for app %q, localization %q: %w", a.PayloadID, app, key, err)
			}
		}
		if m.apps == nil {
			m.apps = map[string]map[string]*push.Message{}
		}
		m.apps[app] = byKey
	}
	return m, nil
}

// localized is the push in localization key; the message's own text when it
// has no such localization (a chunk packed before the payload was read
// cannot name one it lacks, but its own text is the safe answer).
func (m *encodedMessage) localized(key string) *push.Message {
	if l, ok := m.byID[key]; ok {
		return l
	}
	return m.own
}

// variant is the push for a device of app in localization key: the app's
// overrides where the payload has some for it, else localized's.
func (m *encodedMessage) variant(app, key string) *push.Message {
	if byKey, ok := m.apps[app]; ok {
		if l, ok := byKey[key]; ok {
			return l
		}
		return byKey[""]
	}
	return m.localized(key)
}
