//! `--bench-cpu-copy`: a benchmark, not a test. What a host-bounce path pays: memcpy bandwidth
//! of the CPU through mappings of the HBM BAR, in both directions (write: from an ordinary
//! buffer into the mapping; read: from the mapping into an ordinary buffer), at 2 MiB and
//! 64 MiB, and at 1 GiB (writes only) when the time budget allows ([`BIG_BUDGET`]), through:
//!
//! 1. peerdirect: [`DmaBuf::mmap`] of a dma-buf of a fresh allocation (write-combined, huge
//!    PFN entries where the virtual address and the allocation are aligned);
//! 2. vfio-pci: an mmap of BAR 2 of the same device through its VFIO device fd (uncached);
//! 3. anonymous memory: a private anonymous mapping, for reference.
//!
//! Each mapping is written once before anything is timed, so that page faults are not
//! measured (their count is reported: it tells which page table entries the mapping got).
//! Every copy is timed alone; the table shows the best and the median of the runs, and
//! peerdirect's best rates divided by vfio-pci's and by plain memory's.
//!
//! vfio-pci takes the device over, so it comes last: the peerdirect device is closed, the HBM
//! device moved to vfio-pci and the NIC unbound (as `--bench-exporters` does; boot with
//! `qemu/run --topology switch-iommu --hbm 2G --mem 3G`). Leaves the HBM device on vfio-pci and
//! the NIC unbound.

use std::fs;
use std::hint::black_box;
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use peerdirect::{Device, DmaBuf, DmaBufMap, ExportFlags, PciAddress, SyncFlags};

use crate::bench_exporters::open_vfio;
use crate::support::find_nic;
use crate::INDEX;

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
/// The sizes copied both ways, and the timed runs of each direction.
const SIZES: [(usize, usize); 2] = [(2 * MIB, 15), (64 * MIB, 5)];
/// The size whose estimate for the big case is scaled from.
const BASE: usize = 64 * MIB;
/// The big case: writes only, [`BIG_RUNS`] timed runs, if the estimate fits the budget.
const BIG: usize = GIB;
const BIG_RUNS: usize = 3;
/// All big cases together (TCG copies a few hundred MB/s, and faults are slow too).
const BIG_BUDGET: Duration = Duration::from_secs(20);
/// Once [`MIN_RUNS`] are done, a direction stops after this long (uncached reads are slow).
const CASE_LIMIT: Duration = Duration::from_secs(4);
const MIN_RUNS: usize = 3;
/// The HBM BAR (ivshmem-plain's BAR 2), as vfio-pci's region index.
const HBM_BAR: u32 = 2;

/// What is mapped; the table's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Peerdirect,
    VfioPci,
    Anonymous,
}

impl Target {
    const ALL: [Target; 3] = [Target::Peerdirect, Target::VfioPci, Target::Anonymous];

    fn name(self) -> &'static str {
        match self {
            Self::Peerdirect => "peerdirect dma-buf mmap",
            Self::VfioPci => "vfio-pci BAR mmap",
            Self::Anonymous => "anonymous memory",
        }
    }
}

/// The timed runs of one direction, in nanoseconds.
#[derive(Debug, Clone, PartialEq)]
struct Runs(Vec<u64>);

impl Runs {
    fn best(&self) -> Option<u64> {
        self.0.iter().copied().min()
    }

    /// The middle time, or the mean of the two middle ones.
    fn median(&self) -> Option<u64> {
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        let mid = sorted.len() / 2;
        match sorted.len() {
            0 => None,
            n if n % 2 == 1 => Some(sorted[mid]),
            _ => Some(
                sorted[mid - 1] / 2 + sorted[mid] / 2 + (sorted[mid - 1] % 2 + sorted[mid] % 2) / 2,
            ),
        }
    }
}

/// One mapping at one size.
#[derive(Debug, Clone, PartialEq)]
struct Measured {
    /// Page faults of the untimed first write.
    faults: u64,
    write: Runs,
    /// `None`: not measured (the big case).
    read: Option<Runs>,
    /// Wall time of the first write and the timed writes, for the big case's estimate.
    write_phase: Duration,
}

#[derive(Debug, Clone, PartialEq)]
enum Row {
    Done(Measured),
    Failed(String),
    Skipped(String),
}

/// By size and target.
type Results = std::collections::BTreeMap<(usize, Target), Row>;

/// GB/s (10^9 bytes per second) of `bytes` copied in `ns`.
fn gbps(bytes: usize, ns: u64) -> Option<f64> {
    (ns > 0).then(|| bytes as f64 / ns as f64)
}

/// Three significant digits or so, at most one decimal above 10.
fn fmt_gbps(rate: Option<f64>) -> String {
    match rate {
        None => "-".to_owned(),
        Some(r) if r >= 10.0 => format!("{r:.1}"),
        Some(r) if r >= 0.1 => format!("{r:.2}"),
        Some(r) => format!("{r:.4}"),
    }
}

fn fmt_ratio(ours: Option<f64>, theirs: Option<f64>) -> String {
    match (ours, theirs) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".to_owned(),
    }
}

/// [`crate::support::size_name`] of a `usize`.
fn size_name(bytes: usize) -> String {
    crate::support::size_name(bytes as u64)
}

/// A mapping under test: copies in and out of it, bracketed as its kind needs.
trait Mapped {
    fn len(&self) -> usize;
    fn begin(&self, write: bool) -> Result<(), String>;
    fn end(&self, write: bool) -> Result<(), String>;
    fn write_from(&mut self, src: &[u8]);
    fn read_into(&self, dst: &mut [u8]);
}

/// A peerdirect dma-buf and its mapping through the crate.
struct DmaBufTarget {
    dmabuf: DmaBuf,
    map: DmaBufMap,
}

impl DmaBufTarget {
    fn sync(&self, flags: SyncFlags) -> Result<(), String> {
        self.dmabuf
            .sync(flags)
            .map_err(|err| format!("sync failed: {err}"))
    }
}

impl Mapped for DmaBufTarget {
    fn len(&self) -> usize {
        self.map.length()
    }

    fn begin(&self, write: bool) -> Result<(), String> {
        self.sync(if write {
            SyncFlags::START_WRITE
        } else {
            SyncFlags::START_READ
        })
    }

    fn end(&self, write: bool) -> Result<(), String> {
        self.sync(if write {
            SyncFlags::END_WRITE
        } else {
            SyncFlags::END_READ
        })
    }

    fn write_from(&mut self, src: &[u8]) {
        self.map.write(0, src);
    }

    fn read_into(&self, dst: &mut [u8]) {
        self.map.read(0, dst);
    }
}

/// vfio-pci's BAR mapping and anonymous memory need no bracketing.
impl Mapped for sys::Region {
    fn len(&self) -> usize {
        sys::Region::len(self)
    }

    fn begin(&self, _: bool) -> Result<(), String> {
        Ok(())
    }

    fn end(&self, _: bool) -> Result<(), String> {
        Ok(())
    }

    fn write_from(&mut self, src: &[u8]) {
        sys::Region::write_from(self, src);
    }

    fn read_into(&self, dst: &mut [u8]) {
        sys::Region::read_into(self, dst);
    }
}

/// Times `copy` `runs` times, fewer (at least [`MIN_RUNS`]) once [`CASE_LIMIT`] has passed.
fn time_runs(runs: usize, mut copy: impl FnMut()) -> Runs {
    let start = Instant::now();
    let mut ns = Vec::with_capacity(runs);
    while ns.len() < runs && (ns.len() < MIN_RUNS || start.elapsed() < CASE_LIMIT) {
        let t = Instant::now();
        copy();
        ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    Runs(ns)
}

/// Writes the whole mapping once (untimed, counting page faults), then times `runs` writes
/// from `buf` and, if `read`, `runs` reads into it.
fn measure(
    map: &mut dyn Mapped,
    buf: &mut [u8],
    runs: usize,
    read: bool,
) -> Result<Measured, String> {
    let len = map.len();
    let buf = buf
        .get_mut(..len)
        .ok_or_else(|| format!("the buffer is shorter than the {len}-byte mapping"))?;
    let start = Instant::now();
    map.begin(true)?;
    let faults_before = sys::minor_faults();
    map.write_from(black_box(&*buf));
    let faults = sys::minor_faults().saturating_sub(faults_before);
    let write = time_runs(runs, || map.write_from(black_box(&*buf)));
    map.end(true)?;
    let write_phase = start.elapsed();
    let read = if read {
        map.begin(false)?;
        let runs = time_runs(runs, || {
            map.read_into(black_box(&mut *buf));
            black_box(&*buf);
        });
        map.end(false)?;
        Some(runs)
    } else {
        None
    };
    Ok(Measured {
        faults,
        write,
        read,
        write_phase,
    })
}

/// The ordinary buffers copied from and into: one of the largest small size, and one of
/// [`BIG`] made when the first big case runs.
struct Buffers {
    small: Vec<u8>,
    big: Option<Vec<u8>>,
}

/// An ordinary buffer of `len` bytes, every page written.
fn ordinary(len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    buf.fill(0x5a);
    buf
}

/// The bytes of memory available, from /proc/meminfo.
fn mem_available() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The big case's budget, shared out among the targets still to come.
struct BigBudget {
    spent: Duration,
    targets_left: u32,
}

impl BigBudget {
    fn new() -> Self {
        Self {
            spent: Duration::ZERO,
            targets_left: Target::ALL.len() as u32,
        }
    }

    /// What is left of the budget for this target: an even share among the targets still
    /// to come, this one included (which then counts as done).
    fn take_share(&mut self) -> Duration {
        let share = BIG_BUDGET.saturating_sub(self.spent) / self.targets_left.max(1);
        self.targets_left = self.targets_left.saturating_sub(1);
        share
    }
}

/// Whether a big case estimated at `estimate` fits `share`.
fn fits(estimate: Duration, share: Duration) -> Result<(), String> {
    if estimate <= share {
        Ok(())
    } else {
        Err(format!(
            "estimated {:.1} s, over this target's share {:.1} s of the {} s budget",
            estimate.as_secs_f64(),
            share.as_secs_f64(),
            BIG_BUDGET.as_secs()
        ))
    }
}

/// The big case's estimate from the target's [`BASE`] case: its first write and timed writes
/// scaled to [`BIG`] and [`BIG_RUNS`], plus filling the big buffer if it is not there yet.
fn big_estimate(base: &Measured, buffer_ready: bool) -> Duration {
    let scale = (BIG / BASE) as f64;
    let passes = (base.write.0.len() + 1) as f64;
    let per_pass = base.write_phase.as_secs_f64() * scale / passes;
    let passes = (BIG_RUNS + 1) as f64 + if buffer_ready { 0.0 } else { 1.0 };
    // Faults and munmap scale about linearly too; a margin for what does not.
    Duration::from_secs_f64(per_pass * passes * 1.25)
}

/// Runs the small cases of `target` (mapped by `map_of`), then the big case if it fits.
fn bench_target(
    target: Target,
    mut map_of: impl FnMut(usize) -> Result<Box<dyn Mapped>, String>,
    limit: Option<usize>,
    buffers: &mut Buffers,
    budget: &mut BigBudget,
    results: &mut Results,
) {
    let too_big = |len: usize| match limit {
        Some(limit) if len > limit => {
            Some(format!("larger than the {} available", size_name(limit)))
        }
        _ => None,
    };
    for (len, runs) in SIZES {
        let row = match too_big(len) {
            Some(why) => Row::Skipped(why),
            None => match map_of(len)
                .and_then(|mut map| measure(&mut *map, &mut buffers.small, runs, true))
            {
                Ok(m) => Row::Done(m),
                Err(err) => Row::Failed(err),
            },
        };
        results.insert((len, target), row);
    }
    let share = budget.take_share();
    let row = (|| {
        if let Some(why) = too_big(BIG) {
            return Row::Skipped(why);
        }
        let Some(Row::Done(base)) = results.get(&(BASE, target)) else {
            return Row::Skipped(format!("no {} measurement to plan by", size_name(BASE)));
        };
        if let Err(why) = fits(big_estimate(base, buffers.big.is_some()), share) {
            return Row::Skipped(why);
        }
        let buffer = if buffers.big.is_some() { 0 } else { BIG };
        let target_memory = if target == Target::Anonymous { BIG } else { 0 };
        let needed = buffer + target_memory;
        if let Some(available) = mem_available() {
            if available < (needed + 256 * MIB) as u64 {
                return Row::Skipped(format!(
                    "needs {} of RAM, {} MiB available",
                    size_name(needed),
                    available / MIB as u64
                ));
            }
        }
        let start = Instant::now();
        let big = buffers.big.get_or_insert_with(|| ordinary(BIG));
        let row = match map_of(BIG).and_then(|mut map| measure(&mut *map, big, BIG_RUNS, false)) {
            Ok(m) => Row::Done(m),
            Err(err) => Row::Failed(err),
        };
        budget.spent += start.elapsed();
        row
    })();
    results.insert((BIG, target), row);
}

/// peerdirect: a fresh allocation of each size, exported whole and mapped through the crate.
fn bench_peerdirect(
    device: &Device,
    hbm_bytes: u64,
    buffers: &mut Buffers,
    budget: &mut BigBudget,
    results: &mut Results,
) {
    let map_of = |len: usize| -> Result<Box<dyn Mapped>, String> {
        let allocation = device
            .alloc(len as u64, None)
            .map_err(|err| format!("alloc of {} failed: {err}", size_name(len)))?;
        let dmabuf = allocation
            .export(0, len as u64, ExportFlags::CLOEXEC | ExportFlags::RDWR)
            .map_err(|err| format!("export of {} failed: {err}", size_name(len)))?;
        // The dma-buf keeps the memory; the allocation is freed now.
        drop(allocation);
        let map = dmabuf
            .mmap(true)
            .map_err(|err| format!("mmap of {} failed: {err}", size_name(len)))?;
        Ok(Box::new(DmaBufTarget { dmabuf, map }))
    };
    let limit = usize::try_from(hbm_bytes).unwrap_or(usize::MAX);
    bench_target(
        Target::Peerdirect,
        map_of,
        Some(limit),
        buffers,
        budget,
        results,
    );
}

fn bench_anonymous(buffers: &mut Buffers, budget: &mut BigBudget, results: &mut Results) {
    let map_of = |len: usize| -> Result<Box<dyn Mapped>, String> {
        let region = sys::Region::anonymous(len)
            .map_err(|err| format!("anonymous mmap of {} failed: {err}", size_name(len)))?;
        Ok(Box::new(region))
    };
    bench_target(Target::Anonymous, map_of, None, buffers, budget, results);
}

/// vfio-pci: bytes `0..len` of BAR 2 through the VFIO device fd.
fn bench_vfio(
    hbm: Result<PciAddress, String>,
    buffers: &mut Buffers,
    budget: &mut BigBudget,
    results: &mut Results,
) {
    let setup = hbm.and_then(|hbm| {
        let nic = find_nic()?;
        let vfio = open_vfio(&hbm.to_string(), &nic)?;
        let info = sys::vfio_region_info(vfio.device.as_fd(), HBM_BAR)
            .map_err(|err| format!("VFIO_DEVICE_GET_REGION_INFO of BAR {HBM_BAR} failed: {err}"))?;
        if info.flags & sys::VFIO_REGION_INFO_FLAG_MMAP == 0 {
            return Err(format!(
                "vfio-pci does not allow mmap of BAR {HBM_BAR} (flags {:#x})",
                info.flags
            ));
        }
        println!(
            "# vfio-pci: BAR {HBM_BAR} of {hbm} is {} at device fd offset {:#x} (flags {:#x})",
            size_name(usize::try_from(info.size).unwrap_or(usize::MAX)),
            info.offset,
            info.flags
        );
        Ok((vfio, info))
    });
    let (vfio, info) = match setup {
        Ok(setup) => (Some(setup.0), Ok(setup.1)),
        Err(err) => {
            println!("# vfio-pci: {err}");
            (None, Err(format!("vfio-pci setup failed: {err}")))
        }
    };
    let map_of = |len: usize| -> Result<Box<dyn Mapped>, String> {
        let info = info.as_ref().map_err(Clone::clone)?;
        let vfio = vfio.as_ref().ok_or("no vfio-pci device")?;
        let region = sys::Region::shared(vfio.device.as_fd(), len, info.offset)
            .map_err(|err| format!("mmap of {} of BAR {HBM_BAR} failed: {err}", size_name(len)))?;
        Ok(Box::new(region))
    };
    let limit = info
        .as_ref()
        .ok()
        .map(|info| usize::try_from(info.size).unwrap_or(usize::MAX));
    bench_target(Target::VfioPci, map_of, limit, buffers, budget, results);
}

/// The sizes of the table, in order.
fn sizes() -> Vec<usize> {
    SIZES.iter().map(|&(len, _)| len).chain([BIG]).collect()
}

fn rates(len: usize, runs: Option<&Runs>) -> (Option<f64>, Option<f64>) {
    match runs {
        None => (None, None),
        Some(runs) => (
            runs.best().and_then(|ns| gbps(len, ns)),
            runs.median().and_then(|ns| gbps(len, ns)),
        ),
    }
}

/// The table: one line per size and target, best and median rates, peerdirect's ratios on
/// its lines; failures and skips in place of numbers.
fn table(results: &Results, sizes: &[usize]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<24} {:>7} {:>7} {:>7} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "target",
        "size",
        "faults",
        "runs w/r",
        "write best",
        "write med",
        "read best",
        "read med",
        "p/vfio w/r",
        "p/plain w/r"
    )];
    let best = |len: usize, target: Target| match results.get(&(len, target)) {
        Some(Row::Done(m)) => (rates(len, Some(&m.write)).0, rates(len, m.read.as_ref()).0),
        _ => (None, None),
    };
    for &len in sizes {
        for target in Target::ALL {
            let head = format!("{:<24} {:>7}", target.name(), size_name(len));
            let line = match results.get(&(len, target)) {
                Some(Row::Done(m)) => {
                    let (write_best, write_med) = rates(len, Some(&m.write));
                    let (read_best, read_med) = rates(len, m.read.as_ref());
                    let runs = format!(
                        "{}/{}",
                        m.write.0.len(),
                        m.read
                            .as_ref()
                            .map_or("-".to_owned(), |r| r.0.len().to_string())
                    );
                    let (vs_vfio, vs_plain) = if target == Target::Peerdirect {
                        let ratios = |other: Target| {
                            let (w, r) = best(len, other);
                            format!("{}/{}", fmt_ratio(write_best, w), fmt_ratio(read_best, r))
                        };
                        (ratios(Target::VfioPci), ratios(Target::Anonymous))
                    } else {
                        ("-".to_owned(), "-".to_owned())
                    };
                    format!(
                        "{head} {:>7} {runs:>7} {:>11} {:>11} {:>11} {:>11} {vs_vfio:>11} {vs_plain:>11}",
                        m.faults,
                        fmt_gbps(write_best),
                        fmt_gbps(write_med),
                        fmt_gbps(read_best),
                        fmt_gbps(read_med),
                    )
                }
                Some(Row::Failed(err)) => format!("{head} failed: {err}"),
                Some(Row::Skipped(why)) => format!("{head} skipped: {why}"),
                None => format!("{head} not run"),
            };
            lines.push(line);
        }
    }
    lines
}

/// Runs the benchmark and prints the table; success iff no measurement failed (skipped big
/// cases are not failures).
pub(crate) fn run() -> ExitCode {
    let started = Instant::now();
    println!(
        "# kernel {}",
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|err| format!("unknown ({err})"), |r| r.trim().to_owned())
    );
    let mut results = Results::new();
    let mut budget = BigBudget::new();
    let mut buffers = Buffers {
        small: ordinary(SIZES.iter().map(|&(len, _)| len).max().unwrap_or(0)),
        big: None,
    };

    let opened = Device::open_index(INDEX)
        .map_err(|err| err.to_string())
        .and_then(|device| {
            let info = device.info().map_err(|err| err.to_string())?;
            Ok((device, info))
        });
    let hbm = match opened {
        Ok((device, info)) => {
            println!(
                "# HBM {} ({}, bus address {:#x}); memcpy from an ordinary buffer into each \
                 mapping (write) and back (read), each copy timed alone, after one untimed \
                 write that faults the mapping in",
                info.pci_address,
                size_name(usize::try_from(info.hbm_bytes).unwrap_or(usize::MAX)),
                info.hbm_bus_addr
            );
            bench_peerdirect(
                &device,
                info.hbm_bytes,
                &mut buffers,
                &mut budget,
                &mut results,
            );
            // vfio-pci takes the device over: peerdirect must let go of it first.
            drop(device);
            Ok(info.pci_address)
        }
        Err(err) => {
            println!("# peerdirect: {err}");
            for len in sizes() {
                results.insert(
                    (len, Target::Peerdirect),
                    Row::Failed(format!(
                        "{} did not open: {err}",
                        peerdirect::device_path(INDEX).display()
                    )),
                );
            }
            budget.take_share();
            Err(format!(
                "no HBM device address: peerdirect did not open: {err}"
            ))
        }
    };
    bench_anonymous(&mut buffers, &mut budget, &mut results);
    bench_vfio(hbm, &mut buffers, &mut budget, &mut results);
    drop(buffers);

    println!(
        "# GB/s = 10^9 bytes/s, best and median of the runs (runs w/r: timed writes/reads; \
         up to {} at 2 MiB, {} at 64 MiB, {BIG_RUNS} writes only at 1 GiB when the estimate fits \
         {} s); p/vfio, p/plain: peerdirect's best rate over vfio-pci's and plain memory's \
         (write/read; above 1: peerdirect is faster)",
        SIZES[0].1,
        SIZES[1].1,
        BIG_BUDGET.as_secs()
    );
    for line in table(&results, &sizes()) {
        println!("{line}");
    }
    println!(
        "# faults: page faults of the untimed first write: one per 4 KiB page, one per 2 MiB \
         (PMD) or one per 1 GiB (PUD) entry. Huge entries need the virtual address aligned as \
         well as the memory: the crate's DmaBuf::mmap aligns its address (2 MiB, or 1 GiB from \
         1 GiB), vfio-pci's mapping here asks for none and gets 4 KiB entries, anonymous ones \
         of whole 2 MiB are THP-aligned"
    );
    println!(
        "# reads: peerdirect maps HBM write-combined, vfio-pci uncached. Write-combining \
         merges stores into full bursts, so writes can run near link speed; reads of WC or UC \
         memory bypass the caches (no line fills, no prefetch): every load waits for the \
         device, so reading HBM through a CPU mapping is expected to be far slower than \
         writing it or than plain memory. That is the cost a host-bounce path pays, and why \
         the direct path (the NIC DMAs to and from HBM) matters. Under TCG the BAR is host RAM \
         and memory types are not emulated: the numbers measure the emulator, not WC vs UC"
    );
    println!("# took {:.1} s", started.elapsed().as_secs_f64());
    if results.values().any(|row| matches!(row, Row::Failed(_))) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The raw mmaps, the VFIO region ioctl and the fault counter: the only `unsafe` code of this
/// benchmark. A [`Region`] owns what it maps and is only ever copied to and from.
mod sys {
    use core::ptr::{self, NonNull};
    use std::os::fd::BorrowedFd;

    use rustix::io::{Errno, Result};
    use rustix::ioctl::{ioctl, opcode, Opcode, Updater};
    use rustix::mm::{self, MapFlags, ProtFlags};

    /// `struct vfio_region_info` (include/uapi/linux/vfio.h).
    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub(super) struct VfioRegionInfo {
        pub(super) argsz: u32,
        pub(super) flags: u32,
        pub(super) index: u32,
        pub(super) cap_offset: u32,
        pub(super) size: u64,
        pub(super) offset: u64,
    }
    const _: () = assert!(core::mem::size_of::<VfioRegionInfo>() == 32);
    const _: () = assert!(core::mem::offset_of!(VfioRegionInfo, size) == 16);

    pub(super) const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
    /// `_IO(VFIO_TYPE, VFIO_BASE + 8)`: VFIO encodes no size or direction.
    const VFIO_DEVICE_GET_REGION_INFO: Opcode = opcode::none(b';', 108);

    /// `VFIO_DEVICE_GET_REGION_INFO` of region `index` (a BAR), without capabilities.
    pub(super) fn vfio_region_info(device: BorrowedFd<'_>, index: u32) -> Result<VfioRegionInfo> {
        let mut info = VfioRegionInfo {
            argsz: core::mem::size_of::<VfioRegionInfo>() as u32,
            index,
            ..VfioRegionInfo::default()
        };
        // VFIO_DEVICE_GET_REGION_INFO takes a `struct vfio_region_info *`, which `Updater`
        // passes (a pointer to `info`, `VfioRegionInfo` having its `repr(C)` layout, checked
        // above). The kernel reads the struct's 32 bytes and writes back the same 32
        // (capabilities go past the struct only when `argsz` leaves room for them, which 32
        // does not).
        // All of it inside `info`, borrowed exclusively for the call; any bits are valid integers.
        let request =
            // SAFETY: as just said, the kernel reads and writes only `info`'s own bytes.
            unsafe { Updater::<VFIO_DEVICE_GET_REGION_INFO, VfioRegionInfo>::new(&mut info) };
        // SAFETY: the opcode and the argument agree (above).
        unsafe { ioctl(device, request) }?;
        Ok(info)
    }

    /// A read-write mapping this value alone owns, unmapped on drop. Its memory may be a
    /// device's that others change at any time, so no Rust reference into it is ever made:
    /// data only moves in and out by plain copies.
    #[derive(Debug)]
    pub(super) struct Region {
        ptr: NonNull<u8>,
        len: usize,
    }

    impl Region {
        /// `len` bytes of private anonymous memory.
        pub(super) fn anonymous(len: usize) -> Result<Self> {
            // SAFETY: with a null address hint and no MAP_FIXED the kernel picks a range that
            // overlaps no existing mapping, so nothing this process uses is replaced.
            let ptr = unsafe {
                mm::mmap_anonymous(
                    ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::PRIVATE,
                )
            }?;
            Self::adopt(ptr.cast(), len)
        }

        /// Bytes `offset..offset + len` of `fd`, shared.
        pub(super) fn shared(fd: BorrowedFd<'_>, len: usize, offset: u64) -> Result<Self> {
            // SAFETY: with a null address hint and no MAP_FIXED the kernel picks a range that
            // overlaps no existing mapping, so nothing this process uses is replaced.
            let ptr = unsafe {
                mm::mmap(
                    ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED,
                    fd,
                    offset,
                )
            }?;
            Self::adopt(ptr.cast(), len)
        }

        fn adopt(ptr: *mut u8, len: usize) -> Result<Self> {
            let ptr = NonNull::new(ptr).ok_or(Errno::NOMEM)?;
            Ok(Self { ptr, len })
        }

        pub(super) fn len(&self) -> usize {
            self.len
        }

        /// Copies `src` into the start of the mapping.
        ///
        /// # Panics
        ///
        /// If `src` is longer than the mapping.
        pub(super) fn write_from(&mut self, src: &[u8]) {
            assert!(src.len() <= self.len, "copy past the mapping's end");
            // The mapping is readable and writable and stays mapped while `self` lives; no
            // reference into it exists, and `&mut self` keeps other copies through it out.
            // SAFETY: `src.len()` bytes fit (asserted); `src` is Rust's, so no overlap.
            unsafe { ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr(), src.len()) }
        }

        /// Copies the start of the mapping into `dst`.
        ///
        /// # Panics
        ///
        /// If `dst` is longer than the mapping.
        pub(super) fn read_into(&self, dst: &mut [u8]) {
            assert!(dst.len() <= self.len, "copy past the mapping's end");
            // The mapping is readable and stays mapped while `self` lives; no reference into
            // it exists.
            // SAFETY: `dst.len()` bytes fit (asserted); `dst` is Rust's, so no overlap.
            unsafe { ptr::copy_nonoverlapping(self.ptr.as_ptr(), dst.as_mut_ptr(), dst.len()) }
        }
    }

    impl Drop for Region {
        fn drop(&mut self) {
            // An error (impossible for a range we mapped) leaves the mapping in place: safe.
            // SAFETY: `ptr` and `len` are a mapping `anonymous` or `shared` made, unmapped
            // nowhere else, with no reference into it.
            let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }

    /// This thread's minor page faults so far.
    pub(super) fn minor_faults() -> u64 {
        // SAFETY: `rusage` is plain integers and timevals, for which all zeroes is valid.
        let mut usage: libc::rusage = unsafe { core::mem::zeroed() };
        // SAFETY: RUSAGE_THREAD with a pointer to a live, exclusively borrowed `rusage`, which
        // getrusage only fills in.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        u64::try_from(usage.ru_minflt).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(write_ns: &[u64], read_ns: Option<&[u64]>) -> Row {
        Row::Done(Measured {
            faults: 1,
            write: Runs(write_ns.to_vec()),
            read: read_ns.map(|ns| Runs(ns.to_vec())),
            write_phase: Duration::from_millis(100),
        })
    }

    #[test]
    fn best_is_the_shortest_time_and_median_the_middle_one() {
        assert_eq!(Runs(vec![]).best(), None);
        assert_eq!(Runs(vec![]).median(), None);
        assert_eq!(Runs(vec![30, 10, 20]).best(), Some(10));
        assert_eq!(Runs(vec![30, 10, 20]).median(), Some(20));
        assert_eq!(Runs(vec![40, 10, 20, 30]).median(), Some(25));
        assert_eq!(Runs(vec![7]).median(), Some(7));
        // No overflow near the top, and odd halves round down.
        assert_eq!(Runs(vec![u64::MAX, u64::MAX]).median(), Some(u64::MAX));
        assert_eq!(Runs(vec![1, 2]).median(), Some(1));
    }

    #[test]
    fn rates_are_decimal_gigabytes_per_second() {
        assert_eq!(gbps(1_000_000_000, 1_000_000_000), Some(1.0));
        assert_eq!(gbps(2 * MIB, 0), None);
        assert_eq!(fmt_gbps(gbps(2 * MIB, 1_000_000)), "2.10");
        assert_eq!(fmt_gbps(Some(12.345)), "12.3");
        assert_eq!(fmt_gbps(Some(0.01234)), "0.0123");
        assert_eq!(fmt_gbps(None), "-");
        assert_eq!(fmt_ratio(Some(1.0), Some(4.0)), "0.25");
        assert_eq!(fmt_ratio(Some(1.0), Some(0.0)), "-");
        assert_eq!(fmt_ratio(None, Some(1.0)), "-");
        assert_eq!(size_name(2 * MIB), "2 MiB");
        assert_eq!(size_name(GIB), "1 GiB");
    }

    #[test]
    fn table_shows_rates_ratios_failures_and_skips() {
        let mut results = Results::new();
        // 2 MiB in 1 ms = 2.10 GB/s; peerdirect writes twice as fast as vfio-pci.
        results.insert(
            (2 * MIB, Target::Peerdirect),
            done(&[1_000_000, 2_000_000, 3_000_000], Some(&[4_000_000])),
        );
        results.insert(
            (2 * MIB, Target::VfioPci),
            done(&[2_000_000], Some(&[4_000_000])),
        );
        results.insert((2 * MIB, Target::Anonymous), Row::Failed("boom".to_owned()));
        results.insert((GIB, Target::Peerdirect), done(&[1_000_000_000], None));
        results.insert((GIB, Target::VfioPci), Row::Skipped("budget".to_owned()));
        let lines = table(&results, &[2 * MIB, GIB]);
        assert_eq!(lines.len(), 1 + 2 * Target::ALL.len());
        let peerdirect: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            peerdirect,
            [
                "peerdirect",
                "dma-buf",
                "mmap",
                "2",
                "MiB",
                "1",
                "3/1",
                "2.10",
                "1.05",
                "0.52",
                "0.52",
                "2.00/1.00",
                "-/-"
            ]
        );
        assert!(lines[3].ends_with("failed: boom"), "{}", lines[3]);
        let big: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(
            big[5..],
            ["1", "1/-", "1.07", "1.07", "-", "-", "-/-", "-/-"]
        );
        assert!(lines[5].ends_with("skipped: budget"), "{}", lines[5]);
        assert!(lines[6].ends_with("not run"), "{}", lines[6]);
    }

    #[test]
    fn big_case_runs_only_within_its_share_of_the_budget() {
        let base = Measured {
            faults: 16384,
            write: Runs(vec![1; 5]),
            read: None,
            // 6 passes of 64 MiB in 0.6 s: 0.1 s each, 1.6 s per 1 GiB pass.
            write_phase: Duration::from_millis(600),
        };
        let ready = big_estimate(&base, true);
        assert!(
            (ready.as_secs_f64() - 1.6 * 4.0 * 1.25).abs() < 1e-6,
            "{ready:?}"
        );
        let fill = big_estimate(&base, false);
        assert!(
            (fill.as_secs_f64() - 1.6 * 5.0 * 1.25).abs() < 1e-6,
            "{fill:?}"
        );

        let mut budget = BigBudget::new();
        // 20 s over three targets: 6.67 s each.
        let share = budget.take_share();
        assert!(fits(Duration::from_secs(6), share).is_ok());
        assert!(fits(Duration::from_secs(7), share).is_err());
        budget.spent = Duration::from_secs(6);
        // 14 s left over two, then whatever is left for the last.
        let share = budget.take_share();
        assert_eq!(share, Duration::from_secs(7));
        let err = fits(Duration::from_secs(8), share).unwrap_err();
        assert!(err.contains("share 7.0 s"), "{err}");
        budget.spent = Duration::from_secs(8);
        assert_eq!(budget.take_share(), Duration::from_secs(12));
        assert_eq!(budget.take_share(), Duration::from_secs(12));
    }

    #[test]
    fn region_copies_both_ways() {
        let mut region = sys::Region::anonymous(8192).unwrap();
        region.write_from(b"through a mapping");
        let mut back = [0u8; 17];
        region.read_into(&mut back);
        assert_eq!(&back, b"through a mapping");
        let mut buf = ordinary(8192);
        let m = measure(&mut region, &mut buf, 4, true).unwrap();
        assert_eq!(m.write.0.len(), 4);
        assert_eq!(m.read.map(|r| r.0.len()), Some(4));
    }

    #[test]
    fn bench_cpu_copy_is_a_mode_of_its_own() {
        use clap::Parser;
        let parse = |args: &[&str]| crate::Args::try_parse_from(args);
        assert!(
            parse(&["peerdirect-guest-tests", "--bench-cpu-copy"])
                .unwrap()
                .bench_cpu_copy
        );
        assert!(parse(&["peerdirect-guest-tests", "--bench-cpu-copy", "--lifecycle"]).is_err());
        assert!(parse(&[
            "peerdirect-guest-tests",
            "--bench-cpu-copy",
            "--bench-exporters"
        ])
        .is_err());
    }
}
