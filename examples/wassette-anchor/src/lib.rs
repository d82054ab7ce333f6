//! The anchor component: `text_stats`'s own counting
//! (`plugins/text-stats/src/count.rs`, the same source file), exported as a
//! bare function for Wassette — no toolguard contract, no argument schema —
//! so both MCP servers do the same work per call.

use serde::Serialize;

#[path = "../../../plugins/text-stats/src/count.rs"]
mod count;

wit_bindgen::generate!({ world: "text-stats", path: "wit" });

/// What `text_stats` answers, field for field.
#[derive(Serialize)]
struct Stats {
    characters: usize,
    words: usize,
    lines: usize,
    top_words: Vec<WordCount>,
}

#[derive(Serialize)]
struct WordCount {
    word: String,
    count: u64,
}

struct Anchor;

impl Guest for Anchor {
    /// `text_stats` with its default of three top words, as JSON.
    fn text_stats(text: String) -> String {
        let c = count::count(&text, 3);
        let top_words = c.top_words.into_iter().map(|(word, count)| WordCount { word, count }).collect();
        serde_json::to_string(&Stats { characters: c.characters, words: c.words, lines: c.lines, top_words }).unwrap_or_default()
    }
}

export!(Anchor);
