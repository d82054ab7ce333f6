//! The provider's state: payment intents, refunds (its ledger), and the
//! idempotency store with Stripe's, the IETF draft's or Adyen's semantics.
//! Plain data and synchronous rules; the HTTP layer adds timing and faults.

use serde::Serialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

/// Whose idempotency semantics the sandbox follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Stripe v1: bare `Idempotency-Key`, 400 `idempotency_error` on reuse
    /// with other parameters, 409 `idempotency_key_in_use`, `Idempotent-Replayed`.
    #[default]
    Stripe,
    /// The IETF draft: the key must be a quoted sf-string; 422 on reuse with
    /// another payload, 409 while outstanding, 400 when missing.
    Ietf,
    /// Adyen: no payload-mismatch check (the first response is returned);
    /// 422 code 704 with `transient-error: true` while in progress.
    Adyen,
}

/// A fault the sandbox applies to the next refund creation that reaches it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Fault {
    /// No fault for this request (to aim the next fault at a later one).
    Pass,
    /// Commit, then answer only after `ms` milliseconds (outliving the client's deadline).
    DelayAfterCommit { ms: u64 },
    /// Wait `ms` milliseconds while the key is marked executing (a concurrent
    /// request with the same key gets the provider's real 409), then commit.
    DelayBeforeCommit { ms: u64 },
    /// Commit, then drop the connection without answering.
    DropAfterCommit,
    /// Drop the connection before anything is committed.
    DropBeforeCommit,
    /// Commit nothing, store and return a 500 (optionally with `Stripe-Should-Retry`).
    Stored500 { should_retry: Option<bool> },
    /// Commit the refund, yet store and return a 500.
    HiddenCommit500,
    /// Commit the refund and answer 200 with a body that is not the refund
    /// (`{"ok": true}`), as a provider whose success body changed shape.
    CommitAnsweredInAnotherShape,
    /// Answer 409 as if a request with this key were still executing.
    InFlight409,
    /// Answer 429 before the idempotency layer (nothing is stored).
    RateLimit429,
    /// Answer 409 with no retry advice, before the idempotency layer, as a
    /// provider whose 409 is a conflict in its own business (a refund of a
    /// disputed charge): nothing is committed or stored.
    Conflict409,
    /// Answer 503 with Adyen's code 703 ("idempotency store unavailable") and
    /// `transient-error: true`, before the idempotency layer.
    StoreDown503,
    /// Commit, then wait until released (`Sandbox::release`) before answering.
    PauseAfterCommit,
    /// Commit, then drop the connection with the key still marked executing,
    /// as a provider that failed between its commit and its idempotency
    /// record: every later request with the key gets 409, for good.
    CommitStuckInFlight,
}

/// A payment intent that refunds draw on.
#[derive(Debug, Clone, Serialize)]
pub struct PaymentIntent {
    pub id: String,
    pub amount: u64,
    pub currency: String,
    /// The status new refunds of this intent start in (`succeeded`, `pending`, `requires_action`).
    pub refund_status: String,
}

/// One refund: a row of the provider's ledger, in Stripe's object shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refund {
    pub id: String,
    pub object: &'static str,
    pub amount: u64,
    pub currency: String,
    pub payment_intent: String,
    pub reason: Option<String>,
    pub status: String,
    pub metadata: BTreeMap<String, String>,
    pub created: u64,
    /// When it was created (Unix ms); listings show it only `list_lag` later.
    #[serde(skip)]
    pub created_ms: u64,
}

/// What the provider stored under a key.
#[derive(Debug, Clone)]
pub(crate) enum KeyState {
    /// A request with this key is executing.
    Executing,
    /// Finished: the stored status and body.
    Done { status: u16, body: Value },
}

#[derive(Debug, Clone)]
pub(crate) struct KeyEntry {
    pub fingerprint: String,
    pub state: KeyState,
    pub created: u64,
}

/// What the idempotency layer decided for a request.
#[derive(Debug)]
pub(crate) enum Admission {
    /// No usable entry: execute (the key, if any, is now marked executing).
    Execute,
    /// Answer with this stored response (a replay).
    Replay { status: u16, body: Value },
    /// Answer with this error (conflict, in use, bad key).
    Reject { status: u16, body: Value, transient: bool },
}

/// The whole provider state.
#[derive(Debug)]
pub(crate) struct Provider {
    pub mode: Mode,
    pub retention: Duration,
    pub intents: BTreeMap<String, PaymentIntent>,
    pub refunds: Vec<Refund>,
    pub keys: HashMap<String, KeyEntry>,
    pub faults: VecDeque<Fault>,
    /// Seconds added to the real clock (tests advance it past retention).
    pub clock_offset: u64,
    /// How long a new refund stays out of listings.
    pub list_lag: Duration,
    /// A faulty listing: `starting_after` is ignored, every page is the first.
    pub list_ignores_cursor: bool,
    /// Keys must be UUIDs (`8-4-4-4-12` hex digits), as some providers require.
    pub uuid_keys_only: bool,
    /// The ticket desk's tickets (`crate::tickets`), in creation order.
    pub tickets: Vec<crate::tickets::Ticket>,
    next_id: u64,
}

/// Whether `key` is written as a UUID: `8-4-4-4-12` hex digits.
pub fn is_uuid(key: &str) -> bool {
    let groups: Vec<&str> = key.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]) && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Longest key each mode accepts.
fn max_key_len(mode: Mode) -> usize {
    match mode {
        Mode::Stripe => 255,
        Mode::Ietf => 255,
        Mode::Adyen => 64,
    }
}

impl Provider {
    pub fn new(mode: Mode, retention: Duration) -> Self {
        Self {
            mode,
            retention,
            intents: BTreeMap::new(),
            refunds: Vec::new(),
            keys: HashMap::new(),
            faults: VecDeque::new(),
            clock_offset: 0,
            list_lag: Duration::ZERO,
            list_ignores_cursor: false,
            uuid_keys_only: false,
            tickets: Vec::new(),
            next_id: 0,
        }
    }

    /// The provider's clock, in Unix seconds.
    pub fn now(&self) -> u64 {
        let real = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        real + self.clock_offset
    }

    /// Reads the key from the header value as this mode expects it.
    pub fn parse_key(&self, raw: Option<&str>) -> Result<Option<String>, (u16, Value)> {
        let Some(raw) = raw else {
            return match self.mode {
                Mode::Ietf => {
                    Err((400, problem("Idempotency-Key is missing", "This operation is idempotent and requires a correctly formatted Idempotency-Key header")))
                }
                Mode::Stripe | Mode::Adyen => Ok(None),
            };
        };
        let key = match self.mode {
            Mode::Ietf => match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
                Some(inner) if !inner.is_empty() && !inner.contains(['"', '\\']) => inner.to_string(),
                _ => return Err((400, problem("Idempotency-Key is malformed", "The key must be a Structured Field String (quoted)"))),
            },
            // Stripe and Adyen take the value verbatim: quotes become part of the key.
            Mode::Stripe | Mode::Adyen => raw.to_string(),
        };
        if key.is_empty() || key.len() > max_key_len(self.mode) {
            let message = format!("idempotency key must be 1 to {} characters", max_key_len(self.mode));
            return Err((400, stripe_error("invalid_request_error", "idempotency_key_invalid", &message)));
        }
        if self.uuid_keys_only && !is_uuid(&key) {
            return Err((400, stripe_error("invalid_request_error", "idempotency_key_invalid", "idempotency key must be a UUID")));
        }
        Ok(Some(key))
    }

    /// The idempotency layer: replay, reject or admit for execution.
    pub fn admit(&mut self, key: &str, fingerprint: &str) -> Admission {
        let now = self.now();
        let retention = self.retention.as_secs();
        self.keys.retain(|_, e| now.saturating_sub(e.created) < retention || matches!(e.state, KeyState::Executing));
        match self.keys.get(key) {
            None => {
                let entry = KeyEntry { fingerprint: fingerprint.into(), state: KeyState::Executing, created: now };
                self.keys.insert(key.into(), entry);
                Admission::Execute
            }
            Some(entry) => match (&entry.state, self.mode) {
                (KeyState::Executing, _) => self.in_use(),
                (KeyState::Done { .. }, Mode::Stripe) if entry.fingerprint != fingerprint => Admission::Reject {
                    status: 400,
                    body: stripe_error(
                        "idempotency_error",
                        "idempotency_error",
                        "Keys for idempotent requests can only be used with the same parameters they were first used with.",
                    ),
                    transient: false,
                },
                (KeyState::Done { .. }, Mode::Ietf) if entry.fingerprint != fingerprint => Admission::Reject {
                    status: 422,
                    body: problem("Idempotency-Key is already used", "This key was used with a different request payload"),
                    transient: false,
                },
                (KeyState::Done { status, body }, _) => Admission::Replay { status: *status, body: body.clone() },
            },
        }
    }

    /// The answer while a request with the key is executing.
    pub fn in_use(&self) -> Admission {
        match self.mode {
            Mode::Stripe => Admission::Reject {
                status: 409,
                body: stripe_error("idempotency_error", "idempotency_key_in_use", "There is currently another in-progress request using this Idempotent Key."),
                transient: true,
            },
            Mode::Ietf => Admission::Reject { status: 409, body: problem("A request is outstanding for this Idempotency-Key", "Retry later"), transient: true },
            Mode::Adyen => Admission::Reject {
                status: 422,
                body: json!({ "status": 422, "errorCode": "704", "message": "request already processed or in progress", "errorType": "validation" }),
                transient: true,
            },
        }
    }

    /// Stores the final response under `key`.
    pub fn store(&mut self, key: &str, status: u16, body: &Value) {
        if let Some(e) = self.keys.get_mut(key) {
            e.state = KeyState::Done { status, body: body.clone() };
        }
    }

    /// Forgets `key` (nothing was executed under it).
    pub fn forget(&mut self, key: &str) {
        self.keys.remove(key);
    }

    /// Validates and commits a refund; the status and body to answer with.
    pub fn create_refund(&mut self, params: &BTreeMap<String, String>) -> (u16, Value) {
        let Some(pi) = params.get("payment_intent") else {
            return (400, stripe_error("invalid_request_error", "parameter_missing", "Missing required param: payment_intent."));
        };
        let Some(intent) = self.intents.get(pi).cloned() else {
            return (404, stripe_error("invalid_request_error", "resource_missing", &format!("No such payment_intent: '{pi}'")));
        };
        let refunded: u64 =
            self.refunds.iter().filter(|r| r.payment_intent == *pi && !matches!(r.status.as_str(), "failed" | "canceled")).map(|r| r.amount).sum();
        let remaining = intent.amount.saturating_sub(refunded);
        let amount = match params.get("amount").map(|a| a.parse::<u64>()) {
            None => remaining,
            Some(Ok(a)) if a > 0 => a,
            Some(_) => return (400, stripe_error("invalid_request_error", "parameter_invalid_integer", "Invalid positive integer: amount")),
        };
        if remaining == 0 {
            return (400, stripe_error("invalid_request_error", "charge_already_refunded", &format!("Charge for {pi} has already been refunded.")));
        }
        if amount > remaining {
            let message = format!("Refund amount ({amount}) is greater than unrefunded amount on charge ({remaining})");
            return (400, stripe_error("invalid_request_error", "amount_too_large", &message));
        }
        self.next_id += 1;
        let metadata = params.iter().filter_map(|(k, v)| Some((k.strip_prefix("metadata[")?.strip_suffix(']')?.to_string(), v.clone()))).collect();
        let refund = Refund {
            id: format!("re_{:08}{:016x}", self.next_id, fnv(&format!("{pi}{}{}", self.next_id, self.now()))),
            object: "refund",
            amount,
            currency: intent.currency.clone(),
            payment_intent: pi.clone(),
            reason: params.get("reason").cloned(),
            status: intent.refund_status.clone(),
            metadata,
            created: self.now(),
            created_ms: now_ms(),
        };
        let body = serde_json::to_value(&refund).unwrap_or_default();
        self.refunds.push(refund);
        (200, body)
    }

    /// Stripe's list object of the refunds of `payment_intent`, newest first:
    /// at most `limit` (1–100) of them, those after refund `starting_after`
    /// if given (Stripe's cursor), and `has_more` when the list goes on.
    /// An unknown cursor is Stripe's 400 `resource_missing`.
    pub fn list_refunds(&self, payment_intent: Option<&str>, limit: usize, starting_after: Option<&str>) -> Result<Value, Value> {
        let mut listed = self
            .refunds
            .iter()
            .rev()
            .filter(|r| payment_intent.is_none_or(|pi| r.payment_intent == pi))
            .filter(|r| r.created_ms + self.list_lag.as_millis() as u64 <= now_ms())
            .peekable();
        if let Some(cursor) = starting_after.filter(|_| !self.list_ignores_cursor) {
            if !self.refunds.iter().any(|r| r.id == cursor) {
                return Err(stripe_error("invalid_request_error", "resource_missing", &format!("No such refund: '{cursor}'")));
            }
            while listed.next_if(|r| r.id != cursor).is_some() {}
            listed.next();
        }
        let data: Vec<&Refund> = listed.by_ref().take(limit.clamp(1, 100)).collect();
        let has_more = listed.peek().is_some();
        Ok(json!({ "object": "list", "url": "/v1/refunds", "has_more": has_more, "data": data }))
    }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Stripe's error envelope.
pub(crate) fn stripe_error(kind: &str, code: &str, message: &str) -> Value {
    json!({ "error": { "type": kind, "code": code, "message": message } })
}

/// An RFC 9457 problem document, as the IETF draft describes.
fn problem(title: &str, detail: &str) -> Value {
    json!({ "type": "https://developer.example.com/idempotency", "title": title, "detail": detail })
}

/// FNV-1a: a stable, dependency-free hash for ids.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
