//! What the command line prints — JSON made safe for a terminal — and how
//! a command that is done ends.

/// `println!` for what a command prints: a reader that went away (`toolguard
/// ledger export | head -1`) ends the command quietly ([`line`]).
macro_rules! outln {
    ($($arg:tt)*) => { $crate::cli::output::line(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` for what a command prints, ending quietly as [`outln!`] does.
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::output::line(format_args!($($arg)*)) };
}

/// Ends the process at once with `code`: stdout and stderr flushed, nothing
/// torn down (no destructor runs; the ledger is left as a kill would leave
/// it, which it is built to survive). For `toolguard call` once the record
/// that its caller was told has been written: nothing durable is left to
/// do, and every moment the process lived on would be one in which a kill
/// takes the clean exit from a caller that trusts only one, while the
/// ledger says that caller was told.
pub(crate) fn exit_now(code: u8) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process without running atexit handlers or
    // destructors; nothing here relies on them (stdio is flushed above, and
    // every ledger write the caller relies on has landed).
    unsafe { libc::_exit(i32::from(code)) }
}

/// Writes `text` to stdout. A reader that went away (a closed pipe)
/// ends the command quietly, with status 0, as ripgrep does: nobody is left
/// to read the rest. Any other failure to write is reported on stderr once
/// and ends the command with status 1.
pub(crate) fn line(text: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(text) {
        ended(&e);
    }
}

/// Ends the command after stdout failed with `e` ([`line`]).
fn ended(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        exit_now(0);
    }
    let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("toolguard: cannot write to stdout: {e}\n"));
    exit_now(1)
}

/// Prints pretty JSON to stdout (ending quietly if its reader went away).
pub(super) fn print_json(value: &serde_json::Value) {
    if let Err(e) = write_json(value) {
        ended(&e);
    }
}

/// Writes pretty JSON and a newline to stdout and flushes it.
///
/// # Errors
/// stdout is closed or full (the reader went away).
pub(super) fn write_json(value: &serde_json::Value) -> std::io::Result<()> {
    use std::io::Write as _;
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", json_for_terminal(&text))?;
    out.flush()
}

/// `json` with every character a terminal could act on written as a JSON
/// `\u` escape: the same JSON value, but ids and results from plugins or
/// clients cannot move the cursor, retitle the window or reorder text when
/// printed. (serde_json escapes C0 controls already; C1 controls and bidi
/// overrides pass through it.)
pub(super) fn json_for_terminal(json: &str) -> std::borrow::Cow<'_, str> {
    if !json.chars().any(unsafe_on_terminal) {
        return json.into();
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if unsafe_on_terminal(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// Control characters (but the newlines and indents of pretty JSON) and
/// the bidirectional overrides that reorder what a terminal shows.
pub(super) fn unsafe_on_terminal(c: char) -> bool {
    (c.is_control() && c != '\n') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with what a terminal could act on shown as escapes, for the
/// tables of `toolguard ledger` (which print ids plugins and clients chose).
pub(super) fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c == '\n' || unsafe_on_terminal(c)) {
        return text.into();
    }
    text.chars().map(|c| if c == '\n' || unsafe_on_terminal(c) { c.escape_unicode().to_string() } else { c.to_string() }).collect::<String>().into()
}

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// For a person.
    Text,
    /// The documented JSON.
    Json,
    /// SARIF 2.1.0 (the review only).
    Sarif,
}
