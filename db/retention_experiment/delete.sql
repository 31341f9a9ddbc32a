-- One retention batch on the flat ledger: 10,000 rows of the oldest
-- message, as DeleteLedgerRows does it.
DELETE FROM ledger_flat d
USING (SELECT message_id, device_id FROM ledger_flat
       WHERE message_id = (SELECT min(message_id) FROM ledger_flat) LIMIT 10000) v
WHERE d.message_id = v.message_id AND d.device_id = v.device_id;
