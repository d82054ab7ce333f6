//! This process's limit on open files, which RocksDB's table files, the
//! ledger's and downstreams' connections and every MCP client's share.

/// The soft and hard limits on open files, if the system says.
pub fn limits() -> Option<(u64, u64)> {
    // SAFETY: reads this process's own resource limit into a zeroed struct.
    unsafe {
        let mut limit = std::mem::zeroed::<libc::rlimit>();
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0).then_some((limit.rlim_cur, limit.rlim_max))
    }
}

/// Raises the soft limit to the hard one, as Go's runtime does for every
/// program: the soft default is often 1,024, and a few hundred idle HTTP
/// connections would otherwise leave the ledger unable to open a table file.
pub fn raise_to_hard() {
    if let Some((soft, hard)) = limits()
        && soft < hard
    {
        let raised = libc::rlimit { rlim_cur: hard, rlim_max: hard };
        // SAFETY: sets this process's own resource limit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    }
}
