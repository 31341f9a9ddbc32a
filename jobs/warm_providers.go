package jobs

import (
	"context"
	"sync"
	"time"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
)

// connWarmer is a provider client that opens, ahead of an instant, the
// connections a send to targets will use: the APNs, FCM and Web Push
// clients' WarmFor.
type connWarmer interface {
	WarmFor(ctx context.Context, targets []push.Target) error
}

// maxConnWarmups is how many connections (a lane client's APNs
// environment, its FCM pool, one push service) one instant's warm-up opens
// at most: the chunks it reads may name many push services, and an
// instant's first pushes need only those of its first devices.
const maxConnWarmups = 32

// instantConns is the provider side of one instant's warm-up: as each chunk
// is read (FanOutWorker.Warm), the connections its devices will be sent on
// are opened, concurrently, through the lane's clients, each at most once
// and at most maxConnWarmups of them. A warm-up that fails is logged, and
// the instant goes on: its pushes open what the warm-up could not.
type instantConns struct {
	w    *FanOutWorker
	lane Lane
	ctx  context.Context

	mu sync.Mutex
	// seen are the connections this instant's chunks named so far, opened
	// the number of them this warm-up opens.
	seen   map[connKey]bool
	opened int
	wg     sync.WaitGroup
}

func (w *FanOutWorker) instantConns(ctx context.Context, lane Lane) *instantConns {
	return &instantConns{w: w, lane: lane, ctx: ctx, seen: map[connKey]bool{}}
}

// add opens the connections the chunk's pending deliveries will be sent
// on that no warm-up opened lately.
func (ic *instantConns) add(pending []db.ChunkPendingRow) {
	now := time.Now()
	type client struct {
		g       sendGroup
		keys    []connKey
		targets []push.Target
	}
	var clients []*client
	byGroup := map[sendGroup]*client{}
	ic.mu.Lock()
	for _, r := range pending {
		if ic.opened >= maxConnWarmups {
			break
		}
		if r.Gone != "" {
			continue
		}
		g := sendGroup{channel: r.Channel, app: max(r.AppID, apps.DefaultID)}
		if r.Channel == ChannelWebPush {
			g.credential = r.CredentialID
		}
		k := connKey{lane: ic.lane.Queue, channel: g.channel, app: g.app, credential: g.credential, where: connWhere(r)}
		if ic.seen[k] {
			continue
		}
		ic.seen[k] = true
		if !ic.w.warmed.claim(k, now) {
			continue
		}
		ic.opened++
		t := targetOf(r)
		c := byGroup[g]
		if c == nil {
			c = &client{g: g}
			byGroup[g] = c
			clients = append(clients, c)
		}
		c.keys, c.targets = append(c.keys, k), append(c.targets, t.Target)
	}
	ic.mu.Unlock()
	for _, c := range clients {
		ic.wg.Go(func() { ic.warm(c.g, c.keys, c.targets) })
	}
}

// connWhere is what a delivery's connection is within its client: its
// device's APNs environment, or its Web Push service's host.
func connWhere(r db.ChunkPendingRow) string {
	switch r.Channel {
	case ChannelAPNs:
		return r.Environment
	case ChannelWebPush:
		return push.EndpointHost(r.Token)
	}
	return ""
}

// warm opens, through the lane's client of g, the connections keys name,
// which targets will be sent on.
func (ic *instantConns) warm(g sendGroup, keys []connKey, targets []push.Target) {
	s, lease, _ := ic.w.sender(ic.lane, g)
	defer lease.Release()
	cw, ok := s.(connWarmer)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ic.ctx, push.WarmTimeout)
	defer cancel()
	if err := cw.WarmFor(ctx, targets); err != nil {
		ic.w.warmed.forget(keys)
		if ic.ctx.Err() != nil {
			return // the instant came first
		}
		ic.w.cfg.Logger.WarnContext(ic.ctx, "provider connections could not be opened ahead of an instant; its first pushes open them",
			"lane", ic.lane.Queue, "app", ic.w.appName(ic.lane, g.app), "channel", g.channel, "error", err)
	}
}

// wait returns once every warm-up started has ended.
func (ic *instantConns) wait() { ic.wg.Wait() }
