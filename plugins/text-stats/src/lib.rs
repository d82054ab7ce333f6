//! `text_stats`: a read-only example tool. It counts characters, words and
//! lines of a text and reports its most frequent words. No outbound calls.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use toolguard_sdk::{Plugin, ToolError, Tools, config};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The text to analyse.
    text: String,
    /// How many of the most frequent words to list.
    #[serde(default)]
    #[schemars(with = "u64", range(max = 50), extend("default" = 3))]
    top: Option<u64>,
}

#[derive(Serialize, JsonSchema)]
struct Stats {
    characters: usize,
    words: usize,
    lines: usize,
    top_words: Vec<WordCount>,
}

#[derive(Serialize, JsonSchema)]
struct WordCount {
    word: String,
    count: u64,
}

fn text_stats(args: Args) -> Result<Stats, ToolError> {
    // The operator may lower the default list length in the host config.
    let default_top = config("default_top").and_then(|v| v.parse().ok()).unwrap_or(3);
    Ok(stats(&args.text, args.top.unwrap_or(default_top) as usize))
}

/// Counts and ranks; ties are broken alphabetically so results are stable.
fn stats(text: &str, top: usize) -> Stats {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut words = 0;
    for word in text.split(|c: char| !c.is_alphanumeric() && c != '\'').filter(|w| !w.is_empty()) {
        words += 1;
        *counts.entry(word.to_lowercase()).or_default() += 1;
    }
    let mut ranked: Vec<(String, u64)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Stats {
        characters: text.chars().count(),
        words,
        lines: text.lines().count(),
        top_words: ranked.into_iter().take(top).map(|(word, count)| WordCount { word, count }).collect(),
    }
}

struct TextStats;

impl Plugin for TextStats {
    fn tools() -> Tools {
        Tools::new().read_only("text_stats", "Counts the characters, words and lines of a text and lists its most frequent words.", text_stats)
    }
}

toolguard_sdk::export!(TextStats);
