//! The ledger's [`Backend`] on PostgreSQL: each read a prepared statement,
//! each write one transaction ([`super::apply`]), claims by conditional
//! update; the same checks as RocksDB.

use super::*;
use crate::error::failed;
use crate::retention::{LedgerStats, Removal, RetireEntry};
use crate::{AttemptRecord, AttemptState, Backend, BackendError, CallRecord, Claim, Durability, EpisodeRecord, FirstLook, GrantRecord, LedgerWrite, checks};

impl Backend for Postgres {
    #[cfg(any(test, feature = "bench"))]
    fn settle(&self) -> Result<(), BackendError> {
        self.client()?.client.batch_execute("VACUUM ANALYZE").map_err(db)
    }

    #[cfg(feature = "bench")]
    fn replicate_for_bench(&self, seed: &str, prefix: &str, from: u64, to: u64) -> Result<bool, BackendError> {
        off_async(|| bench::replicate(self, seed, prefix, from as i64, to as i64)).map(|()| true)
    }

    #[cfg(feature = "bench")]
    fn bench_schema(&self, name: &str, create: bool) -> Result<(), BackendError> {
        off_async(|| bench::schema(self, name, create))
    }

    fn meta(&self, create: bool) -> Result<(String, [u8; 32]), BackendError> {
        off_async(|| {
            let mut client = self.client()?;
            if create {
                let insert = "INSERT INTO toolguard_meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";
                client.prepared().execute(insert, &[&"schema", &crate::SCHEMA.as_bytes()]).map_err(db)?;
                // The first host to get here sets the secret; every other reads it.
                client.prepared().execute(insert, &[&"secret", &crate::new_secret()?.as_slice()]).map_err(db)?;
            }
            let rows = client.prepared().query("SELECT name, value FROM toolguard_meta", &[]).map_err(db)?;
            let value = |name: &str| rows.iter().find(|r| r.get::<_, &str>("name") == name).map(|r| r.get::<_, Vec<u8>>("value"));
            let schema = value("schema").ok_or("the ledger has no schema record")?;
            let secret = value("secret").and_then(|s| s.try_into().ok()).ok_or("the key secret is missing or damaged")?;
            Ok((String::from_utf8_lossy(&schema).into_owned(), secret))
        })
    }

    fn set_schema(&self, version: &str) -> Result<(), BackendError> {
        off_async(|| {
            let sql = "UPDATE toolguard_meta SET value = $1 WHERE name = 'schema'";
            self.execute(sql, &[&version.as_bytes()]).map(|_| ())
        })
    }

    fn episode(&self, session: &str, tool: &str, args_digest: &str, episode: Option<u64>) -> Result<Option<EpisodeRecord>, BackendError> {
        off_async(|| {
            let rows = match episode {
                Some(n) => {
                    let sql = "SELECT record FROM toolguard_episodes WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4";
                    self.query(sql, &[&session, &tool, &args_digest, &big(n)?])?
                }
                None => {
                    let sql = "SELECT record FROM toolguard_episodes WHERE session = $1 AND tool = $2 AND args_digest = $3 \
                               ORDER BY episode DESC LIMIT 1";
                    self.query(sql, &[&session, &tool, &args_digest])?
                }
            };
            Self::one(&rows)
        })
    }

    fn call(&self, session: &str, call_id: &str) -> Result<Option<CallRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 AND call_id = $2";
            Ok(Self::calls_of(&self.query(sql, &[&session, &call_id])?)?.pop())
        })
    }

    fn first_look(&self, session: &str, call_id: &str, tool: &str, args_digest: &str) -> Result<Option<FirstLook>, BackendError> {
        off_async(|| {
            let tombstone = crate::retention::tombstone(session, call_id);
            let rows = self.query(FIRST_LOOK, &[&session, &call_id, &tool, &args_digest, &tombstone.as_slice()])?;
            let row = rows.first().ok_or("the first look at a call returned no row")?;
            let call = row.get::<_, Option<&str>>("record").map(Self::parse).transpose()?.map(|mut call: CallRecord| {
                Self::claim_of(&mut call, row);
                call
            });
            let pruned = row.get::<_, Option<i64>>("pruned_ms").and_then(|t| u64::try_from(t).ok());
            let episode = row.get::<_, Option<&str>>("episode").map(Self::parse).transpose()?;
            Ok(Some(FirstLook { expired: pruned.filter(|_| call.is_none()), call, episode }))
        })
    }

    fn attempt(&self, key: &str) -> Result<Option<AttemptRecord>, BackendError> {
        off_async(|| Self::one(&self.query("SELECT record FROM toolguard_attempts WHERE key = $1", &[&key])?))
    }

    fn attempt_at(&self, session: &str, call_id: &str, step: u32) -> Result<Option<AttemptRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record FROM toolguard_attempts WHERE session = $1 AND call_id = $2 AND step = $3 ORDER BY generation DESC LIMIT 1";
            Self::one(&self.query(sql, &[&session, &call_id, &int(step)?])?)
        })
    }

    fn attempts_of_call(&self, session: &str, call_id: &str) -> Result<Vec<AttemptRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record FROM toolguard_attempts a WHERE session = $1 AND call_id = $2 AND generation = \
                       (SELECT max(generation) FROM toolguard_attempts b WHERE b.session = a.session AND b.call_id = a.call_id AND b.step = a.step) \
                       ORDER BY step";
            Self::records(&self.query(sql, &[&session, &call_id])?)
        })
    }

    fn calls(&self, session: Option<&str>) -> Result<Vec<CallRecord>, BackendError> {
        off_async(|| {
            // The RocksDB backend's order: length-prefixed session, then call id.
            let order = "ORDER BY octet_length(session), session COLLATE \"C\", octet_length(call_id), call_id COLLATE \"C\"";
            let rows = match session {
                Some(s) => self.query(&format!("SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 {order}"), &[&s])?,
                None => self.query(&format!("SELECT record, owner, lease_until FROM toolguard_calls {order}"), &[])?,
            };
            Self::calls_of(&rows)
        })
    }

    fn attempts_in_state(&self, state: AttemptState) -> Result<Vec<AttemptRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record FROM toolguard_attempts WHERE state = $1 ORDER BY key COLLATE \"C\"";
            Self::records(&self.query(sql, &[&state.as_str()])?)
        })
    }

    fn attempts(&self) -> Result<Vec<AttemptRecord>, BackendError> {
        off_async(|| Self::records(&self.query("SELECT record FROM toolguard_attempts ORDER BY key COLLATE \"C\"", &[])?))
    }

    fn record_grants(&self, record: &GrantRecord) -> Result<bool, BackendError> {
        let value = serde_json::to_string(record).map_err(failed)?;
        let at = i64::try_from(record.recorded_ms).map_err(failed)?;
        let turn = format!("grant-history/{}", record.plugin);
        off_async(|| {
            self.transaction(|tx| {
                // Hosts starting together take turns on one row per plugin (the
                // upsert locks it, new or not), so each compares with the entry
                // the one before it committed: one entry per change, not per host.
                let sql = "INSERT INTO toolguard_meta (name, value) VALUES ($1, ''::bytea) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value";
                tx.execute(sql, &[&turn]).map_err(db)?;
                let sql = "SELECT record FROM toolguard_grant_history WHERE plugin = $1 ORDER BY recorded_ms DESC LIMIT 1";
                let latest: Option<GrantRecord> = Self::one(&tx.query(sql, &[&record.plugin]).map_err(db)?)?;
                if !checks::grants_changed(latest.as_ref(), record) {
                    return Ok(false);
                }
                let sql = "INSERT INTO toolguard_grant_history (plugin, recorded_ms, record) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
                Ok(tx.execute(sql, &[&record.plugin, &at, &value]).map_err(db)? == 1)
            })
        })
    }

    fn note_serving(&self, record: &crate::ServingRecord, stale_before_ms: u64) -> Result<(), BackendError> {
        let (name, value) = (format!("serving/{}", record.host), serde_json::to_vec(record).map_err(failed)?);
        off_async(|| {
            let stale: Vec<String> = self.serving()?.into_iter().filter(|r| r.seen_ms < stale_before_ms).map(|r| format!("serving/{}", r.host)).collect();
            for old in stale {
                self.execute("DELETE FROM toolguard_meta WHERE name = $1", &[&old])?;
            }
            let sql = "INSERT INTO toolguard_meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value";
            self.execute(sql, &[&name, &value]).map(|_| ())
        })
    }

    fn serving(&self) -> Result<Vec<crate::ServingRecord>, BackendError> {
        off_async(|| {
            let rows = self.query("SELECT value FROM toolguard_meta WHERE name LIKE 'serving/%' ORDER BY name COLLATE \"C\"", &[])?;
            Ok(rows.iter().filter_map(|r| serde_json::from_slice(&r.get::<_, Vec<u8>>("value")).ok()).collect())
        })
    }

    fn grant_history(&self) -> Result<Vec<GrantRecord>, BackendError> {
        off_async(|| Self::records(&self.query("SELECT record FROM toolguard_grant_history ORDER BY recorded_ms, plugin COLLATE \"C\"", &[])?))
    }

    fn shared(&self) -> bool {
        true
    }

    fn retire_page(&self, before_ms: u64, after: Option<&RetireEntry>, limit: usize) -> Result<Vec<RetireEntry>, BackendError> {
        off_async(|| self.retire_page_of(before_ms, after, limit))
    }

    fn remove(&self, removal: &Removal) -> Result<(), BackendError> {
        off_async(|| self.remove_unit(removal))
    }

    fn expired(&self, session: &str, call_id: &str) -> Result<Option<u64>, BackendError> {
        off_async(|| self.expired_at(session, call_id))
    }

    fn episode_calls(&self, session: &str, tool: &str, args_digest: &str, episode: u64) -> Result<Vec<CallRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4";
            Self::calls_of(&self.query(sql, &[&session, &tool, &args_digest, &big(episode)?])?)
        })
    }

    fn forget_budget_before(&self, before_ms: u64) -> Result<u64, BackendError> {
        off_async(|| {
            let sql = "DELETE FROM toolguard_budget WHERE at_ms < $1";
            let budget = self.execute(sql, &[&big(before_ms)?])?;
            // A limit's use, once its window has ended.
            let sql = "DELETE FROM toolguard_spend WHERE until_ms < $1";
            let spent = self.execute(sql, &[&big(before_ms)?])?;
            // And its window's running total.
            self.execute("DELETE FROM toolguard_spend_totals WHERE until_ms < $1", &[&big(before_ms)?])?;
            Ok(budget + spent)
        })
    }

    fn stats(&self) -> Result<LedgerStats, BackendError> {
        off_async(|| self.figures())
    }

    fn spent(&self, now_ms: u64) -> Result<Vec<crate::records::SpentUse>, BackendError> {
        off_async(|| {
            let sql = "SELECT scope, at_ms, call_id, amount, until_ms FROM toolguard_spend WHERE until_ms > $1 ORDER BY scope, at_ms";
            let rows = self.query(sql, &[&big(now_ms)?])?;
            let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
            Ok(rows
                .iter()
                .map(|r| crate::records::SpentUse {
                    scope: r.get(0),
                    at_ms: unsigned(r.get(1)),
                    call_id: r.get(2),
                    amount: unsigned(r.get(3)),
                    until_ms: unsigned(r.get(4)),
                })
                .collect())
        })
    }

    fn episodes(&self) -> Result<Vec<EpisodeRecord>, BackendError> {
        off_async(|| Self::records(&self.query("SELECT record FROM toolguard_episodes", &[])?))
    }

    fn backfill_episode_index(&self) -> Result<(), BackendError> {
        off_async(|| {
            let sql = "UPDATE toolguard_calls SET episode = (record::jsonb ->> 'episode')::bigint \
                       WHERE episode IS NULL AND record::jsonb ? 'episode'";
            self.execute(sql, &[]).map(|_| ())
        })
    }

    fn follow_clock(&self) -> Result<(), BackendError> {
        off_async(|| self.follow_server_clock(1))
    }

    fn claim_call(&self, call: &CallRecord, now_ms: u64) -> Result<Claim, BackendError> {
        off_async(|| {
            // Insert, or take over a call that is not completed, is the same
            // action, and whose claim has lapsed or is already ours: one statement,
            // so two hosts can never both hold it.
            let sql = format!(
                "{INSERT_CALL} ON CONFLICT (session, call_id) DO UPDATE SET \
                 owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until \
                 WHERE NOT toolguard_calls.completed AND toolguard_calls.tool = EXCLUDED.tool \
                 AND toolguard_calls.args_digest = EXCLUDED.args_digest \
                 AND (toolguard_calls.lease_until < $10 OR toolguard_calls.owner = EXCLUDED.owner) \
                 AND (toolguard_calls.record::jsonb ->> 'superseded_by') IS NULL \
                 RETURNING record"
            );
            let row = call_row(call)?;
            let now = i64::try_from(now_ms).map_err(failed)?;
            let mut params = row.params().to_vec();
            params.push(&now);
            let mut connection = self.client()?;
            let mut client = connection.prepared();
            let claimed = client.query(&sql, &params).map_err(db)?;
            if let Some(mut record) = Self::one::<CallRecord>(&claimed)? {
                // Taken over: the stored record, with our claim.
                record.owner.clone_from(&call.owner);
                record.lease_until_ms = call.lease_until_ms;
                return Ok(Claim::Run { record, persisted: true });
            }
            let sql = "SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 AND call_id = $2";
            let existing = Self::calls_of(&client.query(sql, &[&call.session, &call.call_id]).map_err(db)?)?.pop();
            let Some(existing) = existing else { return Err("the call vanished while being claimed; retry".into()) };
            Ok(match Claim::of_existing(call, Some(existing)) {
                Claim::Run { record, .. } => Claim::Busy(record),
                other => other,
            })
        })
    }

    fn decide_approval(&self, decided: &CallRecord, request: &str) -> Result<bool, BackendError> {
        off_async(|| {
            // One statement: the decision lands only on the request still pending.
            let sql = "UPDATE toolguard_calls SET record = $3 WHERE session = $1 AND call_id = $2 AND NOT completed \
                       AND record::jsonb -> 'approval' ->> 'request' = $4 AND record::jsonb -> 'approval' ->> 'status' = 'pending'";
            let record = serde_json::to_string(decided).map_err(failed)?;
            let updated = self.execute(sql, &[&decided.session, &decided.call_id, &record, &request])?;
            Ok(updated == 1)
        })
    }

    fn release_call(&self, session: &str, call_id: &str, owner: &str) -> Result<(), BackendError> {
        off_async(|| {
            let sql = "UPDATE toolguard_calls SET lease_until = 0 WHERE session = $1 AND call_id = $2 AND owner = $3";
            self.execute(sql, &[&session, &call_id, &owner]).map(|_| ())
        })
    }

    fn commit(&self, write: &LedgerWrite, _durability: Durability) -> Result<(), BackendError> {
        off_async(|| {
            // A statement is atomic on its own: no BEGIN and COMMIT round trips
            // around one (nor a second try: a lost connection may have committed it).
            if let Some((report, episode, at_ms)) = fused::report_and_close(write) {
                return fused::apply_report_and_close(&mut self.client()?.prepared(), report, episode, at_ms);
            }
            if most_statements(write) == 1 {
                return apply(&mut self.client()?.prepared(), write);
            }
            self.transaction(|tx| apply(tx, write))
        })
    }
}
