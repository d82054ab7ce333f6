//! The counting behind `text_stats`, free of the plugin contract, so that
//! the benchmark's anchor component (`examples/wassette-anchor`) does
//! exactly the same work per call.

use std::collections::BTreeMap;

/// What a text counts to.
pub struct Counts {
    /// Unicode scalar values.
    pub characters: usize,
    /// Runs of letters, digits and apostrophes.
    pub words: usize,
    /// Lines, as `str::lines` sees them.
    pub lines: usize,
    /// The `top` most frequent words (lowercased) with their counts, most
    /// frequent first; ties alphabetically, so results are stable.
    pub top_words: Vec<(String, u64)>,
}

/// Counts `text` and ranks its `top` most frequent words.
pub fn count(text: &str, top: usize) -> Counts {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut words = 0;
    for word in text.split(|c: char| !c.is_alphanumeric() && c != '\'').filter(|w| !w.is_empty()) {
        words += 1;
        *counts.entry(word.to_lowercase()).or_default() += 1;
    }
    let mut ranked: Vec<(String, u64)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    ranked.truncate(top);
    Counts { characters: text.chars().count(), words, lines: text.lines().count(), top_words: ranked }
}
