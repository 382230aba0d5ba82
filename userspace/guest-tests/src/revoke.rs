//! `--revoke unbind|unplug`: what becomes of peerdirect's dma-bufs, their importers and their
//! CPU mappings when the HBM device goes away while they are in use (Documentation/exporter.md,
//! "Removal and revocation"). Runs in the `switch` topology, with the guest's NIC standing in
//! for an RDMA NIC through the test importer module (tests/kmod/peerdirect_importer.c).
//!
//! Three 2 MiB allocations are exported RDWR as dma-bufs A, B and C, and the NIC attaches one
//! held, mapped attachment to each: a dynamic importer (mlx5-like) on A, a revocable one
//! (irdma-like) on B, a pinned one without an invalidate callback (EFA-like) on C. One
//! attachment per dma-buf keeps each range's holder apart: once A and B are closed and their
//! attachments released, only the pinned importer holds C's range.
//!
//! A is also mapped for the CPU, by this process and by a child (this program re-executed with
//! a hidden flag, the dma-buf as its stdin) that maps it before the removal and touches it after:
//! it must die of SIGBUS.
//!
//! Before the removal, a second attachment of B maps twice over (the second map while the first
//! is still mapped) and unmaps twice, once as a revocable and once as a pinned importer: the
//! counts removal waits on must come back to what they were.
//!
//! The device then goes away: `unbind` writes it to the driver's `unbind`; `unplug` prints
//! `@@peerdirect-unplug hbm0`, which the host harness (`qemu/run --hotplug`) answers with QEMU
//! `device_del` of the HBM device (a PCIe hot-unplug), and waits for the device to disappear.
//! After it, every way in fails with ENODEV and every mapping is revoked but the pinned one.
//! `unbind` then rebinds the device: C's range stays reserved (the heap outlives the binding)
//! until the pinned importer lets go. Both end with the modules unloaded.
//!
//! `reset` resets the device instead (its sysfs `reset`: a secondary bus reset of the switch
//! port it is alone below): the exports are revoked as by a removal, without waiting for the
//! pinned importer, and the device stays: exports made after the reset work.
//!
//! The steps share state; a failed step that later ones build on (a gate) stops the sequence.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitCode, Stdio};
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use clap::ValueEnum;
use peerdirect::cache::{Access, ByteRange, CacheLimits, DomainId, ExportId, RegKey, Registrar};
use peerdirect::{
    pattern, Device, DeviceInfo, DmaBuf, DmaBufMap, Errno, ExportFlags, RegCache, SyncFlags,
};
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::removal::{
    expect_going, expect_log_report, expect_waiting, expect_waits_log, waits_reports, Unbinding,
};
use crate::support::{
    expect_eq, expect_errno_of, fdinfo_value, find_nic, module_loaded, request_unplug,
    run_sequence, wait_for, write_sysfs, Outcome, Tap, SYSFS_PCI_DEVICES, UNPLUG_REQUEST,
};
use crate::testmod::{stats, Report, TestModule, IMPORTER as IMPORTER_MODULE};
use crate::{INDEX, SYSFS_DRIVER};

/// How the device goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Removal {
    /// Write the device to /sys/bus/pci/drivers/peerdirect/unbind (then rebind it).
    Unbind,
    /// Ask the host for a PCIe hot-unplug of the HBM device (`@@peerdirect-unplug hbm0`).
    Unplug,
    /// Not a removal: reset the device (write 1 to its sysfs `reset`), which revokes every
    /// export made before it; the device stays.
    Reset,
}

const MODULE: &str = "peerdirect";
/// The HBM device's id on QEMU's command line (qemu/run).
const QEMU_HBM_ID: &str = "hbm0";
/// How long the host gets to remove the device after the request.
const UNPLUG_WAIT: Duration = Duration::from_secs(30);
/// How long a device node or sysfs entry gets to appear or go away after a write.
const SETTLE: Duration = Duration::from_secs(2);
/// How long the child waits for the go signal before giving up.
const CHILD_WAIT: Duration = Duration::from_secs(120);
/// The child's hidden flag (`Args::revoke_touch`).
const TOUCH_FLAG: &str = "--revoke-touch";
/// What the child prints once it has mapped A and read the pattern.
const CHILD_READY: &str = "mapped";
/// How long the device file gets to say the removal started.
const GOING_WAIT: Duration = Duration::from_secs(5);
/// How long the removal gets to complete once the last pinned mapping is released.
const FINISH_WAIT: Duration = Duration::from_secs(5);
const SIGBUS: i32 = 7;
const ENODEV: i64 = 19;
const MIB: u64 = 1 << 20;
/// Each exported range.
const LEN: u64 = 2 * MIB;
/// The pattern written through A.
const SEED: u64 = 0x7e70_4e00;
const RW: ExportFlags = ExportFlags::CLOEXEC.union(ExportFlags::RDWR);

/// A held importer: which dma-buf, how it imports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Dynamic,
    Revocable,
    Pinned,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Dynamic => "dynamic",
            Self::Revocable => "revocable",
            Self::Pinned => "pinned",
        }
    }
}

/// A, B and C, in this order.
const MODES: [Mode; 3] = [Mode::Dynamic, Mode::Revocable, Mode::Pinned];
const NAMES: [&str; 3] = ["A", "B", "C"];
const A: usize = 0;
const B: usize = 1;
const C: usize = 2;

/// One exported range and the importer attached to it.
struct Buf {
    name: &'static str,
    mode: Mode,
    dmabuf: Option<DmaBuf>,
    /// Offset of the range from the start of the HBM BAR.
    bar_offset: u64,
    /// The importer's id for the held attachment.
    id: Option<u64>,
}

impl Buf {
    fn dmabuf(&self) -> Result<&DmaBuf, String> {
        self.dmabuf
            .as_ref()
            .ok_or_else(|| format!("dma-buf {} is not open", self.name))
    }

    fn id(&self) -> Result<u64, String> {
        self.id
            .ok_or_else(|| format!("{} has no held attachment", self.name))
    }

    fn fd(&self) -> Result<i32, String> {
        Ok(self.dmabuf()?.as_fd().as_raw_fd())
    }
}

/// The child that maps A before the removal and touches it after.
struct Toucher {
    child: Child,
    /// Whatever the child printed after its ready line.
    stdout: BufReader<ChildStdout>,
    /// Created to tell the child to touch its mapping.
    go: PathBuf,
}

/// Stands in for a NIC's registrar: a registration is a serial number, so a cached one can be
/// told from a new one.
#[derive(Default)]
struct Numbering(AtomicU64);

impl Registrar for Numbering {
    type Source = ();
    type Mr = u64;
    type Error = std::convert::Infallible;

    fn domain(&self) -> DomainId {
        DomainId(1)
    }

    fn register(&self, _: &(), _: &RegKey) -> Result<u64, Self::Error> {
        Ok(self.0.fetch_add(1, Relaxed) + 1)
    }

    fn deregister(&self, _: u64) {}
}

/// A registration cache attached to D, holding a registration of A.
struct Cached {
    cache: Arc<RegCache<Numbering>>,
    registrar: Arc<Numbering>,
    export: ExportId,
    /// The serial number of A's cached registration.
    serial: u64,
}

impl Cached {
    fn get(&self) -> Result<peerdirect::Registration<Numbering>, String> {
        let range = ByteRange::new(0, LEN).map_err(|err| err.to_string())?;
        let Ok(registration) =
            self.cache
                .get(&self.registrar, &(), self.export, range, Access::all());
        Ok(registration)
    }
}

/// What the steps share.
struct State {
    importer: Option<TestModule>,
    nic: String,
    /// INFO on D, at the start.
    info: DeviceInfo,
    /// D: opened at the start, kept across the removal; after a rebind, E.
    device: Option<Device>,
    bufs: Vec<Buf>,
    /// This process's writable mapping of A.
    map: Option<DmaBufMap>,
    toucher: Option<Toucher>,
    cached: Option<Cached>,
    /// The unbind, while it waits for the pinned importer.
    unbinding: Option<Unbinding>,
    /// A second file of D, opened before the reset, that nothing but the reset's checks reads.
    second: Option<File>,
}

impl State {
    fn importer(&mut self) -> Result<&mut TestModule, String> {
        self.importer
            .as_mut()
            .ok_or_else(|| "the importer's command file is not open".to_owned())
    }

    fn device(&self) -> Result<&Device, String> {
        self.device
            .as_ref()
            .ok_or_else(|| "no /dev/peerdirect0 file is open".to_owned())
    }

    fn bdf(&self) -> String {
        self.info.pci_address.to_string()
    }

    /// The device's removal has started and not returned.
    fn expect_removal_pending(&self) -> Outcome {
        match &self.unbinding {
            Some(unbinding) => unbinding.expect_pending(),
            // A hot-unplug: the device's sysfs entry goes once removal returns.
            None => {
                let dir = format!("{SYSFS_PCI_DEVICES}/{}", self.bdf());
                if Path::new(&dir).exists() {
                    Ok(())
                } else {
                    Err(format!("expected the removal to wait, got {dir} gone"))
                }
            }
        }
    }

    /// Waits for the removal to complete.
    fn finish_removal(&mut self, removal: Removal) -> Outcome {
        match removal {
            Removal::Unbind => {
                let unbinding = self.unbinding.take().ok_or("no unbind is running")?;
                let took = unbinding.finish(FINISH_WAIT)?;
                println!("# the unbind returned after {} ms", took.as_millis());
                expect_bound(&self.bdf(), false)
            }
            Removal::Unplug => {
                let dir = format!("{SYSFS_PCI_DEVICES}/{}", self.bdf());
                wait_for(FINISH_WAIT, || !Path::new(&dir).exists()).map_err(|waited| {
                    format!("expected {dir} to go away within {waited} s, got it still present")
                })
            }
            Removal::Reset => Err("a reset is no removal".to_owned()),
        }
    }

    /// The importer's `status` of `buf`'s attachment.
    fn status(&mut self, buf: usize) -> Result<Report, String> {
        let id = self.bufs[buf].id()?;
        self.importer()?.command(&format!("status id={id}"))
    }

    /// A new attachment of `buf` from the NIC in `mode` (not held); the importer's report.
    fn attach(&mut self, buf: usize, mode: Mode) -> Result<Report, String> {
        let line = format!(
            "fd={} dev={} mode={}",
            self.bufs[buf].fd()?,
            self.nic,
            mode.name()
        );
        self.importer()?.command(&line)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // A sequence stopped early must not leave the child waiting.
        if let Some(mut toucher) = self.toucher.take() {
            let _ = toucher.child.kill();
            let _ = toucher.child.wait();
            let _ = fs::remove_file(&toucher.go);
        }
    }
}

type Step = crate::support::Step<State>;

/// A step whose failure stops the sequence.
fn gate(description: impl Into<String>, run: impl Fn(&mut State) -> Outcome + 'static) -> Step {
    crate::support::gate(description, run)
}

/// A step whose failure the following steps do not depend on.
fn check(description: impl Into<String>, run: impl Fn(&mut State) -> Outcome + 'static) -> Step {
    crate::support::check(description, run)
}

const START: &str = "switch topology: peerdirect_importer loads, the NIC (virtio-net) is found, /dev/peerdirect0 opens as fd D and answers INFO";

/// Prints TAP for `--revoke`; success iff every step passed.
pub(crate) fn run(removal: Removal) -> ExitCode {
    let steps = steps(removal);
    let mut tap = Tap::plan(1 + steps.len());
    run_sequence(
        START,
        start(),
        &steps,
        |state| {
            println!(
                "# HBM {} (bus address {:#x}, {} MiB), NIC {}, removal by {removal:?}",
                state.info.pci_address,
                state.info.hbm_bus_addr,
                state.info.hbm_bytes / MIB,
                state.nic
            );
        },
        &mut |description, outcome| tap.report(description, outcome),
    );
    tap.finish()
}

fn start() -> Result<State, String> {
    let importer = TestModule::load_importer()?;
    let nic = find_nic()?;
    let device = Device::open_index(INDEX)
        .map_err(|err| format!("expected /dev/peerdirect0 to open, got {err}"))?;
    let info = device
        .info()
        .map_err(|err| format!("expected INFO on D to succeed, got {err}"))?;
    Ok(State {
        importer: Some(importer),
        nic,
        info,
        device: Some(device),
        bufs: Vec::new(),
        map: None,
        toucher: None,
        cached: None,
        unbinding: None,
        second: None,
    })
}

fn steps(removal: Removal) -> Vec<Step> {
    let mut steps = vec![
        gate(
            "three 2 MiB allocations on D, each exported RDWR: dma-bufs A, B, C",
            allocate_and_export,
        ),
        gate(
            "the NIC attaches and holds one mapping each: dynamic on A, revocable on B, pinned on C; each maps its range at HBM's bus address + offset, in one contiguous range",
            attach_held,
        ),
        gate(
            "A mapped writable by this process: a pattern written through it reads back",
            map_and_write,
        ),
        gate(
            "a child process (this program re-executed, A as its stdin) maps A read-only and reads the pattern",
            |s| {
                s.toucher = Some(spawn_toucher(s.bufs[A].dmabuf()?)?);
                Ok(())
            },
        ),
        gate(
            "a registration cache attached to D caches a registration of A; D's status page says live",
            cache_a,
        ),
        check(
            "a second attachment of B from the NIC, revocable and then pinned, each mapped a second time while its first mapping is mapped and unmapped twice, leaves the counts as they were: mappings_revocable 2, mappings_pinned 1",
            map_twice,
        ),
        check(
            "debugfs stats before removal: allocations 3, exports 3, mappings_revocable 2, mappings_pinned 1, present true",
            |_| {
                expect_stats(&[
                    ("allocations", "3"),
                    ("exports", "3"),
                    ("mappings_revocable", "2"),
                    ("mappings_pinned", "1"),
                    ("present", "true"),
                ])
            },
        ),
    ];
    if removal == Removal::Reset {
        steps.extend(reset_steps());
        return steps;
    }
    steps.push(match removal {
        Removal::Unbind => gate(
            format!("writing the device to {SYSFS_DRIVER}/unbind (in a thread) starts its removal: D polls POLLPRI | POLLHUP, and within {} s the kernel reports that removal waits for a pinned mapping", GOING_WAIT.as_secs()),
            |s| {
                let seen = waits_reports()?;
                s.unbinding = Some(Unbinding::start(&s.bdf()));
                expect_going(s.device()?, GOING_WAIT)?;
                expect_waiting(seen, GOING_WAIT)
            },
        ),
        Removal::Unplug => gate(
            format!(
                "after '{UNPLUG_REQUEST} {QEMU_HBM_ID}' the host starts hot-unplugging the HBM device: D polls POLLPRI | POLLHUP within {} s, and the kernel reports that removal waits for a pinned mapping",
                UNPLUG_WAIT.as_secs()
            ),
            unplug,
        ),
        Removal::Reset => unreachable!("a reset has steps of its own"),
    });
    steps.extend([
        check(
            "right after removal started, before any command on D: its status page says revoked, and the cache has dropped A's registration instead of handing it out (a miss; the new one is not cached)",
            cache_after_removal,
        ),
        check("after removal, /dev/peerdirect0 goes away", |_| {
            expect_node(false)
        }),
    ]);
    steps.extend(revoked_importers());
    steps.extend([
        check(
            "the pinned importer of C (no invalidate callback) keeps its mapping (mapped=1, pinned=1, invalidations=0), and the removal waits for it",
            |s| {
                let status = s.status(C)?;
                status.expect(&[("mapped", 1), ("pinned", 1), ("invalidations", 0)])?;
                s.expect_removal_pending()
            },
        ),
        check(
            "the kernel log says the removal waits, naming C's range, this process as its exporter and the NIC as its importer",
            |s| {
                expect_waits_log(&[
                    format!("[{:#x}+{LEN:#x}]", s.bufs[C].bar_offset),
                    format!("exported by pid {}", std::process::id()),
                    format!("mapped by {}", s.nic),
                ])
            },
        ),
        check(
            "a new attach (dynamic, and pinned) from the NIC to A, B or C fails with ENODEV",
            attach_fails,
        ),
        check(
            "DMA_BUF_IOCTL_SYNC start (begin CPU access) on A, B and C fails with ENODEV",
            sync_fails,
        ),
        check(
            "mmap of A, B and C (read-only and writable) fails with ENODEV",
            mmap_fails,
        ),
        child_faults("removal"),
        check(
            "INFO on D (opened before removal) fails with ENODEV",
            |s| expect_errno_of("INFO on D", s.device()?.info(), Errno::NODEV),
        ),
        check(
            "A, B and C stay valid: fstat gives their size, fdinfo is readable and says exp_name peerdirect",
            stay_valid,
        ),
        gate(
            "releasing the dynamic and revocable attachments and closing A, B, the mapping and D leaves the pinned importer and C's fd holding C's range; the removal still waits",
            |s| {
                release_all_but_pinned(s)?;
                s.expect_removal_pending()
            },
        ),
        gate(
            format!("release all: the pinned importer lets go of C (released=1), and then the removal completes within {} s", FINISH_WAIT.as_secs()),
            move |s| {
                let report = s.importer()?.command("release all")?;
                report.expect(&[("released", 1)])?;
                for buf in &mut s.bufs {
                    buf.id = None;
                }
                s.finish_removal(removal)
            },
        ),
    ]);
    if removal == Removal::Unbind {
        steps.extend([
            gate(
                format!("writing the device to {SYSFS_DRIVER}/bind rebinds it; /dev/peerdirect0 comes back and opens as fd E"),
                rebind,
            ),
            check(
                "debugfs stats after rebind: allocations 1 and allocated_bytes 2 MiB (C's range, kept for C's open dma-buf), mappings_pinned 0, exports 0, present true",
                |_| {
                    println!("# stats after rebind: {}", stats()?.summary());
                    expect_stats(&[
                        ("allocations", "1"),
                        ("allocated_bytes", &LEN.to_string()),
                        ("mappings_pinned", "0"),
                        ("exports", "0"),
                        ("present", "true"),
                    ])
                },
            ),
            check(
                "ALLOC of all of HBM on E fails with ENOMEM while C's dma-buf holds C's range",
                |s| {
                    let all = s.device()?.alloc(s.info.hbm_bytes, None);
                    expect_errno_of("ALLOC of all of HBM", all.map(drop), Errno::NOMEM)
                },
            ),
            check(
                "2 MiB allocations on E fill all of HBM but C's range, and none overlaps it",
                fill_around_pinned,
            ),
        ]);
    }
    if removal == Removal::Unbind {
        steps.push(check(
            "once C is closed, ALLOC of all of HBM on E succeeds at offset 0 (C's fd was the last holder of its range); freed, stats show allocations 0",
            alloc_all_after_release,
        ));
    }
    steps.push(check(format!("{IMPORTER_MODULE} unloads"), |s| {
        s.importer = None;
        expect_rmmod(IMPORTER_MODULE)
    }));
    steps.push(check(
        match removal {
            Removal::Unbind => {
                "with every fd closed, rmmod peerdirect succeeds and the module is gone"
            }
            Removal::Unplug => {
                "with every fd closed, rmmod peerdirect succeeds although its device was hot-unplugged, and the module is gone"
            }
            Removal::Reset => unreachable!("a reset has steps of its own"),
        },
        |s| {
            s.device = None;
            s.bufs.clear();
            expect_rmmod(MODULE)?;
            if module_loaded(MODULE)? {
                return Err(format!(
                    "expected {MODULE} gone from /proc/modules, got it listed"
                ));
            }
            Ok(())
        },
    ));
    steps
}

/// What removal or a reset did to the held importers of A and B: both told to let go, and
/// neither can map again.
fn revoked_importers() -> [Step; 3] {
    [
        check(
            "the dynamic importer of A was invalidated: invalidations >= 1, mapped=0",
            |s| {
                let status = s.status(A)?;
                expect_invalidated(&status)?;
                status.expect(&[("mapped", 0)])
            },
        ),
        check(
            "the revocable importer of B was revoked: invalidations >= 1, mapped=0, pinned=0, revoked=1",
            |s| {
                let status = s.status(B)?;
                expect_invalidated(&status)?;
                status.expect(&[("mapped", 0), ("pinned", 0), ("revoked", 1)])
            },
        ),
        check(
            "remap of A's (dynamic) and B's (revocable) attachments fails with ENODEV",
            remap_fails,
        ),
    ]
}

/// Begin-CPU-access (both directions) on A, B and C fails with `ENODEV`.
fn sync_fails(s: &mut State) -> Outcome {
    for buf in &s.bufs {
        for flags in [SyncFlags::START_READ, SyncFlags::START_WRITE] {
            expect_errno_of(
                &format!("SYNC {flags:?} on {}", buf.name),
                buf.dmabuf()?.sync(flags),
                Errno::NODEV,
            )?;
        }
    }
    Ok(())
}

/// mmap of A, B and C, read-only and writable, fails with `ENODEV`.
fn mmap_fails(s: &mut State) -> Outcome {
    for buf in &s.bufs {
        for writable in [false, true] {
            expect_errno_of(
                &format!("mmap of {} (writable: {writable})", buf.name),
                buf.dmabuf()?.mmap(writable),
                Errno::NODEV,
            )?;
        }
    }
    Ok(())
}

/// The child's mapping of A, made before `what` (removal, the reset), faults when touched.
fn child_faults(what: &str) -> Step {
    check(
        format!("the child's mapping of A, made before {what}, faults when touched: the child dies of SIGBUS"),
        |s| {
            let mut toucher = s.toucher.take().ok_or("the child is not running")?;
            let touched = touch(&mut toucher);
            let _ = fs::remove_file(&toucher.go);
            touched
        },
    )
}

/// How long a reset gets: it waits for no pinned importer.
const RESET_WAIT: Duration = Duration::from_secs(10);
/// What the kernel logs when a reset revokes exports a pinned importer still maps.
const RESET_PINNED_LOG: &str = "reset with 1 mapping(s) that cannot be revoked";

/// After the common first steps: the device is reset with A, B and C imported and A mapped.
fn reset_steps() -> Vec<Step> {
    let mut steps = vec![
        gate(
            format!("writing 1 to the device's sysfs reset (method: bus) returns within {} s although a pinned importer maps C", RESET_WAIT.as_secs()),
            reset,
        ),
        check(
            "D's status page counts the reset (resets 0 before, 1 after) and does not say revoked; INFO on D still answers",
            |s| {
                let status = s.device()?.status().ok_or("D has no status page")?;
                expect_eq("resets after", 1, status.resets())?;
                expect_eq("D revoked", false, status.revoked())?;
                let info = s.device()?.info().map_err(|err| {
                    format!("expected INFO on D to succeed after the reset, got {err}")
                })?;
                expect_eq("hbm_bytes", s.info.hbm_bytes, info.hbm_bytes)
            },
        ),
        check(
            "a second file of D, opened before the reset, polls POLLPRI alone (not POLLHUP) until a read returns the status page's struct (version 1, state 0, resets 1; a buffer under its 12 bytes: EINVAL); then no event",
            reset_polled,
        ),
        check(
            "the registration cache attached to D drops A's registration by itself within 5 s of the reset, with no request: the library's thread watching D saw the event (entries 0, one invalidation)",
            cache_dropped_by_watcher,
        ),
        check(
            "a request for A after the reset gets a new registration (a miss), not the dropped one; one invalidation in all",
            cache_after_reset,
        ),
    ];
    steps.extend(revoked_importers());
    steps.extend([
        check(
            "the pinned importer of C (no invalidate callback) keeps its mapping (mapped=1, pinned=1, invalidations=0), and the kernel log says the reset went on without it, naming C's range, this process as its exporter and the NIC as its importer",
            |s| {
                let status = s.status(C)?;
                status.expect(&[("mapped", 1), ("pinned", 1), ("invalidations", 0)])?;
                expect_log_report(RESET_PINNED_LOG, &[
                    format!("[{:#x}+{LEN:#x}]", s.bufs[C].bar_offset),
                    format!("exported by pid {}", std::process::id()),
                    format!("mapped by {}", s.nic),
                ])
            },
        ),
        check(
            "a new attachment (dynamic, and pinned) of A, B or C attaches but cannot map: ENODEV",
            |s| {
                for k in [A, B, C] {
                    for mode in [Mode::Dynamic, Mode::Pinned] {
                        s.attach(k, mode)?
                            .expect(&[("attach", 0), ("map", -ENODEV)])
                            .map_err(|err| format!("{} attach of {}: {err}", mode.name(), NAMES[k]))?;
                    }
                }
                Ok(())
            },
        ),
        check(
            "DMA_BUF_IOCTL_SYNC start on A, B and C, and their mmap (read-only and writable), fail with ENODEV",
            |s| sync_fails(s).and_then(|()| mmap_fails(s)),
        ),
        child_faults("the reset"),
        check(
            "debugfs stats after the reset: exports 3, mappings_revocable 0, mappings_pinned 1, resets 1, resetting 0, present true",
            |_| {
                expect_stats(&[
                    ("exports", "3"),
                    ("mappings_revocable", "0"),
                    ("mappings_pinned", "1"),
                    ("resets", "1"),
                    ("resetting", "0"),
                    ("present", "true"),
                ])
            },
        ),
        check(
            "after the reset a new export works: 2 MiB allocated and exported on D, the NIC maps it at HBM's bus address + offset, and a pattern written through its CPU mapping reads back",
            export_after_reset,
        ),
        gate(
            "release all: the importer lets go of its three held attachments (released=3); closing A, B, C, the mapping and D, mappings_pinned is 0",
            |s| {
                s.importer()?.command("release all")?.expect(&[("released", 3)])?;
                for buf in &mut s.bufs {
                    buf.id = None;
                }
                s.map = None;
                s.cached = None;
                s.bufs.clear();
                s.device = None;
                expect_stats(&[("mappings_pinned", "0")])
            },
        ),
    ]);
    steps.push(check(format!("{IMPORTER_MODULE} unloads"), |s| {
        s.importer = None;
        expect_rmmod(IMPORTER_MODULE)
    }));
    steps.push(check(
        "with every fd closed, rmmod peerdirect succeeds after the reset, and the module is gone",
        |_| {
            expect_rmmod(MODULE)?;
            if module_loaded(MODULE)? {
                return Err(format!(
                    "expected {MODULE} gone from /proc/modules, got it listed"
                ));
            }
            Ok(())
        },
    ));
    steps
}

/// Resets the device through sysfs, in a thread so that a reset that never returns fails
/// after [`RESET_WAIT`] instead of hanging the guest.
fn reset(s: &mut State) -> Outcome {
    let dir = format!("{SYSFS_PCI_DEVICES}/{}", s.bdf());
    let method = fs::read_to_string(format!("{dir}/reset_method"))
        .map_err(|err| format!("read {dir}/reset_method: {err}"))?;
    expect_eq("reset_method", "bus", method.trim())?;
    let status = s.device()?.status().ok_or("D has no status page")?;
    expect_eq("resets before", 0, status.resets())?;
    let path = peerdirect::device_path(INDEX);
    let second = File::open(&path).map_err(|err| format!("open {}: {err}", path.display()))?;
    expect_eq(
        "a new file's events before the reset",
        PollFlags::empty(),
        events(&second)?,
    )?;
    s.second = Some(second);
    let (done, finished) = std::sync::mpsc::channel();
    let path = format!("{dir}/reset");
    std::thread::spawn(move || {
        let _ = done.send(write_sysfs(&path, "1"));
    });
    finished
        .recv_timeout(RESET_WAIT)
        .map_err(|_| format!("the reset did not return within {} s", RESET_WAIT.as_secs()))?
}

/// A new export after the reset maps for the NIC and for the CPU.
fn export_after_reset(s: &mut State) -> Outcome {
    // Field by field: the allocation borrows the device while the importer is used.
    let device = s
        .device
        .as_ref()
        .ok_or("no /dev/peerdirect0 file is open")?;
    let importer = s
        .importer
        .as_mut()
        .ok_or("the importer's command file is not open")?;
    let allocation = device
        .alloc(LEN, None)
        .map_err(|err| format!("expected ALLOC after the reset to succeed, got {err}"))?;
    let dmabuf = allocation
        .export(0, 0, RW)
        .map_err(|err| format!("expected EXPORT after the reset to succeed, got {err}"))?;
    let expected = s.info.hbm_bus_addr + allocation.hbm_offset();
    let line = format!(
        "fd={} dev={} mode=dynamic",
        dmabuf.as_fd().as_raw_fd(),
        s.nic
    );
    let report = importer.command(&line)?;
    report.expect(&[("attach", 0), ("map", 0), ("contiguous", 1)])?;
    expect_eq("dma_first", expected, report.uint("dma_first")?)?;
    let mut map = dmabuf
        .mmap(true)
        .map_err(|err| format!("expected mmap after the reset to succeed, got {err}"))?;
    let mut data = vec![0; map.length()];
    pattern::fill(SEED, 0, &mut data);
    map.write(0, &data);
    let mut back = vec![0; map.length()];
    map.read(0, &mut back);
    expect_pattern(&back)
}

fn allocate_and_export(s: &mut State) -> Outcome {
    let device = s.device()?;
    let mut bufs = Vec::new();
    for (name, mode) in NAMES.into_iter().zip(MODES) {
        let allocation = device
            .alloc(LEN, None)
            .map_err(|err| format!("expected ALLOC for {name} to succeed, got {err}"))?;
        let dmabuf = allocation
            .export(0, 0, RW)
            .map_err(|err| format!("expected EXPORT of {name} to succeed, got {err}"))?;
        let bar_offset = allocation.hbm_offset();
        // Owned by D from now on: freed when D is closed, kept by the dma-buf meanwhile.
        allocation.into_handle();
        bufs.push(Buf {
            name,
            mode,
            dmabuf: Some(dmabuf),
            bar_offset,
            id: None,
        });
    }
    s.bufs = bufs;
    Ok(())
}

fn attach_held(s: &mut State) -> Outcome {
    for k in [A, B, C] {
        let buf = &s.bufs[k];
        let line = format!(
            "fd={} dev={} hbm={} mode={} hold=1",
            buf.fd()?,
            s.nic,
            s.info.pci_address,
            buf.mode.name()
        );
        let (name, mode) = (buf.name, buf.mode);
        let expected = s.info.hbm_bus_addr + buf.bar_offset;
        let report = s.importer()?.command(&line)?;
        let within = |r: Outcome| r.map_err(|err| format!("{name} ({line}): {err}"));
        if report.int("p2p_distance")? < 0 {
            return within(Err(format!(
                "the kernel refuses P2P between HBM and NIC: not the switch topology\n{}",
                report.summary()
            )));
        }
        let mut ok = vec![("attach", 0), ("map", 0), ("contiguous", 1)];
        if mode != Mode::Dynamic {
            ok.push(("pin", 0));
        }
        within(report.expect(&ok))?;
        within(expect_eq("dma_first", expected, report.uint("dma_first")?))?;
        within(expect_eq("dma_total", LEN, report.uint("dma_total")?))?;
        s.bufs[k].id = Some(report.uint("id")?);
    }
    Ok(())
}

fn cache_a(s: &mut State) -> Outcome {
    let device = s.device()?;
    if device.status().is_none() {
        return Err("D has no status page (mmap of /dev/peerdirect0 failed)".to_owned());
    }
    expect_eq("D revoked", false, device.is_revoked())?;
    let cache = Arc::new(RegCache::new(CacheLimits::default()));
    cache.attach(device);
    let export = device
        .export_id(s.bufs[A].dmabuf()?)
        .map_err(|errno| format!("fstat of A: {errno}"))?;
    let mut cached = Cached {
        cache,
        registrar: Arc::new(Numbering::default()),
        export,
        serial: 0,
    };
    cached.serial = *cached.get()?.mr();
    expect_eq(
        "second request's serial (a hit)",
        cached.serial,
        *cached.get()?.mr(),
    )?;
    expect_eq("hits", 1, cached.cache.stats().hits)?;
    s.cached = Some(cached);
    Ok(())
}

fn cache_after_removal(s: &mut State) -> Outcome {
    expect_eq("D revoked", true, s.device()?.is_revoked())?;
    // A's entry was dropped once: by the thread that watches D (it polled POLLPRI), or by
    // this request, whichever came first.
    let again = cache_dropped_a(s, "revoked")?;
    expect_eq(
        "uncached",
        Some(peerdirect::cache::Uncached::Invalidated),
        again.uncached(),
    )
}

fn cache_after_reset(s: &mut State) -> Outcome {
    cache_dropped_a(s, "reset").map(drop)
}

/// The events `file` polls now (`POLLPRI` and what always comes: `POLLHUP`, `POLLERR`).
fn events(file: &File) -> Result<PollFlags, String> {
    let mut fds = [PollFd::new(file, PollFlags::PRI)];
    poll(&mut fds, Some(&Timespec::default())).map_err(|err| format!("poll: {err}"))?;
    Ok(fds[0].revents())
}

/// The second file of D says there was a reset, until it reads the status.
fn reset_polled(s: &mut State) -> Outcome {
    // Taken: closed whatever the outcome, so that the module can unload at the end.
    let file = s.second.take().ok_or("no second file of D")?;
    let file = &file;
    expect_eq("events after the reset", PollFlags::PRI, events(file)?)?;
    let mut short = [0u8; 11];
    match rustix::io::read(file, &mut short) {
        Err(Errno::INVAL) => {}
        other => {
            return Err(format!(
                "a read of 11 bytes: expected EINVAL, got {other:?}"
            ))
        }
    }
    expect_eq("events after a refused read", PollFlags::PRI, events(file)?)?;
    let mut status = [0u8; 16];
    let n = rustix::io::read(file, &mut status).map_err(|err| format!("read: {err}"))?;
    expect_eq("bytes read", 12, n)?;
    let word =
        |i: usize| u32::from_ne_bytes([status[i], status[i + 1], status[i + 2], status[i + 3]]);
    expect_eq(
        "(version, state, resets)",
        (1, 0, 1),
        (word(0), word(4), word(8)),
    )?;
    expect_eq("events once read", PollFlags::empty(), events(file)?)
}

/// The cache let go of A's registration with nobody asking it for one.
fn cache_dropped_by_watcher(s: &mut State) -> Outcome {
    let cached = s.cached.as_ref().ok_or("no cache")?;
    let dropped = wait_for(Duration::from_secs(5), || {
        let stats = cached.cache.stats();
        stats.entries == 0 && stats.invalidations == 1
    });
    let stats = cached.cache.stats();
    dropped.map_err(|secs| {
        format!(
            "expected no entry and one invalidation within {secs} s, got {} and {}",
            stats.entries, stats.invalidations
        )
    })?;
    expect_eq("hits", 1, stats.hits)
}

/// A request for A after the device was `what` (revoked, reset) gets a new registration, not
/// the cached one, which was dropped once: one hit and one invalidation since the cache was
/// made. Returns the new registration.
fn cache_dropped_a(s: &State, what: &str) -> Result<peerdirect::Registration<Numbering>, String> {
    let cached = s.cached.as_ref().ok_or("no cache")?;
    let again = cached.get()?;
    let after = cached.cache.stats();
    if *again.mr() == cached.serial {
        return Err(format!(
            "the cache handed out A's registration {} after the device was {what}",
            cached.serial
        ));
    }
    expect_eq("hits since the cache was made", 1, after.hits)?;
    expect_eq(
        "invalidations since the cache was made",
        1,
        after.invalidations,
    )?;
    Ok(again)
}

fn map_and_write(s: &mut State) -> Outcome {
    let dmabuf = s.bufs[A].dmabuf()?;
    let mut map = dmabuf
        .mmap(true)
        .map_err(|err| format!("expected mmap of A to succeed, got {err}"))?;
    let mut data = vec![0; map.length()];
    pattern::fill(SEED, 0, &mut data);
    sync(dmabuf, SyncFlags::START_WRITE)?;
    map.write(0, &data);
    sync(dmabuf, SyncFlags::END_WRITE)?;
    let mut back = vec![0; map.length()];
    map.read(0, &mut back);
    expect_pattern(&back)?;
    s.map = Some(map);
    Ok(())
}

/// Asks the host to hot-unplug the HBM device and waits until its removal has started.
fn unplug(s: &mut State) -> Outcome {
    let seen = waits_reports()?;
    request_unplug(QEMU_HBM_ID)?;
    expect_going(s.device()?, UNPLUG_WAIT)
        .map_err(|err| format!("{err} (does the host harness run with --hotplug?)"))?;
    expect_waiting(seen, GOING_WAIT)
}

fn remap_fails(s: &mut State) -> Outcome {
    for k in [A, B] {
        let id = s.bufs[k].id()?;
        let report = s.importer()?.command(&format!("remap id={id}"))?;
        report
            .expect(&[("map", -ENODEV)])
            .map_err(|err| format!("remap of {}: {err}", NAMES[k]))?;
    }
    Ok(())
}

fn attach_fails(s: &mut State) -> Outcome {
    for k in [A, B, C] {
        for mode in [Mode::Dynamic, Mode::Pinned] {
            let report = s.attach(k, mode)?;
            report
                .expect(&[("attach", -ENODEV)])
                .map_err(|err| format!("{} attach of {}: {err}", mode.name(), NAMES[k]))?;
        }
    }
    Ok(())
}

fn stay_valid(s: &mut State) -> Outcome {
    for buf in &s.bufs {
        let name = buf.name;
        let dup = buf
            .dmabuf()?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|err| format!("expected {name}'s fd to duplicate, got {err}"))?;
        let meta = File::from(dup)
            .metadata()
            .map_err(|err| format!("expected fstat of {name} to succeed, got {err}"))?;
        expect_eq(&format!("fstat size of {name}"), LEN, meta.len())?;
        let path = format!("/proc/self/fdinfo/{}", buf.fd()?);
        let fdinfo = fs::read_to_string(&path)
            .map_err(|err| format!("expected to read {path}, got {err}"))?;
        let size = LEN.to_string();
        for (key, expected) in [("exp_name", "peerdirect"), ("size", size.as_str())] {
            expect_eq(
                &format!("fdinfo {key} of {name}"),
                Some(expected),
                fdinfo_value(&fdinfo, key),
            )?;
        }
    }
    Ok(())
}

fn release_all_but_pinned(s: &mut State) -> Outcome {
    for k in [A, B] {
        let id = s.bufs[k].id()?;
        let report = s.importer()?.command(&format!("release id={id}"))?;
        report
            .expect(&[("mapped", 0)])
            .map_err(|err| format!("release of {}: {err}", NAMES[k]))?;
        s.bufs[k].id = None;
    }
    s.map = None;
    for k in [A, B] {
        s.bufs[k].dmabuf = None;
    }
    s.device = None;
    Ok(())
}

fn rebind(s: &mut State) -> Outcome {
    write_sysfs(&format!("{SYSFS_DRIVER}/bind"), &s.bdf())?;
    expect_bound(&s.bdf(), true)?;
    expect_node(true)?;
    let device = Device::open_index(INDEX)
        .map_err(|err| format!("expected /dev/peerdirect0 to open, got {err}"))?;
    let info = device
        .info()
        .map_err(|err| format!("expected INFO on E to succeed, got {err}"))?;
    expect_eq("hbm_bytes", s.info.hbm_bytes, info.hbm_bytes)?;
    s.device = Some(device);
    Ok(())
}

/// Allocates 2 MiB ranges until HBM is full: all of it but C's range, never overlapping it.
fn fill_around_pinned(s: &mut State) -> Outcome {
    let device = s.device()?;
    let c = s.bufs[C].bar_offset;
    let room = s.info.hbm_bytes / LEN - 1;
    let mut allocations = Vec::new();
    loop {
        let allocation = match device.alloc(LEN, None) {
            Ok(allocation) => allocation,
            Err(err) if err.errno() == Some(Errno::NOMEM) => break,
            Err(err) => {
                return Err(format!(
                    "expected ALLOC to succeed or fail with ENOMEM, got {err}"
                ))
            }
        };
        let (offset, len) = (allocation.hbm_offset(), allocation.length());
        if offset < c + LEN && c < offset + len {
            return Err(format!(
                "allocation {} at {offset:#x}+{len:#x} overlaps C's range at {c:#x}+{LEN:#x}, which the pinned importer still maps",
                allocations.len() + 1
            ));
        }
        allocations.push(allocation);
        if allocations.len() as u64 > room {
            return Err(format!(
                "expected at most {room} allocations of 2 MiB, got more"
            ));
        }
    }
    expect_eq(
        "allocations of 2 MiB that fit",
        room,
        allocations.len() as u64,
    )
}

fn alloc_all_after_release(s: &mut State) -> Outcome {
    s.bufs[C].dmabuf = None;
    let bytes = s.info.hbm_bytes;
    {
        let all = s
            .device()?
            .alloc(bytes, None)
            .map_err(|err| format!("expected ALLOC of all {bytes} bytes to succeed, got {err}"))?;
        expect_eq("hbm_offset", 0, all.hbm_offset())?;
        all.free()
            .map_err(|err| format!("expected FREE to succeed, got {err}"))?;
    }
    s.device = None;
    expect_stats(&[("allocations", "0"), ("allocated_bytes", "0")])
}

/// Starts the child that maps A and waits for the go signal; returns once it has mapped A and
/// read the pattern.
fn spawn_toucher(dmabuf: &DmaBuf) -> Result<Toucher, String> {
    let go = PathBuf::from(format!("/tmp/peerdirect-revoke-go-{}", std::process::id()));
    let _ = fs::remove_file(&go);
    let stdin = dmabuf
        .as_fd()
        .try_clone_to_owned()
        .map_err(|err| format!("cannot duplicate A's fd: {err}"))?;
    let mut child = Command::new("/proc/self/exe")
        .arg(TOUCH_FLAG)
        .arg(&go)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|err| format!("cannot start the child: {err}"))?;
    let mut stdout = BufReader::new(child.stdout.take().ok_or("the child has no stdout")?);
    let mut line = String::new();
    let read = stdout.read_line(&mut line);
    if line.trim() == CHILD_READY {
        return Ok(Toucher { child, stdout, go });
    }
    let _ = child.kill();
    let status = child.wait();
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    Err(format!(
        "expected the child to say '{CHILD_READY}', got {:?} ({read:?}), then {rest:?}; it ended with {status:?}",
        line.trim()
    ))
}

/// Tells the child to touch its mapping and checks that it dies of SIGBUS.
fn touch(toucher: &mut Toucher) -> Outcome {
    File::create(&toucher.go)
        .map_err(|err| format!("cannot create {}: {err}", toucher.go.display()))?;
    let status = toucher
        .child
        .wait()
        .map_err(|err| format!("cannot wait for the child: {err}"))?;
    let mut said = String::new();
    let _ = toucher.stdout.read_to_string(&mut said);
    match status.signal() {
        Some(SIGBUS) => Ok(()),
        Some(signal) => Err(format!(
            "expected the child to die of SIGBUS (7), got signal {signal}; it said {:?}",
            said.trim()
        )),
        None => Err(format!(
            "expected the child to die of SIGBUS (7), got {status}; it said {:?}",
            said.trim()
        )),
    }
}

/// The child (`--revoke-touch GO_FILE`): maps the dma-buf on its stdin and checks the pattern,
/// says [`CHILD_READY`], waits for GO_FILE to exist, then reads through the mapping again. After
/// a removal that read must kill it with SIGBUS; if it survives, it says what it read and exits
/// with 2 (3 on any other problem).
pub(crate) fn touch_child(go: &Path) -> ExitCode {
    match touch_child_inner(go) {
        Ok(word) => {
            println!("survived: read {word:02x?} after the go signal");
            ExitCode::from(2)
        }
        Err(err) => {
            println!("error: {err}");
            ExitCode::from(3)
        }
    }
}

fn touch_child_inner(go: &Path) -> Result<[u8; 8], String> {
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|err| format!("cannot duplicate stdin: {err}"))?;
    map_wait_touch(DmaBuf::from_fd(fd).map_err(|err| err.to_string())?, go)
}

/// The child's work on `dmabuf`: what it read when told to touch its mapping.
fn map_wait_touch(dmabuf: DmaBuf, go: &Path) -> Result<[u8; 8], String> {
    let map = dmabuf
        .mmap(false)
        .map_err(|err| format!("mmap failed: {err}"))?;
    drop(dmabuf);
    let mut data = vec![0; map.length()];
    map.read(0, &mut data);
    expect_pattern(&data)?;
    println!("{CHILD_READY}");
    std::io::stdout()
        .flush()
        .map_err(|err| format!("cannot flush stdout: {err}"))?;
    wait_for(CHILD_WAIT, || go.exists())
        .map_err(|waited| format!("no go signal ({}) within {waited} s", go.display()))?;
    let mut word = [0; 8];
    map.read(0, &mut word);
    Ok(word)
}

/// Checks the stats' values of `keys` (the whole file on a mismatch).
/// Two mappings on one attachment: the dma-buf core keeps no sg table per attachment, so each
/// map reaches the exporter, which must undo each unmap as it counted its map. (Counted by one
/// bit per attachment, the second unmap of a revocable importer was taken for a pinned one:
/// `mappings_pinned` wrapped below zero, and removal then waited forever.)
fn map_twice(s: &mut State) -> Outcome {
    for mode in [Mode::Revocable, Mode::Pinned] {
        let line = format!(
            "fd={} dev={} mode={} maps=2",
            s.bufs[B].fd()?,
            s.nic,
            mode.name()
        );
        let report = s.importer()?.command(&line)?;
        report.expect(&[("attach", 0), ("map", 0), ("map2", 0)])?;
        expect_eq(
            &format!("{}: map2_nents", mode.name()),
            report.int("nents")?,
            report.int("map2_nents")?,
        )?;
        expect_stats(&[("mappings_revocable", "2"), ("mappings_pinned", "1")])
            .map_err(|err| format!("after the {} importer's two maps: {err}", mode.name()))?;
    }
    Ok(())
}

fn expect_stats(keys: &[(&str, &str)]) -> Outcome {
    let stats = stats()?;
    for &(key, expected) in keys {
        expect_eq(key, expected, stats.get(key)?)
            .map_err(|err| format!("{err}\n{}", stats.summary()))?;
    }
    Ok(())
}

fn expect_invalidated(status: &Report) -> Outcome {
    let invalidations = status.int("invalidations")?;
    if invalidations >= 1 {
        Ok(())
    } else {
        Err(format!(
            "invalidations: expected >= 1, got {invalidations}\n{}",
            status.summary()
        ))
    }
}

fn expect_pattern(data: &[u8]) -> Outcome {
    match pattern::first_mismatch(SEED, 0, data) {
        None => Ok(()),
        Some(m) => Err(format!(
            "expected pattern {SEED:#x}, got {:#04x} instead of {:#04x} at byte {:#x}",
            m.found, m.expected, m.offset
        )),
    }
}

fn sync(dmabuf: &DmaBuf, flags: SyncFlags) -> Outcome {
    dmabuf
        .sync(flags)
        .map_err(|err| format!("expected SYNC {flags:?} to succeed, got {err}"))
}

/// Checks whether `bdf` is bound to peerdirect.
fn expect_bound(bdf: &str, bound: bool) -> Outcome {
    let link = format!("{SYSFS_PCI_DEVICES}/{bdf}/driver");
    let driver = fs::read_link(&link)
        .ok()
        .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()));
    if (driver.as_deref() == Some(MODULE)) == bound {
        return Ok(());
    }
    let got = driver.map_or_else(|| "no driver".to_owned(), |d| format!("driver {d}"));
    let expected = if bound { "bound to" } else { "not bound to" };
    Err(format!("expected {bdf} {expected} {MODULE}, got {got}"))
}

/// Waits for /dev/peerdirect0 to appear (or to go away) within [`SETTLE`].
fn expect_node(exists: bool) -> Outcome {
    let node = peerdirect::device_path(INDEX);
    wait_for(SETTLE, || node.exists() == exists).map_err(|waited| {
        let (expected, got) = if exists {
            ("appear", "absent")
        } else {
            ("go away", "still present")
        };
        format!(
            "expected {} to {expected} within {waited} s, got it {got}",
            node.display()
        )
    })
}

/// Runs `rmmod name`, expecting success.
fn expect_rmmod(name: &str) -> Outcome {
    let output = Command::new("rmmod")
        .arg(name)
        .output()
        .map_err(|err| format!("cannot run rmmod: {err}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "expected rmmod {name} to succeed, got {} ({})",
        String::from_utf8_lossy(&output.stderr).trim(),
        output.status
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn unbind_reset_and_unplug_have_their_own_steps() {
        let unbind = steps(Removal::Unbind);
        let unplug = steps(Removal::Unplug);
        assert!(unbind.len() > unplug.len());
        assert!(unbind
            .iter()
            .any(|s| s.description.contains("/bind rebinds")));
        assert!(!unplug.iter().any(|s| s.description.contains("rebinds")));
        assert!(unplug
            .iter()
            .any(|s| s.description.contains("@@peerdirect-unplug hbm0")));
        let reset = steps(Removal::Reset);
        assert!(reset.iter().any(|s| s.description.contains("sysfs reset")));
        assert!(!reset
            .iter()
            .any(|s| s.description.contains("rebinds") || s.description.contains("@@peerdirect")));
        for steps in [&unbind, &unplug, &reset] {
            assert!(steps
                .last()
                .unwrap()
                .description
                .contains("rmmod peerdirect"));
        }
    }

    #[test]
    fn revoke_takes_a_removal() {
        let parse = |args: &[&str]| crate::Args::try_parse_from(args);
        assert!(parse(&["peerdirect-guest-tests", "--revoke"]).is_err());
        assert!(parse(&["peerdirect-guest-tests", "--revoke", "yank"]).is_err());
        assert!(parse(&[
            "peerdirect-guest-tests",
            "--revoke",
            "unbind",
            "--lifecycle"
        ])
        .is_err());
        let args = parse(&["peerdirect-guest-tests", "--revoke", "unplug"]).unwrap();
        assert_eq!(args.revoke, Some(Removal::Unplug));
    }

    /// A regular file stands in for A: it maps, shows the pattern and is never revoked, so the
    /// child's touch reads the pattern's first bytes.
    #[test]
    fn the_child_maps_checks_the_pattern_and_touches_on_go() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("peerdirect-revoke-test-{}", std::process::id()));
        let go = dir.join(format!("peerdirect-revoke-test-go-{}", std::process::id()));
        let mut data = vec![0; 8192];
        pattern::fill(SEED, 0, &mut data);
        fs::write(&path, &data).unwrap();
        File::create(&go).unwrap();
        let open = || DmaBuf::from_fd(File::open(&path).unwrap().into()).unwrap();
        assert_eq!(
            map_wait_touch(open(), &go),
            Ok(data[..8].try_into().unwrap())
        );
        fs::remove_file(&go).unwrap();
        data[100] ^= 1;
        fs::write(&path, &data).unwrap();
        let err = map_wait_touch(open(), &go).unwrap_err();
        assert!(err.contains("at byte 0x64"), "{err}");
        fs::remove_file(&path).unwrap();
    }
}
