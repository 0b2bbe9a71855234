-- SUBAGENT_APPROVAL=admins: a run recorded `queued` in the same write that marks it as needing an admin's
-- approval, so a crash before its question is asked cannot let it start unapproved (the next start asks again).
ALTER TABLE subagent_runs ADD COLUMN needs_approval INTEGER NOT NULL DEFAULT 0;
