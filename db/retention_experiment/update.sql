-- The dispatch path's ledger write, as a generic prepared plan (pgx
-- prepares every statement): 500 devices of a message settle.
\set m random(1, :messages)
\set d random(1, 24500)
UPDATE LEDGER SET attempt = attempt + 1, accepted_at = now()
WHERE message_id = :m AND device_id BETWEEN :d AND :d + 499;
