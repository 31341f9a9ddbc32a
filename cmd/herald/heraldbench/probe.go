package heraldbench

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// providers builds provider clients as a Herald worker of lane would, on
// fakepush.
func (b *Benchmark) providers(ctx context.Context, lane string) (map[string]jobs.Sender, func(), error) {
	return b.Providers(ctx, func(k string) string {
		if v, ok := b.fakeEnv[k]; ok {
			return v
		}
		return b.Getenv(k)
	}, lane)
}

// probeEvery is how often the bench probes the machine while the bulk
// message is in flight.
const probeEvery = 50 * time.Millisecond

// probe measures, from this process, round trips like the urgent lane's
// while the bulk message is in flight: every probeEvery, one APNs push to
// fakepush through a client of its own (each with a message id of its own,
// so never a duplicate) and one empty query (db Ping, SELECT 1) on a connection of its own. It
// probes until stop is closed, then returns the round trips in ms, sorted.
func (b *Benchmark) probe(ctx context.Context, apns jobs.Sender, conn *pgx.Conn, stop <-chan struct{}) (provider, database []float64) {
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	target := []push.Target{{Token: strings.Repeat("cd", 32)}}
	result := make([]push.Result, 1)
	allow := func() bool { return true }
	for n := 0; ; n++ {
		msg, err := push.NewMessage("msg_probe_"+strconv.Itoa(n), true, push.Content{Title: "probe"}, time.Now().Add(time.Minute))
		if err == nil && apns != nil {
			start := time.Now()
			apns.Send(ctx, msg, target, result, allow, nil)
			if result[0].Accepted {
				provider = append(provider, ms(time.Since(start)))
			}
		}
		start := time.Now()
		if err := db.On(conn).Ping(ctx); err == nil {
			database = append(database, ms(time.Since(start)))
		}
		select {
		case <-stop:
			slices.Sort(provider)
			slices.Sort(database)
			return provider, database
		case <-tick.C:
		}
	}
}
