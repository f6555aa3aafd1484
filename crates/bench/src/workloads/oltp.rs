//! oltp-insert: a proxy for sysbench's `oltp_insert.lua` on MySQL/InnoDB (CJFS's OLTP-insert),
//! after the fio recipe in the reference notes. Each thread is one client committing
//! transactions:
//! - the commit appends a 4 KiB record to the one shared redo log (`oltp/redo.log`, offsets
//!   handed out in order as InnoDB's log buffer does) and calls **fdatasync** on it — the
//!   group-commit pattern many threads hammer at once;
//! - the insert grows the thread's own table file (`oltp/table<T>.ibd`) by a 16 KiB page,
//!   with an **fsync** every 8 pages (InnoDB's page flushing, with block allocation and extent
//!   updates in the journal).
//!
//! One operation is one transaction (sysbench's events/s).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{pattern, run_threads, Measured, Step, WorkloadParams};
use crate::fsapi::{FsApi, OpenFile};

const RECORD_BYTES: usize = 4096;
const PAGE_BYTES: usize = 16384;
const FSYNC_EVERY_PAGES: u64 = 8;

pub fn run(api: &dyn FsApi, params: &WorkloadParams) -> io::Result<Measured> {
    api.mkdir("oltp")?;
    // The redo log is shared: each thread opens it (as each connection would write through
    // the server's one descriptor, a descriptor per thread keeps the proxy lock-free here).
    drop(api.create("oltp/redo.log")?);
    let mut logs = Vec::new();
    let mut tables = Vec::new();
    for t in 0..params.threads {
        logs.push(Mutex::new(api.open("oltp/redo.log")?));
        tables.push(Mutex::new((api.create(&format!("oltp/table{t}.ibd"))?, 0u64)));
    }
    api.sync()?;
    let log_end = AtomicU64::new(0);
    let record = pattern(RECORD_BYTES, params.seed);
    let page = pattern(PAGE_BYTES, params.seed + 1);
    run_threads(params, params.threads, |thread, iteration, c| {
        let at = log_end.fetch_add(RECORD_BYTES as u64, Ordering::Relaxed);
        let mut log = logs[thread].lock();
        c.write(&mut **log, at, &record)?;
        c.timed_sync(&mut **log as &mut dyn OpenFile, true)?;
        drop(log);
        let mut table = tables[thread].lock();
        let (file, size) = &mut *table;
        c.write(&mut **file, *size, &page)?;
        *size += PAGE_BYTES as u64;
        if (iteration + 1) % FSYNC_EVERY_PAGES == 0 {
            c.timed_sync(&mut **file, false)?;
        }
        c.ops += 1;
        Ok(Step::More)
    })
}
