-- abridge schema, version 15 (PostgreSQL): one index of the pins' values
-- fewer (see the SQLite form, migrations/0015_pins_by_value_dropped.sql).
DROP INDEX pins_by_value;
