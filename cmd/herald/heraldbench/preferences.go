package heraldbench

import (
	"context"
	"fmt"
	"time"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/preferences"
)

// benchCategory is the bulk messages' category with --preferences.
const benchCategory = "bench"

// Withheld is what a --preferences run's bulk messages withheld for their
// users, against what the population's rules say they should (want_*),
// and the cost a device sent to or withheld.
type Withheld struct {
	OptedOut     int `json:"opted_out"`
	Held         int `json:"held"`
	Capped       int `json:"capped"`
	WantOptedOut int `json:"want_opted_out"`
	WantHeld     int `json:"want_held"`
	WantCapped   int `json:"want_capped"`
	// CPUPerDevice is Herald's and PostgreSQL's CPU over the messages'
	// life (as cpu_us_per_send and postgres_cpu_us_per_send), per device
	// of the audience, sent or withheld.
	CPUPerDevice float64 `json:"cpu_us_per_device"`
	// FirstCPUPerPush is Herald's and PostgreSQL's CPU from the instant
	// until the held users' quiet hours end, a push sent in that span (the
	// accepted but the held); ReleaseCPUPerPush is theirs from then until
	// the messages settled, a held push: what a delivery held to the end
	// of quiet hours costs to send, against one sent at the instant. Both
	// are left out when the cluster's CPU was not read, or the messages
	// settled before the hours ended.
	FirstCPUPerPush   *float64 `json:"first_cpu_us_per_push,omitempty"`
	ReleaseCPUPerPush *float64 `json:"release_cpu_us_per_push,omitempty"`
}

// heldUntil is when the quiet hours of the users held at a --preferences
// run's instant end: the next whole minute (preferencesInstant).
func heldUntil(instant time.Time) time.Time {
	return instant.Add(time.Minute).Truncate(time.Minute)
}

// markRelease marks the CPU spans (markReleased) when the quiet hours of
// the users held at instant end, unless stop is closed first.
func (b *Benchmark) markRelease(ctx context.Context, cpu *cpuSpans, instant time.Time, stop <-chan struct{}) error {
	t := time.NewTimer(time.Until(heldUntil(instant)))
	defer t.Stop()
	select {
	case <-stop:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	if err := cpu.markHerald(markReleased); err != nil {
		return err
	}
	if err := cpu.markPostgres(ctx, markReleased); err != nil {
		return err
	}
	cpu.released = true
	return nil
}

// preferencesInstant is the instant of a --preferences run: at least
// Config.Ahead from now, three seconds before a whole minute, so that the
// quiet hours of the users held at the instant (which end on a minute, as
// every quiet hours do) end moments after it.
func (b *Benchmark) preferencesInstant() time.Time {
	earliest := time.Now().Add(b.Config.Ahead)
	at := earliest.Truncate(time.Minute).Add(time.Minute - 3*time.Second)
	if at.Before(earliest) {
		at = at.Add(time.Minute)
	}
	return at
}

// setPreferences declares the bench's category, with a cap that leaves
// room for the earlier rounds and the measured one, and gives the
// population its preferences for a run due at instant. Before the earlier
// rounds (instant zero) the users held at the measured instant have their
// quiet hours far from now, as the others with quiet hours do: the earlier
// rounds hold no one, and the measured round finds the histories they
// left.
func (b *Benchmark) setPreferences(ctx context.Context, pool db.DBTX, instant time.Time) error {
	capCount := int32(b.Config.Before + 2)
	day := int32(86400)
	q := db.On(pool)
	if _, err := q.PutCategory(ctx, db.PutCategoryParams{Name: benchCategory, CapCount: &capCount, CapPeriodS: &day}); err != nil {
		return fmt.Errorf("declare the bench's category: %w", err)
	}
	clock := func(t time.Time) preferences.Clock {
		t = t.UTC()
		return preferences.Clock(t.Hour()*3600 + t.Minute()*60)
	}
	from := instant
	if from.IsZero() {
		from = time.Now()
	}
	params := db.SetBenchPreferencesParams{
		Category: benchCategory,
		FarStart: clock(from.Add(6 * time.Hour)).PG(), FarEnd: clock(from.Add(9 * time.Hour)).PG(),
		CapCount: capCount,
	}
	params.HeldStart, params.HeldEnd = params.FarStart, params.FarEnd
	end := heldUntil(instant)
	if !instant.IsZero() {
		params.HeldStart, params.HeldEnd = clock(instant.Add(-time.Hour)).PG(), clock(end).PG()
	}
	if err := q.SetBenchPreferences(ctx, params); err != nil {
		return fmt.Errorf("set the users' preferences: %w", err)
	}
	// As the population is: statistics, and nothing left for autovacuum
	// to do in the measured spans.
	if err := q.VacuumAnalyze(ctx); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	if instant.IsZero() {
		b.Progress("preferences: category %q capped at %d a day, for the earlier rounds too", benchCategory, capCount)
		return nil
	}
	b.Progress("preferences: quiet hours end at %s UTC for the users held", end.UTC().Format("15:04:05"))
	return nil
}

// withheldView counts what the measured bulk messages withheld and checks
// it against the rules: a count that differs is an error.
func (b *Benchmark) withheldView(ctx context.Context, pool db.DBTX, s scheduled, cpu *cpuSpans, res *Result) error {
	w := &Withheld{}
	for _, n := range s.bulkNs {
		r, err := db.On(pool).BenchWithheld(ctx, n)
		if err != nil {
			return fmt.Errorf("count what was withheld: %w", err)
		}
		w.OptedOut += int(r.OptedOut)
		w.Held += int(r.Held)
		w.Capped += int(r.Capped)
		w.WantOptedOut += int(r.WantOptedOut)
		w.WantHeld += int(r.WantHeld)
		w.WantCapped += int(r.WantCapped)
	}
	if devices := res.Devices - 1; devices > 0 && res.PostgresCPUPerSend != nil {
		w.CPUPerDevice = round1((res.CPUPerSend + *res.PostgresCPUPerSend) * float64(res.Accepted) / float64(devices))
	}
	first, firstRead := cpu.both(markInstant, markReleased)
	release, _ := cpu.both(markReleased, markSettled)
	if pushes := res.Accepted - w.Held; cpu.released && firstRead && w.Held > 0 && pushes > 0 {
		w.FirstCPUPerPush = new(perDevice(first, pushes))
		w.ReleaseCPUPerPush = new(perDevice(release, w.Held))
		b.Progress("preferences: Herald's and PostgreSQL's CPU a push sent at the instant %.1f µs, a push held to the end of quiet hours %.1f µs",
			*w.FirstCPUPerPush, *w.ReleaseCPUPerPush)
	}
	res.Preferences = w
	b.Progress("preferences: %d opted out (want %d), %d held (want %d), %d capped (want %d)",
		w.OptedOut, w.WantOptedOut, w.Held, w.WantHeld, w.Capped, w.WantCapped)
	if w.OptedOut != w.WantOptedOut || w.Held != w.WantHeld || w.Capped != w.WantCapped {
		return fmt.Errorf("what was withheld is not what the users asked: %+v", *w)
	}
	return nil
}

// bulkCategory is the bulk messages' category: the bench's with
// --preferences, else the default one.
func (b *Benchmark) bulkCategory() string {
	if b.Config.Preferences {
		return benchCategory
	}
	return ""
}
