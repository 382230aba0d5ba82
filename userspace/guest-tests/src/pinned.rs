//! `--pinned-removal`: the removal protocol for importers that cannot be revoked
//! (Documentation/lifecycle.md). The test importer module (tests/kmod/peerdirect_importer.c)
//! stands in for EFA's memory registrations: a pinned attachment without an invalidate
//! callback, mapped until released.
//!
//! 1. Held by hand: the unbind does not return while the pinned mapping exists; the device
//!    file polls `POLLPRI | POLLHUP` and the kernel log names the range, the exporting
//!    process and the importer; releasing the mapping lets the unbind return.
//! 2. Held by a registration in a [`RegCache`] attached to the device, whose registrar pins
//!    through the importer module and releases on deregistration: the unbind completes by
//!    itself, because the cache's watching thread sees the device file poll `POLLPRI` and
//!    deregisters the device's registrations (once the removal has reported waiting for the
//!    mapping: [`PinnedImporter::release_after_wait`]). A watchdog releases everything after
//!    [`WATCHDOG`] so that a broken protocol fails the test instead of hanging it.

use std::os::fd::{AsFd, AsRawFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use peerdirect::cache::{Access, ByteRange, CacheLimits, DomainId, RegKey, Registrar};
use peerdirect::{Device, DmaBuf, ExportFlags, RegCache};

use crate::race::{expect_idle, rebind};
use crate::removal::{
    expect_going, expect_waiting, expect_waits_log, importer_setup, waits_reports, Unbinding,
    WAITS_LOG,
};
use crate::support::{expect_eq, join, Tap};
use crate::testmod::{stats, TestModule};
use crate::INDEX;

const LEN: u64 = 2 << 20;
/// How long the unbind is watched waiting before the mapping is released by hand.
const HELD: Duration = Duration::from_secs(3);
/// How long the unbind gets to return once nothing maps the device any more.
const FINISH: Duration = Duration::from_secs(5);
/// How long the cache gets to let go by itself.
const BY_ITSELF: Duration = Duration::from_secs(10);
/// When the watchdog releases everything.
const WATCHDOG: Duration = Duration::from_secs(30);

/// A registrar whose registrations are the importer module's pinned attachments, as EFA's
/// memory registrations are `ib_umem_dmabuf_get_pinned` imports.
struct PinnedImporter {
    module: Mutex<TestModule>,
    nic: String,
    deregistered: AtomicU64,
    /// If set, the kernel log's count of [`WAITS_LOG`] lines before an unbind: deregistration
    /// lets go only once the removal has reported waiting for the mapping (a new line), or after
    /// [`SLOW_DEREGISTRATION`]. The cache's thread sees `POLLPRI` as soon as removal begins, and
    /// would otherwise often release before the removal walks the exports: the wait the test
    /// must see would not happen. A NIC whose deregistration is slow does the same.
    release_after_wait: Mutex<Option<usize>>,
}

/// How long a deregistration waits for the removal to report waiting for it.
const SLOW_DEREGISTRATION: Duration = Duration::from_secs(5);

impl Registrar for PinnedImporter {
    type Source = DmaBuf;
    type Mr = u64;
    type Error = String;

    fn domain(&self) -> DomainId {
        DomainId(9)
    }

    fn register(&self, source: &DmaBuf, _: &RegKey) -> Result<u64, String> {
        let line = format!(
            "fd={} dev={} mode=pinned hold=1",
            source.as_fd().as_raw_fd(),
            self.nic
        );
        let report = lock(&self.module).command(&line)?;
        report.expect(&[("attach", 0), ("pin", 0), ("map", 0)])?;
        report.uint("id")
    }

    fn deregister(&self, id: u64) {
        if let Some(before) = *lock(&self.release_after_wait) {
            // Not waited for: the test then finds no new line and says so.
            let _ = expect_waiting(before, SLOW_DEREGISTRATION);
        }
        let _ = lock(&self.module).command(&format!("release id={id}"));
        self.deregistered.fetch_add(1, Ordering::SeqCst);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn run() -> ExitCode {
    let mut tap = Tap::plan(9);
    let Some((bdf, nic, mut importer)) = importer_setup(&mut tap) else {
        return tap.finish();
    };
    by_hand(&mut tap, &bdf, &nic, &mut importer);
    by_cache(&mut tap, &bdf, &nic, importer);
    tap.finish()
}

/// A pinned mapping held and released by hand.
fn by_hand(tap: &mut Tap, bdf: &str, nic: &str, importer: &mut TestModule) {
    let held = (|| {
        let device = Device::open_index(INDEX).map_err(|e| e.to_string())?;
        let alloc = device.alloc(LEN, None).map_err(|e| e.to_string())?;
        let offset = alloc.hbm_offset();
        let dmabuf = alloc
            .export(0, 0, ExportFlags::RDWR)
            .map_err(|e| e.to_string())?;
        let report = importer.command(&format!(
            "fd={} dev={nic} mode=pinned hold=1",
            dmabuf.as_fd().as_raw_fd()
        ))?;
        report.expect(&[("attach", 0), ("pin", 0), ("map", 0)])?;
        // The file frees it when closed; the dma-buf holds its range until then anyway.
        alloc.into_handle();
        Ok::<_, String>((device, dmabuf, offset, report.uint("id")?))
    })();
    tap.report(
        "a pinned importer without an invalidate callback (EFA-like) maps a 2 MiB export",
        &held.as_ref().map(drop).map_err(Clone::clone),
    );
    let Ok((device, dmabuf, offset, id)) = held else {
        return;
    };
    let unbinding = Unbinding::start(bdf);
    tap.report(
        "unbind starts the removal: the device file polls POLLPRI | POLLHUP within 5 s",
        &expect_going(&device, Duration::from_secs(5)),
    );
    thread::sleep(HELD.saturating_sub(unbinding.elapsed()));
    tap.report(
        &format!(
            "{} s later the unbind has not returned, and the kernel log names the range, this process as its exporter and the NIC as the importer it waits for",
            HELD.as_secs()
        ),
        &unbinding.expect_pending().and_then(|()| {
            expect_waits_log(&[
                format!("[{offset:#x}+{LEN:#x}]"),
                format!("exported by pid {}", std::process::id()),
                format!("mapped by {nic}"),
            ])
        }),
    );
    // The answer describes the attachment as it was when released.
    let released = importer.command(&format!("release id={id}")).map(drop);
    let finished = released
        .and_then(|()| unbinding.finish(FINISH))
        .map(|took| {
            println!(
                "# the unbind returned {} ms after it started",
                took.as_millis()
            );
        });
    tap.report(
        &format!(
            "once the importer releases its mapping, the unbind returns within {} s",
            FINISH.as_secs()
        ),
        &finished,
    );
    drop((dmabuf, device));
    tap.report(
        "rebound, the device has nothing allocated or exported and all HBM free",
        &rebind(bdf).and_then(|()| expect_idle()),
    );
}

/// A pinned mapping held by a cached registration; the cache lets go when told.
fn by_cache(tap: &mut Tap, bdf: &str, nic: &str, importer: TestModule) {
    let registrar = Arc::new(PinnedImporter {
        module: Mutex::new(importer),
        nic: nic.to_owned(),
        deregistered: AtomicU64::new(0),
        release_after_wait: Mutex::new(None),
    });
    let cache = Arc::new(RegCache::<PinnedImporter>::new(CacheLimits::default()));
    let held = (|| {
        let device = Device::open_index(INDEX).map_err(|e| e.to_string())?;
        cache.attach(&device);
        let alloc = device.alloc(LEN, None).map_err(|e| e.to_string())?;
        let dmabuf = alloc
            .export(0, 0, ExportFlags::RDWR)
            .map_err(|e| e.to_string())?;
        let export = device.export_id(&dmabuf).map_err(|e| e.to_string())?;
        let range = ByteRange::new(0, LEN).map_err(|e| e.to_string())?;
        drop(cache.get(&registrar, &dmabuf, export, range, Access::all())?);
        expect_eq("pinned mappings", 1, stats()?.uint("mappings_pinned")?)?;
        alloc.into_handle();
        Ok::<_, String>((device, dmabuf))
    })();
    tap.report(
        "a registration cache attached to the device holds a registration whose MR is a pinned mapping",
        &held.as_ref().map(drop).map_err(Clone::clone),
    );
    let Ok(held) = held else {
        return;
    };
    // Releases everything if the cache never lets go, so that the unbind returns; ends early
    // once told (its sender dropped). Says whether it fired.
    let (settled, watching) = mpsc::channel::<()>();
    let watchdog = thread::spawn(move || {
        let fired = watching.recv_timeout(WATCHDOG) == Err(RecvTimeoutError::Timeout);
        if fired {
            if let Ok(mut module) = TestModule::load_importer() {
                let _ = module.command("release all");
            }
        }
        fired
    });
    let waits_before = waits_reports();
    *lock(&registrar.release_after_wait) = waits_before.as_ref().ok().copied();
    let unbinding = Unbinding::start(bdf);
    let finished = unbinding.finish(WATCHDOG + FINISH);
    drop(settled);
    // The removal reports at once when it finds a mapping it cannot revoke and waits for it.
    *lock(&registrar.release_after_wait) = None;
    let waited = waits_before.and_then(|before| Ok(waits_reports()? > before));
    let outcome = match (finished, join("the watchdog", watchdog), waited) {
        (Err(err), ..) | (_, Err(err), _) | (_, _, Err(err)) => Err(err),
        (Ok(took), Ok(false), Ok(true)) if took <= BY_ITSELF => {
            println!(
                "# the unbind waited for the pinned mapping and returned by itself after {} ms",
                took.as_millis()
            );
            Ok(())
        }
        (Ok(took), Ok(fired), Ok(waited)) => Err(format!(
            "expected the removal to wait for the pinned mapping (a new '{WAITS_LOG}' line) and the unbind to return by itself within {} s, got {} and the unbind after {} ms{}",
            BY_ITSELF.as_secs(),
            if waited { "a wait" } else { "no wait: the cache let go before the removal reached it" },
            took.as_millis(),
            if fired {
                ", once the watchdog released the mapping"
            } else {
                ""
            }
        )),
    };
    tap.report(
        &format!(
            "unbind waits for the pinned mapping and completes by itself within {} s: the cache deregisters when the device file polls POLLPRI",
            BY_ITSELF.as_secs()
        ),
        &outcome,
    );
    let stats = cache.stats();
    tap.report(
        "the cache invalidated that registration once, and the registrar deregistered it once",
        &expect_eq("invalidations", 1, stats.invalidations).and_then(|()| {
            expect_eq(
                "deregistrations",
                1,
                registrar.deregistered.load(Ordering::SeqCst),
            )
        }),
    );
    drop(held);
    drop(cache);
    tap.report(
        "rebound, the device has nothing allocated or exported and all HBM free",
        &rebind(bdf).and_then(|()| expect_idle()),
    );
}
