//! `--release-revoke`: dma-bufs whose last reference goes while removal revokes the device's
//! exports.
//!
//! Removal walks the device's exports under the lock each export's release takes to forget
//! itself, so a release that begins meanwhile waits there: its file has no reference left and
//! its inode has been put already. A slow revocable importer (the test importer module's
//! `stall=`, a NIC that waits for its hardware before it lets go) holds the walk long enough
//! for an RCU grace period to pass, which frees those inodes before the walk reaches their
//! buffers. Revocation must skip buffers whose file is already going (`get_file_active`):
//! zapping their CPU mappings reads the freed inode, which the KASAN kernel reports (and the
//! guest run fails on). Run by `tests/system/pinned.sh`, in the same KASAN boot as `--pinned-removal`.

use std::os::fd::{AsFd, AsRawFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use peerdirect::{Device, DmaBuf, ExportFlags};

use crate::race::{expect_idle, rebind};
use crate::removal::{importer_setup, revocation_report, Unbinding};
use crate::support::{all_of, expect_eq, join_all, wait_for, Tap};
use crate::testmod::TestModule;
use crate::INDEX;

const LEN: u64 = 2 << 20;
/// Exports imported by the slow importer. Revocation reaches them in the order of its walk, so
/// with several of them most of the buffers closed meanwhile come after a stall.
const SLOW: usize = 4;
/// How long each of their invalidations sleeps: many RCU grace periods, even under TCG.
const STALL_MS: u64 = 800;
/// Exports only this process holds, closed while revocation stalls (a multiple of `SLOW`).
const CLOSED: usize = 24;
/// How long after the closes start they are counted as waiting.
const SETTLE: Duration = Duration::from_millis(300);

pub(crate) fn run() -> ExitCode {
    let mut tap = Tap::plan(7);
    let Some((bdf, nic, mut importer)) = importer_setup(&mut tap) else {
        return tap.finish();
    };
    let made = (|| {
        let device = Device::open_index(INDEX).map_err(|e| e.to_string())?;
        let alloc = device.alloc(LEN, None).map_err(|e| e.to_string())?;
        let export = || {
            alloc
                .export(0, 0, ExportFlags::RDWR)
                .map_err(|e| e.to_string())
        };
        // Made in turns, so that whichever way the walk orders them, most of the closed ones
        // come after a slow one.
        let (mut slow, mut closed) = (Vec::new(), Vec::new());
        for _ in 0..SLOW {
            let dmabuf = export()?;
            let report = importer.command(&format!(
                "fd={} dev={nic} mode=revocable stall={STALL_MS} hold=1",
                dmabuf.as_fd().as_raw_fd()
            ))?;
            report.expect(&[("attach", 0), ("pin", 0), ("map", 0)])?;
            slow.push((dmabuf, report.uint("id")?));
            for _ in 0..CLOSED / SLOW {
                closed.push(export()?);
            }
        }
        // The buffers keep their range; the allocation's handle goes with the file.
        alloc.into_handle();
        Ok::<_, String>((device, slow, closed))
    })();
    tap.report(
        &format!(
            "{SLOW} exports mapped by a revocable importer whose invalidation sleeps {STALL_MS} ms, and {CLOSED} held only by this process"
        ),
        &made.as_ref().map(drop).map_err(Clone::clone),
    );
    let Ok((device, slow, closed)) = made else {
        return tap.finish();
    };

    let mut stalls = || importer_stalls(&mut importer);
    let before = stalls();
    let unbinding = Unbinding::start(&bdf);
    let stalled = before.and_then(|before| {
        let mut now = Ok(before);
        wait_for(Duration::from_secs(5), || {
            now = stalls();
            now.as_ref().map_or(true, |&now| now > before)
        })
        .map_err(|s| format!("no invalidation of the slow importer began within {s} s"))?;
        now.map(drop)
    });
    tap.report(
        "the unbind's revocation reaches the slow importer within 5 s",
        &stalled,
    );

    // Each close in a thread of its own: a release that waits for the walk blocks its thread.
    let returned = Arc::new(AtomicUsize::new(0));
    let closers: Vec<_> = closed
        .into_iter()
        .map(|dmabuf: DmaBuf| {
            let returned = returned.clone();
            thread::spawn(move || {
                drop(dmabuf);
                returned.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    thread::sleep(SETTLE);
    let waiting = CLOSED - returned.load(Ordering::SeqCst);
    println!("# {waiting} of {CLOSED} closes wait while revocation stalls");
    tap.report(
        "closes of the other exports begin while revocation stalls, and their releases wait for it",
        &if stalled.is_err() {
            Err("not run: revocation did not stall".to_owned())
        } else if waiting == 0 {
            Err(format!(
                "expected some of the {CLOSED} closes to wait for revocation {} ms in, got all returned",
                SETTLE.as_millis()
            ))
        } else {
            Ok(())
        },
    );

    let limit = Duration::from_millis(STALL_MS * SLOW as u64) + Duration::from_secs(10);
    let finished = unbinding.finish(limit).map(|took| {
        println!("# the unbind returned after {} ms", took.as_millis());
    });
    let (_, joined) = join_all("closing thread", closers);
    tap.report(
        &format!(
            "the unbind returns within {} s, and every close returns",
            limit.as_secs()
        ),
        &all_of([finished, joined]),
    );

    let report = revocation_report().and_then(|(revoked, releasing)| {
        println!("# revocation revoked {revoked} exports and skipped {releasing} being released");
        expect_eq("exports revoked or skipped", (SLOW + CLOSED) as u64, revoked + releasing)?;
        if releasing == 0 {
            return Err(format!(
                "expected revocation to reach some of the {CLOSED} buffers after their release began, got none skipped"
            ));
        }
        Ok(())
    });
    tap.report(
        "the kernel reports each export revoked or skipped, and some skipped because their release had begun",
        &report,
    );

    let released = slow.iter().try_for_each(|(_, id)| {
        let report = importer.command(&format!("release id={id}"))?;
        expect_eq("invalidations", 1, report.uint("invalidations")?)?;
        expect_eq("revoked", 1, report.uint("revoked")?)
    });
    tap.report(
        "each slow importer was invalidated once and let go of its mapping",
        &released,
    );
    drop((slow, device));
    tap.report(
        "rebound, the device has nothing allocated or exported and all HBM free",
        &rebind(&bdf).and_then(|()| expect_idle()),
    );
    tap.finish()
}

/// How many stalled invalidations the importer module has begun.
fn importer_stalls(importer: &mut TestModule) -> Result<u64, String> {
    importer.command("stalls")?.uint("stalls")
}
