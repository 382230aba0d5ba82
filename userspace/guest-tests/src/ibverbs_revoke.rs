//! `--ibverbs-revoke unbind|unplug|race`: the HBM device goes away while a [`RegCache`] holds
//! verbs registrations of its memory (`IbverbsRegistrar`, `ibv_reg_dmabuf_mr` on rxe0), on the
//! test kernel's patched rxe and provider (`qemu/run --rxe-dmabuf`).
//!
//! rxe imports a dma-buf pinned and revocable, as irdma does (qemu/patches/0002): removal
//! revokes the import (ib_core unmaps and unpins it and marks it revoked) and does not wait
//! for the memory region, which stays until `ibv_dereg_mr`. Until then its attachment holds
//! the dma-buf, and a cached registration would hold it for as long as the cache lives. So the
//! cache must let go by itself: attached to the device, its watching thread sees the device
//! file poll `POLLPRI | POLLHUP` and drops the device's entries, which deregisters them.
//!
//! - `unbind` and `unplug`: one registration cached (no handle holds it) in a cache attached
//!   to `/dev/peerdirect0`, with a listener; the device is unbound (then rebound), or
//!   hot-unplugged (`@@peerdirect-unplug hbm0`, `qemu/run --hotplug`). With no call into the
//!   cache after the removal, the listener is told, the entry goes and the registration is
//!   deregistered; the kernel's side is witnessed independently in the dma-buf core's debugfs
//!   `bufinfo` (the NIC's attachment to the dma-buf, and the reference the import holds on
//!   it, gone). A new request for the range then fails with `ENODEV`.
//! - `race`: rounds in which two threads keep requesting ranges of an export through one
//!   attached cache and dropping the handles (one also invalidates the export now and then
//!   until the removal starts, deregistering on its own thread) while the device is unbound:
//!   the unbind returns, the threads end (every request made after the unbind returned fails
//!   with `ENODEV`: none is served by a cached registration of the revoked device), and the
//!   cache lets go of every registration.

use std::fs;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use peerdirect::cache::{Access, ByteRange, CacheLimits, ExportId};
use peerdirect::registrar::ibverbs::{IbverbsError, IbverbsRegistrar};
use peerdirect::{Allocation, Cause, Device, DeviceStatus, DmaBuf, Errno, RegCache};

use crate::ibverbs::{alloc_export, nic_under_rxe, range, registrar, EXPORT_LEN, FIRST};
use crate::race::{bound_device, expect_idle, expect_raced, rebind};
use crate::removal::{expect_going, waits_reports, Unbinding};
use crate::support::{expect_eq, request_unplug, wait_for, Outcome, Tap, SYSFS_PCI_DEVICES};
use crate::INDEX;

/// How the device goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Way {
    /// Write the device to the driver's `unbind`, then rebind it.
    Unbind,
    /// Ask the host for a PCIe hot-unplug of the HBM device (the device is gone after it).
    Unplug,
    /// Unbind it, rounds of it, while threads request and drop registrations.
    Race,
}

type Cache = RegCache<IbverbsRegistrar>;

/// The HBM device's id on QEMU's command line (qemu/run).
const QEMU_HBM_ID: &str = "hbm0";
/// How long an unbind gets to return: rxe's import is revocable, nothing is waited for.
const UNBIND_LIMIT: Duration = Duration::from_secs(10);
/// How long the host gets to remove the device after the request.
const UNPLUG_LIMIT: Duration = Duration::from_secs(30);
/// How long the cache gets to let go by itself.
const BY_ITSELF: Duration = Duration::from_secs(10);
/// How long a request gets to fail once the device is gone.
const REQUEST_LIMIT: Duration = Duration::from_secs(5);
/// How long the racing threads get to end once the unbind returned.
const THREADS_LIMIT: Duration = Duration::from_secs(30);
/// Successful requests each round's threads make before the unbind.
const BEFORE_UNBIND: u64 = 16;

/// Prints TAP for `--ibverbs-revoke`; success iff every test passed.
pub(crate) fn run(way: Way, rounds: u32) -> ExitCode {
    match way {
        Way::Unbind | Way::Unplug => removal(way),
        Way::Race => race(rounds),
    }
}

/// What the dma-buf core's debugfs `bufinfo` says of one dma-buf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BufInfo {
    /// The references to its file: the descriptors open on it and the importers' (ib_core's
    /// umem takes one for as long as the import lives).
    pub(crate) count: u64,
    /// The devices attached to it.
    pub(crate) attached: Vec<String>,
}

/// The dma-buf core's debugfs `bufinfo` of the dma-buf whose inode is `ino`, if it lists it.
pub(crate) fn bufinfo(ino: u64) -> Result<Option<BufInfo>, String> {
    let path = "/sys/kernel/debug/dma_buf/bufinfo";
    let text = fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    Ok(parse_bufinfo(&text, ino))
}

/// `bufinfo`'s entry of inode `ino`: a line `size flags mode count exp_name ino name` (tabs),
/// the reservation's fences, `\tAttached Devices:`, a `\tDEVICE` line each, `Total N devices
/// attached`.
fn parse_bufinfo(text: &str, ino: u64) -> Option<BufInfo> {
    let mut lines = text.lines();
    let count = lines.by_ref().find_map(|line| {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields.as_slice() {
            [_, _, _, count, _, this, _] if this.parse::<u64>().ok() == Some(ino) => {
                count.parse::<u64>().ok()
            }
            _ => None,
        }
    })?;
    let attached = lines
        .skip_while(|l| l.trim() != "Attached Devices:")
        .skip(1)
        .take_while(|l| l.starts_with('\t'))
        .map(|l| l.trim().to_owned())
        .collect();
    Some(BufInfo { count, attached })
}

/// The entry of `ino`, which `bufinfo` must list.
fn buf(ino: u64) -> Result<BufInfo, String> {
    bufinfo(ino)?.ok_or_else(|| format!("the dma-buf core's bufinfo does not list inode {ino}"))
}

/// What the listener was told of one registration.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Told {
    rkey: u32,
    cause: Cause,
    held: bool,
}

/// A cache attached to `device`, whose listener records what it is told in `told`.
fn attached_cache(device: &Device, told: &Arc<Mutex<Vec<Told>>>) -> Arc<Cache> {
    let cache = Arc::new(Cache::new(CacheLimits::default()));
    cache.attach(device);
    let told = Arc::clone(told);
    cache.set_listener(Some(Arc::new(move |invalidated| {
        lock(&told).push(Told {
            rkey: invalidated.mr.rkey,
            cause: invalidated.cause,
            held: invalidated.held,
        });
    })));
    cache
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A 4 MiB allocation of `device`, exported RDWR, and its identity. The allocation is kept:
/// freeing it through the crate would invalidate the export's entries, which the test must see
/// go by themselves.
fn export(device: &Device) -> Result<(Allocation<'_>, DmaBuf, ExportId), String> {
    let (allocation, dmabuf) = alloc_export(device)?;
    let export = device
        .export_id(&dmabuf)
        .map_err(|e| format!("fstat of the dma-buf: {e}"))?;
    Ok((allocation, dmabuf, export))
}

/// Checks that `err` is a registration refused with `ENODEV` that names the device whose
/// export is revoked.
fn expect_enodev(err: &IbverbsError) -> Outcome {
    expect_eq("errno", Some(Errno::NODEV), err.errno())?;
    if !matches!(
        err,
        IbverbsError::Revoked {
            hbm_device: INDEX,
            ..
        }
    ) {
        return Err(format!(
            "expected IbverbsError::Revoked of device {INDEX}, got {err:?}"
        ));
    }
    let text = err.to_string();
    let export = format!("the export of /dev/peerdirect{INDEX} is revoked");
    for part in [
        "ibv_reg_dmabuf_mr on rxe0",
        "ENODEV",
        &export,
        "HBM device is gone",
    ] {
        if !text.contains(part) {
            return Err(format!("{part:?} missing from: {text}"));
        }
    }
    Ok(())
}

/// What `removal` holds of `device`.
struct Held<'a> {
    device: &'a Device,
    /// Kept, not freed (see [`export`]).
    _allocation: Allocation<'a>,
    dmabuf: DmaBuf,
    export: ExportId,
    registrar: Arc<IbverbsRegistrar>,
    cache: Arc<Cache>,
    told: Arc<Mutex<Vec<Told>>>,
    rkey: u32,
    /// `bufinfo`'s entry of the dma-buf before the registration.
    before: BufInfo,
}

const SETUP: &str = "a verbs registration (ibv_reg_dmabuf_mr on rxe0 through IbverbsRegistrar) of 2 MiB of a 4 MiB export is cached, no handle holding it, in a RegCache attached to /dev/peerdirect0 with a listener: the dma-buf core lists the NIC under rxe0 as the dma-buf's one attached device, and one more reference to it than before the registration";
const LET_GO: &str = "with no call into the cache after the removal, within 10 s the listener is told of the registration once (cause device, held by no handle, its rkey), and the cache holds no entry, counts one invalidation and one deregistration";
const DEREGISTERED: &str = "the dma-buf core lists no device attached to the dma-buf any more, and its reference count is back to what it was before the registration: ibv_dereg_mr ran and ib_core let go of the import";
const REQUEST: &str = "a new request for the range through the cache fails within 5 s with ENODEV (IbverbsError::Revoked, naming /dev/peerdirect0 as the device whose export is revoked), and caches nothing";
const UNBOUND: &str = "writing the device to the driver's unbind returns within 10 s while the registration is cached, without waiting for it (the kernel reports no 'removal waits')";
const UNPLUGGED: &str = "the HBM device is hot-unplugged (QEMU device_del): the device file polls POLLPRI | POLLHUP and its PCI device is gone within 30 s, without the removal waiting for the registration (no 'removal waits')";
const REBOUND: &str =
    "with the files closed, the device rebinds with nothing allocated or exported and all HBM free";

fn removal(way: Way) -> ExitCode {
    let mut tap = Tap::plan(if way == Way::Unbind { 6 } else { 5 });
    let bdf = bound_device();
    let device = bdf
        .clone()
        .and_then(|_| Device::open_index(INDEX).map_err(|e| e.to_string()));
    let held = device.as_ref().map_err(Clone::clone).and_then(setup);
    tap.report(SETUP, &held.as_ref().map(drop).map_err(Clone::clone));
    let (Ok(bdf), Ok(held)) = (bdf, held) else {
        for description in [UNBOUND, LET_GO, DEREGISTERED, REQUEST, REBOUND]
            .into_iter()
            .take(if way == Way::Unbind { 5 } else { 4 })
        {
            tap.report(description, &Err("not run: the setup failed".into()));
        }
        return tap.finish();
    };
    let waits = waits_reports();
    let removed = match way {
        Way::Unbind => {
            let unbinding = Unbinding::start(&bdf);
            unbinding.finish(UNBIND_LIMIT).map(|took| {
                println!(
                    "# the unbind returned {} ms after it started",
                    took.as_millis()
                );
            })
        }
        _ => unplug(held.device, &bdf),
    };
    let no_wait = waits.and_then(|before| {
        let after = waits_reports()?;
        expect_eq(
            "'removal waits' reports during the removal",
            0,
            after - before,
        )
    });
    tap.report(
        if way == Way::Unbind {
            UNBOUND
        } else {
            UNPLUGGED
        },
        &removed.and(no_wait),
    );

    // No call into the cache from here until the checks below have seen it let go.
    let started = Instant::now();
    let let_go = wait_for(BY_ITSELF, || {
        let stats = held.cache.stats();
        stats.entries == 0 && stats.deregistrations == 1 && !lock(&held.told).is_empty()
    });
    if let_go.is_ok() {
        println!(
            "# the cache let go by itself within {} ms of the removal's end",
            started.elapsed().as_millis()
        );
    }
    let stats = held.cache.stats();
    let told = lock(&held.told).clone();
    tap.report(
        LET_GO,
        &(|| {
            let_go.map_err(|secs| format!("not within {secs} s: {stats:?}, told {told:?}"))?;
            expect_eq(
                "told",
                vec![Told {
                    rkey: held.rkey,
                    cause: Cause::Device,
                    held: false,
                }],
                told,
            )?;
            expect_eq(
                "(entries, invalidations, registrations, deregistrations)",
                (0, 1, 1, 1),
                (
                    stats.entries,
                    stats.invalidations,
                    stats.registrations,
                    stats.deregistrations,
                ),
            )
        })(),
    );
    let ino = held.export.dma_buf_inode();
    let mut now = None;
    let gone = wait_for(BY_ITSELF, || {
        now = bufinfo(ino).ok().flatten();
        now.as_ref() == Some(&held.before)
    });
    tap.report(
        DEREGISTERED,
        &gone.map_err(|secs| {
            format!(
                "within {secs} s, bufinfo lists {now:?} for the dma-buf; expected {:?}, as before the registration",
                held.before
            )
        }),
    );

    let requested = Instant::now();
    let again = held.cache.get(
        &held.registrar,
        &held.dmabuf,
        held.export,
        range(FIRST).expect("a valid range"),
        Access::all(),
    );
    let took = requested.elapsed();
    let stats = held.cache.stats();
    tap.report(
        REQUEST,
        &(|| {
            let err = match again {
                Ok(registration) => {
                    return Err(format!(
                        "the request got a registration: {:?} (rkey {:#x})",
                        registration,
                        registration.mr().rkey
                    ))
                }
                Err(err) => err,
            };
            println!("# after the removal: {err}");
            expect_enodev(&err)?;
            if took > REQUEST_LIMIT {
                return Err(format!("the request took {} ms", took.as_millis()));
            }
            expect_eq("entries", 0, stats.entries)?;
            expect_eq("failed registrations", 1, stats.failed_registrations)
        })(),
    );

    drop(held);
    drop(device);
    if way == Way::Unbind {
        tap.report(REBOUND, &rebind(&bdf).and_then(|()| expect_idle()));
    }
    tap.finish()
}

/// [`SETUP`]: the cached registration.
fn setup(device: &Device) -> Result<Held<'_>, String> {
    let nic = nic_under_rxe()?;
    let registrar = registrar()?;
    let told = Arc::default();
    let cache = attached_cache(device, &told);
    let (allocation, dmabuf, export) = export(device)?;
    let before = buf(export.dma_buf_inode())?;
    expect_eq(
        "devices attached before the registration",
        0,
        before.attached.len(),
    )?;
    let registration = cache
        .get(&registrar, &dmabuf, export, range(FIRST)?, Access::all())
        .map_err(|e| format!("RegCache::get: {e}"))?;
    let rkey = registration.mr().rkey;
    drop(registration);
    let stats = cache.stats();
    expect_eq(
        "(entries, registrations)",
        (1, 1),
        (stats.entries, stats.registrations),
    )?;
    let during = buf(export.dma_buf_inode())?;
    println!("# bufinfo before the registration: {before:?}; with it: {during:?}");
    expect_eq(
        "bufinfo while registered",
        BufInfo {
            count: before.count + 1,
            attached: vec![nic],
        },
        during,
    )?;
    Ok(Held {
        device,
        _allocation: allocation,
        dmabuf,
        export,
        registrar,
        cache,
        told,
        rkey,
        before,
    })
}

/// Asks the host to hot-unplug the HBM device `bdf`, whose file is `device`, and waits until it
/// is gone.
fn unplug(device: &Device, bdf: &str) -> Outcome {
    let started = Instant::now();
    request_unplug(QEMU_HBM_ID)?;
    expect_going(device, UNPLUG_LIMIT)
        .map_err(|err| format!("{err} (does the host harness run with --hotplug?)"))?;
    let dir = format!("{SYSFS_PCI_DEVICES}/{bdf}");
    wait_for(UNPLUG_LIMIT, || !Path::new(&dir).exists())
        .map_err(|secs| format!("{dir} still present {secs} s after the request"))?;
    println!(
        "# the HBM device was gone {} ms after the request",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// What one racing thread did in a round.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    /// Requests that got a registration.
    got: u64,
    /// Requests refused with `ENODEV` before the unbind returned (it was under way).
    enodev_during: u64,
    /// Requests refused with `ENODEV` after it returned.
    enodev_after: u64,
    /// Explicit invalidations of the export.
    invalidations: u64,
}

/// What the threads of a round share.
struct Shared {
    cache: Arc<Cache>,
    registrar: Arc<IbverbsRegistrar>,
    dmabuf: DmaBuf,
    export: ExportId,
    /// Successful requests of all threads, so that the unbind comes once they run.
    got: AtomicU64,
    /// Set once the unbind returned.
    unbound: AtomicBool,
    /// The device file's status page: says when the removal starts.
    status: DeviceStatus,
}

/// Thread `which`'s loop: requests ranges of the export (64 KiB to 1 MiB at 64 KiB steps),
/// keeps the last four handles, and with `invalidate` invalidates the export every eighth
/// request until the device's status page says it is being revoked; ends after three requests in a row refused with `ENODEV` once the unbind returned.
fn racer(shared: &Shared, which: u64, invalidate: bool) -> Result<Counts, String> {
    let mut counts = Counts::default();
    let mut handles = std::collections::VecDeque::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ which;
    let mut refused_after = 0;
    let mut unbound_at = None;
    for n in 0u64.. {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let length = (1 + seed % 16) * (64 << 10);
        let offset = (seed >> 8) % ((EXPORT_LEN - length) / (64 << 10) + 1) * (64 << 10);
        let range = ByteRange::new(offset, length).map_err(|e| e.to_string())?;
        let after = shared.unbound.load(SeqCst);
        if after {
            let since = *unbound_at.get_or_insert_with(Instant::now);
            if since.elapsed() > THREADS_LIMIT {
                return Err(format!(
                    "thread {which}: requests still not refused {} s after the unbind returned: {counts:?}",
                    THREADS_LIMIT.as_secs()
                ));
            }
        }
        match shared.cache.get(
            &shared.registrar,
            &shared.dmabuf,
            shared.export,
            range,
            Access::all(),
        ) {
            Ok(registration) => {
                if after {
                    return Err(format!(
                        "thread {which}: a request made after the unbind returned got a registration: {registration:?}"
                    ));
                }
                counts.got += 1;
                shared.got.fetch_add(1, SeqCst);
                handles.push_back(registration);
                if handles.len() > 4 {
                    handles.pop_front();
                }
            }
            Err(err) if err.errno() == Some(Errno::NODEV) => {
                expect_enodev(&err).map_err(|e| format!("thread {which}: {e}"))?;
                if after {
                    counts.enodev_after += 1;
                    refused_after += 1;
                    if refused_after == 3 {
                        return Ok(counts);
                    }
                } else {
                    counts.enodev_during += 1;
                }
            }
            Err(err) => return Err(format!("thread {which}: request {n}: {err}")),
        }
        // Only until the removal starts: from then on nothing of the caller's drops the revoked
        // device's entries (an invalidation that began before may still be running), and a
        // request made once the unbind returned must still never get one.
        if invalidate && !shared.status.revoked() && n % 8 == 7 {
            shared.cache.invalidate_export(shared.export);
            counts.invalidations += 1;
        }
    }
    unreachable!("the loop returns")
}

const RACE_UNBIND: &str = "in each round, while two threads keep requesting ranges of an export through one attached RegCache with verbs registrations and dropping the handles (one also invalidating the export), the unbind returns within 10 s, without waiting for a registration (no 'removal waits')";
const RACE_THREADS: &str = "in each round, both threads end within 30 s of the unbind: once it returned, every request fails with ENODEV (none gets a registration); no other error, no hang";
const RACE_LET_GO: &str = "in each round, with the threads' handles dropped, within 10 s the cache has let go of every registration of the revoked device (its watcher, or the requests that found the device revoked): as many deregistrations as registrations, no entry, and the dma-buf core lists no device attached to the export's dma-buf and no reference of an import";
const RACE_MET: &str =
    "the race ran: in every round registrations before the unbind and ENODEV after it";

fn race(rounds: u32) -> ExitCode {
    let mut tap = Tap::plan(5);
    let setup = bound_device().and_then(|bdf| Ok((bdf, registrar()?)));
    let (bdf, registrar) = match setup {
        Ok(setup) => setup,
        Err(err) => {
            for description in [RACE_UNBIND, RACE_THREADS, RACE_LET_GO, RACE_MET, REBOUND] {
                tap.report(description, &Err(format!("not run: {err}")));
            }
            return tap.finish();
        }
    };
    let mut outcomes: [Outcome; 4] = [Ok(()), Ok(()), Ok(()), Ok(())];
    let mut totals = Counts::default();
    let mut hung = false;
    for round in 1..=rounds {
        let result = race_round(round, &bdf, &registrar, &mut totals);
        for (outcome, result) in outcomes.iter_mut().zip(result.outcomes) {
            if outcome.is_ok() {
                *outcome = result.map_err(|e| format!("round {round}: {e}"));
            }
        }
        if result.hung {
            hung = true;
            break;
        }
        if let Err(err) = rebind(&bdf) {
            outcomes[0] = outcomes[0]
                .clone()
                .and(Err(format!("round {round}: rebind: {err}")));
            hung = true;
            break;
        }
    }
    println!("# {rounds} rounds: {totals:?}");
    for (description, outcome) in [RACE_UNBIND, RACE_THREADS, RACE_LET_GO, RACE_MET]
        .into_iter()
        .zip(outcomes)
    {
        tap.report(description, &outcome);
    }
    tap.report(
        REBOUND,
        &if hung {
            Err("not run: a round did not end".into())
        } else {
            expect_idle()
        },
    );
    tap.finish()
}

/// A round's outcomes ([`RACE_UNBIND`], [`RACE_THREADS`], [`RACE_LET_GO`], [`RACE_MET`]), and
/// whether something in it did not end (the rounds stop).
struct Round {
    outcomes: [Outcome; 4],
    hung: bool,
}

fn race_round(
    round: u32,
    bdf: &str,
    registrar: &Arc<IbverbsRegistrar>,
    totals: &mut Counts,
) -> Round {
    let not_run = |err: String| Round {
        outcomes: [
            Err(format!("not run: {err}")),
            Err("not run".into()),
            Err("not run".into()),
            Err("not run".into()),
        ],
        hung: true,
    };
    let device = match Device::open_index(INDEX) {
        Ok(device) => device,
        Err(err) => return not_run(err.to_string()),
    };
    let told = Arc::default();
    let cache = attached_cache(&device, &told);
    let (allocation, dmabuf, export) = match export(&device) {
        Ok(exported) => exported,
        Err(err) => return not_run(err),
    };
    let before = match buf(export.dma_buf_inode()) {
        Ok(before) => before,
        Err(err) => return not_run(err),
    };
    let Some(status) = device.status() else {
        return not_run("/dev/peerdirect0 has no status page".into());
    };
    let shared = Arc::new(Shared {
        cache: Arc::clone(&cache),
        registrar: Arc::clone(registrar),
        dmabuf,
        export,
        got: AtomicU64::new(0),
        unbound: AtomicBool::new(false),
        status,
    });
    let (done, ended) = mpsc::channel();
    for which in 0..2u64 {
        let shared = Arc::clone(&shared);
        let done = done.clone();
        thread::spawn(move || {
            let _ = done.send(racer(&shared, which, which == 1));
        });
    }
    drop(done);
    // The unbind comes once the threads run, a few milliseconds later each round.
    let running = wait_for(Duration::from_secs(60), || {
        shared.got.load(SeqCst) >= BEFORE_UNBIND
    });
    thread::sleep(Duration::from_millis(u64::from(round % 4) * 7));
    let waits = waits_reports();
    let unbound = running
        .map_err(|secs| {
            format!("the threads made fewer than {BEFORE_UNBIND} registrations in {secs} s")
        })
        .and_then(|()| Unbinding::start(bdf).finish(UNBIND_LIMIT));
    shared.unbound.store(true, SeqCst);
    let unbind = unbound.and_then(|took| {
        println!(
            "# round {round}: the unbind returned after {} ms",
            took.as_millis()
        );
        let waited = waits_reports()? - waits?;
        expect_eq("'removal waits' reports during the unbind", 0, waited)
    });

    let mut counts = Vec::new();
    let mut threads: Outcome = Ok(());
    let deadline = Instant::now() + THREADS_LIMIT + Duration::from_secs(5);
    for _ in 0..2 {
        match ended.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Ok(c)) => counts.push(c),
            Ok(Err(err)) => threads = threads.and(Err(err)),
            Err(_) => {
                // A thread that does not end is a hang: stop the rounds, leave it be.
                return Round {
                    outcomes: [
                        unbind,
                        threads.and(Err(format!(
                            "a thread did not end within {} s of the unbind",
                            THREADS_LIMIT.as_secs() + 5
                        ))),
                        Err("not run: a thread hangs".into()),
                        Err("not run: a thread hangs".into()),
                    ],
                    hung: true,
                };
            }
        }
    }
    for c in &counts {
        totals.got += c.got;
        totals.enodev_during += c.enodev_during;
        totals.enodev_after += c.enodev_after;
        totals.invalidations += c.invalidations;
    }
    println!("# round {round}: {counts:?}");

    // The threads' handles are dropped; nothing calls into the cache from here.
    let ino = export.dma_buf_inode();
    let mut now = None;
    let let_go = wait_for(BY_ITSELF, || {
        let stats = cache.stats();
        now = bufinfo(ino).ok().flatten();
        stats.entries == 0
            && stats.registrations == stats.deregistrations
            && now.as_ref() == Some(&before)
    });
    let stats = cache.stats();
    println!(
        "# round {round}: {} registrations, {} deregistrations, {} hits, {} invalidations, {} told",
        stats.registrations,
        stats.deregistrations,
        stats.hits,
        stats.invalidations,
        lock(&told).len()
    );
    let let_go = let_go.map_err(|secs| {
        format!(
            "not within {secs} s: {stats:?}; bufinfo {now:?}, before the registrations {before:?}"
        )
    });
    let got: u64 = counts.iter().map(|c| c.got).sum();
    let after: u64 = counts.iter().map(|c| c.enodev_after).sum();
    let met = if counts.len() < 2 {
        Err("not run: a thread failed".into())
    } else {
        expect_raced("registrations before the unbind", got, BEFORE_UNBIND).and(expect_raced(
            "requests refused with ENODEV after it",
            after,
            6,
        ))
    };
    drop(shared);
    drop((cache, allocation));
    drop(device);
    Round {
        outcomes: [unbind, threads, let_go, met],
        hung: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUFINFO: &str = "\nDma-buf Objects:\nsize    \tflags   \tmode    \tcount   \texp_name\tino     \tname\n04194304\t00000002\t00080007\t00000002\tpeerdirect\t00000042\tpeerdirect0:1\n\tAttached Devices:\n\t0000:03:00.0\nTotal 1 devices attached\n\n04194304\t00000002\t00080007\t00000001\tpeerdirect\t00000043\t<none>\n\tshared fence: x\n\tAttached Devices:\nTotal 0 devices attached\n\n\nTotal 2 objects, 8388608 bytes\n";

    #[test]
    fn bufinfo_entries_by_inode() {
        assert_eq!(
            parse_bufinfo(BUFINFO, 42),
            Some(BufInfo {
                count: 2,
                attached: vec!["0000:03:00.0".into()],
            })
        );
        assert_eq!(
            parse_bufinfo(BUFINFO, 43),
            Some(BufInfo {
                count: 1,
                attached: vec![],
            })
        );
        assert_eq!(parse_bufinfo(BUFINFO, 44), None);
    }
}
