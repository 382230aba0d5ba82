//! `--race SUITE`: races between the HBM device going away and what userspace does with it
//! (Documentation/lifecycle.md). Each suite runs for a bounded time (`--seconds`), counts how
//! often it ran, and counts the outcomes that only come when the two sides of the race meet
//! (after "met:" in its first check); it fails when the race was not run often enough to mean
//! anything, or when an outcome that proves the meeting never came: a race that never
//! overlapped proves nothing. A thread that panics fails the check it was part of.
//! Kernel reports (KASAN, refcount warnings, lockdep) fail the guest run itself (`qemu/run`);
//! `make test` runs these suites on the KASAN kernel (`tests/system/race.sh`).
//!
//! - `open-unbind`: three threads open `/dev/peerdirect0`, ask INFO and close, while the device
//!   is unbound and rebound in a loop. Met: files opened before a removal whose INFO then
//!   fails with `ENODEV`, or opens refused (`ENODEV`, `ENXIO`) while the device went.
//! - `mmap-unbind`, `mmap-unplug`: two threads export small dma-bufs, map and write them, while
//!   the device is unbound (then rebound, in rounds) or hot-unplugged once; afterwards every
//!   mapping made, whenever it was made, must fault (SIGBUS) instead of reaching the BAR. Met:
//!   mappings revoked while held, and exports or mmaps refused once removal began.
//! - `close-unbind`: the last references of many dma-bufs are dropped by two threads while the
//!   device is unbound, in rounds; nothing may be left exported afterwards. Met: rounds whose
//!   revocation (the kernel's report of it) found some of the dma-bufs closed and some not.
//! - `import-unbind`: first, removal must wait for a dynamic importer that unmaps 300 ms after
//!   it is told to (the test importer's `defer=`); then two threads have the NIC attach, pin,
//!   map, unmap and detach dma-bufs through the test importer module (dynamic, revocable,
//!   pinned, and dynamic holding its mapping with a 1 ms late unmap, in turn) while a third
//!   reads debugfs's `exports` (which walks each dma-buf's attachments under its reservation
//!   lock) and the device is unbound and rebound in a loop. Met: imports refused with `ENODEV`
//!   at attach or map, or invalidated between their map and their unmap.
//! - `nic-rescan`: the NIC is deleted (sysfs `remove`) and found again (bus rescan) in a loop,
//!   each time the PCI bus notifier making every bound device's P2P verdict cache forget its
//!   address, while the HBM device is unbound and rebound (its cache joining and leaving the
//!   caches the notifier walks) and two threads have the NIC attach and map dma-bufs (asking
//!   for verdicts and keeping them). Met: imports that found the NIC deleted, and deletions
//!   during an unbind or a bind.
//! - `bind-two` (`qemu/run --second-hbm`): two devices, each unbound and bound again in a loop
//!   by a thread of its own; every bind must succeed. A device's index and names are given
//!   back only once its node and debugfs directory are gone, so the other device never gets
//!   names still in use. Met: binds during the other device's unbind or bind, and indexes
//!   taken over from the other device (the kernel log's bind lines).
//! - `rmmod-bind`: the module is unloaded (and loaded again) while a thread unbinds and binds
//!   the device through the driver's sysfs files: a probe may run until the driver is
//!   unregistered, so what devices share must outlive that. Every other unload is held: a
//!   bind waits behind a reset of the device across the unload's start, and probes while the
//!   driver unregisters. Met: held binds that probed then (toggled binds that an unload began
//!   under are counted too; they are rare).
//! - `import-reset`: the device is reset (sysfs `reset`) in a loop while two threads export
//!   dma-bufs, have the NIC import them (dynamic and revocable holding their mapping a
//!   moment, dynamic, pinned) and mmap them; the device stays, and the status page counts
//!   every reset. Met: exports refused with `EBUSY` during a reset, imports whose map found
//!   the export revoked (`ENODEV`), and imports invalidated while mapped.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use peerdirect::{Device, Errno, Error, ExportFlags};

use crate::support::{
    all_of, errno_name, expect_eq, join, join_all, request_unplug, run_command, wait_for,
    write_sysfs, FirstFailure, Outcome, Tap, SYSFS_PCI_DEVICES,
};
use crate::testmod::{stats, TestModule};
use crate::{INDEX, SYSFS_DRIVER};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Suite {
    OpenUnbind,
    MmapUnbind,
    MmapUnplug,
    CloseUnbind,
    ImportUnbind,
    NicRescan,
    RmmodBind,
    BindTwo,
    ImportReset,
}

const PAGE: usize = 4096;
/// How long a device node or a sysfs entry gets to appear or go away.
const SETTLE: Duration = Duration::from_secs(5);
/// How long the host gets to hot-unplug the device (`qemu/run --hotplug`).
const UNPLUG_WAIT: Duration = Duration::from_secs(30);
/// Mappings one round of `mmap-*` keeps at most (each is a VMA and a dma-buf).
const MAX_MAPPINGS: usize = 4000;
/// Mappings made before a round removes the device.
const MIN_MAPPINGS: usize = 50;
/// Dma-bufs one round of `close-unbind` exports.
const CLOSE_BUFS: usize = 512;

/// Runs `suites` one after the other, each for `seconds`.
pub(crate) fn run(suites: &[Suite], seconds: u64) -> ExitCode {
    let budget = Duration::from_secs(seconds);
    let mut tap = Tap::plan(
        suites
            .iter()
            .map(|suite| match suite {
                Suite::OpenUnbind
                | Suite::CloseUnbind
                | Suite::NicRescan
                | Suite::RmmodBind
                | Suite::BindTwo
                | Suite::ImportReset => 2,
                Suite::MmapUnbind | Suite::MmapUnplug | Suite::ImportUnbind => 3,
            })
            .sum(),
    );
    if let [Suite::BindTwo] = suites {
        bind_two(&mut tap, budget);
        return tap.finish();
    }
    let bdf = match bound_device() {
        Ok(bdf) => bdf,
        Err(err) => {
            tap.report("the HBM device is bound to peerdirect", &Err(err));
            return tap.finish();
        }
    };
    for suite in suites {
        match suite {
            Suite::OpenUnbind => open_unbind(&mut tap, &bdf, budget),
            Suite::MmapUnbind => mmap_race(&mut tap, &bdf, budget, Removal::Unbind),
            Suite::MmapUnplug => mmap_race(&mut tap, &bdf, budget, Removal::Unplug),
            Suite::CloseUnbind => close_unbind(&mut tap, &bdf, budget),
            Suite::ImportUnbind => import_unbind(&mut tap, &bdf, budget),
            Suite::NicRescan => nic_rescan(&mut tap, &bdf, budget),
            Suite::RmmodBind => rmmod_bind(&mut tap, &bdf, budget),
            Suite::ImportReset => import_reset(&mut tap, &bdf, budget),
            Suite::BindTwo => tap.report(
                "bind-two runs alone (it needs qemu/run --second-hbm)",
                &Err("bind-two was combined with other suites".to_owned()),
            ),
        }
    }
    tap.finish()
}

/// The PCI addresses of the devices bound to peerdirect, in order.
fn bound_devices() -> Result<Vec<String>, String> {
    bound_to(SYSFS_DRIVER)
}

/// The PCI addresses of the devices bound to the driver whose sysfs directory is `driver`.
fn bound_to(driver: &str) -> Result<Vec<String>, String> {
    let mut bound: Vec<String> = fs::read_dir(driver)
        .map_err(|err| format!("cannot list {driver}: {err}"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("0000:"))
        .collect();
    bound.sort();
    Ok(bound)
}

/// The PCI address of the one device bound to peerdirect.
pub(crate) fn bound_device() -> Result<String, String> {
    one_bound_to(SYSFS_DRIVER)
}

/// The PCI address of the one device bound to the driver whose sysfs directory is `driver`.
pub(crate) fn one_bound_to(driver: &str) -> Result<String, String> {
    let mut bound = bound_to(driver)?;
    match bound.len() {
        1 => Ok(bound.remove(0)),
        n => Err(format!(
            "expected one device in {driver}, got {n}: {bound:?}"
        )),
    }
}

pub(crate) fn unbind(bdf: &str) -> Outcome {
    write_sysfs(&format!("{SYSFS_DRIVER}/unbind"), bdf)
}

/// Binds `bdf` again and waits for its device node.
pub(crate) fn rebind(bdf: &str) -> Outcome {
    bind(bdf)?;
    node_appears()
}

fn bind(bdf: &str) -> Outcome {
    write_sysfs(&format!("{SYSFS_DRIVER}/bind"), bdf)
}

/// Waits for the device node of a device just bound.
fn node_appears() -> Outcome {
    let node = peerdirect::device_path(INDEX);
    wait_for(SETTLE, || node.exists()).map_err(|s| {
        format!(
            "{} did not come back within {s} s of rebinding",
            node.display()
        )
    })
}

/// Whether `err` says the device is gone or going: the answers a racing caller may get.
fn gone(err: &Error) -> bool {
    matches!(err.errno(), Some(e) if e == Errno::NODEV || e == Errno::NOENT || e == Errno::NXIO)
}

/// Collects the first unexpected error of the racing threads.
#[derive(Default)]
struct Unexpected(FirstFailure);

impl Unexpected {
    fn record(&self, what: &str, err: &Error) {
        self.record_errno(what, &err.to_string(), err.errno());
    }

    fn record_errno(&self, what: &str, err: &str, errno: Option<Errno>) {
        self.record_message(format!(
            "{what}: expected success or ENODEV/ENOENT/ENXIO while the device goes, got {err} ({})",
            errno.map_or("no errno", errno_name)
        ));
    }

    fn record_message(&self, message: String) {
        self.0.record(message);
    }

    fn outcome(&self) -> Outcome {
        self.0.outcome()
    }
}

/// Unbind/rebind cycles a race against them needs at least.
const MIN_CYCLES: u64 = 5;
/// Opens `open-unbind` needs at least.
const MIN_OPENS: u64 = 50;
/// Imports `import-unbind` needs at least, and reads of debugfs's exports.
const MIN_IMPORTS: u64 = 20;
const MIN_READS: u64 = 20;
/// Imports `nic-rescan` needs at least: the NIC is away for much of the run (15-23 imports in
/// 10 s on a busy host).
const MIN_RESCAN_IMPORTS: u64 = 5;

/// Rounds `close-unbind` needs at least.
const MIN_ROUNDS: u64 = 3;
/// Unloads `rmmod-bind` needs at least.
const MIN_UNLOADS: u64 = 5;

/// How many times its budget a race may run past it while what it must count has not come
/// yet (a loaded host: two guests under TCG on two cores).
const OVERTIME: u32 = 4;

/// Whether a race started at `start` goes on: for its `budget`, then while it has not run
/// `enough`, up to [`OVERTIME`] budgets more.
fn running(start: Instant, budget: Duration, enough: impl FnOnce() -> bool) -> bool {
    let elapsed = start.elapsed();
    elapsed < budget || (elapsed < budget * (1 + OVERTIME) && !enough())
}

/// Unbinds and rebinds `bdf` in a loop for `budget` while `threads` race it, then stops and
/// joins them: the cycles done, the first failure to unbind or rebind and every thread that
/// panicked, and what the threads returned. Past `budget` the loop goes on while `enough`,
/// given the cycles so far, says the race has not yet run as often as its checks require, up
/// to [`OVERTIME`] budgets more: a slow host lengthens the run instead of failing it, and a
/// race that never comes still fails. `transitions`, if given, counts each unbind and each
/// rebind as it starts and as it ends (odd while one runs).
fn cycle_against<T>(
    bdf: &str,
    budget: Duration,
    enough: &dyn Fn(u64) -> bool,
    stop: &AtomicBool,
    transitions: Option<&AtomicU64>,
    threads: Vec<thread::JoinHandle<T>>,
) -> (u64, Outcome, Vec<T>) {
    let start = Instant::now();
    let (mut cycles, mut outcome) = (0, Ok(()));
    let transition = |step: &dyn Fn() -> Outcome| {
        let count = || transitions.map(|t| t.fetch_add(1, Ordering::SeqCst));
        count();
        let done = step();
        count();
        done
    };
    while running(start, budget, || enough(cycles)) {
        let cycle = transition(&|| unbind(bdf))
            .and_then(|()| transition(&|| bind(bdf)))
            .and_then(|()| node_appears());
        if let Err(err) = cycle {
            outcome = Err(err);
            break;
        }
        cycles += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (values, joined) = join_all("racing thread", threads);
    (cycles, all_of([outcome, joined]), values)
}

/// Checks that the race ran: `met` times, at least `min`.
pub(crate) fn expect_raced(what: &str, met: u64, min: u64) -> Outcome {
    if met >= min {
        Ok(())
    } else {
        Err(format!(
            "{what}: expected at least {min}, got {met}: the race was not run"
        ))
    }
}

/// Checks that each of `counts`, outcomes that only come when the two sides of the race meet,
/// happened at least once: a race that never overlapped proves nothing.
pub(crate) fn expect_met(counts: &[(&str, u64)]) -> Outcome {
    let missed: Vec<&str> = counts
        .iter()
        .filter(|&&(_, n)| n == 0)
        .map(|&(what, _)| what)
        .collect();
    if missed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "expected at least one of each outcome that shows the race was met, got no {}: the two sides never met",
            missed.join(", no ")
        ))
    }
}

/// Checks the device is back, with nothing allocated and nothing exported: in its own
/// counters and in the dma-buf core's list.
pub(crate) fn expect_idle() -> Outcome {
    let device =
        Device::open_index(INDEX).map_err(|err| format!("cannot open the device: {err}"))?;
    device
        .info()
        .map_err(|err| format!("expected INFO to succeed, got {err}"))?;
    drop(device);
    let report = stats()?;
    for key in [
        "allocations",
        "exports",
        "mappings_revocable",
        "mappings_pinned",
    ] {
        let value = report.uint(key)?;
        if value != 0 {
            return Err(format!(
                "{key}: expected 0 once every file is closed, got {value}"
            ));
        }
    }
    let (hbm, free) = (report.uint("hbm_bytes")?, report.uint("free_bytes")?);
    if hbm != free {
        return Err(format!(
            "free_bytes: expected all {hbm} bytes free, got {free}"
        ));
    }
    // The dma-buf core's own list: no buffer of ours may be left (a leaked file reference).
    let bufinfo =
        fs::read_to_string(BUFINFO).map_err(|err| format!("cannot read {BUFINFO}: {err}"))?;
    let ours: Vec<&str> = bufinfo
        .lines()
        .filter(|l| l.contains("peerdirect"))
        .collect();
    if !ours.is_empty() {
        return Err(format!(
            "{BUFINFO}: expected no peerdirect buffer, got {}:\n{}",
            ours.len(),
            ours[..ours.len().min(5)].join("\n")
        ));
    }
    Ok(())
}

/// Every dma-buf of the system, as the dma-buf core lists them.
const BUFINFO: &str = "/sys/kernel/debug/dma_buf/bufinfo";

/// What the opening threads of `open-unbind` saw.
#[derive(Default)]
struct Opens {
    opened: u64,
    /// Files opened before a removal whose INFO then failed with `ENODEV`.
    outlived: u64,
    /// Opens that reached the device while it was going (`ENODEV`, `ENXIO`).
    refused: u64,
    /// Opens that found no device node (`ENOENT`): between an unbind and its rebind.
    absent: u64,
}

fn open_unbind(tap: &mut Tap, bdf: &str, budget: Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let unexpected = Arc::new(Unexpected::default());
    // Opens, and opens that met a removal, as they come: what the run waits for.
    let progress = Arc::new([const { AtomicU64::new(0) }; 2]);
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let (stop, unexpected, progress) = (stop.clone(), unexpected.clone(), progress.clone());
            thread::spawn(move || {
                let mut seen = Opens::default();
                let count = |i: usize| progress[i].fetch_add(1, Ordering::Relaxed);
                while !stop.load(Ordering::Relaxed) {
                    match Device::open_index(INDEX) {
                        Ok(device) => {
                            seen.opened += 1;
                            count(0);
                            match device.info() {
                                Ok(_) => {}
                                Err(err) if err.errno() == Some(Errno::NODEV) => {
                                    seen.outlived += 1;
                                    count(1);
                                }
                                Err(err) => unexpected.record("INFO", &err),
                            }
                        }
                        Err(err) => match err.errno() {
                            Some(Errno::NOENT) => seen.absent += 1,
                            Some(Errno::NODEV | Errno::NXIO) => {
                                seen.refused += 1;
                                count(1);
                            }
                            _ => unexpected.record("open", &err),
                        },
                    }
                }
                seen
            })
        })
        .collect();
    let start = Instant::now();
    let enough = |cycles| {
        cycles >= MIN_CYCLES
            && progress[0].load(Ordering::Relaxed) >= MIN_OPENS
            && progress[1].load(Ordering::Relaxed) > 0
    };
    let (cycles, outcome, seen) = cycle_against(bdf, budget, &enough, &stop, None, threads);
    let sum = |count: fn(&Opens) -> u64| seen.iter().map(count).sum::<u64>();
    let (opened, outlived, refused, absent) = (
        sum(|s| s.opened),
        sum(|s| s.outlived),
        sum(|s| s.refused),
        sum(|s| s.absent),
    );
    let outcome = all_of([outcome, unexpected.outcome()])
        .and_then(|()| expect_raced("unbind/rebind cycles", cycles, MIN_CYCLES))
        .and_then(|()| expect_raced("opens", opened, MIN_OPENS))
        // Either shows an open meeting a removal: before it (the file outlived it) or during.
        .and_then(|()| {
            expect_met(&[(
                "open that met a removal (its file then saw ENODEV, or it was refused with ENODEV or ENXIO)",
                outlived + refused,
            )])
        });
    tap.report(
        &format!(
            "3 threads open, INFO and close /dev/peerdirect0 while it is unbound and rebound ({cycles} cycles, {opened} opens in {} s; met: {outlived} files outlived a removal and saw ENODEV, {refused} opens refused while it went; {absent} found no node)",
            start.elapsed().as_secs()
        ),
        &outcome,
    );
    tap.report(
        "afterwards the device works, with nothing allocated or exported and all HBM free",
        &expect_idle(),
    );
}

#[derive(Clone, Copy, PartialEq)]
enum Removal {
    Unbind,
    Unplug,
}

/// A CPU mapping of a dma-buf, by address (unmapped by [`Mapping::drop`]).
pub(crate) struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// A shared, writable mapping of the whole dma-buf `fd` of `len` bytes.
    fn new(fd: &OwnedFd, len: usize) -> Result<Self, Errno> {
        Self::with(fd.as_fd(), len, true, false, rustix::mm::MapFlags::SHARED)
    }

    /// A mapping of `len` bytes of `fd`, readable, writable and executable as asked.
    pub(crate) fn with(
        fd: BorrowedFd<'_>,
        len: usize,
        write: bool,
        exec: bool,
        flags: rustix::mm::MapFlags,
    ) -> Result<Self, Errno> {
        let mut prot = rustix::mm::ProtFlags::READ;
        if write {
            prot |= rustix::mm::ProtFlags::WRITE;
        }
        if exec {
            prot |= rustix::mm::ProtFlags::EXEC;
        }
        // SAFETY: a new mapping chosen by the kernel (no address hint): it overlaps nothing
        // this process uses.
        let addr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0)? };
        Ok(Self {
            addr: addr as usize,
            len,
        })
    }

    /// Reads the first word; a revoked mapping faults, which only a [`sigbus::Trap`] survives.
    pub(crate) fn read_first(&self) -> u64 {
        // SAFETY: the mapping is ours, readable, at least a page long and page aligned.
        unsafe { std::ptr::read_volatile(self.addr as *const u64) }
    }

    /// Writes `word` at the start of the mapping.
    fn write(&self, word: u64) {
        // A revoked mapping faults (SIGBUS): a `sigbus::Trap` turns that into a write to a
        // page of zeroes.
        // SAFETY: the mapping is ours, writable, at least a page long and page aligned.
        unsafe { std::ptr::write_volatile(self.addr as *mut u64, word) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `addr..addr+len` is a mapping this value made and nothing else refers to.
        let _ = unsafe { rustix::mm::munmap(self.addr as *mut _, self.len) };
    }
}

fn mmap_race(tap: &mut Tap, bdf: &str, budget: Duration, removal: Removal) {
    let start = Instant::now();
    let (mut rounds, mut counts, mut survived) = (0u64, MapCounts::default(), Vec::new());
    let mut outcome = Ok(());
    // Unplug removes the device for good: one round.
    while outcome.is_ok()
        && (rounds == 0 || (removal == Removal::Unbind && start.elapsed() < budget))
    {
        match mmap_round(bdf, removal, rounds) {
            Ok(round) => {
                let c = &round.counts;
                println!(
                    "# mmap round {rounds}: {} mappings, {} revoked while held, {} exports and {} mmaps refused, {} faulted at their first write",
                    c.made, c.revoked_held, c.export_refused, c.mmap_refused, c.faulted_at_once
                );
                counts.add(c);
                survived.extend(round.survived);
            }
            Err(err) => outcome = Err(err),
        }
        rounds += 1;
    }
    let how = match removal {
        Removal::Unbind => "unbound",
        Removal::Unplug => "hot-unplugged",
    };
    let MapCounts {
        made,
        export_refused,
        mmap_refused,
        faulted_at_once,
        revoked_held,
    } = counts;
    let refused = export_refused + mmap_refused;
    tap.report(
        &format!(
            "2 threads export, map and write 4 KiB dma-bufs while the device is {how} ({rounds} rounds, {made} mappings in {} s; met: {revoked_held} mappings revoked while held, {refused} exports or mmaps refused with ENODEV once removal began ({mmap_refused} of them mmaps of dma-bufs exported before), {faulted_at_once} mappings faulted at their first write)",
            start.elapsed().as_secs()
        ),
        &outcome
            .and_then(|()| expect_raced("mappings", made, MIN_MAPPINGS as u64 * rounds))
            .and_then(|()| {
                expect_met(&[
                    ("mapping revoked while held", revoked_held),
                    ("export or mmap refused once removal began", refused),
                ])
            }),
    );
    tap.report(
        &format!("after the device is {how}, every one of those mappings faults (SIGBUS) instead of reaching the BAR"),
        &if survived.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} of {made} mappings still reach the BAR after removal returned, e.g. {:?}",
                survived.len(),
                &survived[..survived.len().min(5)]
            ))
        },
    );
    tap.report(
        match removal {
            Removal::Unbind => {
                "afterwards the device works, with nothing allocated or exported and all HBM free"
            }
            Removal::Unplug => "afterwards /dev/peerdirect0 is gone and rmmod peerdirect succeeds",
        },
        &match removal {
            Removal::Unbind => expect_idle(),
            Removal::Unplug => expect_unplugged(),
        },
    );
}

/// What rounds of `mmap-*` counted.
#[derive(Default)]
struct MapCounts {
    made: u64,
    /// ALLOC or EXPORT refused with `ENODEV`: the threads were still at work when removal began.
    export_refused: u64,
    /// mmaps refused with `ENODEV`, of dma-bufs exported before removal began.
    mmap_refused: u64,
    /// Mappings whose first write faulted: made right before their revocation.
    faulted_at_once: u64,
    /// Mappings written before the removal that fault after it.
    revoked_held: u64,
}

impl MapCounts {
    fn add(&mut self, other: &Self) {
        self.made += other.made;
        self.export_refused += other.export_refused;
        self.mmap_refused += other.mmap_refused;
        self.faulted_at_once += other.faulted_at_once;
        self.revoked_held += other.revoked_held;
    }
}

struct Round {
    counts: MapCounts,
    /// Mappings that were still there after removal: (round, index, what was read).
    survived: Vec<(u64, usize, u64)>,
}

fn mmap_round(bdf: &str, removal: Removal, round: u64) -> Result<Round, String> {
    // A mapping made just before the removal and written just after it faults: survive that.
    sigbus::forget();
    let trap = sigbus::Trap::install()?;
    let stop = Arc::new(AtomicBool::new(false));
    let mappings = Arc::new(Mutex::new(Vec::<Mapping>::new()));
    let unexpected = Arc::new(Unexpected::default());
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (stop, mappings, unexpected) = (stop.clone(), mappings.clone(), unexpected.clone());
            thread::spawn(move || {
                let mut counts = MapCounts::default();
                let device = match Device::open_index(INDEX) {
                    Ok(device) => device,
                    Err(err) => {
                        unexpected.record_message(format!("cannot open the device: {err}"));
                        return counts;
                    }
                };
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if mappings.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_MAPPINGS {
                        thread::yield_now();
                        continue;
                    }
                    let made = device
                        .alloc(PAGE as u64, Some(PAGE as u64))
                        .and_then(|alloc| alloc.export(0, 0, ExportFlags::RDWR));
                    let dmabuf = match made {
                        Ok(dmabuf) => OwnedFd::from(dmabuf),
                        Err(err) => {
                            if gone(&err) {
                                counts.export_refused += 1;
                            } else {
                                unexpected.record("ALLOC/EXPORT", &err);
                            }
                            thread::yield_now();
                            continue;
                        }
                    };
                    match Mapping::new(&dmabuf, PAGE) {
                        Ok(map) => {
                            n += 1;
                            // Touch it at once: a mapping made before removal is populated.
                            map.write(n);
                            mappings.lock().unwrap_or_else(|e| e.into_inner()).push(map);
                        }
                        Err(Errno::NODEV) => counts.mmap_refused += 1,
                        Err(errno) => {
                            unexpected.record_errno("mmap", &errno.to_string(), Some(errno))
                        }
                    }
                }
                counts
            })
        })
        .collect();
    // Let the threads get going (some mappings made, the next ones on their way), then
    // remove the device under them, a little later each round.
    let _ = wait_for(Duration::from_secs(3), || {
        mappings.lock().unwrap_or_else(|e| e.into_inner()).len() >= MIN_MAPPINGS
    });
    thread::sleep(Duration::from_millis(23 * (round % 5)));
    let removed = match removal {
        Removal::Unbind => unbind(bdf),
        Removal::Unplug => unplug(bdf),
    };
    stop.store(true, Ordering::Relaxed);
    let (per_thread, joined) = join_all("mapping thread", threads);
    // Only the threads' first writes ran under the trap so far.
    let faulted_at_once = sigbus::trapped();
    drop(trap);
    all_of([removed, joined, unexpected.outcome()])?;
    let mappings = std::mem::take(&mut *mappings.lock().unwrap_or_else(|e| e.into_inner()));
    let survived: Vec<_> = sigbus::probe_each(&mappings)?
        .into_iter()
        .map(|(i, word)| (round, i, word))
        .collect();
    let mut counts = MapCounts {
        made: mappings.len() as u64,
        faulted_at_once,
        revoked_held: ((mappings.len() - survived.len()) as u64).saturating_sub(faulted_at_once),
        ..MapCounts::default()
    };
    per_thread.iter().for_each(|c| counts.add(c));
    drop(mappings);
    if removal == Removal::Unbind {
        rebind(bdf)?;
    }
    Ok(Round { counts, survived })
}

/// Asks the host to hot-unplug the HBM device and waits until it is gone.
fn unplug(bdf: &str) -> Outcome {
    request_unplug("hbm0")?;
    let dir = format!("{SYSFS_PCI_DEVICES}/{bdf}");
    wait_for(UNPLUG_WAIT, || !std::path::Path::new(&dir).exists())
        .map_err(|s| format!("{dir} still there {s} s after asking for a hot-unplug"))
}

fn expect_unplugged() -> Outcome {
    let node = peerdirect::device_path(INDEX);
    wait_for(SETTLE, || !node.exists())
        .map_err(|s| format!("{} still there {s} s after the unplug", node.display()))?;
    crate::support::run_command("rmmod", &["peerdirect"])
}

fn close_unbind(tap: &mut Tap, bdf: &str, budget: Duration) {
    let start = Instant::now();
    let (mut rounds, mut met, mut totals) = (0u64, 0u64, Closes::default());
    let mut outcome = Ok(());
    while running(start, budget, || rounds >= MIN_ROUNDS && met > 0) {
        match close_round(bdf, rounds) {
            Ok(round) => {
                println!(
                    "# close-unbind round {rounds}: revocation found {} of {CLOSE_BUFS} dma-bufs open and {} being released",
                    round.revoked, round.releasing
                );
                met += u64::from(round.met());
                totals.closed += round.closed;
                totals.revoked += round.revoked;
                totals.releasing += round.releasing;
            }
            Err(err) => {
                outcome = Err(err);
                break;
            }
        }
        rounds += 1;
    }
    let Closes {
        closed,
        revoked,
        releasing,
    } = totals;
    tap.report(
        &format!(
            "2 threads close the last references of {CLOSE_BUFS} dma-bufs while the device is unbound ({rounds} rounds, {closed} closed in {} s; met: {met} rounds whose revocation came amid the closes, {revoked} dma-bufs revoked still open, {releasing} skipped being released)",
            start.elapsed().as_secs()
        ),
        &outcome
            .and_then(|()| expect_raced("rounds", rounds, MIN_ROUNDS))
            .and_then(|()| expect_met(&[("round whose revocation came amid the closes", met)])),
    );
    tap.report(
        "afterwards the device works, with nothing allocated or exported and all HBM free",
        &expect_idle(),
    );
}

/// What a round of `close-unbind` closed, and what the unbind's revocation found.
#[derive(Default)]
struct Closes {
    closed: u64,
    /// Dma-bufs still open when revocation reached them.
    revoked: u64,
    /// Dma-bufs whose release had begun when revocation reached them.
    releasing: u64,
}

impl Closes {
    /// Whether revocation came while the closes went on: some dma-bufs were gone by then and
    /// some were not.
    fn met(&self) -> bool {
        let found = self.revoked + self.releasing;
        found > 0 && found < CLOSE_BUFS as u64
    }
}

/// One round of `close-unbind`: `CLOSE_BUFS` dma-bufs, closed from two threads while the
/// device is unbound; then rebinds.
fn close_round(bdf: &str, round: u64) -> Result<Closes, String> {
    let device =
        Device::open_index(INDEX).map_err(|err| format!("cannot open the device: {err}"))?;
    let alloc = device
        .alloc((CLOSE_BUFS * PAGE) as u64, Some(PAGE as u64))
        .map_err(|err| format!("ALLOC of {CLOSE_BUFS} pages failed: {err}"))?;
    let mut bufs = Vec::with_capacity(CLOSE_BUFS);
    for i in 0..CLOSE_BUFS {
        let dmabuf = alloc
            .export((i * PAGE) as u64, PAGE as u64, ExportFlags::empty())
            .map_err(|err| format!("EXPORT {i} failed: {err}"))?;
        bufs.push(OwnedFd::from(dmabuf));
    }
    drop(alloc);
    drop(device);
    let half = bufs.split_off(CLOSE_BUFS / 2);
    let closed = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = [bufs, half]
        .into_iter()
        .map(|bufs| {
            let (closed, go) = (closed.clone(), go.clone());
            thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                for fd in bufs {
                    drop(fd);
                    closed.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    go.store(true, Ordering::Release);
    // Start the unbind a little later each round, so it meets the closes at different points.
    thread::sleep(Duration::from_micros(200 * (round % 8)));
    let unbound = unbind(bdf);
    let (_, joined) = join_all("closing thread", threads);
    all_of([unbound, joined])?;
    let (revoked, releasing) = crate::removal::last_removal_report(INDEX, bdf)?;
    rebind(bdf)?;
    Ok(Closes {
        closed: closed.load(Ordering::Relaxed) as u64,
        revoked,
        releasing,
    })
}

fn bind_two(tap: &mut Tap, budget: Duration) {
    let bdfs = match bound_devices() {
        Ok(bdfs) if bdfs.len() == 2 => bdfs,
        Ok(bdfs) => {
            let err = format!("expected two devices bound (qemu/run --second-hbm), got {bdfs:?}");
            tap.report("two HBM devices are bound to peerdirect", &Err(err));
            return;
        }
        Err(err) => {
            tap.report("two HBM devices are bound to peerdirect", &Err(err));
            return;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let failure = Arc::new(FirstFailure::default());
    // Each device's unbinds and binds, counted as they start and as they end (odd while one
    // runs), so that the other thread sees whether its bind overlapped one.
    let transitions = Arc::new([const { AtomicU64::new(0) }; 2]);
    let start = Instant::now();
    let threads: Vec<_> = bdfs
        .iter()
        .enumerate()
        .map(|(me, bdf)| {
            let (stop, failure, transitions, bdf) = (
                stop.clone(),
                failure.clone(),
                transitions.clone(),
                bdf.clone(),
            );
            thread::spawn(move || {
                let (mut cycles, mut overlapped) = (0u64, 0u64);
                let mine = &transitions[me];
                let other = &transitions[1 - me];
                let step = |what: &dyn Fn() -> Outcome| {
                    mine.fetch_add(1, Ordering::SeqCst);
                    let done = what();
                    mine.fetch_add(1, Ordering::SeqCst);
                    done
                };
                while !stop.load(Ordering::Relaxed) {
                    let unbound = step(&|| unbind(&bdf));
                    let before = other.load(Ordering::SeqCst);
                    let cycle = unbound.and_then(|()| step(&|| bind(&bdf)));
                    if let Err(err) = cycle {
                        failure.record(format!("{bdf}, cycle {cycles}: {err}"));
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                    if before % 2 == 1 || other.load(Ordering::SeqCst) != before {
                        overlapped += 1;
                    }
                    cycles += 1;
                }
                (cycles, overlapped)
            })
        })
        .collect();
    while start.elapsed() < budget && !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let (counts, joined) = join_all("binding thread", threads);
    let cycles: Vec<u64> = counts.iter().map(|&(c, _)| c).collect();
    let overlapped: u64 = counts.iter().map(|&(_, o)| o).sum();
    let handovers = crate::removal::kernel_log().map(|log| index_handovers(&log));
    tap.report(
        &format!(
            "two devices are unbound and bound again by a thread each, and every bind succeeds ({:?} cycles in {} s; met: {overlapped} binds during the other device's unbind or bind, {} indexes taken over from the other device)",
            cycles,
            start.elapsed().as_secs(),
            handovers.as_ref().map_or_else(|_| "?".to_owned(), u64::to_string)
        ),
        &all_of([failure.outcome(), joined]).and_then(|()| {
            cycles
                .iter()
                .try_for_each(|&c| expect_raced("unbind/bind cycles of each device", c, 20))?;
            expect_met(&[
                ("bind during the other device's unbind or bind", overlapped),
                ("index taken over from the other device", handovers?),
            ])
        }),
    );
    let nodes = (0..2).map(peerdirect::device_path).collect::<Vec<_>>();
    tap.report(
        "afterwards both devices are bound, as /dev/peerdirect0 and /dev/peerdirect1",
        &bound_devices().and_then(|now| {
            expect_eq("bound devices", &bdfs, &now)?;
            wait_for(SETTLE, || nodes.iter().all(|n| n.exists()))
                .map_err(|s| format!("expected {nodes:?} to exist within {s} s of the last bind"))
        }),
    );
}

/// How often, in the kernel log `log`, a bind gave a device the index (and names) another
/// device held last: the index went back and the other device took it.
fn index_handovers(log: &str) -> u64 {
    let mut holders = std::collections::BTreeMap::new();
    let mut handovers = 0;
    for line in log.lines() {
        // "peerdirect 0000:01:00.0: peerdirect1: HBM BAR2 ...": the driver, the device, its name.
        let Some((prefix, index)) = line
            .split_once(crate::removal::BOUND_LOG)
            .and_then(|(named, _)| named.rsplit_once(": peerdirect"))
        else {
            continue;
        };
        let (Ok(index), Some(bdf)) = (index.parse::<u32>(), prefix.split_whitespace().last())
        else {
            continue;
        };
        if holders.insert(index, bdf).is_some_and(|last| last != bdf) {
            handovers += 1;
        }
    }
    handovers
}

/// The module file in the guest.
const MODULE_PATH: &str = "/lib/peerdirect/peerdirect.ko";

/// What `/sys/module/peerdirect/initstate` says of the module: `live`, `going` while it
/// unloads, `None` when it is not loaded.
fn module_state() -> Option<String> {
    fs::read_to_string("/sys/module/peerdirect/initstate")
        .ok()
        .map(|s| s.trim().to_owned())
}

/// How long the reset of a held unload gets to take the device's lock, and then the bind to
/// queue behind it, before the next step begins.
const HOLD_LEAD: Duration = Duration::from_millis(20);

fn rmmod_bind(tap: &mut Tap, bdf: &str, budget: Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    // Held unloads stop the thread meanwhile: `pause` asks, `idle` answers.
    let (pause, idle) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    // Unbinds and binds in a loop; every write may fail while the driver comes and goes
    // (no such file, already bound, not bound, no driver), so only successes are counted:
    // all binds, and those the unload began under (the module live before the write, going
    // or gone once the bind returned), whose probe ran while the driver was unregistering.
    let toggler = {
        let (stop, pause, idle, bdf) = (stop.clone(), pause.clone(), idle.clone(), bdf.to_owned());
        thread::spawn(move || {
            let (mut bound, mut under_unload) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                if pause.load(Ordering::SeqCst) {
                    idle.store(true, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(1));
                    continue;
                }
                let _ = fs::write(format!("{SYSFS_DRIVER}/unbind"), &bdf);
                let live = module_state().as_deref() == Some("live");
                if fs::write(format!("{SYSFS_DRIVER}/bind"), &bdf).is_ok() {
                    bound += 1;
                    if live && module_state().as_deref() != Some("live") {
                        under_unload += 1;
                    }
                }
            }
            (bound, under_unload)
        })
    };
    let paused = |f: &dyn Fn() -> Result<bool, String>| {
        pause.store(true, Ordering::SeqCst);
        let done = wait_for(SETTLE, || idle.load(Ordering::SeqCst))
            .map_err(|s| format!("the toggling thread did not stop within {s} s"))
            .and_then(|()| f());
        idle.store(false, Ordering::SeqCst);
        pause.store(false, Ordering::SeqCst);
        done
    };
    let start = Instant::now();
    let (mut cycles, mut held, mut outcome) = (0u64, 0u64, Ok(()));
    while running(start, budget, || cycles >= MIN_UNLOADS && held > 0) {
        // Once loaded, the device binds by itself (driver_override). Every other unload, the
        // thread toggles it for a while, a little longer each time, so that the unload meets
        // the toggling at different points; the others are held unloads.
        let loaded = wait_for(SETTLE, || peerdirect::device_path(INDEX).exists())
            .map_err(|s| format!("/dev/peerdirect{INDEX} did not appear within {s} s of insmod"));
        let unloaded = loaded
            .and_then(|()| {
                if cycles % 2 == 1 {
                    held += u64::from(paused(&|| unload_across_a_held_bind(bdf))?);
                    Ok(())
                } else {
                    thread::sleep(Duration::from_millis(3 * (cycles / 2 % 16)));
                    run_command("rmmod", &["peerdirect"])
                }
            })
            .and_then(|()| run_command("insmod", &[MODULE_PATH]));
        if let Err(err) = unloaded {
            outcome = Err(err);
            break;
        }
        cycles += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (bound, under_unload) = match join("the toggling thread", toggler) {
        Ok(counts) => counts,
        Err(err) => {
            outcome = all_of([outcome, Err(err)]);
            (0, 0)
        }
    };
    // Toggled binds seldom meet an unload (the window is a probe's length); held ones do.
    println!("# {under_unload} toggled binds were in flight when an unload began");
    tap.report(
        &format!(
            "rmmod and insmod peerdirect while a thread unbinds and binds the device ({cycles} unloads, {bound} binds in {} s; met: {held} binds held by a reset across an unload's start that probed during it)",
            start.elapsed().as_secs()
        ),
        &outcome
            .and_then(|()| expect_raced("unloads", cycles, MIN_UNLOADS))
            .and_then(|()| expect_raced("binds", bound, 5))
            .and_then(|()| expect_met(&[("bind held across an unload's start", held)])),
    );
    // The thread may have left the device unbound.
    let _ = fs::write(format!("{SYSFS_DRIVER}/bind"), bdf);
    tap.report(
        "afterwards the module is loaded, the device bound and working, with nothing allocated or exported and all HBM free",
        &wait_for(SETTLE, || peerdirect::device_path(INDEX).exists())
            .map_err(|s| format!("/dev/peerdirect{INDEX} did not come back within {s} s"))
            .and_then(|()| expect_idle()),
    );
}

/// An unload that a bind waits across: a reset of the unbound device holds its lock (a
/// secondary bus reset, 100 ms or more), a bind queues behind that lock, and meanwhile the
/// unload starts; the driver's unregistration waits for the bind, whose probe then runs with
/// the module going. Whether it did: the bind succeeded, and returned with the module no
/// longer live. (A bind that came too late for the driver is refused; not an error.)
fn unload_across_a_held_bind(bdf: &str) -> Result<bool, String> {
    if std::path::Path::new(&format!("{SYSFS_DRIVER}/{bdf}")).exists() {
        unbind(bdf)?;
    }
    let reset = {
        let path = format!("{SYSFS_PCI_DEVICES}/{bdf}/reset");
        thread::spawn(move || write_sysfs(&path, "1"))
    };
    thread::sleep(HOLD_LEAD);
    let binding = {
        let bdf = bdf.to_owned();
        thread::spawn(move || (bind(&bdf), module_state()))
    };
    thread::sleep(HOLD_LEAD);
    // The system call itself: starting rmmod can take longer than the reset holds the lock.
    // SAFETY: a NUL-terminated name and flags; the call reads nothing else of this process.
    let unloaded = match unsafe {
        libc::syscall(
            libc::SYS_delete_module,
            c"peerdirect".as_ptr(),
            libc::O_NONBLOCK,
        )
    } {
        0 => Ok(()),
        _ => Err(format!(
            "unloading peerdirect failed: {}",
            std::io::Error::last_os_error()
        )),
    };
    let (bound, after) = join("the binding thread", binding)?;
    join("the resetting thread", reset)??;
    unloaded?;
    Ok(bound.is_ok() && after.as_deref() != Some("live"))
}

fn import_unbind(tap: &mut Tap, bdf: &str, budget: Duration) {
    let nic = match crate::support::find_nic() {
        Ok(nic) => nic,
        Err(err) => {
            tap.report("the NIC is found", &Err(err));
            return;
        }
    };
    // Loaded once here; the threads open its command file for themselves.
    let mut importer = match TestModule::load_importer() {
        Ok(importer) => importer,
        Err(err) => {
            tap.report("the test importer module loads", &Err(err));
            return;
        }
    };
    tap.report(
        &format!("removal waits for a dynamic importer that unmaps {DEFER_MS} ms after it is told to, and completes"),
        &removal_waits_for_late_unmap(&mut importer, bdf, &nic),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new([const { AtomicU64::new(0) }; 4]);
    let (imported, refused, invalidated, doubled) = (0, 1, 2, 3);
    let unexpected = Arc::new(Unexpected::default());
    let mut threads = {
        let counts = counts.clone();
        // `maps=2`: a second map of the attachment while its first is mapped, each uncounted
        // at its unmap as it was counted at its map, or removal waits for a mapping that is
        // not there.
        importing_threads(
            &stop,
            &unexpected,
            &nic,
            &[
                "dynamic",
                "revocable maps=2",
                "pinned",
                "dynamic hold=1 defer=1",
                "revocable",
            ],
            move |importer, mode, answer| {
                let report = answer?;
                // A held mapping: let go of it at once, an unbind may be invalidating it. Its
                // invalidations are in the release's answer.
                let released = match report.value("id") {
                    Some(id) => Some(importer.command(&format!("release id={id}"))?),
                    None => None,
                };
                let count = match imported_or_refused(&report) {
                    Some(true) => imported,
                    Some(false) => refused,
                    None => return Err(format!("{mode} import: {}", report.summary())),
                };
                counts[count].fetch_add(1, Ordering::Relaxed);
                if report.value("map2") == Some("0") {
                    counts[doubled].fetch_add(1, Ordering::Relaxed);
                }
                // Removal told the importer to drop the mapping it made: the unbind came
                // between its map and its unmap.
                let last = released.as_ref().unwrap_or(&report);
                if count == imported && last.uint("invalidations")? > 0 {
                    counts[invalidated].fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            },
        )
    };
    let (reads, listed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    threads.push({
        let (stop, reads, listed, unexpected) = (
            stop.clone(),
            reads.clone(),
            listed.clone(),
            unexpected.clone(),
        );
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match read_exports() {
                    Ok(Some(n)) => {
                        reads.fetch_add(1, Ordering::Relaxed);
                        listed.fetch_add(n, Ordering::Relaxed);
                    }
                    Ok(None) => thread::yield_now(),
                    Err(err) => return unexpected.record_message(err),
                }
            }
        })
    });
    let enough = |cycles| {
        let count = |i: usize| counts[i].load(Ordering::Relaxed);
        cycles >= MIN_CYCLES
            && count(imported) >= MIN_IMPORTS
            && count(doubled) >= 1
            && count(refused) + count(invalidated) > 0
            && reads.load(Ordering::Relaxed) >= MIN_READS
    };
    let (cycles, outcome, _) = cycle_against(bdf, budget, &enough, &stop, None, threads);
    let [imported, refused, invalidated, doubled] =
        [imported, refused, invalidated, doubled].map(|i| counts[i].load(Ordering::Relaxed));
    let (reads, listed) = (
        reads.load(Ordering::Relaxed),
        listed.load(Ordering::Relaxed),
    );
    let outcome = all_of([outcome, unexpected.outcome()])
        .and_then(|()| expect_raced("unbind/rebind cycles", cycles, MIN_CYCLES))
        .and_then(|()| expect_raced("imports", imported, MIN_IMPORTS))
        .and_then(|()| expect_raced("imports mapped twice", doubled, 1))
        .and_then(|()| expect_raced("debugfs exports reads", reads, MIN_READS))
        // Either shows an import meeting a removal: before its attach or map, or after its map.
        .and_then(|()| {
            expect_met(&[(
                "import that met a removal (refused with ENODEV at attach or map, or invalidated while mapped)",
                refused + invalidated,
            )])
        });
    tap.report(
        &format!(
            "2 threads have the NIC attach, pin, map (some twice over), unmap and detach dma-bufs while debugfs's exports is read and the device is unbound and rebound ({cycles} cycles, {imported} imports, {doubled} of them mapped twice, {reads} reads listing {listed} attachments; met: {refused} imports refused with ENODEV, {invalidated} invalidated while mapped)"
        ),
        &outcome,
    );
    tap.report(
        "afterwards the device works, with nothing allocated or exported and all HBM free",
        &expect_idle(),
    );
}

/// The NIC, with the test importer module loaded for racing threads to open its command file
/// (loaded once, before them: two threads' insmod at once would fail one with EEXIST); `None`
/// after reporting what is missing as a failed check.
fn nic_with_importer(tap: &mut Tap) -> Option<String> {
    let nic = crate::support::find_nic()
        .map_err(|err| tap.report("the NIC is found", &Err(err)))
        .ok()?;
    TestModule::load_importer()
        .map_err(|err| tap.report("the test importer module loads", &Err(err)))
        .ok()?;
    Some(nic)
}

/// What the threads of `import-reset` counted, by index.
const RESET_IMPORTED: usize = 0;
const RESET_REVOKED: usize = 1;
const RESET_INVALIDATED: usize = 2;
const RESET_BUSY: usize = 3;
const RESET_MMAPS_REFUSED: usize = 4;

fn import_reset(tap: &mut Tap, bdf: &str, budget: Duration) {
    let Some(nic) = nic_with_importer(tap) else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new([const { AtomicU64::new(0) }; 5]);
    let unexpected = Arc::new(Unexpected::default());
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (stop, counts, unexpected, nic) = (
                stop.clone(),
                counts.clone(),
                unexpected.clone(),
                nic.clone(),
            );
            thread::spawn(move || {
                if let Err(err) = import_across_resets(t, &stop, &counts, &nic) {
                    unexpected.record_message(err);
                }
            })
        })
        .collect();
    let count = |i: usize| counts[i].load(Ordering::Relaxed);
    let dir = format!("{SYSFS_PCI_DEVICES}/{bdf}");
    let start = Instant::now();
    let (mut resets, mut outcome) = (0u64, Ok(()));
    let enough = |resets: u64| {
        resets >= MIN_CYCLES
            && count(RESET_IMPORTED) >= MIN_IMPORTS
            && count(RESET_BUSY) + count(RESET_REVOKED) + count(RESET_INVALIDATED) > 0
    };
    while running(start, budget, || enough(resets)) {
        if let Err(err) = write_sysfs(&format!("{dir}/reset"), "1") {
            outcome = Err(err);
            break;
        }
        resets += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (_, joined) = join_all("racing thread", threads);
    // Every reset counted on the status page and in debugfs, none more, none still under way.
    let counted = Device::open_index(INDEX)
        .map_err(|err| format!("cannot open the device: {err}"))
        .and_then(|device| {
            let status = device.status().ok_or("the device has no status page")?;
            expect_eq(
                "resets on the status page",
                resets,
                u64::from(status.resets()),
            )?;
            let stats = stats()?;
            expect_eq("debugfs resets", resets, stats.uint("resets")?)?;
            expect_eq("debugfs resetting", 0, stats.uint("resetting")?)
        });
    let [imported, revoked, invalidated, busy, mmaps_refused] = [
        RESET_IMPORTED,
        RESET_REVOKED,
        RESET_INVALIDATED,
        RESET_BUSY,
        RESET_MMAPS_REFUSED,
    ]
    .map(count);
    let outcome = all_of([outcome, joined, unexpected.outcome(), counted])
        .and_then(|()| expect_raced("resets", resets, MIN_CYCLES))
        .and_then(|()| expect_raced("imports", imported, MIN_IMPORTS))
        .and_then(|()| {
            expect_met(&[(
                "export or import that met a reset (an export refused with EBUSY, a map of a revoked export refused with ENODEV, or a mapping invalidated)",
                busy + revoked + invalidated,
            )])
        });
    tap.report(
        &format!(
            "2 threads export dma-bufs, have the NIC attach, pin, map and unmap them, and mmap them while the device is reset in a loop ({resets} resets, each counted on the status page and in debugfs, none left under way; {imported} imports; met: {busy} exports refused with EBUSY, {revoked} maps of revoked exports refused with ENODEV, {invalidated} invalidated while mapped, {mmaps_refused} mmaps refused with ENODEV)"
        ),
        &outcome,
    );
    tap.report(
        "afterwards the device works, with nothing allocated or exported and all HBM free",
        &expect_idle(),
    );
}

/// One thread of `import-reset` until `stop`: exports 16 pages, has `nic` import them (in a
/// mode by turns), and maps them for the CPU (never touched: a reset may have revoked the
/// mapping), counting outcomes in `counts`; any other outcome is an error.
fn import_across_resets(
    t: usize,
    stop: &AtomicBool,
    counts: &[AtomicU64; 5],
    nic: &str,
) -> Outcome {
    const MODES: [&str; 4] = ["dynamic hold=1", "revocable hold=1", "dynamic", "pinned"];
    let add = |i: usize| counts[i].fetch_add(1, Ordering::Relaxed);
    let mut importer = TestModule::load_importer()?;
    let device = Device::open_index(INDEX).map_err(|err| format!("open: {err}"))?;
    let mut n = t;
    while !stop.load(Ordering::Relaxed) {
        let dmabuf = match device
            .alloc(16 * PAGE as u64, None)
            .and_then(|alloc| alloc.export(0, 0, ExportFlags::RDWR))
        {
            Ok(dmabuf) => dmabuf,
            Err(err) if err.errno() == Some(Errno::BUSY) => {
                add(RESET_BUSY);
                continue;
            }
            Err(err) => {
                return Err(format!(
                    "alloc and export: expected success or EBUSY, got {err}"
                ))
            }
        };
        let mode = MODES[n % MODES.len()];
        n += 1;
        let line = format!("fd={} dev={nic} mode={mode}", dmabuf.as_fd().as_raw_fd());
        let report = importer.command(&line)?;
        let released = match report.value("id") {
            Some(id) => Some(importer.command(&format!("release id={id}"))?),
            None => None,
        };
        match (report.int("attach"), report.int("map")) {
            (Ok(0), Ok(0)) => {
                add(RESET_IMPORTED);
                let last = released.as_ref().unwrap_or(&report);
                if last.uint("invalidations")? > 0 {
                    add(RESET_INVALIDATED);
                }
            }
            (Ok(0), Ok(-19)) => {
                add(RESET_REVOKED);
            }
            _ => return Err(format!("{mode} import: {}", report.summary())),
        }
        match dmabuf.mmap(true) {
            Ok(map) => drop(map),
            Err(err) if err.errno() == Some(Errno::NODEV) => {
                add(RESET_MMAPS_REFUSED);
            }
            Err(err) => return Err(format!("mmap: expected success or ENODEV, got {err}")),
        }
    }
    Ok(())
}

/// NIC deletions and rescans `nic-rescan` makes at least (each takes about 5 s on the KASAN
/// kernel under TCG).
const MIN_RESCANS: u64 = 2;

/// What the importer answers when the NIC it is asked to import on is not there (deleted).
const NO_NIC: &str = "error=no PCI device";

fn nic_rescan(tap: &mut Tap, bdf: &str, budget: Duration) {
    let Some(nic) = nic_with_importer(tap) else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let unexpected = Arc::new(Unexpected::default());
    let counts = Arc::new([const { AtomicU64::new(0) }; 3]);
    let (imported, refused, absent) = (0, 1, 2);
    let mut threads = {
        let counts = counts.clone();
        importing_threads(
            &stop,
            &unexpected,
            &nic,
            &["dynamic", "pinned"],
            move |_, mode, answer| {
                let report = match answer {
                    Ok(report) => report,
                    Err(err) if err.contains(NO_NIC) => {
                        counts[absent].fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    Err(err) => return Err(err),
                };
                // The NIC's deletion does not move it: the verdict never changes.
                let count = match imported_or_refused(&report) {
                    Some(true) => imported,
                    Some(false) => refused,
                    None => return Err(format!("{mode} import: {}", report.summary())),
                };
                counts[count].fetch_add(1, Ordering::Relaxed);
                Ok(())
            },
        )
    };
    let (rescans, amid) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let transitions = Arc::new(AtomicU64::new(0));
    threads.push({
        let (stop, rescans, amid, transitions, unexpected, nic) = (
            stop.clone(),
            rescans.clone(),
            amid.clone(),
            transitions.clone(),
            unexpected.clone(),
            nic.clone(),
        );
        thread::spawn(move || {
            let dir = format!("{SYSFS_PCI_DEVICES}/{nic}");
            // A deletion and a rescan take seconds on the KASAN kernel: past the budget, the
            // thread goes on until it made the fewest that mean anything.
            while !stop.load(Ordering::Relaxed) || rescans.load(Ordering::Relaxed) < MIN_RESCANS {
                // The deletion's notifier walks the verdict caches: it met a cache joining or
                // leaving if an unbind or bind ran at any time during it.
                let before = transitions.load(Ordering::SeqCst);
                let deleted = write_sysfs(&format!("{dir}/remove"), "1");
                if before % 2 == 1 || transitions.load(Ordering::SeqCst) != before {
                    amid.fetch_add(1, Ordering::Relaxed);
                }
                let cycle = deleted
                    .and_then(|()| write_sysfs("/sys/bus/pci/rescan", "1"))
                    .and_then(|()| {
                        wait_for(SETTLE, || std::path::Path::new(&dir).exists()).map_err(|s| {
                            format!("{dir} did not come back within {s} s of a rescan")
                        })
                    });
                if let Err(err) = cycle {
                    return unexpected.record_message(err);
                }
                rescans.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    let enough = |cycles| {
        cycles >= MIN_CYCLES
            && counts[imported].load(Ordering::Relaxed) >= MIN_RESCAN_IMPORTS
            && counts[absent].load(Ordering::Relaxed) > 0
            && amid.load(Ordering::Relaxed) > 0
    };
    let (cycles, outcome, _) =
        cycle_against(bdf, budget, &enough, &stop, Some(&transitions), threads);
    let [imported, refused, absent] =
        [imported, refused, absent].map(|i| counts[i].load(Ordering::Relaxed));
    let (rescans, amid) = (
        rescans.load(Ordering::Relaxed),
        amid.load(Ordering::Relaxed),
    );
    let outcome = all_of([outcome, unexpected.outcome()])
        .and_then(|()| expect_raced("unbind/rebind cycles", cycles, MIN_CYCLES))
        .and_then(|()| expect_raced("NIC deletions and rescans", rescans, MIN_RESCANS))
        .and_then(|()| expect_raced("imports", imported, MIN_RESCAN_IMPORTS))
        .and_then(|()| {
            expect_met(&[
                ("import that found the NIC deleted", absent),
                ("NIC deletion during an unbind or bind", amid),
            ])
        });
    tap.report(
        &format!(
            "the NIC is deleted and rescanned while the device is unbound and rebound and 2 threads have the NIC attach and map dma-bufs ({rescans} rescans, {cycles} cycles, {imported} imports, {refused} refused with ENODEV; met: {absent} imports without a NIC, {amid} deletions during an unbind or bind)"
        ),
        &outcome,
    );
    tap.report(
        "afterwards the NIC imports again, and the device works with nothing allocated or exported and all HBM free",
        &import_once(&nic).and_then(|()| expect_idle()),
    );
}

/// One dynamic import of a new dma-buf on `nic`, which must attach and map.
fn import_once(nic: &str) -> Outcome {
    let mut importer = TestModule::load_importer()?;
    let report = import_new(&mut importer, nic, "dynamic")
        .ok_or("cannot open the device, allocate or export")??;
    match imported_or_refused(&report) {
        Some(true) => Ok(()),
        _ => Err(format!("import: {}", report.summary())),
    }
}

/// Two threads, each with its own handle on the importer module, that import new dma-bufs on
/// `nic` ([`import_new`]) in `modes` in turn until `stop`, and give `each` the importer, the
/// mode and each answer (`Err`: the command was refused). An `Err` from `each` is recorded in
/// `unexpected` and ends its thread.
fn importing_threads(
    stop: &Arc<AtomicBool>,
    unexpected: &Arc<Unexpected>,
    nic: &str,
    modes: &'static [&'static str],
    each: impl Fn(&mut TestModule, &str, Result<crate::testmod::Report, String>) -> Outcome
        + Clone
        + Send
        + 'static,
) -> Vec<thread::JoinHandle<()>> {
    (0..2)
        .map(|t| {
            let (stop, unexpected, nic, each) = (
                stop.clone(),
                unexpected.clone(),
                nic.to_owned(),
                each.clone(),
            );
            thread::spawn(move || {
                let mut importer = match TestModule::load_importer() {
                    Ok(importer) => importer,
                    Err(err) => return unexpected.record_message(err),
                };
                let mut n = t;
                while !stop.load(Ordering::Relaxed) {
                    let mode = modes[(n + 1) % modes.len()];
                    let Some(answer) = import_new(&mut importer, &nic, mode) else {
                        continue;
                    };
                    n += 1;
                    if let Err(err) = each(&mut importer, mode, answer) {
                        return unexpected.record_message(err);
                    }
                }
            })
        })
        .collect()
}

/// Exports 16 pages of a new allocation and has `nic` import them in `mode` through
/// `importer`: the importer's answer (`Err`: it refused the command), or `None` when the
/// device could not open, allocate or export (going, or gone).
fn import_new(
    importer: &mut TestModule,
    nic: &str,
    mode: &str,
) -> Option<Result<crate::testmod::Report, String>> {
    let device = Device::open_index(INDEX).ok()?;
    let dmabuf = device
        .alloc(16 * PAGE as u64, None)
        .and_then(|alloc| alloc.export(0, 0, ExportFlags::RDWR))
        .ok()?;
    let line = format!("fd={} dev={nic} mode={mode}", dmabuf.as_fd().as_raw_fd());
    Some(importer.command(&line))
}

/// Whether an import attached and mapped (`true`) or was refused because the device went at
/// any point, with `ENODEV` (`false`); `None`: anything else, a bug.
fn imported_or_refused(report: &crate::testmod::Report) -> Option<bool> {
    match (report.int("attach"), report.int("map")) {
        (Ok(0), Ok(0)) => Some(true),
        (Ok(-19), _) | (Ok(0), Ok(-19)) => Some(false),
        _ => None,
    }
}

/// How late the importer in [`removal_waits_for_late_unmap`] unmaps.
const DEFER_MS: u64 = 300;

/// A dynamic importer holds a mapping and unmaps it [`DEFER_MS`] after it is invalidated;
/// unbinding must take at least that long (removal waits for revocable mappings to go) and
/// complete; the device is bound again after.
fn removal_waits_for_late_unmap(importer: &mut TestModule, bdf: &str, nic: &str) -> Outcome {
    let device = Device::open_index(INDEX).map_err(|err| format!("open: {err}"))?;
    let dmabuf = device
        .alloc(16 * PAGE as u64, None)
        .and_then(|alloc| alloc.export(0, 0, ExportFlags::RDWR))
        .map_err(|err| format!("alloc and export: {err}"))?;
    let held = importer.command(&format!(
        "fd={} dev={nic} mode=dynamic hold=1 defer={DEFER_MS}",
        dmabuf.as_fd().as_raw_fd()
    ))?;
    expect_eq("map", Some("0"), held.value("map"))?;
    let id = held.get("id")?.to_owned();
    drop(dmabuf);
    drop(device);
    let start = Instant::now();
    let unbound = unbind(bdf);
    let took = start.elapsed();
    let status = importer.command(&format!("status id={id}"))?;
    let released = importer.command(&format!("release id={id}"));
    let rebound = rebind(bdf);
    unbound?;
    if took < Duration::from_millis(DEFER_MS * 8 / 10) {
        return Err(format!(
            "unbind returned after {} ms, before the importer unmapped ({DEFER_MS} ms after it was told)",
            took.as_millis()
        ));
    }
    expect_eq("invalidations", Some("1"), status.value("invalidations"))?;
    expect_eq("mapped after the unbind", Some("0"), status.value("mapped"))?;
    released?;
    rebound
}

/// Reads debugfs's `exports` of the device: the number of attachment lines, each checked for
/// its form; `None` while the device (and so its directory) is away.
fn read_exports() -> Result<Option<u64>, String> {
    let path = format!("/sys/kernel/debug/peerdirect/peerdirect{INDEX}/exports");
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        // The directory goes with the device (ENOENT); a file removed while open reads EIO.
        Err(err) if matches!(err.raw_os_error(), Some(2 | 5)) => return Ok(None),
        Err(err) => return Err(format!("{path}: {err}")),
    };
    let mut listed = 0;
    for line in text.lines().filter(|l| l.starts_with(' ')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let well_formed = matches!(
            fields.as_slice(),
            [importer, kind, pinned, entries]
                if importer.starts_with("importer=")
                    && (*kind == "revocable" || *kind == "not-revocable")
                    && (*pinned == "pinned=0" || *pinned == "pinned=1")
                    && entries.strip_prefix("mapped_entries=").is_some_and(|n| n.parse::<u32>().is_ok())
        ) || line.trim_start().starts_with('(');
        if !well_formed {
            return Err(format!("{path}: malformed attachment line {line:?}"));
        }
        listed += 1;
    }
    Ok(Some(listed))
}

/// Reading a mapping that may fault, without dying of it.
pub(crate) mod sigbus {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::Mapping;

    /// The page the last SIGBUS hit, 0 if none since it was reset.
    static FAULTED: AtomicUsize = AtomicUsize::new(0);
    /// Every page a SIGBUS hit since [`forget`], up to [`TRAPPED_MAX`]: they are anonymous
    /// memory now, and reading them again proves nothing.
    static TRAPPED: [AtomicUsize; TRAPPED_MAX] = [const { AtomicUsize::new(0) }; TRAPPED_MAX];
    static TRAPPED_N: AtomicUsize = AtomicUsize::new(0);
    const TRAPPED_MAX: usize = 8192;

    /// Forgets the pages trapped so far.
    pub(crate) fn forget() {
        TRAPPED_N.store(0, Ordering::SeqCst);
    }

    /// How many faults were trapped since [`forget`].
    pub(crate) fn trapped() -> u64 {
        TRAPPED_N.load(Ordering::SeqCst) as u64
    }

    /// Replaces the page that faulted with anonymous memory and records it, so the faulting
    /// read completes (reading 0) and the caller learns that it faulted.
    extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() } as usize & !(super::PAGE - 1);
        // SAFETY: mmap is async-signal-safe; MAP_FIXED over the page of the faulting mapping,
        // which `probe_each` owns and unmaps afterwards (the record tells it so).
        let placed = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                super::PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if placed == libc::MAP_FAILED {
            // SAFETY: _exit is async-signal-safe; without the page the read would fault forever.
            unsafe { libc::_exit(86) };
        }
        FAULTED.store(addr, Ordering::SeqCst);
        let n = TRAPPED_N.fetch_add(1, Ordering::SeqCst);
        if n < TRAPPED_MAX {
            TRAPPED[n].store(addr, Ordering::SeqCst);
        }
    }

    /// While it exists, SIGBUS in this process replaces the faulting page with zeroes instead
    /// of killing it (and records the page for [`probe_each`]).
    pub(crate) struct Trap(libc::sigaction);

    impl Trap {
        pub(crate) fn install() -> Result<Self, String> {
            let mut action = zeroed_action();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            let mut old = zeroed_action();
            // SAFETY: both structs are valid for the call; the handler is async-signal-safe.
            if unsafe { libc::sigaction(libc::SIGBUS, &action, &mut old) } != 0 {
                return Err(format!(
                    "cannot install a SIGBUS handler: {}",
                    std::io::Error::last_os_error()
                ));
            }
            Ok(Self(old))
        }
    }

    impl Drop for Trap {
        fn drop(&mut self) {
            // SAFETY: restores the disposition saved by `install`.
            unsafe { libc::sigaction(libc::SIGBUS, &self.0, std::ptr::null_mut()) };
        }
    }

    /// Reads the first word of each mapping; returns those that did not fault, with the word
    /// read. Called with no other thread touching the mappings.
    pub(super) fn probe_each(mappings: &[Mapping]) -> Result<Vec<(usize, u64)>, String> {
        let n = TRAPPED_N.load(Ordering::SeqCst);
        if n > TRAPPED_MAX {
            return Err(format!(
                "{n} pages faulted while mapping, more than {TRAPPED_MAX} recorded"
            ));
        }
        let trapped: std::collections::HashSet<usize> = TRAPPED[..n]
            .iter()
            .map(|a| a.load(Ordering::SeqCst))
            .collect();
        let _trap = Trap::install()?;
        let mut survived = Vec::new();
        // Pages that faulted already, when first written, were revoked.
        for (i, map) in mappings
            .iter()
            .enumerate()
            .filter(|(_, m)| !trapped.contains(&m.addr))
        {
            FAULTED.store(0, Ordering::SeqCst);
            let word = map.read_first();
            if FAULTED.load(Ordering::SeqCst) != map.addr {
                survived.push((i, word));
            }
        }
        Ok(survived)
    }

    fn zeroed_action() -> libc::sigaction {
        // SAFETY: a zeroed sigaction is a valid (default) disposition.
        unsafe { std::mem::zeroed() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handovers_are_indexes_another_device_held_last() {
        let bound = |bdf: &str, index: u32| {
            format!("[ 5.1] peerdirect {bdf}: peerdirect{index}: HBM BAR2 256 MiB at bus address 0xd0000000")
        };
        let (a, b) = ("0000:03:00.0", "0000:04:00.0");
        let log = [
            bound(a, 0),
            bound(b, 1),
            "[ 6.0] peerdirect: peerdirect0: removed 0000:03:00.0".to_owned(),
            bound(a, 0),
            bound(b, 0),
            bound(a, 1),
            bound(a, 1),
        ]
        .join("\n");
        // b took 0 from a, a took 1 from b; a's own rebinds are no handover.
        assert_eq!(index_handovers(&log), 2);
        assert_eq!(index_handovers(""), 0);
    }

    #[test]
    fn expect_met_names_each_outcome_that_never_came() {
        assert_eq!(expect_met(&[("refusal", 3), ("fault", 1)]), Ok(()));
        let err = expect_met(&[("refusal", 0), ("fault", 1), ("handover", 0)]).unwrap_err();
        assert!(err.contains("got no refusal, no handover:"), "{err}");
    }
}
