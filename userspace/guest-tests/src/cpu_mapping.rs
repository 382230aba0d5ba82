//! `--cpu-mapping`: CPU mappings of dma-bufs are filled at fault time with the largest page
//! table entries the alignment allows (Documentation/exporter.md): one PUD entry for 1 GiB,
//! one PMD entry per 2 MiB, else 4 KiB PTEs. Told apart by counting this thread's page faults
//! (`getrusage`) while touching every page; needs `qemu/run --hbm 2G`.
//!
//! The entries themselves are read back from the page table (tests/kmod/peerdirect_pte.c):
//! their size, their physical address, and the memory type the CPU uses, which must be
//! write-combining: on x86 the insert functions replace the mapping's requested type by the
//! type reserved for the range, so the exporter reserves write-combining for the BAR.
//!
//! A write must also complete where the kernel first put a read-only huge entry and then
//! allows writing: after `mprotect` from read-only to read-write, and once the mapping is
//! tracked for soft-dirty writes (`echo 4 > /proc/PID/clear_refs`, as CRIU's pre-dump does;
//! on kernels with `CONFIG_MEM_SOFT_DIRTY`). There the write faults on a present entry, and
//! the fault handler must make that entry writable, else the write faults forever.

use std::os::fd::AsFd;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use peerdirect::{Allocation, Device, DmaBuf, ExportFlags};
use rustix::mm::{MapFlags, ProtFlags};

use crate::support::{expect_eq, Outcome, Tap};
use crate::testmod::TestModule;
use crate::INDEX;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const PAGE: u64 = 4 * KIB;

/// A dma-buf mapped at a chosen alignment of the virtual address (plus `skew`).
struct Placed {
    addr: usize,
    len: usize,
    /// The whole reservation, unmapped on drop.
    reserved: (usize, usize),
}

impl Placed {
    fn new(dmabuf: &DmaBuf, align: u64, skew: u64) -> Result<Self, String> {
        let len = dmabuf.length() as usize;
        let span = len + (align + skew) as usize;
        // SAFETY: a new inaccessible reservation chosen by the kernel; nothing else uses it.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                span,
                ProtFlags::empty(),
                MapFlags::PRIVATE,
            )
        }
        .map_err(|e| format!("cannot reserve {span} bytes: {e}"))? as usize;
        let addr = base.div_ceil(align as usize) * align as usize + skew as usize;
        // SAFETY: `addr..addr + len` lies inside the reservation made above, which this value
        // owns; MAP_FIXED replaces that part of it.
        let mapped = unsafe {
            rustix::mm::mmap(
                addr as *mut _,
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                dmabuf.as_fd(),
                0,
            )
        };
        let placed = Self {
            addr,
            len,
            reserved: (base, span),
        };
        mapped.map_err(|e| format!("mmap of {len} bytes at {addr:#x} failed: {e}"))?;
        Ok(placed)
    }

    /// Minor faults of this thread while reading one word at each of `offsets`.
    fn faults_touching(&self, offsets: impl Iterator<Item = u64>) -> u64 {
        let before = minor_faults();
        for offset in offsets {
            assert!((offset as usize) < self.len);
            // SAFETY: inside the mapping, which is readable and stays mapped while `self` lives.
            unsafe { std::ptr::read_volatile((self.addr + offset as usize) as *const u64) };
        }
        minor_faults() - before
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        // SAFETY: the reservation (and the dma-buf mapping inside it) is ours alone.
        let _ = unsafe { rustix::mm::munmap(self.reserved.0 as *mut _, self.reserved.1) };
    }
}

fn minor_faults() -> u64 {
    // SAFETY: a zeroed rusage is valid, and getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    usage.ru_minflt as u64
}

/// Every page of the first 2 MiB, then one word per 2 MiB of the rest.
fn touch_plan(len: u64) -> impl Iterator<Item = u64> {
    (0..2 * MIB.min(len))
        .step_by(PAGE as usize)
        .chain((2 * MIB..len).step_by(2 * MIB as usize))
}

/// An allocation of `len` bytes of HBM aligned to `align` (at least 2 MiB, so that huge entries
/// can map it), exported whole, read-write.
fn exported(device: &Device, len: u64, align: u64) -> Result<(Allocation<'_>, DmaBuf), String> {
    let alloc = device
        .alloc(len, Some(align.max(2 * MIB)))
        .map_err(|e| format!("ALLOC of {len} bytes aligned to {align}: {e}"))?;
    let dmabuf = alloc
        .export(0, 0, ExportFlags::RDWR)
        .map_err(|e| format!("EXPORT: {e}"))?;
    Ok((alloc, dmabuf))
}

fn case(device: &Device, len: u64, align: u64, skew: u64, most: u64, least: u64) -> Outcome {
    let (_alloc, dmabuf) = exported(device, len, align)?;
    let placed = Placed::new(&dmabuf, align, skew)?;
    let faults = placed.faults_touching(touch_plan(len));
    println!(
        "# {} MiB at a virtual address aligned to {} KiB{}: {faults} faults",
        len / MIB,
        align / KIB,
        if skew > 0 { " + 4 KiB" } else { "" }
    );
    if (least..=most).contains(&faults) {
        Ok(())
    } else {
        Err(format!(
            "expected {least} to {most} page faults touching it, got {faults}"
        ))
    }
}

/// The page-table entry behind each of a 4 KiB-, a 2 MiB- and a 1 GiB-aligned mapping, once
/// touched: its size, writable, at the BAR's physical address plus the allocation's offset
/// (x86: physical and bus addresses of a BAR are the same), and write-combining with PAT on.
fn entries_write_combining(device: &Device) -> Outcome {
    let mut pte = TestModule::load_pte()?;
    let bar = device
        .info()
        .map_err(|e| format!("INFO: {e}"))?
        .hbm_bus_addr;
    for (len, align, skew, size) in [
        (4 * MIB, 2 * MIB, PAGE, PAGE),
        (4 * MIB, 2 * MIB, 0, 2 * MIB),
        (GIB, GIB, 0, GIB),
    ] {
        let (alloc, dmabuf) = exported(device, len, align)?;
        let placed = Placed::new(&dmabuf, align, skew)?;
        placed.faults_touching([0].into_iter());
        let report = pte.command(&format!("addr={:#x}", placed.addr))?;
        let what = |key: &str| format!("{} MiB mapped at + {skew:#x}: {key}", len / MIB);
        println!("# {}: {}", what("entry"), report.summary());
        report.expect(&[("mapped", 1), ("writable", 1), ("pat", 1)])?;
        expect_eq(&what("size"), size, report.uint("size")?)?;
        expect_eq(
            &what("phys"),
            bar + alloc.hbm_offset(),
            report.uint("phys")?,
        )?;
        expect_eq(&what("cachemode"), "wc", report.get("cachemode")?)?;
    }
    Ok(())
}

/// How long a write through a fresh mapping gets before it counts as stuck in its fault.
const WRITE_WAIT: Duration = Duration::from_secs(10);

/// Writes `value` at `addr` in a thread and waits up to [`WRITE_WAIT`] for it: a write that
/// faults forever (the fault handler returning without making the entry writable) keeps its
/// thread in a fault loop, which the process's exit ends.
fn write_within_limit(addr: usize, value: u64) -> Outcome {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: the caller's mapping, readable and writable, stays mapped until this
        // function returns (or, if the write never completes, until the process exits).
        unsafe { std::ptr::write_volatile(addr as *mut u64, value) };
        let _ = done.send(());
    });
    finished.recv_timeout(WRITE_WAIT).map_err(|_| {
        format!(
            "the write at {addr:#x} did not complete within {} s: its page fault repeats without making the entry writable",
            WRITE_WAIT.as_secs()
        )
    })?;
    // SAFETY: as above; the write completed.
    let read = unsafe { std::ptr::read_volatile(addr as *const u64) };
    if read == value {
        Ok(())
    } else {
        Err(format!(
            "wrote {value:#x} at {addr:#x}, read back {read:#x}"
        ))
    }
}

/// A 4 MiB dma-buf mapped read-write at a 2 MiB-aligned address (PMD entries).
fn placed_pmd(device: &Device) -> Result<(Placed, DmaBuf), String> {
    let len = 4 * MIB;
    let (_alloc, dmabuf) = exported(device, len, 2 * MIB)?;
    Ok((Placed::new(&dmabuf, 2 * MIB, 0)?, dmabuf))
}

/// Read-only first (a read faults in a read-only PMD entry), then read-write: a write to the
/// same 2 MiB completes.
fn write_after_mprotect(device: &Device) -> Outcome {
    let (placed, _dmabuf) = placed_pmd(device)?;
    let protect = |flags| {
        // SAFETY: the range is the placed mapping, which this function owns.
        unsafe { rustix::mm::mprotect(placed.addr as *mut _, placed.len, flags) }
            .map_err(|e| format!("mprotect to {flags:?}: {e}"))
    };
    protect(rustix::mm::MprotectFlags::READ)?;
    let faults = placed.faults_touching([0, 2 * MIB].into_iter());
    println!("# read-only: reading a word in each 2 MiB took {faults} faults");
    protect(rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE)?;
    writes_within_limit(placed, 0x5eed_0001)
}

/// [`write_within_limit`] of `value` in the first and second 2 MiB of `placed`. Should a
/// write not complete, the mapping is left in place for the thread stuck in its fault (else
/// that thread would die of SIGSEGV once it is unmapped).
fn writes_within_limit(placed: Placed, value: u64) -> Outcome {
    let result = write_within_limit(placed.addr + 8, value)
        .and_then(|()| write_within_limit(placed.addr + 2 * MIB as usize + 8, value + 1));
    if result.is_err() {
        std::mem::forget(placed);
    }
    result
}

/// Whether the kernel tracks soft-dirty pages (`CONFIG_MEM_SOFT_DIRTY`): a page this process
/// just wrote has bit 55 set in `/proc/self/pagemap` only then.
fn soft_dirty_tracked() -> Result<bool, String> {
    let page = Box::new([1u8; PAGE as usize * 2]);
    let addr = (page.as_ptr() as u64).div_ceil(PAGE) * PAGE;
    // SAFETY: inside `page`, which is ours and writable.
    unsafe { std::ptr::write_volatile(addr as *mut u8, 2) };
    let pagemap = std::fs::File::open("/proc/self/pagemap")
        .map_err(|e| format!("/proc/self/pagemap: {e}"))?;
    let mut entry = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&pagemap, &mut entry, addr / PAGE * 8)
        .map_err(|e| format!("read /proc/self/pagemap: {e}"))?;
    drop(page);
    Ok(u64::from_ne_bytes(entry) >> 55 & 1 == 1)
}

/// With soft-dirty tracking cleared (`clear_refs` 4), the mapping needs write notification:
/// a write to each untouched 2 MiB completes. Fails on a kernel that does not track soft-dirty
/// pages, where it could not fail otherwise (the test kernels and Debian's have
/// `CONFIG_MEM_SOFT_DIRTY`).
fn write_after_clear_refs(device: &Device) -> Outcome {
    if !soft_dirty_tracked()? {
        return Err("this kernel does not track soft-dirty pages (no CONFIG_MEM_SOFT_DIRTY: a page just written has no soft-dirty bit in /proc/self/pagemap), so clear_refs 4 asks for no write notification and the check cannot tell anything".into());
    }
    let (placed, _dmabuf) = placed_pmd(device)?;
    std::fs::write("/proc/self/clear_refs", "4")
        .map_err(|e| format!("write 4 to /proc/self/clear_refs: {e}"))?;
    writes_within_limit(placed, 0x5eed_0003)
}

pub(crate) fn run() -> ExitCode {
    let mut tap = Tap::plan(6);
    let device = match Device::open_index(INDEX) {
        Ok(device) => device,
        Err(err) => {
            tap.report("the device opens", &Err(err.to_string()));
            return tap.finish();
        }
    };
    // 4 KiB entries: 512 faults for the first 2 MiB, one per further 2 MiB touched (a few
    // extra for the test's own stack or heap are allowed).
    let pages = 2 * MIB / PAGE;
    tap.report(
        "a 4 MiB dma-buf mapped at a 4 KiB-aligned address: touching each page of its first 2 MiB faults once per page (4 KiB entries)",
        &case(&device, 4 * MIB, 2 * MIB, PAGE, pages + 8, pages),
    );
    tap.report(
        "a 4 MiB dma-buf mapped at a 2 MiB-aligned address: touching every page faults once per 2 MiB (PMD entries)",
        &case(&device, 4 * MIB, 2 * MIB, 0, 2 + 4, 2),
    );
    tap.report(
        "a 1 GiB dma-buf mapped at a 1 GiB-aligned address: touching a word in each 2 MiB faults once (one PUD entry)",
        &case(&device, GIB, GIB, 0, 1 + 4, 1),
    );
    tap.report(
        "the page-table entries of a 4 KiB-, a 2 MiB- and a 1 GiB-aligned mapping (peerdirect_pte reads them): 4 KiB, 2 MiB and 1 GiB, writable, at the BAR's physical address + the allocation's offset, write-combining (PAT on)",
        &entries_write_combining(&device),
    );
    tap.report(
        "a 4 MiB dma-buf mapped at a 2 MiB-aligned address, made read-only by mprotect and read (read-only PMD entries), then read-write again: a write to each 2 MiB completes within 10 s and reads back",
        &write_after_mprotect(&device),
    );
    tap.report(
        "a 4 MiB dma-buf mapped read-write at a 2 MiB-aligned address after clear_refs 4 (soft-dirty tracking, as CRIU's pre-dump; the kernel tracks soft-dirty pages): a write to each untouched 2 MiB completes within 10 s and reads back",
        &write_after_clear_refs(&device),
    );
    tap.finish()
}
