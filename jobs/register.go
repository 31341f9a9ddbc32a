package jobs

import (
	"time"

	"github.com/riverqueue/river"
)

// Register adds Herald's job workers to workers and returns the chunk
// worker, whose breakers the API reports.
func Register(workers *river.Workers, fanOut FanOutConfig, materializer *Materializer, retainer *Retainer) *FanOutWorker {
	w := NewFanOutWorker(fanOut)
	river.AddWorker(workers, w)
	river.AddWorker(workers, &MaterializeWorker{m: materializer})
	river.AddWorker(workers, &ReconcileWorker{r: &Reconciler{
		Pool: fanOut.Pool, Logger: fanOut.Logger, Metrics: fanOut.Metrics,
		// Past any chunk attempt still sending, and River's rescue of a
		// chunk whose process died.
		Grace: max(5*time.Minute, 2*w.cfg.Timeout),
	}})
	river.AddWorker(workers, NewRetainWorker(retainer))
	return w
}
