//! (i)'s figures: each size against the empty ledger measured in turns with
//! it, and cold replays against the smallest filled ledger.

use super::{AtSize, PASSES};
use crate::Figure;

/// The figures of one backend, each against the empty ledger's measured
/// beside it (for replays: the smallest filled ledger's, same pass).
pub(super) fn report(backend: &str, results: &[AtSize]) -> Vec<Figure> {
    let first = &results[0];
    let mut figures = Vec::new();
    for r in results {
        let label = |what: &str| format!("(i) {backend}, {} completed calls: {what}", r.filled);
        let beside = "the empty ledger measured beside it";
        let (own, empty) = (&r.own, &r.beside);
        figures.push(
            Figure::new(label("guarded calls/s, 64 in flight"), own.rate64, "calls/s")
                .against(beside, own.rate64 / empty.rate64)
                .target("no worse than 1.5× empty", empty.rate64 / own.rate64 <= 1.5),
        );
        figures.push(
            Figure::new(label("guarded p50, 1 in flight"), own.p50, "ms")
                .against(beside, own.p50 / empty.p50)
                .target("≤ 1.5× empty", own.p50 / empty.p50 <= 1.5),
        );
        figures.push(
            Figure::new(label("admission, mean"), own.admit_us, "µs")
                .against(beside, own.admit_us / empty.admit_us)
                .target("≤ 1.5× empty", own.admit_us / empty.admit_us <= 1.5),
        );
        // What the figures would say against the first size's, measured minutes earlier.
        println!(
            "    ({backend}, {} calls: against the empty ledger of the first size instead, measured before the fills: calls/s {:.2}×, p50 {:.2}×, admission {:.2}×)",
            r.filled,
            own.rate64 / first.own.rate64,
            own.p50 / first.own.p50,
            own.admit_us / first.own.admit_us
        );
        for (pass, &per_sec) in r.cold.iter().enumerate() {
            let figure = Figure::new(label(PASSES[pass].0), per_sec, "replays/s");
            // The smallest filled ledger is the baseline of the larger ones: it
            // carries no ratio and no target of its own (it would meet one
            // against itself).
            let smallest = results.iter().find(|x| x.cold.get(pass).is_some());
            let Some(first) = smallest.filter(|x| !std::ptr::eq(*x, r)).map(|x| x.cold[pass]) else {
                figures.push(figure);
                continue;
            };
            let figure = figure.against("the smallest filled ledger, same pass", per_sec / first);
            // Only the first pass carries the target: the others say why it is what it is.
            figures.push(if pass == 0 { figure.target("no worse than 1.5×", first / per_sec <= 1.5) } else { figure });
        }
        figures.push(Figure::new(label("bytes per recorded call"), r.bytes_per_call, "bytes"));
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::super::{AtSize, measure::Figures};
    use super::report;

    fn at(filled: usize, cold: Vec<f64>) -> AtSize {
        let figures = || Figures { rate64: 1000.0, p50: 1.0, admit_us: 10.0 };
        AtSize { filled, own: figures(), beside: figures(), cold, bytes_per_call: 700.0 }
    }

    #[test]
    fn cold_replays_carry_a_target_only_against_a_smaller_ledger() {
        let figures = report("RocksDB", &[at(0, vec![]), at(1_000_000, vec![100.0]), at(10_000_000, vec![50.0])]);
        let cold: Vec<_> = figures.iter().filter(|f| f.name.contains("cold replays")).collect();
        assert_eq!(cold.len(), 2);
        assert!(
            cold[0].name.contains("1000000") && cold[0].ratio.is_none() && cold[0].met.is_none(),
            "the baseline is not measured against itself: {:?}",
            cold[0]
        );
        assert!(cold[1].name.contains("10000000") && cold[1].ratio == Some(0.5) && cold[1].met == Some(false), "{:?}", cold[1]);
    }
}
