//! The `toolguard` command; everything lives in [`toolguard::cli`].

fn main() -> std::process::ExitCode {
    pin_mmap_threshold();
    toolguard::cli::main()
}

/// Serves allocations of 512 KiB and more from their own mappings, returned
/// to the system when freed.
///
/// glibc raises its mmap threshold each time a large block is freed, so a
/// long-running host ends up putting per-call buffers (Wasm instance state,
/// HTTP bodies, RocksDB write batches) on its heaps, where freed memory stays
/// resident as fragmentation: RSS grew 23–28 % over a 100k-call soak while
/// live memory stayed flat. A fixed threshold turns the dynamic one off and
/// the growth is 2–4 % (docs/benchmarks.md, figure g).
fn pin_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator parameters; it is called before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 512 * 1024);
    }
}
