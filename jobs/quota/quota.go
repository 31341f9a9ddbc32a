// Package quota paces a provider's requests to a rate that every Herald
// process shares: an FCM project's sends, a Web Push sender's at one push
// service. The rate is the provider's, configured once; each process's
// clients, in every lane, take their turns from one token bucket kept in
// PostgreSQL (migration 0023), so the sum over all processes never exceeds
// it, however many workers run. The urgent lane has first claim: the bulk
// lane leaves part of the bucket to it.
//
// A quota is a rate counted over a window (a minute by default, as FCM
// counts its quota): no window, however it falls, carries more than the
// rate's worth. The bucket holds at most a twentieth of a window's worth,
// which is the burst an instant can send at once; a process spends the
// tokens it claimed within Keep or drops them; and the bucket refills at
// what is left of the rate, with room for the requests' way to the
// provider (Jitter). A process claims a few tokens at a time (about
// 10 ms worth), so the database sees a claim for every few dozen sends,
// not one a send.
package quota

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// Keep is how long a process may hold tokens it claimed before it drops
// them: what bounds the sends a second over all processes with the tokens
// they hold.
const Keep = 50 * time.Millisecond

// Jitter is the delay between a request's turn and its arrival at the
// provider that a bucket leaves room for: the request's way through the
// process, its connection and the network, longer on a loaded machine.
// The provider counts arrivals.
const Jitter = 150 * time.Millisecond

// urgentReserve is how much of the rate the bulk lane leaves in the bucket
// for the urgent lane: 50 ms worth, which the bulk lane waits out after
// draining the bucket, and more than the urgent lane sends at once.
const urgentReserve = 50 * time.Millisecond

// claimEvery is how long a batch of tokens lasts at the full rate.
const claimEvery = 10 * time.Millisecond

// DefaultWindow is the span a quota's rate is counted over: a minute, as
// FCM counts its projects' quotas (600,000 messages a minute by default).
const DefaultWindow = time.Minute

// Store hands out the process's buckets, one a quota key, so that every
// client of a lane sending under one quota shares its tokens.
type Store struct {
	logger *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	buckets map[string]*Bucket
}

// NewStore returns the process's Store of quotas.
func NewStore(logger *slog.Logger) *Store {
	return &Store{logger: logger, now: time.Now, buckets: map[string]*Bucket{}}
}

// Bucket is the quota of key at perSecond, counted over window, made on
// first use. A key's rate is the one of its first use in the process;
// every process should configure the same.
func (s *Store) Bucket(key string, perSecond float64, window time.Duration) *Bucket {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.buckets[key]; ok {
		return b
	}
	b := newBucket(s, key, perSecond, window)
	s.buckets[key] = b
	return b
}

// Bucket is one quota as this process takes from it: one Pacer a lane.
type Bucket struct {
	store *Store
	key   string
	// rate is the quota; refill and capacity the bucket's, derived from it
	// (newBucket); batch how many tokens a claim asks for.
	rate, refill, capacity float64
	batch                  int

	mu     sync.Mutex
	pacers map[bool]*Pacer
}

func newBucket(s *Store, key string, perSecond float64, window time.Duration) *Bucket {
	// Any window holds at most what the bucket held at its start, what it
	// refills within it, and what was claimed just before it and arrives
	// in it (spent within Keep, arriving within Jitter):
	// capacity + refill*(window+Keep+Jitter) <= rate*window.
	worth := perSecond * window.Seconds()
	capacity := max(1, worth/20)
	refill := (worth - capacity) / (window + Keep + Jitter).Seconds()
	batch := int(max(1, min(capacity, math.Ceil(refill*claimEvery.Seconds()))))
	return &Bucket{store: s, key: key, rate: perSecond, refill: max(refill, perSecond/100), capacity: capacity, batch: batch, pacers: map[bool]*Pacer{}}
}

// Rate is the quota, a second: no window carries more than its worth.
func (b *Bucket) Rate() float64 { return b.rate }

// Pacer is the bucket as one lane of the process takes from it, claiming
// through pool: the urgent lane's own connections, so that its claims never
// wait behind a bulk fan-out's. The urgent lane takes any token; the bulk
// lane leaves it urgentReserve's worth of the rate (at most half the
// bucket), which a bulk fan-out that drained the bucket refills first. A lane's clients sending
// under the same quota share its Pacer.
func (b *Bucket) Pacer(urgent bool, pool *pgxpool.Pool) *Pacer {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.pacers[urgent]; ok {
		return p
	}
	reserve := min(b.capacity/2, b.rate*urgentReserve.Seconds())
	if urgent || b.capacity < 2 {
		reserve = 0
	}
	p := &Pacer{bucket: b, pool: pool, reserve: reserve}
	b.pacers[urgent] = p
	return p
}

// Pacer paces one lane's requests under a shared quota (push.Pacer).
type Pacer struct {
	bucket  *Bucket
	pool    *pgxpool.Pool
	reserve float64

	// mu serializes the lane's claims: one at a time asks the database,
	// the others then find its tokens.
	mu        sync.Mutex
	local     int
	grantedAt time.Time
	// failing is set while claims fail, so that the failure is logged once.
	failing bool
}

// Wait blocks until the lane may make one request, or ctx ends. While the
// database cannot be reached it waits and tries again: a request that may
// exceed the quota is not made.
func (p *Pacer) Wait(ctx context.Context) error {
	for {
		wait, ok := p.take(ctx)
		if ok {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// take takes a token the lane holds, or claims a batch; when none is to be
// had it says how long to wait before asking again.
func (p *Pacer) take(ctx context.Context) (time.Duration, bool) {
	b := p.bucket
	p.mu.Lock()
	defer p.mu.Unlock()
	now := b.store.now()
	if p.local > 0 && now.Sub(p.grantedAt) < Keep {
		p.local--
		return 0, true
	}
	p.local = 0
	granted, left, err := db.ClaimQuota(ctx, p.pool, db.QuotaClaim{
		Key: b.key, Rate: b.refill, Capacity: b.capacity, Want: b.batch, Reserve: p.reserve,
	})
	if err != nil {
		if !p.failing && ctx.Err() == nil {
			b.store.logger.Warn("a provider quota cannot be claimed: its requests wait until the database answers", "quota", b.key, "error", err)
		}
		p.failing = ctx.Err() == nil
		return 100 * time.Millisecond, false
	}
	if p.failing {
		b.store.logger.Info("a provider quota can be claimed again", "quota", b.key)
		p.failing = false
	}
	if granted > 0 {
		p.local, p.grantedAt = granted-1, b.store.now()
		return 0, true
	}
	// The bucket refills at refill a second: wait for one token above the
	// reserve, within bounds that keep a lane responsive.
	need := 1 + p.reserve - left
	wait := time.Duration(need / b.refill * float64(time.Second))
	return min(max(wait, time.Millisecond), 100*time.Millisecond), false
}

// Busiest is the most of the sorted instants at that fall in any span of
// window, however it falls: the busiest window a provider counting its
// quota over window saw of sends that arrived at those instants.
func Busiest(at []time.Time, window time.Duration) int {
	most, start := 0, 0
	for end := range at {
		for at[end].Sub(at[start]) >= window {
			start++
		}
		most = max(most, end-start+1)
	}
	return most
}
