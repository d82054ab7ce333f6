//! A task as the Tasks extension writes it: the task handle a `tools/call`
//! answers with, and the detailed task of `tasks/get`.

use super::{Progress, Snapshot};
use crate::error::ErrorKind;
use rmcp::model::{CallToolResult, CreateTaskResult, DetailedTask, JsonObject, Task, TaskPayload, TaskStatus};
use std::time::Duration;

/// How a client should poll, and how long the task is kept.
#[derive(Clone, Copy)]
pub(crate) struct Timing {
    /// `pollIntervalMs`.
    pub(crate) poll: Duration,
    /// `ttlMs`.
    pub(crate) ttl: Duration,
}

/// An ISO 8601 time (UTC, milliseconds) of Unix ms `ms`.
fn iso(ms: u64) -> String {
    let at = chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)).unwrap_or_default();
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The task's base fields in `snapshot`'s state (`status` as given).
fn task(task_id: &str, snapshot: &Snapshot, status: TaskStatus, timing: Timing) -> Task {
    let mut task = Task::new(task_id, status, iso(snapshot.created_ms), iso(snapshot.updated_ms))
        .with_ttl_ms(timing.ttl.as_millis() as u64)
        .with_poll_interval_ms(timing.poll.as_millis().max(1) as u64);
    let message = match (&snapshot.progress, &snapshot.cancel_refused) {
        (Progress::Working(why), Some(refused)) => Some(format!("{why}. Not cancelled: {refused}")),
        (Progress::Working(why), None) => Some(why.clone()),
        (Progress::Settled(_), _) => None,
    };
    task.status_message = message;
    task
}

/// The handle a `tools/call` answers with when its call is not settled in time.
pub(crate) fn created(task_id: &str, snapshot: &Snapshot, timing: Timing) -> CreateTaskResult {
    CreateTaskResult::new(task(task_id, snapshot, TaskStatus::Working, timing))
}

/// The task as `tasks/get` reports it; `result` is the MCP result of its
/// settled answer (the same a `tools/call` would have had). A task whose
/// tool asks its client questions lists those not answered yet
/// (`input_required`); one awaiting a person's approval asks for it if the
/// client asking can elicit (`elicit`).
pub(crate) fn detailed(task_id: &str, snapshot: &Snapshot, result: Option<CallToolResult>, timing: Timing, elicit: bool) -> DetailedTask {
    if let (Some(asked), None) = (&snapshot.asked, snapshot.settled())
        && let Ok(input_requests) = crate::mcp::questions::requests(asked)
    {
        let payload = TaskPayload::InputRequired { input_requests };
        return DetailedTask::new(task(task_id, snapshot, payload.status(), timing), payload);
    }
    if let (Some(approval), Some(key), true, None) = (&snapshot.approval, &snapshot.approval_key, elicit, snapshot.settled())
        && let Some(input_requests) = crate::mcp::approval::approval_requests(approval, key)
    {
        let payload = TaskPayload::InputRequired { input_requests };
        return DetailedTask::new(task(task_id, snapshot, payload.status(), timing), payload);
    }
    let payload = match (snapshot.settled(), result.map(serde_json::to_value)) {
        (Some(Err(e)), _) if e.kind == ErrorKind::Cancelled => TaskPayload::Cancelled,
        // The tool itself broke (or the host did): a failed task, not a tool's error result.
        (Some(Err(e)), _) if matches!(e.kind, ErrorKind::PluginTrap | ErrorKind::Internal) => TaskPayload::Failed { error: failed(&e.to_string()) },
        (_, Some(Ok(serde_json::Value::Object(result)))) => TaskPayload::Completed { result: result as JsonObject },
        (_, Some(_)) => TaskPayload::Failed { error: failed("the task's result could not be written") },
        (_, None) => TaskPayload::Working,
    };
    DetailedTask::new(task(task_id, snapshot, payload.status(), timing), payload)
}

/// A JSON-RPC error object (`internal error`) saying `message`.
fn failed(message: &str) -> JsonObject {
    let mut error = JsonObject::new();
    error.insert("code".into(), (-32603).into());
    error.insert("message".into(), message.into());
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_iso_8601_in_utc() {
        assert_eq!(iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso(1_796_601_600_123), "2026-12-07T00:00:00.123Z");
    }
}
