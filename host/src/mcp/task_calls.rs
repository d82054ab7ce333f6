//! The MCP methods of tasks ([`super::tasks`]): a `tools/call` answered with
//! a task when it is not settled in time, `tasks/get` and `tasks/cancel`.

use super::McpHost;
use super::tasks::{self, Progress, Watched, wire};
use crate::ledger::records::CallRecord;
use crate::policy::Effect;
use crate::runtime::CallRequest;
use crate::runtime::questions::journal::Inputs;
use rmcp::model::{CallToolResponse, GetTaskResult, MetaObject};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use std::collections::BTreeMap;
use std::time::Duration;

/// How often a call past its budget is looked for in the ledger before
/// its task handle is given out (a handle names only a durable call).
const RECORD_POLL: Duration = Duration::from_millis(20);

/// How long the first try of a call of a tool in `[mcp] tasks_required` is
/// waited for before its task handle is given out: time for its tool to ask
/// its first questions on the `tools/call` itself.
const ASK_FIRST: Duration = Duration::from_millis(250);

/// How long `tasks/get` of a task no host drives waits for the call to be
/// run again (a completed call replays in that time).
const RESUME_GRACE: Duration = Duration::from_millis(250);

impl McpHost {
    /// `call` for a client that opted into tasks: its answer if the call is
    /// settled within `[mcp] task_after_ms` (never, when that is 0), else a
    /// task handle once the call is recorded in the ledger; the answer of a
    /// call refused before it was recorded. The questions of a tool in
    /// `[mcp] tasks_required` asked before its task exists go on the
    /// `tools/call` itself (a 2026-07-28 client's `input_required`): its
    /// first try is waited for up to [`ASK_FIRST`], and the task handle
    /// answers the retry that brings their answers.
    pub(super) async fn call_as_task(
        &self,
        call: CallRequest,
        effect: Effect,
        cx: &RequestContext<RoleServer>,
        inputs: Inputs,
    ) -> Result<CallToolResponse, ErrorData> {
        let required = self.config.tasks_required.contains(&call.tool);
        let ask_first = required && cx.meta.protocol_version().is_some();
        // The round this request brings answers to: not asked again here.
        let fed = inputs.offered_for.clone().filter(|_| !inputs.offered.is_empty());
        if let Err(cap) = self.tasks.room_for(&call) {
            let message = format!(
                "{cap} of your tasks are still unsettled here, the most [mcp] max_tasks_per_principal lets one principal have; `{}` \
                 was not run and nothing was recorded: poll your tasks, then call it again",
                call.tool
            );
            return Ok(super::busy_saying(&call.tool, &call.call_id, message).into());
        }
        let Watched { request, mut state } = self.tasks.drive(call, inputs, None);
        let budget_ms = match (ask_first, &fed) {
            (true, Some(_)) => 0,
            (true, None) => self.config.task_after_ms.max(ASK_FIRST.as_millis() as u64),
            (false, _) => self.config.task_after_ms,
        };
        let budget = tokio::time::Instant::now() + Duration::from_millis(budget_ms);
        // With no budget, every call that is recorded is answered with a task.
        let mut in_time = budget_ms > 0;
        loop {
            let asked = state.borrow().asked.clone().filter(|a| ask_first && fed.as_ref() != Some(&a.digest));
            if let Some(asked) = asked {
                let requests = super::questions::requests(&asked).map_err(|why| ErrorData::internal_error(why, None))?;
                let sealed = self.seal(&request, asked.journal, Some(asked.digest));
                return Ok(rmcp::model::InputRequiredResult::new(Some(requests), Some(sealed)).into());
            }
            let settled = state.borrow().settled().cloned();
            if in_time {
                match settled {
                    // A tool served only as a task answers with one, however fast.
                    Some(_) if required => in_time = false,
                    Some(answer) => return self.answer(cx, ((*request).clone(), self.runtime()), effect, answer).map(Into::into),
                    None => in_time = matches!(tokio::time::timeout_at(budget, state.changed()).await, Ok(Ok(()))),
                }
                continue;
            }
            if let Some(record) = self.recorded(&request.session, &request.call_id).await.ok().flatten() {
                // The task was created when its call was recorded: its createdAt on every host, after any restart.
                self.tasks.recorded_at(&request.session, &request.call_id, record.created_ms);
                break;
            }
            if let Some(answer) = settled {
                // Refused before it was recorded (bad arguments, a conflict): no task to name.
                return self.answer(cx, ((*request).clone(), self.runtime()), effect, answer).map(Into::into);
            }
            tokio::time::sleep(RECORD_POLL).await;
        }
        let task_id = self.task_ids().encode(&request.session, &request.call_id, request.principal.as_deref());
        let snapshot = state.borrow().clone();
        Ok(wire::created(&task_id, &snapshot, self.timing()).into())
    }

    /// `tasks/get`: the task's state; once settled, its result, recorded as
    /// told (for an irreversible tool) when the response is written.
    pub(super) async fn task_state(&self, task_id: &str, cx: &RequestContext<RoleServer>) -> Result<GetTaskResult, ErrorData> {
        let Watched { request, state } = self.find(task_id, cx).await?;
        let mut snapshot = state.borrow().clone();
        if matches!(&snapshot.progress, Progress::Working(m) if m == tasks::STARTED)
            && self.recorded(&request.session, &request.call_id).await?.is_some_and(|r| r.follower)
        {
            // Its first try waits inside the hold rule: the ledger says behind what.
            snapshot.progress = Progress::Working(tasks::HELD.into());
        }
        let effect = self.views.current().tools.get(&request.tool).map_or(Effect::ReadOnly, |(_, e)| *e);
        let result = match snapshot.settled() {
            Some(answer) => Some(self.answer(cx, ((*request).clone(), self.runtime()), effect, answer.clone())?),
            None => None,
        };
        let elicit = cx.client_capabilities().is_some_and(|c| c.elicitation.is_some());
        let mut got = GetTaskResult::new(wire::detailed(task_id, &snapshot, result, self.timing(), elicit));
        let mut meta = MetaObject::default();
        meta.0.insert(super::ids::CALL_ID_KEY.into(), request.call_id.clone().into());
        got.meta = Some(meta);
        Ok(got)
    }

    /// `tasks/cancel`: always the empty acknowledgement. A settled task is
    /// left as it is; an unsettled one is cancelled only if nothing of its
    /// call has left the host, and otherwise says why not.
    pub(super) async fn cancel(&self, task_id: &str, cx: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let Watched { request, .. } = self.find(task_id, cx).await?;
        self.tasks.cancel(&request.session, &request.call_id).await;
        Ok(())
    }

    /// `tasks/update`: the person's answer to the approval its task asks
    /// for (`inputRequests` of an `input_required` task, under the key it
    /// is asked under now), recorded as the decision of
    /// `client:<principal>`; the task then runs (approved) or ends
    /// `denied`. A dismissal, or an answer that is none (`-32602`), decides
    /// nothing and the question is put again under a new key. Answers
    /// under any other `approval-` key — never asked, or answered before —
    /// are ignored, as the extension says of keys not outstanding; the rest
    /// answer the tool's own questions.
    pub(super) async fn update(&self, task_id: &str, responses: &rmcp::model::InputResponses, cx: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let Watched { request, state } = self.find(task_id, cx).await?;
        // Outstanding only while the task is unsettled: after it, every key is stale.
        let (approval, key) = {
            let s = state.borrow();
            if s.settled().is_some() { (None, None) } else { (s.approval.clone(), s.approval_key.clone()) }
        };
        let asked = approval.as_ref().and_then(|a| a["request"].as_str()).map(str::to_string);
        if let (Some(asked), Some(key)) = (asked, key)
            && let Some(answer) = responses.get(&key)
        {
            let decided = self.decide_at_client(&request, &asked, answer).await;
            let again = || self.tasks.ask_approval_again(&request.session, &request.call_id);
            return match decided {
                Ok(Some(approve)) => {
                    self.tasks.decided(&request.session, &request.call_id, approve);
                    Ok(())
                }
                Ok(None) => {
                    again();
                    Ok(())
                }
                Err(why) => {
                    again();
                    Err(ErrorData::invalid_params(format!("task `{task_id}`, `{key}`: {why}; nothing was decided and the question is asked again"), None))
                }
            };
        }
        let own: BTreeMap<String, serde_json::Value> =
            responses.iter().filter(|(k, _)| !k.starts_with(super::approval::APPROVAL_KEY)).map(|(k, v)| (k.clone(), v.clone())).collect();
        // Answers to the tool's own questions.
        let answered = self.tasks.answer(&request.session, &request.call_id, &own);
        answered.map_err(|why| ErrorData::invalid_params(format!("task `{task_id}`: {why}; nothing was taken"), None))
    }

    /// The task `task_id` names for the principal asking: the one this host
    /// drives, else its call read from the ledger and run again.
    async fn find(&self, task_id: &str, cx: &RequestContext<RoleServer>) -> Result<Watched, ErrorData> {
        let principal = self.principal(cx);
        let unknown = || ErrorData::invalid_params(format!("no task `{task_id}` of yours (a task id names one of your own tool calls)"), None);
        let (session, call_id) = self.task_ids().decode(task_id, principal.as_deref()).ok_or_else(unknown)?;
        if let Some(watched) = self.tasks.watch(&session, &call_id) {
            return Ok(watched);
        }
        let record = self.recorded(&session, &call_id).await?.ok_or_else(unknown)?;
        if !self.views.current().tools.contains_key(&record.tool) {
            let message = format!("task `{task_id}` is a call of `{}`, which this host does not serve; ask a host that does", record.tool);
            return Err(ErrorData::invalid_params(message, None));
        }
        let args_json = record.args.to_string();
        let inputs = Inputs { askable: super::questions::askable(cx), ..Inputs::default() };
        let created = Some(record.created_ms);
        let mut watched = self.tasks.drive(CallRequest { session, call_id, tool: record.tool, args_json, principal, tenant: None }, inputs, created);
        let _ = tokio::time::timeout(RESUME_GRACE, watched.state.wait_for(|s| s.settled().is_some())).await;
        Ok(watched)
    }

    /// The ledger's record of call (`session`, `call_id`).
    async fn recorded(&self, session: &str, call_id: &str) -> Result<Option<CallRecord>, ErrorData> {
        let Some(guard) = self.runtime().guard().cloned() else { return Ok(None) };
        let (s, c) = (session.to_string(), call_id.to_string());
        let read = guard.ledger().read(move |ledger| ledger.call(&s, &c)).await;
        read.map_err(|e| ErrorData::internal_error(format!("the ledger could not be read ({e}); ask again"), None))
    }

    /// The sealer of this host's task ids (`tasks::id`), under the fleet's key.
    fn task_ids(&self) -> tasks::id::TaskIds<'_> {
        tasks::id::TaskIds::new(self.handles.task_key(|| self.runtime()))
    }

    /// How clients should poll tasks, and how long they are kept.
    fn timing(&self) -> wire::Timing {
        wire::Timing { poll: Duration::from_millis(self.config.task_poll_ms), ttl: Duration::from_millis(self.config.task_ttl_ms) }
    }
}
