package heraldbench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// scheduled are the run's measured messages, due at the same instant:
// the bulk ones (Config.Messages) and the urgent one.
type scheduled struct {
	dispatchAt time.Time
	bulkIDs    []string
	bulkNs     []int64
	urgentID   string
	urgentN    int64
}

// ids are every message of s, the urgent one first.
func (s scheduled) ids() []string { return append([]string{s.urgentID}, s.bulkIDs...) }

// bulkPayloads are the bulk message's payloads that --payload names: plain,
// rich with every field of the payload reference that a digest would use,
// and localized, the rich one in five languages, so that the runs compare
// what the fields and the languages cost per send.
var bulkPayloads = map[string]push.Content{
	"plain":     {Title: "Your daily digest", Body: "12 new items since yesterday", Data: map[string]string{"deep_link": "app://digest"}},
	"rich":      richPayload,
	"localized": localized(richPayload),
}

// richPayload uses every field of the payload reference a digest would.
var richPayload = push.Content{
	Title: "Your daily digest", Subtitle: "Tuesday", Body: "12 new items since yesterday",
	Data:  map[string]string{"deep_link": "app://digest"},
	Image: "https://cdn.example.com/digest.png", URL: "https://app.example.com/digest",
	Sound: "default", Badge: ptr(12), Category: "DIGEST", ThreadID: "digest",
	InterruptionLevel: "passive", RelevanceScore: ptr(0.4),
	APNs: &push.APNsOptions{TargetContentID: "digest"},
	FCM:  &push.FCMOptions{AndroidChannelID: "digest", Tag: "digest", Color: "#3366ff", Icon: "ic_digest"},
	WebPush: &push.WebPushOptions{Icon: "https://cdn.example.com/icon.png", BadgeIcon: "https://cdn.example.com/badge.png",
		Actions: []push.WebPushAction{{Action: "open", Title: "Open"}, {Action: "later", Title: "Later"}}, Tag: "digest", Urgency: "low"},
}

// localized is the rich payload in four more languages; a run with it
// gives the users locales (SetBenchLocales), so that a fifth of the
// devices each get German, Portuguese, French, Spanish and the English.
func localized(c push.Content) push.Content {
	c.Localizations = map[string]push.Text{
		"de":    {Title: "Deine tägliche Übersicht", Subtitle: "Dienstag", Body: "12 neue Einträge seit gestern"},
		"pt-BR": {Title: "Seu resumo diário", Subtitle: "Terça-feira", Body: "12 novos itens desde ontem"},
		"fr":    {Title: "Votre résumé du jour", Subtitle: "Mardi", Body: "12 nouveaux éléments depuis hier"},
		"es":    {Title: "Tu resumen diario", Subtitle: "Martes", Body: "12 elementos nuevos desde ayer"},
	}
	return c
}

func ptr[T any](v T) *T { return &v }

// bulkPayload is the payload Config.Payload names, plain when empty.
func (b *Benchmark) bulkPayload() push.Content {
	return bulkPayloads[cmp.Or(b.Config.Payload, "plain")]
}

// schedule schedules, through the API, each bulk message to every user of
// its segment and the urgent one to the urgent user, all for the same
// instant Config.Ahead from now.
func (b *Benchmark) schedule(ctx context.Context, res *Result) (scheduled, error) {
	dispatchAt := time.Now().Add(b.Config.Ahead).Truncate(time.Millisecond)
	if !b.instant.IsZero() {
		dispatchAt = b.instant
	}
	b.Progress("scheduling %d bulk message(s) to %d devices and the urgent one for %s", b.Config.messages(), res.Devices-1, dispatchAt.Format(time.RFC3339Nano))
	start := time.Now()
	s := scheduled{dispatchAt: dispatchAt}
	for i := range b.Config.messages() {
		bulk, err := b.postBulk(ctx, i, &dispatchAt)
		if err != nil {
			return scheduled{}, err
		}
		res.ChunkCount += bulk.ChunkCount
		n, _ := push.ParseMessageID(bulk.MessageID)
		s.bulkIDs, s.bulkNs = append(s.bulkIDs, bulk.MessageID), append(s.bulkNs, n)
	}
	res.ScheduleMs = ms(time.Since(start))
	urgent, err := b.api.CreateMessageWithResponse(ctx, nil, client.NewMessage{
		DispatchAt: &dispatchAt, Priority: new(client.PriorityUrgent),
		Audience: client.Audience{Type: client.AudienceTypeUsers, IDs: &[]string{"urgent-user"}},
		Payload:  client.Payload{Title: new("Your sign-in code"), Body: new("123456")},
	})
	if err := answered("schedule the urgent message", http.StatusAccepted, urgent, err); err != nil {
		return scheduled{}, err
	}
	s.urgentID = urgent.JSON202.MessageID
	s.urgentN, _ = push.ParseMessageID(s.urgentID)
	b.Progress("scheduled in %.0f ms (%d chunks); waiting for %s", res.ScheduleMs, res.ChunkCount, dispatchAt.Format("15:04:05.000"))
	if time.Now().After(dispatchAt) {
		b.Progress("the instant passed before the messages were scheduled: their skews include the wait; a larger --ahead leaves room")
	}
	return s, nil
}

// postBulk schedules the bulk payload, through the API, to every user of
// segment i at dispatchAt (now when nil).
func (b *Benchmark) postBulk(ctx context.Context, i int, dispatchAt *time.Time) (*client.MessageHead, error) {
	// The bulk payload is push.Content, what Herald stores; the client
	// takes the same JSON.
	var payload client.Payload
	if raw, err := json.Marshal(b.bulkPayload()); err != nil {
		return nil, err
	} else if err := json.Unmarshal(raw, &payload); err != nil {
		return nil, fmt.Errorf("the %s payload as the client's: %w", b.Config.Payload, err)
	}
	m := client.NewMessage{
		DispatchAt: dispatchAt, Priority: new(client.PriorityBulk),
		Audience: client.Audience{Type: client.AudienceTypeSegment, ID: new(segment(i))},
		Payload:  payload,
	}
	if c := b.bulkCategory(); c != "" {
		m.Category = new(c)
	}
	bulk, err := b.api.CreateMessageWithResponse(ctx, nil, m)
	if err := answered("schedule a bulk message", http.StatusAccepted, bulk, err); err != nil {
		return nil, err
	}
	return bulk.JSON202, nil
}

// dispatch waits for the messages' instant, probes the machine while they
// are sent, and waits until settled (the status reads that schedule's
// caller started) says every one has settled. It marks the CPU spans at
// the instant (2) and once settled (3); Herald's CPU in between the
// scheduling and the instant, when an idle process only polls its queues,
// is measured apart as a rate (it is paid per second, not per send).
func (b *Benchmark) dispatch(ctx context.Context, dbURL string, s scheduled, settled <-chan error, cpu *cpuSpans, res *Result) error {
	idleFrom := time.Now()
	probeAPNs, closeProbe, err := b.providers(ctx, "probe")
	if err != nil {
		return err
	}
	defer closeProbe()
	probeConn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer probeConn.Close(context.WithoutCancel(ctx))
	var conns *Connections
	if d := b.Config.DropConnections; d > 0 {
		time.Sleep(time.Until(s.dispatchAt.Add(-d)))
		if conns, err = b.dropConnections(s.dispatchAt); err != nil {
			return err
		}
	}
	time.Sleep(time.Until(s.dispatchAt.Add(-100 * time.Millisecond)))
	if conns != nil {
		if conns.OpenedBeforeInstant, err = conns.openedSince(b); err != nil {
			return err
		}
	}
	if err := cpu.markHerald(2); err != nil {
		return err
	}
	if err := cpu.markPostgres(ctx, 2); err != nil {
		return err
	}
	res.IdleCPUPercent = round1(float64((cpu.heraldAt[2] - cpu.heraldAt[1]).Microseconds()) / float64(time.Since(idleFrom).Microseconds()) * 100)

	stopProbe := make(chan struct{})
	probed := make(chan [2][]float64, 1)
	go func() {
		time.Sleep(time.Until(s.dispatchAt))
		p, d := b.probe(ctx, probeAPNs[jobs.ChannelAPNs], probeConn, stopProbe)
		probed <- [2][]float64{p, d}
	}()
	released := make(chan error, 1)
	if b.Config.Preferences {
		go func() { released <- b.markRelease(ctx, cpu, s.dispatchAt, stopProbe) }()
	} else {
		released <- nil
	}
	err = <-settled
	close(stopProbe)
	rtts := <-probed
	if err := <-released; err != nil {
		return err
	}
	if err != nil {
		return err
	}
	if conns != nil {
		if conns.OpenedAfterInstant, err = conns.openedSince(b); err != nil {
			return err
		}
		res.Connections = conns
		b.Progress("connections: %d closed %.0f ms before the instant, %d opened again before it, %d after it",
			conns.Closed, conns.DroppedBeforeMs, conns.OpenedBeforeInstant, conns.OpenedAfterInstant)
	}
	res.Probe.ProviderMs, res.Probe.DatabaseMs = summarize(rtts[0]), summarize(rtts[1])
	b.Progress("probes while the bulk message was in flight: provider round trip p50 %.0f ms, max %.0f ms; database p50 %.1f ms, max %.1f ms",
		res.Probe.ProviderMs.P50, res.Probe.ProviderMs.Max, res.Probe.DatabaseMs.P50, res.Probe.DatabaseMs.Max)
	if err := cpu.markHerald(3); err != nil {
		return err
	}
	if err := cpu.markPostgres(ctx, 3); err != nil {
		return err
	}
	for _, h := range b.heralds {
		rss, err := peakRSS(h.cmd.Process.Pid)
		if err != nil {
			return err
		}
		res.PeakRSSMb = max(res.PeakRSSMb, rss)
	}
	return nil
}
