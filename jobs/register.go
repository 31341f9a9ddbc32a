package jobs

import "github.com/riverqueue/river"

// Register adds Herald's job workers to workers and returns the chunk
// worker, whose breakers the API reports.
func Register(workers *river.Workers, fanOut FanOutConfig, materializer *Materializer, retainer *Retainer) *FanOutWorker {
	w := NewFanOutWorker(fanOut)
	river.AddWorker(workers, w)
	river.AddWorker(workers, &MaterializeWorker{m: materializer})
	river.AddWorker(workers, NewRetainWorker(retainer))
	return w
}
