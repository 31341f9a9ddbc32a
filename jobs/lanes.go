package jobs

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
)

// Lanes: each priority has its own River queue and its own workers, so that
// a one-device urgent message never waits behind a bulk fan-out.
const (
	QueueUrgent = "urgent"
	QueueBulk   = "bulk"
)

// Priorities a message may have; each names its lane.
const (
	PriorityUrgent = "urgent"
	PriorityBulk   = "bulk"
)

// Lane is one chunk lane of a worker process, with everything it has of
// its own: its River queue (named like the priority of the messages it
// carries), how many of its chunks run at once, and the connections and
// provider clients its chunks use, so that nothing of the urgent lane
// queues behind a bulk fan-out. A deployment that must keep urgent pushes
// fast while bulk fan-outs saturate its workers runs some processes with
// the urgent lane alone: inside one process the lanes share the Go
// scheduler, and nothing there puts an urgent goroutine ahead of a bulk one
// (docs/operations.md, "Sizing").
type Lane struct {
	// Queue is QueueUrgent or QueueBulk.
	Queue string
	// Workers is how many of the lane's chunks run at once in this
	// process; zero takes DefaultUrgentWorkers or DefaultBulkWorkers.
	Workers int
	// Pool, when set, is the lane's own connections: its chunks read and
	// write through them, and a River client of its own fetches and
	// completes its jobs on them. At the instant a bulk message is due, its
	// chunks take every connection of the shared pool, and the urgent
	// lane's work would queue behind them. Nil: the process's pool and its
	// main River client.
	Pool *pgxpool.Pool
	// Providers are the lane's provider clients by channel, with their own
	// connections and in-flight limits; a channel without one is disabled,
	// and its deliveries fail with channel_disabled. They send the default
	// app's devices when Apps is nil.
	Providers map[string]Sender
	// Apps, when set, is where every device's client comes from, by its
	// app and channel (jobs/apps): the clients of each app's credentials,
	// this lane's own, and the environment's for the default app. Providers
	// is then not used.
	Apps *apps.Registry
}

// LaneQueues are the lanes' queues, urgent first.
var LaneQueues = []string{QueueUrgent, QueueBulk}

// ParseLanes reads a comma-separated list of lanes ("urgent", "bulk") into
// their queues, urgent first; empty means both.
func ParseLanes(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return LaneQueues, nil
	}
	named := map[string]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(LaneQueues, name) {
			return nil, fmt.Errorf("unknown lane %q: the lanes are urgent and bulk, comma-separated", name)
		}
		named[name] = true
	}
	var queues []string
	for _, q := range LaneQueues {
		if named[q] {
			queues = append(queues, q)
		}
	}
	return queues, nil
}

func laneQueue(priority string) string {
	if priority == PriorityUrgent {
		return QueueUrgent
	}
	return QueueBulk
}

// workers is the lane's worker count, or its default.
func (l Lane) workers() int {
	switch {
	case l.Workers > 0:
		return l.Workers
	case l.Queue == QueueUrgent:
		return DefaultUrgentWorkers
	default:
		return DefaultBulkWorkers
	}
}

// Sender sends one message to many devices of one channel: a provider. It
// fills results[i] for targets[i], asking allow before each request; a send
// that allow refuses is left unattempted (zero Result.At) and parked. It
// calls answered (unless nil) with i once results[i] holds a request's
// answer, as answers come, and does not call it for targets it refused
// without a request. It bounds its own requests in flight.
type Sender interface {
	Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(i int))
}
