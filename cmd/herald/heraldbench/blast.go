package heraldbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// blast sends the messages' devices again, straight through the same
// provider clients Herald uses, with the same chunking and worker count but
// no database and no queue: the floor of what the fan-out can cost here.
func (b *Benchmark) blast(ctx context.Context, pool db.DBTX, messageIDs []int64) (wallMs, cpuPerSend float64, err error) {
	resp, err := b.fakeHTTP.Post(b.fakeURL+"/_reset", "application/json", nil)
	if err != nil {
		return 0, 0, err
	}
	resp.Body.Close()

	// The chunks exactly as Herald's workers read them, message by message.
	var chunks [][]jobs.Target
	for _, id := range messageIDs {
		rows, err := db.On(pool).BenchChunkTargets(ctx, id)
		if err != nil {
			return 0, 0, fmt.Errorf("read the chunks: %w", err)
		}
		for i, r := range rows {
			if i == 0 || r.Chunk != rows[i-1].Chunk {
				chunks = append(chunks, nil)
			}
			chunks[len(chunks)-1] = append(chunks[len(chunks)-1],
				jobs.NewTarget(r.DeviceID, r.Channel, nil, r.Token, r.P256dh, r.Auth, r.Environment))
		}
	}

	provs, closeProvs, err := b.providers(ctx, "bulk")
	if err != nil {
		return 0, 0, err
	}
	defer closeProvs()
	msg, err := push.NewMessage("msg_blast", false, b.bulkPayload(), time.Now().Add(time.Hour))
	if err != nil {
		return 0, 0, err
	}

	// The pushes carry receipt tokens as the worker's do, signed a slice
	// at a time, unless the run's Herald sends none.
	signer, err := b.blastSigner()
	if err != nil {
		return 0, 0, err
	}
	expires := time.Now().Add(time.Hour + jobs.DefaultReceiptWindow)

	workers := 50 // jobs.RiverConfig's default
	if n, err := strconv.Atoi(b.Getenv("HERALD_BULK_WORKERS")); err == nil && n > 0 {
		workers = n
	}
	allow := func() bool { return true }
	var (
		mu          sync.Mutex
		first, last time.Time
		sends       int
	)
	cpu0 := selfCPU()
	work := make(chan []jobs.Target)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for chunk := range work {
				byChannel := map[string][]push.Target{}
				for _, t := range chunk {
					byChannel[t.Channel] = append(byChannel[t.Channel], t.Target)
				}
				var cw sync.WaitGroup
				for channel, targets := range byChannel {
					p := provs[channel]
					cw.Go(func() {
						push.SignReceipts(signer, 1, expires, targets)
						results := make([]push.Result, len(targets))
						p.Send(ctx, msg, targets, results, allow, nil)
						mu.Lock()
						defer mu.Unlock()
						for _, r := range results {
							if !r.Accepted {
								continue
							}
							sends++
							if first.IsZero() || r.At.Before(first) {
								first = r.At
							}
							if r.At.After(last) {
								last = r.At
							}
						}
					})
				}
				cw.Wait()
			}
		})
	}
	for _, c := range chunks {
		work <- c
	}
	close(work)
	wg.Wait()
	cpu := selfCPU() - cpu0
	if sends == 0 {
		return 0, 0, errors.New("blast: no send was accepted")
	}
	return ms(last.Sub(first)), round1(float64(cpu.Microseconds()) / float64(sends)), nil
}
