package jobs

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// Takeover gives the running chunks of a worker process that is gone to
// the living, within seconds: every Every it lists the running chunks whose
// worker no longer holds its liveness lock (Liveness), and makes available
// again those whose lock has stayed free for Grace. Any worker's lane then
// fetches them at once and sends what is still pending; what the dead
// worker had in flight without an answer written may be sent twice, the
// same bound as River's own rescue, which still covers workers of releases
// without a liveness lock. Every worker runs one; they may race for a
// chunk, and RetakeChunk takes it once.
type Takeover struct {
	cfg TakeoverConfig
}

// TakeoverConfig configures a Takeover.
type TakeoverConfig struct {
	Pool   *pgxpool.Pool
	Logger *slog.Logger
	// Every is how often it looks (DefaultTakeoverEvery); Grace how long a
	// worker's lock must be seen free before its chunks are taken
	// (DefaultTakeoverGrace); Lease how long a worker's liveness session
	// may be silent before it is ended (DefaultLivenessLease), which must
	// exceed the workers' fence.
	Every, Grace, Lease time.Duration
	// Wake, when set, is called with a queue whose chunks were made
	// available, so that its lane fetches them at once.
	Wake func(ctx context.Context, queue string)
	// Metrics counts the chunks taken over; optional.
	Metrics *Metrics
}

// withDefaults fills the settings left zero with their defaults.
func (c *TakeoverConfig) withDefaults() {
	c.Every = cmp.Or(c.Every, DefaultTakeoverEvery)
	c.Grace = cmp.Or(c.Grace, DefaultTakeoverGrace)
	c.Lease = cmp.Or(c.Lease, DefaultLivenessLease)
}

// validate names the first setting a Takeover cannot work with.
func (c *TakeoverConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errRequired("TakeoverConfig.Pool")
	case c.Logger == nil:
		return errRequired("TakeoverConfig.Logger")
	case c.Every < 0:
		return errNegative("TakeoverConfig.Every", c.Every)
	case c.Grace < 0:
		return errNegative("TakeoverConfig.Grace", c.Grace)
	case c.Lease <= DefaultLivenessFence:
		return fmt.Errorf("jobs: TakeoverConfig.Lease (%s) must exceed the workers' fence (%s)", c.Lease, DefaultLivenessFence)
	}
	return nil
}

// NewTakeover fills cfg's defaults and checks it.
func NewTakeover(cfg *TakeoverConfig) (*Takeover, error) {
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	return &Takeover{cfg: c}, nil
}

// Run looks every Every until ctx ends.
func (t *Takeover) Run(ctx context.Context) {
	seen := map[db.AbandonedChunk]time.Time{}
	tick := time.NewTicker(t.cfg.Every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := t.pass(ctx, seen, time.Now()); err != nil && ctx.Err() == nil {
			t.cfg.Logger.Warn("taking over a gone worker's chunks failed; trying again", "error", err)
		}
	}
}

// pass is one look: seen holds when each abandoned chunk was first seen
// so, and forgets those that are no longer.
func (t *Takeover) pass(ctx context.Context, seen map[db.AbandonedChunk]time.Time, now time.Time) error {
	// A worker that went silent without its session closing (frozen, or
	// its host or network gone) holds its lock until its session is ended:
	// then its chunks are abandoned like a dead worker's.
	ended, err := db.EndSilentLiveness(ctx, t.cfg.Pool, t.cfg.Lease)
	if err != nil {
		return err
	}
	if len(ended) > 0 {
		t.cfg.Metrics.silentLivenessEnded(len(ended))
		t.cfg.Logger.Warn("ended the liveness sessions of workers silent for longer than the lease: their chunks are taken over once their locks stay free",
			"liveness_keys", ended, "lease", t.cfg.Lease)
	}
	abandoned, err := db.AbandonedChunks(ctx, t.cfg.Pool, chunkKinds)
	if err != nil {
		return err
	}
	still := make(map[db.AbandonedChunk]bool, len(abandoned))
	woken := map[string]bool{}
	for _, c := range abandoned {
		still[c] = true
		first, ok := seen[c]
		if !ok {
			seen[c] = now
			continue
		}
		if now.Sub(first) < t.cfg.Grace {
			continue
		}
		taken, err := db.RetakeChunk(ctx, t.cfg.Pool, c, "the worker process running this chunk is gone (its liveness lock was free for "+t.cfg.Grace.String()+"): taken over")
		if err != nil {
			return err
		}
		delete(seen, c)
		if !taken {
			continue
		}
		t.cfg.Metrics.chunkTakenOver()
		t.cfg.Logger.Warn("took over a chunk whose worker is gone", "job_id", c.ID, "client", c.ClientID, "queue", c.Queue)
		woken[c.Queue] = true
	}
	for c := range seen {
		if !still[c] {
			delete(seen, c)
		}
	}
	if t.cfg.Wake != nil {
		for queue := range woken {
			t.cfg.Wake(ctx, queue)
		}
	}
	return nil
}
