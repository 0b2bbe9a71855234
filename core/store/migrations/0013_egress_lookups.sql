-- The names each run's door looked up for it (DNS traffic from the host), all counted, also past the cap of
-- connections recorded one by one.
ALTER TABLE subagent_runs ADD COLUMN egress_lookups INTEGER NOT NULL DEFAULT 0;
