-- abridge schema, version 10 (PostgreSQL): a fact mentioned again refreshes
-- its turn (see the SQLite form, migrations/0010_restated_pins.sql).
DROP INDEX pins_unslotted_once;
CREATE UNIQUE INDEX pins_unslotted_once_a_turn ON pins (session_id, value, turn_index)
WHERE slot IS NULL AND strpos(value, '[redacted]') = 0;
