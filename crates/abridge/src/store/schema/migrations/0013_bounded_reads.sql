-- abridge schema, version 13: the pending compaction rows, and the pins that
-- hold a value, indexed.
--
-- A step asks for its session's newest pending compaction (a background
-- summary on its way is waited for or let finish, not overtaken), and a
-- background server for every pending row of the store. Through the
-- boundary index alone the first visited every compaction the session ever
-- had when none was pending (the common answer), and the second every row of
-- the store. Pending rows are few at any time: this partial index holds
-- just them, so both reads visit only those.
CREATE INDEX compactions_pending ON compactions (session_id, up_to_turn_index)
    WHERE status = 'pending';

-- A fact without a slot asks who holds its value: a slotted pin (any of its
-- values), else the value's pin not superseded. A value restated every turn
-- gets a pin a turn (the earlier ones superseded, kept), so through
-- `pins_by_value` the question visited every one of them at every step.
-- These hold just the rows each half of the question asks for.
CREATE INDEX pins_slotted_by_value ON pins (session_id, value) WHERE slot IS NOT NULL;
CREATE INDEX pins_held_by_value ON pins (session_id, value)
    WHERE slot IS NULL AND superseded_by IS NULL;
