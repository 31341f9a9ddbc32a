-- Idempotency keys of POST /v1/schedules are kept beside the messages' keys,
-- in key spaces of their own (api's scheduleScope: the caller's scope with a
-- prefix that no message's scope has), so that a key a caller used for a
-- message never answers a schedule, nor the other way round. Such a key
-- names the schedule it made. Retention deletes it once its schedule has
-- been deleted for longer than the retention: schedules are never deleted
-- outright, so a key of a schedule that lives is kept as long as it does.
ALTER TABLE idempotency_keys ADD COLUMN schedule_id bigint;

-- Retention deletes evicted devices once they have been evicted for longer
-- than HERALD_DEVICE_RETENTION, those evicted longest ago first: this index
-- finds them without reading the active devices, and holds only the evicted.
CREATE INDEX devices_evicted_at_idx ON devices (evicted_at) WHERE status = 'evicted';
