//! The guard's most frequent write of several records as one statement:
//! what a caller was told, with the close of its action's episode (and the
//! closed episode's retire entry). As statements of a transaction it cost
//! five round trips (`BEGIN`, three statements, `COMMIT`); as one statement
//! of data-modifying CTEs it costs one, and is as atomic.

use super::prepared::Prepared;
use super::{big, db};
use crate::retention::RetireEntry;
use crate::write::Report;
use crate::{BackendError, EpisodeId, EpisodeOp, LedgerWrite};
use r2d2_postgres::postgres::GenericClient;

/// `reported` on call ($1, $2) ($3); episode ($4, $5, $6, $7) closed at
/// $8 unless it is closed already, and then its retire entry ($8, $9).
const REPORT_AND_CLOSE: &str = "WITH reported AS (\
        UPDATE toolguard_calls SET record = (record::jsonb || jsonb_build_object('reported', $3::text))::text \
        WHERE session = $1 AND call_id = $2), \
    closed AS (\
        UPDATE toolguard_episodes SET closed = true, \
        record = (record::jsonb || jsonb_build_object('closed', true, 'closed_ms', $8::bigint))::text \
        WHERE session = $4 AND tool = $5 AND args_digest = $6 AND episode = $7 AND NOT closed RETURNING 1) \
    INSERT INTO toolguard_retire (at_ms, unit) SELECT $8, $9 FROM closed ON CONFLICT DO NOTHING";

/// A report with the close of an episode, when that is all `write` holds.
pub(super) fn report_and_close(write: &LedgerWrite) -> Option<(&Report, &EpisodeId, u64)> {
    // Every field named: a new kind of record must be considered here.
    let LedgerWrite { calls, attempts, episodes, reports, superseding, charges, spends, releases, retire } = write;
    if !calls.is_empty()
        || !attempts.is_empty()
        || superseding.is_some()
        || !charges.is_empty()
        || !spends.is_empty()
        || !releases.is_empty()
        || !retire.is_empty()
    {
        return None;
    }
    match (reports.as_slice(), episodes.as_slice()) {
        ([report], [EpisodeOp::Close { episode, at_ms }]) => Some((report, episode, *at_ms)),
        _ => None,
    }
}

/// Applies [`report_and_close`]'s parts in one statement.
pub(super) fn apply_report_and_close(c: &mut Prepared<'_, impl GenericClient>, report: &Report, episode: &EpisodeId, at_ms: u64) -> Result<(), BackendError> {
    let entry = RetireEntry::of_close(episode, at_ms);
    let (n, at) = (big(episode.episode)?, big(at_ms)?);
    let params: [super::Param<'_>; 9] =
        [&report.session, &report.call_id, &report.reported.as_str(), &episode.session, &episode.tool, &episode.args_digest, &n, &at, &entry.unit];
    c.execute(REPORT_AND_CLOSE, &params).map(|_| ()).map_err(db)
}
