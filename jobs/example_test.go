package jobs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// An application books an appointment and the reminder the day before in
// one transaction of its own: both are committed, or neither. A running
// Herald on the same database sends the reminder at its time.
func ExampleScheduler_Schedule() {
	ctx := context.Background()
	url, drop := heraldDatabase(ctx) // a database `herald migrate` has made, where "pat" has a phone
	defer drop()

	// The application's own pool: nothing in it is Herald's.
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE appointments (
		id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		user_id   text NOT NULL,
		starts_at timestamptz NOT NULL,
		reminder  text)`); err != nil {
		log.Fatal(err)
	}

	// One Scheduler for the process; its zero config suits a Herald with
	// the default HERALD_DB_SCHEMA and HERALD_CHUNK_SIZE.
	scheduler, err := jobs.NewScheduler(jobs.SchedulerConfig{})
	if err != nil {
		log.Fatal(err)
	}

	startsAt := time.Date(2030, 3, 14, 9, 0, 0, 0, time.UTC)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO appointments (user_id, starts_at) VALUES ($1, $2) RETURNING id",
			"pat", startsAt).Scan(&id); err != nil {
			return err
		}
		receipt, err := scheduler.Schedule(ctx, tx, jobs.Message{
			Audience:   jobs.Audience{UserIDs: []string{"pat"}},
			Payload:    push.Content{Title: "Dentist tomorrow", Body: "9:00, 12 Main Street"},
			DispatchAt: startsAt.Add(-24 * time.Hour),
			// A retried transaction schedules the reminder once.
			IdempotencyKey: fmt.Sprintf("appointment-%d-reminder", id),
		})
		if err != nil {
			return err // the appointment is not booked either
		}
		fmt.Println(receipt.State, receipt.DispatchAt.Format(time.RFC3339), receipt.DeviceCount, "device")
		_, err = tx.Exec(ctx, "UPDATE appointments SET reminder = $1 WHERE id = $2", receipt.MessageID, id)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: scheduled 2030-03-13T09:00:00Z 1 device
}

// heraldDatabase makes a database on the server of DATABASE_URL, migrates
// it as `herald migrate` does, and registers a device for user pat, as
// POST /v1/devices would. It returns the database's URL and what drops it.
func heraldDatabase(ctx context.Context) (string, func()) {
	admin := os.Getenv("DATABASE_URL")
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		log.Fatalf("connect to DATABASE_URL: %v", err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "herald_example_" + hex.EncodeToString(b)
	if err := db.CreateDatabase(ctx, conn, name); err != nil {
		log.Fatal(err)
	}
	drop := func() {
		_ = db.DropDatabase(ctx, conn, name)
		_ = conn.Close(ctx)
	}
	url, err := db.WithDatabase(admin, name)
	if err != nil {
		log.Fatal(err)
	}
	herald, err := db.Open(ctx, url, db.PoolConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer herald.Close()
	if _, err := db.Migrate(ctx, herald, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		log.Fatal(err)
	}
	q := db.On(herald)
	if err := q.EnsureUsers(ctx, []string{"pat"}); err != nil {
		log.Fatal(err)
	}
	if _, err := q.RegisterDevices(ctx, db.RegisterDevicesParams{
		UserIds: []string{"pat"}, Channels: []string{"fcm"}, Tokens: []string{"fcm-token-of-pat"}, P256dhs: []string{""}, Auths: []string{""},
	}); err != nil {
		log.Fatal(err)
	}
	return url, drop
}
