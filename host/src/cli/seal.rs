//! `toolguard seal IN -o OUT`: see [`crate::seal`].

use std::path::Path;

/// Seals `input` into `output`; prints what was sealed and the new digest.
pub fn run(input: &Path, output: &Path) -> u8 {
    let bytes = match std::fs::read(input) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("toolguard seal: cannot read {}: {e}", input.display());
            return super::EXIT_CONFIG;
        }
    };
    let (sealed, record) = match crate::seal::seal(&bytes) {
        Ok(done) => done,
        Err(e) => {
            eprintln!("toolguard seal: {}: {e}", input.display());
            return super::EXIT_CONFIG;
        }
    };
    if let Err(e) = std::fs::write(output, &sealed) {
        eprintln!("toolguard seal: cannot write {}: {e}", output.display());
        return super::EXIT_CONFIG;
    }
    use sha2::Digest as _;
    let digest = hex::encode(sha2::Sha256::digest(&sealed));
    if record.sealed.is_empty() {
        outln!("{}: imports nothing to seal; written unchanged", input.display());
    } else {
        outln!("sealed {} interface(s) under a trapping stub: {}", record.sealed.len(), record.sealed.join(", "));
    }
    outln!("wrote {} (sha256 {digest}); pin it: [policy.plugins.NAME] sha256 = \"{digest}\"", output.display());
    0
}
