//! The work each benchmark does, as the Method table of
//! `docs/benchmarks.md` states it. The benchmarks take their counts from
//! here, and a test checks that the table states each one: a description
//! that drifts from the code fails the tests.

/// (a): synced appends, one at a time.
pub const A_APPENDS: usize = 400;
/// (a): batches of [`A_BATCH`] records per fsync.
pub const A_BATCHES: usize = 100;
/// (a): records per batched fsync.
pub const A_BATCH: usize = 64;
/// (b): calls at 1 in flight.
pub const B_ONE: usize = 300;
/// (b): calls at 8, 64 and 256 in flight.
pub const B_MANY: usize = 8_000;
/// (b): unmeasured warm-up calls per worker, on each side.
pub const B_WARM_PER_WORKER: usize = 16;
/// (b): calls of the sustained run at 64 in flight.
pub const B_SUSTAINED: usize = 100_000;
/// (c): rounds of the guard's CPU path.
pub const C_ROUNDS: usize = 50_000;
/// (d): the plugin whose tool is invoked in a fresh sandbox.
pub const D_PLUGIN: &str = "template";
/// (d): that tool.
pub const D_TOOL: &str = "greet";
/// (d): invocations.
pub const D_CALLS: usize = 5_000;
/// (e): warm replays of one completed call.
pub const E_WARM: usize = 200_000;
/// (e): completed calls, each replayed once by a fresh host.
pub const E_COLD: usize = 5_000;
/// (g): calls with the plugins loaded, at 64 in flight.
pub const G_LOADED: usize = 10_000;
/// (g): the window over which a high-water mark is taken.
pub const G_WINDOW: usize = 30_000;
/// (g): calls of the soak.
pub const G_SOAK: usize = 100_000;
/// (j): calls per language.
pub const J_CALLS: usize = 1_000;
/// (k): measured calls, after a fifth as many of warm-up.
pub const K_CALLS: usize = 5_000;

/// `n` as the document writes it: thousands separated by commas.
fn written(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What the Method table's row for each benchmark must say, as phrases.
pub fn phrases() -> Vec<(char, Vec<String>)> {
    let w = written;
    vec![
        ('a', vec![format!("{} times", w(A_APPENDS)), format!("{A_BATCH} records per `fdatasync`, {} times", w(A_BATCHES))]),
        (
            'b',
            vec![
                format!("{} calls at 1, {} otherwise", w(B_ONE), w(B_MANY)),
                format!("{B_WARM_PER_WORKER} calls per worker"),
                format!("{} calls on each side", w(B_SUSTAINED)),
            ],
        ),
        ('c', vec![format!("{} times", w(C_ROUNDS))]),
        ('d', vec![format!("`{D_TOOL}`"), format!("`{D_PLUGIN}`"), format!("{} times", w(D_CALLS))]),
        ('e', vec![format!("{} times", w(E_WARM)), format!("{} completed calls", w(E_COLD))]),
        ('g', vec![format!("{} calls at 64 in flight", w(G_LOADED)), format!("{} calls", w(G_WINDOW)), format!("{}-call soak", w(G_SOAK))]),
        ('j', vec![format!("{} calls each", w(J_CALLS))]),
        ('k', vec![format!("{} calls after {} of warm-up", w(K_CALLS), w(K_CALLS / 5))]),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_method_table_states_the_work_each_benchmark_does() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/benchmarks.md")).unwrap();
        let mut wrong = Vec::new();
        for (letter, phrases) in super::phrases() {
            let prefix = format!("| {letter} |");
            let Some(row) = doc.lines().find(|l| l.starts_with(&prefix)) else {
                wrong.push(format!("({letter}) has no row in the Method table"));
                continue;
            };
            wrong.extend(phrases.into_iter().filter(|p| !row.contains(p.as_str())).map(|p| format!("({letter}) does not say \"{p}\"")));
        }
        assert!(wrong.is_empty(), "docs/benchmarks.md's Method table disagrees with the code (host/bench/src/described.rs):\n{}", wrong.join("\n"));
    }

    #[test]
    fn numbers_are_written_as_the_document_writes_them() {
        assert_eq!(super::written(64), "64");
        assert_eq!(super::written(5_000), "5,000");
        assert_eq!(super::written(100_000), "100,000");
        assert_eq!(super::written(1_000_000), "1,000,000");
    }
}
