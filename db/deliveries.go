package db

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// snapshotChunksAtOnce is how many chunks' snapshots ListDeliveries reads
// in one statement.
const snapshotChunksAtOnce = 8

// ListAllDeliveries is one page of a message's deliveries in device order,
// as the API lists them: its ledger rows (the ListDeliveries query) merged
// with the devices of its chunks' snapshots that have no row yet
// (ListSnapshotDeliveries, migration 0022): accepted in a run of their
// chunk (migration 0028), pending, or with their message's fate. A snapshot's chunks are read in the order of their first
// device, a few at a time, until no later chunk can hold a device of the
// page: a page near the start of a million-device message reads one or two
// chunks, not the message. A reason filter reads the rows alone: a
// delivery without a row has no reason.
func (qs *Queries) ListAllDeliveries(ctx context.Context, p ListDeliveriesParams) ([]ListDeliveriesRow, error) {
	rows, err := qs.ListDeliveries(ctx, p)
	if err != nil {
		return nil, err
	}
	if p.Reason != nil {
		return rows, nil
	}
	if p.Status != nil && *p.Status == "failed" {
		// A delivery without a row failed in no way: it is pending, with
		// its message's fate, or accepted in a run (migration 0028).
		return rows, nil
	}
	chunks, err := qs.SnapshotChunksAfter(ctx, SnapshotChunksAfterParams{MessageID: p.MessageID, AfterDeviceID: p.AfterDeviceID})
	if err != nil {
		return nil, fmt.Errorf("read the message's chunks: %w", err)
	}
	page := int(p.PageSize)
	// bound is the highest id the page can hold: the last row's, once the
	// rows fill a page.
	bound := func() (int64, bool) {
		if len(rows) < page {
			return 0, false
		}
		return rows[page-1].DeviceID, true
	}
	for len(chunks) > 0 {
		if last, full := bound(); full && chunks[0].FirstDevice > last {
			break
		}
		n := min(len(chunks), snapshotChunksAtOnce)
		batch := make([]int32, n)
		for i := range batch {
			batch[i] = chunks[i].Chunk
		}
		chunks = chunks[n:]
		unsent, err := qs.ListSnapshotDeliveries(ctx, ListSnapshotDeliveriesParams{
			MessageID: p.MessageID, Chunks: batch, AfterDeviceID: p.AfterDeviceID,
			Status: p.Status, Confirmed: p.Confirmed, AppID: p.AppID, PageSize: p.PageSize,
		})
		if err != nil {
			return nil, fmt.Errorf("list the snapshot's deliveries: %w", err)
		}
		for _, u := range unsent {
			rows = append(rows, ListDeliveriesRow{
				DeviceID: u.DeviceID, UserID: u.UserID, Channel: u.Channel, Status: u.Status, DueAt: u.DueAt,
				AttemptedAt: unlessEpoch(u.AttemptedAt), AcceptedAt: unlessEpoch(u.AcceptedAt),
				ConfirmedAt: u.ConfirmedAt, ConfirmedDeviceAt: u.ConfirmedDeviceAt, ConfirmedSkewMs: u.ConfirmedSkewMs,
				OpenedAt: u.OpenedAt, OpenedDeviceAt: u.OpenedDeviceAt, AppID: u.AppID,
			})
		}
		slices.SortFunc(rows, func(a, b ListDeliveriesRow) int { return cmp.Compare(a.DeviceID, b.DeviceID) })
		if len(rows) > page {
			rows = rows[:page]
		}
	}
	return rows, nil
}

// unlessEpoch is t, or nil for the epoch, which a statement gives for none.
func unlessEpoch(t time.Time) *time.Time {
	if t.Equal(time.Unix(0, 0)) {
		return nil
	}
	return &t
}
