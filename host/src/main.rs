//! The `toolguard` command; everything lives in [`toolguard::cli`].

fn main() -> std::process::ExitCode {
    toolguard::cli::main()
}
