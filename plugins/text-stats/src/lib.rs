//! `text_stats`: a read-only example tool. It counts characters, words and
//! lines of a text and reports its most frequent words. No outbound calls.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolguard_sdk::{Plugin, ToolError, Tools, config};

mod count;

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

/// Counts and ranks ([`count::count`]).
fn stats(text: &str, top: usize) -> Stats {
    let c = count::count(text, top);
    Stats {
        characters: c.characters,
        words: c.words,
        lines: c.lines,
        top_words: c.top_words.into_iter().map(|(word, count)| WordCount { word, count }).collect(),
    }
}

struct TextStats;

impl Plugin for TextStats {
    fn tools() -> Tools {
        Tools::new().read_only("text_stats", "Counts the characters, words and lines of a text and lists its most frequent words.", text_stats)
    }
}

toolguard_sdk::export!(TextStats);
