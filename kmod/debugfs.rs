// SPDX-License-Identifier: GPL-2.0

//! debugfs: `/sys/kernel/debug/peerdirect/peerdirectN/` with `stats`, `allocations` and
//! `exports` (with their importers' attachments).

use crate::{
    hbm::{Hbm, MAX_LISTED},
    sys::{self, dma_buf::AttachInfo},
};
use kernel::{
    debugfs::{Dir, Scope, Writer},
    fmt,
    prelude::*,
    sync::{atomic::Relaxed, Arc},
};

crate::sys::global::global_mutex! {
    /// `/sys/kernel/debug/peerdirect`, from module init to module exit.
    static ROOT: Mutex<Option<Dir>> = None;
}

/// Creates `/sys/kernel/debug/peerdirect`, from the module initializer.
pub(crate) fn init_root() {
    *ROOT.lock() = Some(Dir::new(c"peerdirect"));
}

/// Lets go of the root; it disappears with the last device directory (which hold it).
pub(crate) fn release_root() {
    drop(ROOT.lock().take());
}

/// `stats`: one `key: value` line each.
pub(crate) struct Stats(Arc<Hbm>);

impl Writer for Stats {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hbm = &self.0;
        let state = hbm.memory.heap.lock();
        let allocations = state.live.iter().count();
        let allocated: u64 = state.live.values().map(|&(_, len, _)| len).sum();
        writeln!(f, "hbm_bytes: {}", state.heap.size())?;
        writeln!(f, "free_bytes: {}", state.heap.free_bytes())?;
        writeln!(f, "allocations: {allocations}")?;
        writeln!(f, "allocated_bytes: {allocated}")?;
        writeln!(f, "exports: {}", hbm.exports.load(Relaxed))?;
        writeln!(f, "mappings_revocable: {}", hbm.mappings.revocable())?;
        writeln!(
            f,
            "mappings_pinned: {}",
            hbm.memory.pinned_mappings.load(Relaxed)
        )?;
        let (asked, kept) = hbm.verdicts.counts();
        writeln!(f, "p2p_verdicts_asked: {asked}")?;
        writeln!(f, "p2p_verdicts_kept: {kept}")?;
        let (resets, resetting) = hbm.resets();
        writeln!(f, "resets: {resets}")?;
        writeln!(f, "resetting: {resetting}")?;
        writeln!(f, "present: {}", hbm.is_present())
    }
}

/// `allocations`: one line per live range: handle, BAR offset, length, owner pid.
pub(crate) struct Allocations(Arc<Hbm>);

impl Writer for Allocations {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.0.memory.heap.lock();
        for (offset, &(handle, len, pid)) in state.live.iter() {
            writeln!(
                f,
                "handle={handle} offset={offset:#x} length={len:#x} pid={pid}"
            )?;
        }
        Ok(())
    }
}

/// `exports`: one line per live dma-buf, then one indented line per importer attachment.
pub(crate) struct Exports(Arc<Hbm>);

impl Writer for Exports {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The reservation lock is taken under `exported`, as removal does.
        let exported = self.0.exported.lock();
        for listed in exported.iter() {
            let export = listed.record();
            writeln!(
                f,
                "handle={} offset={:#x} length={:#x}",
                export.handle, export.offset, export.len
            )?;
            let mut infos = [AttachInfo::EMPTY; MAX_LISTED];
            let n = listed.attachments(&mut infos);
            for a in &infos[..n.min(MAX_LISTED)] {
                writeln!(
                    f,
                    "  importer={} {} pinned={} mapped_entries={}",
                    a.importer(),
                    if a.revocable {
                        "revocable"
                    } else {
                        "not-revocable"
                    },
                    u8::from(a.pinned),
                    a.entries
                )?;
            }
            if n > MAX_LISTED {
                writeln!(f, "  ({} more importers)", n - MAX_LISTED)?;
            }
        }
        Ok(())
    }
}

/// What a device directory's files read.
pub(crate) struct DeviceFiles {
    stats: Stats,
    allocations: Allocations,
    exports: Exports,
}

/// The directory `peerdirect/<name>` for `hbm`, removed when the returned scope drops.
pub(crate) fn device_dir(
    name: &'static CStr,
    hbm: Arc<Hbm>,
) -> impl PinInit<Scope<DeviceFiles>, Error> {
    let files = DeviceFiles {
        stats: Stats(hbm.clone()),
        allocations: Allocations(hbm.clone()),
        exports: Exports(hbm),
    };
    // The directory holds a reference to the root, which may be released meanwhile.
    let root = || {
        ROOT.lock()
            .clone()
            .unwrap_or_else(|| Dir::new(c"peerdirect"))
    };
    sys::debugfs::scope_under(
        root,
        Ok::<_, Error>(files),
        name,
        |files: &DeviceFiles, dir| {
            dir.read_only_file(c"stats", &files.stats);
            dir.read_only_file(c"allocations", &files.allocations);
            dir.read_only_file(c"exports", &files.exports);
        },
    )
}
