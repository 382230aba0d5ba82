//! `--cpu-mapping`: CPU mappings of dma-bufs are filled at fault time with the largest page
//! table entries the alignment allows (Documentation/exporter.md): one PUD entry for 1 GiB,
//! one PMD entry per 2 MiB, else 4 KiB PTEs. Told apart by counting this thread's page faults
//! (`getrusage`) while touching every page; needs `qemu/run --hbm 2G`.

use std::os::fd::AsFd;
use std::process::ExitCode;

use peerdirect::{Device, DmaBuf, ExportFlags};
use rustix::mm::{MapFlags, ProtFlags};

use crate::support::{Outcome, Tap};
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

fn case(device: &Device, len: u64, align: u64, skew: u64, most: u64, least: u64) -> Outcome {
    let alloc = device
        .alloc(len, Some(align.max(2 * MIB)))
        .map_err(|e| format!("ALLOC of {len} bytes aligned to {align}: {e}"))?;
    let dmabuf = alloc
        .export(0, 0, ExportFlags::RDWR)
        .map_err(|e| format!("EXPORT: {e}"))?;
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

pub(crate) fn run() -> ExitCode {
    let mut tap = Tap::plan(3);
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
    tap.finish()
}
