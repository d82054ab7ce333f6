//! The `toolguard` command; everything lives in [`toolguard::cli`].

/// mimalloc for Rust's allocations: per-thread free lists make a guarded
/// call's many small allocations cheaper than glibc's arenas (64 in flight:
/// +25–40 % calls/s; docs/benchmarks.md). RocksDB's C++ keeps glibc's malloc.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit` in mimalloc's `mi_option_e` (v3 header);
/// the crate exports no constant for it.
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

fn main() -> std::process::ExitCode {
    pin_mmap_threshold();
    toolguard::open_files::raise_to_hard();
    toolguard::cli::main()
}

/// Makes mimalloc commit arena memory as it is used, not up front: RSS when
/// loaded 79 → 51 MiB, and faster at 1 in flight (docs/benchmarks.md). It
/// must run before the first Rust allocation creates an arena, so it is a
/// constructor: the loader runs it before Rust's runtime starts.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static LAZY_ARENA_COMMIT: extern "C" fn() = {
    extern "C" fn lazy_arena_commit() {
        // SAFETY: sets a mimalloc option; nothing has allocated yet.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
    }
    lazy_arena_commit
};

/// Serves glibc allocations (RocksDB's C++, wasmtime's C parts) of 512 KiB
/// and more from their own mappings, returned to the system when freed.
///
/// glibc raises its mmap threshold each time a large block is freed, so a
/// long-running host ends up keeping per-call buffers on its heaps, where
/// freed memory stays resident as fragmentation: with glibc serving every
/// allocation, RSS grew 23–28 % over a 100k-call soak while live memory
/// stayed flat; a fixed threshold brought that to 2–4 %
/// (docs/benchmarks.md, figure g).
fn pin_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator parameters; it is called before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 512 * 1024);
    }
}
