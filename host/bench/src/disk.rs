//! (a) The disk's own limit: sequential synced appends, and batches of 64
//! records per sync, on the data directory's filesystem.

use super::{Figure, Scale, Stats, ms};
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

/// Bytes of one appended record (a ledger attempt is a few hundred).
const RECORD: usize = 256;

/// What the disk allows.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// One synced append.
    pub sync: Stats,
    /// Synced appends per second, one record each.
    pub appends_per_sec: f64,
    /// Records per second when 64 share each sync.
    pub batch64_records_per_sec: f64,
}

impl Bound {
    /// The most records per second `in_flight` concurrent writers could
    /// commit if they shared every sync (at most 64 per sync).
    pub fn records_per_sec(&self, in_flight: usize) -> f64 {
        if in_flight >= 64 { self.batch64_records_per_sec } else { self.appends_per_sec * in_flight as f64 }
    }

    /// Its figures.
    pub fn figures(&self) -> Vec<Figure> {
        vec![
            Figure::new("(a) synced append, p50", ms(self.sync.p50), "ms"),
            Figure::new("(a) synced append, p99", ms(self.sync.p99), "ms"),
            Figure::new("(a) synced appends/s (1 record per sync)", self.appends_per_sec, "rec/s"),
            Figure::new("(a) batched appends/s (64 records per sync)", self.batch64_records_per_sec, "rec/s")
                .against("1 record per sync", self.batch64_records_per_sec / self.appends_per_sec),
        ]
    }
}

/// Measures the bound in `dir`.
///
/// # Errors
/// The directory cannot hold a scratch file.
pub async fn measure(dir: &Path, scale: Scale) -> anyhow::Result<Bound> {
    let path = dir.join("fsync-probe");
    let (n, batches) = (scale.n(super::described::A_APPENDS), scale.n(super::described::A_BATCHES));
    let bound = tokio::task::spawn_blocking(move || -> std::io::Result<Bound> {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        let record = [b'x'; RECORD];
        let mut samples = Vec::with_capacity(n);
        let started = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            file.write_all(&record)?;
            file.sync_data()?;
            samples.push(t.elapsed());
        }
        let appends_per_sec = n as f64 / started.elapsed().as_secs_f64();
        let batch = [b'x'; RECORD * 64];
        let started = Instant::now();
        for _ in 0..batches {
            file.write_all(&batch)?;
            file.sync_data()?;
        }
        let batch64_records_per_sec = (batches * 64) as f64 / started.elapsed().as_secs_f64();
        drop(file);
        let _ = std::fs::remove_file(&path);
        Ok(Bound { sync: Stats::of(&mut samples), appends_per_sec, batch64_records_per_sec })
    })
    .await??;
    Ok(bound)
}
