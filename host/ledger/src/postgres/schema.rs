//! The tables, as each schema version adds them (`docs/ledger.md`,
//! "Schema versions"); the host creates and migrates them.

/// Version 1's tables and indexes.
pub(super) const MIGRATION_1: &str = "
CREATE TABLE IF NOT EXISTS toolguard_meta (
    name TEXT PRIMARY KEY,
    value BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS toolguard_calls (
    session TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    completed BOOLEAN NOT NULL,
    owner TEXT,
    lease_until BIGINT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (session, call_id)
);
CREATE TABLE IF NOT EXISTS toolguard_attempts (
    key TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    call_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    state TEXT NOT NULL,
    record TEXT NOT NULL,
    UNIQUE (session, call_id, step, generation)
);
CREATE INDEX IF NOT EXISTS toolguard_attempts_by_state ON toolguard_attempts (state);
CREATE INDEX IF NOT EXISTS toolguard_attempts_by_action ON toolguard_attempts (session, tool, args_digest);
CREATE TABLE IF NOT EXISTS toolguard_grant_history (
    plugin TEXT NOT NULL,
    recorded_ms BIGINT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (plugin, recorded_ms)
);
";

/// Version 2: episodes. (The migration of the rows is `ledger::migrate`.)
pub(super) const MIGRATION_2: &str = "
CREATE TABLE IF NOT EXISTS toolguard_episodes (
    session TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    episode BIGINT NOT NULL,
    executor TEXT NOT NULL,
    closed BOOLEAN NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (session, tool, args_digest, episode)
);
DROP INDEX IF EXISTS toolguard_attempts_by_action;
CREATE TABLE IF NOT EXISTS toolguard_budget_scopes (
    scope TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS toolguard_budget (
    scope TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    call_id TEXT NOT NULL,
    PRIMARY KEY (scope, at_ms, call_id)
);
";

/// Version 3: retention (`ledger::retention`). The episode column is filled
/// from the records here; the retire index by `ledger::migrate`.
pub(super) const MIGRATION_3: &str = "
ALTER TABLE toolguard_calls ADD COLUMN IF NOT EXISTS episode BIGINT;
CREATE INDEX IF NOT EXISTS toolguard_calls_by_episode ON toolguard_calls (session, tool, args_digest, episode) WHERE episode IS NOT NULL;
CREATE TABLE IF NOT EXISTS toolguard_retire (
    at_ms BIGINT NOT NULL,
    unit TEXT NOT NULL,
    PRIMARY KEY (at_ms, unit)
);
CREATE TABLE IF NOT EXISTS toolguard_expired (
    call_digest BYTEA PRIMARY KEY,
    pruned_ms BIGINT NOT NULL
);
";

/// Version 4: spending limits' uses (`LedgerWrite::spend`), and each
/// scope's running total per window (`toolguard_spend_totals`, keyed by the
/// window's end; a missing row is summed from the uses the first time a
/// spend needs it, so a ledger written before the totals needs no filling);
/// their scopes are locked through `toolguard_budget_scopes`, as budgets' are.
pub(super) const MIGRATION_4: &str = "
CREATE TABLE IF NOT EXISTS toolguard_spend (
    scope TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    call_id TEXT NOT NULL,
    amount BIGINT NOT NULL,
    until_ms BIGINT NOT NULL,
    PRIMARY KEY (scope, at_ms, call_id)
);
CREATE INDEX IF NOT EXISTS toolguard_spend_by_end ON toolguard_spend (until_ms);
CREATE TABLE IF NOT EXISTS toolguard_spend_totals (
    scope TEXT NOT NULL,
    until_ms BIGINT NOT NULL,
    total BIGINT NOT NULL,
    PRIMARY KEY (scope, until_ms)
);
";
