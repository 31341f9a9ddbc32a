package jobs

import (
	"github.com/riverqueue/river"
)

// Register adds Herald's job workers to workers and returns the chunk
// worker, whose breakers the API reports.
func Register(workers *river.Workers, fanOut FanOutConfig, materializer *Materializer, retainer *Retainer) (*FanOutWorker, error) {
	w := NewFanOutWorker(fanOut)
	reconciler, err := NewReconciler(&ReconcilerConfig{
		Pool: fanOut.Pool, Logger: fanOut.Logger, Metrics: fanOut.Metrics,
		// Past any chunk attempt still sending, and River's rescue of a
		// chunk whose process died.
		Grace:       max(DefaultReconcileGrace, 2*w.cfg.Timeout),
		AttemptSpan: w.cfg.Timeout + recordTimeout,
	})
	if err != nil {
		return nil, err
	}
	AddChunkWorkers(workers, w)
	river.AddWorker(workers, &MaterializeWorker{m: materializer})
	river.AddWorker(workers, &ReconcileWorker{r: reconciler, chunkSize: materializer.cfg.ChunkSize})
	river.AddWorker(workers, &RestWorker{pool: fanOut.Pool, chunkSize: materializer.cfg.ChunkSize})
	river.AddWorker(workers, NewRetainWorker(retainer))
	return w, nil
}
