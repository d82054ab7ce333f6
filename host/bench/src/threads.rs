//! Where a run's CPU goes, by the role of the thread that spent it: the
//! async workers (the calls themselves, and the blocking pool, whose
//! threads share their name), the ledger's writer and sync threads, and
//! RocksDB's flushes and compactions. Read from each thread's
//! `/proc/self/task/TID/schedstat` (nanoseconds on a CPU), so (b) can say
//! at 64 in flight which part of the guard's extra CPU lies where.

use std::collections::HashMap;

/// The thread roles (b) reports, in the order it prints them.
pub(crate) const ROLES: [Role; 4] = [Role::Workers, Role::Ledger, Role::Background, Role::Other];

/// What a thread of this process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// Tokio's async workers and blocking pool: plugins, the guard, HTTP.
    Workers,
    /// The RocksDB ledger's writer and sync threads (`toolguard-ledger*`).
    Ledger,
    /// RocksDB's background threads: memtable flushes and compactions.
    Background,
    /// Any other thread, and threads that ended during the run.
    Other,
}

impl Role {
    /// The role of a thread named `comm` (Linux truncates names to 15 bytes).
    fn of(comm: &str) -> Self {
        if comm.starts_with("tokio-rt-worker") {
            Self::Workers
        } else if comm.starts_with("toolguard-ledge") {
            Self::Ledger
        } else if comm.starts_with("rocksdb:") {
            Self::Background
        } else {
            Self::Other
        }
    }

    /// How (b) names it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Workers => "async workers (plugins, guard, HTTP)",
            Self::Ledger => "ledger writer and sync threads",
            Self::Background => "RocksDB flushes and compactions",
            Self::Other => "other threads",
        }
    }
}

/// CPU time so far of each live thread of this process, in seconds, by thread id.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot(HashMap<u64, (Role, f64)>);

impl Snapshot {
    /// Reads every live thread's CPU time (empty where `/proc` is unavailable).
    pub(crate) fn now() -> Self {
        let mut threads = HashMap::new();
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Self(threads) };
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<u64>().ok()) else { continue };
            let (Ok(comm), Ok(stat)) = (std::fs::read_to_string(task.path().join("comm")), std::fs::read_to_string(task.path().join("schedstat"))) else {
                continue;
            };
            // schedstat: time on a CPU (ns), time waiting for one (ns), timeslices.
            if let Some(ns) = stat.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()) {
                threads.insert(tid, (Role::of(comm.trim_end()), ns as f64 * 1e-9));
            }
        }
        Self(threads)
    }

    /// CPU seconds spent by each role between `self` and `later`, with
    /// `total` (the process's own count, which includes threads that ended)
    /// making up what the live threads do not account for as [`Role::Other`].
    pub(crate) fn spent_until(&self, later: &Self, total: f64) -> HashMap<Role, f64> {
        let mut by_role: HashMap<Role, f64> = ROLES.iter().map(|r| (*r, 0.0)).collect();
        for (tid, (role, seconds)) in &later.0 {
            let before = self.0.get(tid).map_or(0.0, |(_, s)| *s);
            *by_role.get_mut(role).expect("every role is listed") += (seconds - before).max(0.0);
        }
        let seen: f64 = by_role.values().sum();
        *by_role.get_mut(&Role::Other).expect("listed") += (total - seen).max(0.0);
        by_role
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_is_counted_under_its_role() {
        let before = Snapshot::now();
        let spin = std::thread::Builder::new()
            .name("rocksdb:bench".into())
            .spawn(|| {
                let started = std::time::Instant::now();
                let mut x = 0u64;
                while started.elapsed() < std::time::Duration::from_millis(60) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            })
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(120));
        let after = Snapshot::now();
        spin.join().unwrap();
        if after.0.is_empty() {
            return; // no /proc here: nothing to check
        }
        let by_role = before.spent_until(&after, 0.0);
        // It spun for 60 ms; a loaded machine may have given it less of a CPU, never more.
        let background = by_role[&Role::Background];
        assert!(background > 0.005 && background < 0.2, "the spinning thread's CPU should land under its role, got {background} s");
        assert_eq!(Role::of("tokio-rt-worker"), Role::Workers);
        assert_eq!(Role::of("toolguard-ledge"), Role::Ledger);
        assert_eq!(Role::of("main"), Role::Other);
    }
}
