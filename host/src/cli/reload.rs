//! `toolguard reload`: asks the `toolguard serve` of a config to read it
//! again (`docs/operations.md`) and prints what it answered.

use std::path::Path;

/// Reloads the serve of the config at `path`: 0 if it swapped the new
/// configuration in, 1 if it refused it (still serving the old one), 3 if
/// no serve could be asked.
pub(super) async fn run(path: &Path) -> u8 {
    let config = match crate::Config::load(path) {
        Ok(c) => c,
        // Unread, it cannot name the serve to ask: say nothing about what one does.
        Err(e) => {
            return super::config_error(format!(
                "reload refused: the configuration cannot be read, so no serve was asked (one that runs keeps its configuration): {e}"
            ));
        }
    };
    let Some(socket) = crate::handover::control_socket(&config) else {
        return super::config_error("the data directory's path is too long for a Unix socket; send the serve SIGHUP instead".into());
    };
    match crate::handover::ask_reload(&socket).await {
        Ok(answer) => {
            super::output::print_json(&answer);
            if answer["reloaded"] == true { 0 } else { super::EXIT_CALL_FAILED }
        }
        Err(e) => super::config_error(e),
    }
}
