//! What only the benchmarks use (the `bench` feature, which the
//! `toolguard-bench` crate turns on; no shipped build has it): a bulk load's
//! housekeeping, server-side copies of filler sessions, and a second schema.

use crate::{Ledger, LedgerError};

impl Ledger {
    /// Finishes the housekeeping a bulk load leaves, as a ledger that grew
    /// over months has had it done (the bench, after filling a ledger).
    ///
    /// # Errors
    /// The backend failed.
    pub fn settle(&self) -> Result<(), LedgerError> {
        self.backend.settle().map_err(|e| self.backend_err(e))
    }

    /// `toolguard-bench` only: see `Backend::replicate_for_bench`.
    pub fn replicate_for_bench(&self, seed: &str, prefix: &str, from: u64, to: u64) -> Result<bool, LedgerError> {
        self.backend.replicate_for_bench(seed, prefix, from, to).map_err(|e| self.backend_err(e))
    }

    /// `toolguard-bench` only: see `Backend::bench_schema`.
    pub fn bench_schema(&self, name: &str, create: bool) -> Result<(), LedgerError> {
        self.backend.bench_schema(name, create).map_err(|e| self.backend_err(e))
    }
}
