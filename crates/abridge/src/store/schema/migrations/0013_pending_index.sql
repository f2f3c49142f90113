-- abridge schema, version 13: the pending compaction rows, indexed.
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
