//! `--bench-exporters`: a benchmark, not a test. The NIC's PCI device (virtio-net) imports
//! 2 MiB, 64 MiB, 1 GiB and 16 GiB dma-bufs (the sizes the BAR holds; udmabuf's up to 1 GiB,
//! guest RAM) from three exporters through the test importer module
//! (`tests/kmod/peerdirect_importer.c`), with the DMA max segment size of the PCI default
//! (64 KiB, the stand-in's own) and of real RDMA NICs (mlx5: 2 GiB; EFA: `UINT_MAX`), which
//! the importer sets for each attachment. One table reports the sg entries and the best of
//! [`RUNS`] attach, map and unmap+detach times of each, with the ratios of peerdirect to the
//! other two, and whether peerdirect meets its goal against vfio-pci with real NICs' max
//! segment ([`GOAL`]):
//!
//! 1. peerdirect: `Device::alloc` + `Allocation::export` of the HBM BAR;
//! 2. udmabuf: `UDMABUF_CREATE` over a sealed memfd (guest RAM, mapped through the IOMMU);
//! 3. vfio-pci: its own dma-buf of a range of the same HBM BAR (`VFIO_DEVICE_FEATURE_DMA_BUF`).
//!
//! A second table times a whole memory registration of each dma-buf as RDMA drivers make one,
//! through ib_core's own functions (`tests/kmod/peerdirect_ibimport.c`, `bench`): get the umem
//! (EFA's pinned path, `ib_umem_dmabuf_get_pinned_with_dma_device`; irdma's revocable pinned
//! path), choose the best page size (4 KiB to 2 GiB, as EFA offers), walk every DMA block as
//! the driver fills its page list, then release it. vfio-pci refuses the pinned path (it
//! takes only importers it can revoke), so the goal compares peerdirect's pinned and
//! revocable registrations with vfio-pci's revocable one ([`REG_GOAL`], [`REG_UDMABUF_GOAL`]).
//!
//! All three attach in the importer's `dynamic` mode (`allow_peer2peer` and an
//! `invalidate_mappings` callback, as mlx5 does): vfio-pci refuses importers it cannot revoke,
//! so that is the one mode all three take, and the comparison stays like for like.
//!
//! vfio-pci needs the HBM device, an IOMMU and a viable group, so it comes last: the HBM
//! device is unbound from peerdirect and the NIC from virtio-pci (HBM and NIC sit below one
//! switch without ACS, in one group; the importer only needs the NIC's `struct device`), the
//! HBM device is bound to vfio-pci through `driver_override`, and BAR 2 ranges are exported
//! through the container/group interface. Boot with `qemu/run --topology switch-iommu --hbm 16G
//! --mem 3G` (`scripts/bench-exporters`). Leaves the HBM device on vfio-pci and the NIC unbound.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::ExitCode;

use peerdirect::{Device, DmaBuf, ExportFlags, PciAddress};
use rustix::fs::{MemfdFlags, SealFlags};

use crate::support::{find_nic, size_name, write_sysfs, SYSFS_PCI_DEVICES};
use crate::testmod::{Report, TestModule};
use crate::INDEX;

const MIB: u64 = 1 << 20;
/// The sizes measured, those the HBM BAR holds (16 GiB needs `qemu/run --hbm 16G`).
const SIZES: [u64; 4] = [2 * MIB, 64 * MIB, 1 << 30, 16 << 30];
/// udmabuf's largest: its memory is guest RAM, allocated and pinned at create.
const UDMABUF_MAX: u64 = 1 << 30;
/// Commands per case in each round; times are the best of them.
const RUNS: usize = 5;
/// Cycles (attach, map, unmap+detach) that one command runs where peerdirect maps at most
/// [`CYCLES_UP_TO`] entries (every real NIC's row): its time is the median of them, not one
/// sample, which is what single samples of a microsecond-long step varied by under TCG.
const CYCLES: u64 = 40;
const CYCLES_UP_TO: u64 = 64;
/// The HBM BAR (ivshmem-plain's BAR 2), as vfio-pci's region index.
const HBM_BAR: u32 = 2;
/// The importer's DMA max segment sizes, and whose they are.
const MAX_SEGS: [(u64, &str); 3] = [
    (64 << 10, "PCI default"),
    (2 << 30, "mlx5"),
    (u32::MAX as u64, "EFA"),
];
/// With a real NIC's max segment, peerdirect's attach, map and unmap+detach each within this
/// ratio of vfio-pci's, and one sg entry per `min(size, max segment)`.
const GOAL: f64 = 1.2;
/// The NIC's max segment for registrations: EFA's, which registers this way.
const EFA_MAX_SEG: u64 = u32::MAX as u64;
/// A registration of 1 GiB or more: peerdirect's within this ratio of vfio-pci's, ...
const REG_GOAL: f64 = 1.2;
/// ... and at least this many times faster than udmabuf's (guest RAM, pinned page by page).
const REG_UDMABUF_GOAL: f64 = 100.0;
/// The page size: peerdirect cuts at the max segment rounded down to it.
const PAGE: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Exporter {
    Peerdirect,
    Udmabuf,
    VfioPci,
}

impl Exporter {
    const ALL: [Exporter; 3] = [Exporter::Peerdirect, Exporter::Udmabuf, Exporter::VfioPci];

    fn name(self) -> &'static str {
        match self {
            Self::Peerdirect => "peerdirect",
            Self::Udmabuf => "udmabuf",
            Self::VfioPci => "vfio-pci",
        }
    }
}

/// One exporter at one size: the best of [`RUNS`] attachments by the NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Measured {
    nents: u64,
    max_seg: u64,
    max_entry: u64,
    /// Entries longer than `max_seg`.
    over_max_seg: u64,
    attach_ns: u64,
    map_ns: u64,
    unmap_detach_ns: u64,
    /// The dma-buf's `exp_name`, as the importer saw it.
    exp_name: String,
    dma_first: u64,
    importer_iommu: String,
    /// The kernel's P2P distance HBM → NIC (asked for the two BAR exporters only).
    p2p_distance: Option<i64>,
}

/// Attaches `dmabuf` to `nic` [`RUNS`] times in dynamic mode, each time mapping, walking and
/// unmapping it, and for a case of few entries repeating that [`CYCLES`] times in the kernel
/// (each run's times are then the medians of its cycles); checks every run mapped the whole
/// buffer into the same number of entries and keeps the best times.
fn measure(
    importer: &mut TestModule,
    nic: &str,
    hbm: Option<PciAddress>,
    dmabuf: &DmaBuf,
    max_seg: u64,
) -> Result<Measured, String> {
    let hbm = hbm.map_or(String::new(), |hbm| format!(" hbm={hbm}"));
    let cycles = cycles_for(dmabuf.length(), max_seg);
    let line = format!(
        "fd={} dev={nic} mode=dynamic{hbm} max_seg={max_seg} cycles={cycles}",
        dmabuf.as_fd().as_raw_fd()
    );
    // The median of the run's cycles, or its one sample.
    let time = |report: &Report, key: &str| match cycles {
        1 => report.uint(key),
        _ => report.uint(&format!("{key}_p50")),
    };
    let mut best: Option<Measured> = None;
    for run in 1..=RUNS {
        let report = importer.command(&line)?;
        for key in ["attach", "map"] {
            let value = report.int(key)?;
            if value != 0 {
                return Err(format!(
                    "run {run}: {key} failed with {value} ({})",
                    report.summary()
                ));
            }
        }
        if cycles > 1 && report.int("cycles_failed")? != 0 {
            return Err(format!(
                "run {run}: {}",
                report.get("cycles_error").unwrap_or("a cycle failed")
            ));
        }
        let total = report.uint("dma_total")?;
        if total != dmabuf.length() {
            return Err(format!(
                "run {run}: the sg table covers {total} bytes of {}",
                dmabuf.length()
            ));
        }
        let this = Measured {
            nents: report.uint("nents")?,
            max_seg: report.uint("max_seg")?,
            max_entry: report.uint("max_entry")?,
            over_max_seg: report.uint("over_max_seg")?,
            attach_ns: time(&report, "attach_ns")?,
            map_ns: time(&report, "map_ns")?,
            unmap_detach_ns: time(&report, "unmap_detach_ns")?,
            exp_name: report.get("exporter")?.to_owned(),
            dma_first: report.uint("dma_first")?,
            importer_iommu: report.get("importer_iommu")?.to_owned(),
            p2p_distance: report.value("p2p_distance").and_then(|d| d.parse().ok()),
        };
        best = Some(match best {
            None => this,
            Some(best) if best.nents != this.nents => {
                return Err(format!(
                    "run {run}: {} sg entries, run 1 had {}",
                    this.nents, best.nents
                ))
            }
            Some(best) => best.fastest(&this),
        });
    }
    best.ok_or_else(|| "no run".to_owned())
}

impl Measured {
    /// These facts, with the best of each time here and in `other` (another run of the same).
    fn fastest(self, other: &Measured) -> Measured {
        Measured {
            attach_ns: self.attach_ns.min(other.attach_ns),
            map_ns: self.map_ns.min(other.map_ns),
            unmap_detach_ns: self.unmap_detach_ns.min(other.unmap_detach_ns),
            ..self
        }
    }
}

/// By exporter, importer max segment and size.
type Results = BTreeMap<(Exporter, u64, u64), Result<Measured, String>>;

/// How a registration imports the dma-buf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum RegMode {
    /// EFA's: `ib_umem_dmabuf_get_pinned_with_dma_device`, not revocable.
    Pinned,
    /// irdma's: pinned, with a revoke callback.
    Revocable,
}

impl RegMode {
    const ALL: [RegMode; 2] = [RegMode::Pinned, RegMode::Revocable];

    fn name(self) -> &'static str {
        match self {
            Self::Pinned => "pinned",
            Self::Revocable => "revocable",
        }
    }
}

/// One registration: the best of [`RUNS`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Registered {
    reg_ns: u64,
    dereg_ns: u64,
    pgsz: u64,
    blocks: u64,
}

/// By exporter, mode and size; `Ok(None)`: refused as expected (vfio-pci's pinned path).
type Registrations = BTreeMap<(Exporter, RegMode, u64), Result<Option<Registered>, String>>;

/// What the benchmark drives: the two test importers and the NIC they import for.
struct Importers {
    importer: TestModule,
    /// ib_core's importer; `Err` says why the registration table is missing.
    ibimport: Result<TestModule, String>,
    nic: String,
}

/// Registers `dmabuf` in each mode, best of [`RUNS`] each.
fn register_each_mode(
    importers: &mut Importers,
    exporter: Exporter,
    len: u64,
    dmabuf: &Result<DmaBuf, String>,
    regs: &mut Registrations,
) {
    for mode in RegMode::ALL {
        let registered = match (&mut importers.ibimport, dmabuf) {
            (Err(err), _) => Err(err.clone()),
            (_, Err(err)) => Err(err.clone()),
            (Ok(ibimport), Ok(dmabuf)) => register(ibimport, &importers.nic, dmabuf, mode)
                .and_then(|r| match (r, exporter, mode) {
                    (Err(errno), Exporter::VfioPci, RegMode::Pinned)
                        if errno == -EOPNOTSUPP_ERRNO =>
                    {
                        Ok(None)
                    }
                    (Err(errno), _, _) => Err(format!(
                        "{} registration failed: {}",
                        mode.name(),
                        std::io::Error::from_raw_os_error(i32::try_from(-errno).unwrap_or(0))
                    )),
                    (Ok(r), _, _) => Ok(Some(r)),
                }),
        };
        regs.insert((exporter, mode, len), registered);
    }
}

/// `EOPNOTSUPP`, as ib_core's `get=` reports it (negated).
const EOPNOTSUPP_ERRNO: i64 = 95;

/// One `bench` command: `Ok(Err(errno))` when ib_core refused the import.
fn register(
    ibimport: &mut TestModule,
    nic: &str,
    dmabuf: &DmaBuf,
    mode: RegMode,
) -> Result<Result<Registered, i64>, String> {
    let report = ibimport.command(&format!(
        "bench fd={} nic={nic} mode={} reps={RUNS} max_seg={EFA_MAX_SEG}",
        dmabuf.as_fd().as_raw_fd(),
        mode.name()
    ))?;
    let get = report.int("get")?;
    if get != 0 {
        return Ok(Err(get));
    }
    Ok(Ok(Registered {
        reg_ns: report.uint("reg_ns")?,
        dereg_ns: report.uint("dereg_ns")?,
        pgsz: report.uint("pgsz")?,
        blocks: report.uint("blocks")?,
    }))
}

/// What the runs found: imports by max segment, registrations by mode.
#[derive(Default)]
struct Found {
    results: Results,
    regs: Registrations,
}

impl Found {
    /// Keeps the better of each time this and `other` (another round) found; an error in
    /// either round stays an error.
    fn keep_best(&mut self, other: Found) {
        for (key, theirs) in other.results {
            let best = match (self.results.remove(&key), theirs) {
                (Some(Ok(ours)), Ok(theirs)) => Ok(ours.fastest(&theirs)),
                (Some(Err(err)), _) | (_, Err(err)) => Err(err),
                (None, theirs) => theirs,
            };
            self.results.insert(key, best);
        }
        for (key, theirs) in other.regs {
            let best = match (self.regs.remove(&key), theirs) {
                (Some(Ok(Some(ours))), Ok(Some(theirs))) => Ok(Some(Registered {
                    reg_ns: ours.reg_ns.min(theirs.reg_ns),
                    dereg_ns: ours.dereg_ns.min(theirs.dereg_ns),
                    ..ours
                })),
                (Some(Err(err)), _) | (_, Err(err)) => Err(err),
                (_, theirs) => theirs,
            };
            self.regs.insert(key, best);
        }
    }
}

/// Rounds of peerdirect and vfio-pci, alternating (the device moves between the two drivers
/// each time), so that a slow phase of the guest does not fall on one exporter only.
const ROUNDS: usize = 4;

/// Measures `dmabuf` (made once per size) with each max segment, then registers it in each
/// mode.
fn measure_each(
    importers: &mut Importers,
    hbm: Option<PciAddress>,
    exporter: Exporter,
    len: u64,
    dmabuf: Result<DmaBuf, String>,
    found: &mut Found,
) {
    for (seg, _) in MAX_SEGS {
        let measured = dmabuf
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|dmabuf| measure(&mut importers.importer, &importers.nic, hbm, dmabuf, seg));
        found.results.insert((exporter, seg, len), measured);
    }
    register_each_mode(importers, exporter, len, &dmabuf, &mut found.regs);
}

/// peerdirect: a fresh allocation of each size, exported whole.
fn bench_peerdirect(
    importers: &mut Importers,
    device: &Device,
    hbm: PciAddress,
    sizes: &[u64],
    found: &mut Found,
) {
    for &len in sizes {
        let allocation = device
            .alloc(len, None)
            .map_err(|err| format!("alloc of {} failed: {err}", size_name(len)));
        let dmabuf = allocation.as_ref().map_err(Clone::clone).and_then(|a| {
            a.export(0, len, ExportFlags::CLOEXEC | ExportFlags::RDWR)
                .map_err(|err| format!("export of {} failed: {err}", size_name(len)))
        });
        measure_each(
            importers,
            Some(hbm),
            Exporter::Peerdirect,
            len,
            dmabuf,
            found,
        );
    }
}

/// DMA-API debug's knobs (CONFIG_DMA_API_DEBUG): how many more errors to report with a
/// WARNING, and how many it has seen.
const DMA_API_NUM_ERRORS: &str = "/sys/kernel/debug/dma-api/num_errors";
const DMA_API_ERROR_COUNT: &str = "/sys/kernel/debug/dma-api/error_count";

fn read_u32(path: &str) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// udmabuf: a sealed memfd of each size (its pages are allocated and pinned by the create).
///
/// udmabuf builds its sg table with `sg_alloc_table_from_pages`, which merges contiguous pages
/// with no regard for the importer's max segment size, so DMA-API debug flags its mappings
/// ("mapping sg segment longer than device claims to support") with a WARNING, which the
/// harness counts as a failed run. That is upstream udmabuf's doing, not this benchmark's: the
/// warnings are turned off (`num_errors` 0) for udmabuf's runs only, and the errors counted
/// meanwhile are printed instead.
fn bench_udmabuf(importers: &mut Importers, sizes: &[u64], found: &mut Found) {
    let num_errors = read_u32(DMA_API_NUM_ERRORS);
    let errors_before = read_u32(DMA_API_ERROR_COUNT);
    if num_errors.is_some() {
        if let Err(err) = write_sysfs(DMA_API_NUM_ERRORS, "0") {
            println!("# udmabuf: {err}");
        }
    }
    bench_udmabuf_sizes(importers, sizes, found);
    if let Some(num_errors) = num_errors {
        if let Err(err) = write_sysfs(DMA_API_NUM_ERRORS, &num_errors.to_string()) {
            println!("# udmabuf: {err}");
        }
    }
    if let (Some(before), Some(after)) = (errors_before, read_u32(DMA_API_ERROR_COUNT)) {
        println!(
            "# udmabuf: DMA-API debug counted {} error(s) in udmabuf's mappings (its warnings \
             were off for these runs: udmabuf's sg entries exceed the NIC's max segment size)",
            after.wrapping_sub(before)
        );
    }
}

fn bench_udmabuf_sizes(importers: &mut Importers, sizes: &[u64], found: &mut Found) {
    let udmabuf = open_udmabuf();
    for &len in sizes.iter().filter(|&&len| len <= UDMABUF_MAX) {
        let dmabuf = udmabuf
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|udmabuf| udmabuf_of(udmabuf, len));
        measure_each(importers, None, Exporter::Udmabuf, len, dmabuf, found);
    }
}

/// `/dev/udmabuf`, to make dma-bufs of guest RAM with [`udmabuf_of`].
pub(crate) fn open_udmabuf() -> Result<File, String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/udmabuf")
        .map_err(|err| format!("cannot open /dev/udmabuf: {err}"))
}

/// A udmabuf of `len` bytes: `UDMABUF_CREATE` over a new sealed memfd, whose pages the create
/// allocates and pins.
pub(crate) fn udmabuf_of(udmabuf: &File, len: u64) -> Result<DmaBuf, String> {
    let memfd = rustix::fs::memfd_create(
        "peerdirect-udmabuf",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|err| format!("memfd_create failed: {err}"))?;
    rustix::fs::ftruncate(&memfd, len)
        .map_err(|err| format!("ftruncate of the memfd to {len} failed: {err}"))?;
    rustix::fs::fcntl_add_seals(&memfd, SealFlags::SHRINK)
        .map_err(|err| format!("F_ADD_SEALS F_SEAL_SHRINK failed: {err}"))?;
    let fd = sys::udmabuf_create(udmabuf.as_fd(), memfd.as_fd(), len)
        .map_err(|err| format!("UDMABUF_CREATE of {} failed: {err}", size_name(len)))?;
    DmaBuf::from_fd(fd).map_err(|err| err.to_string())
}

/// The PCI driver `bdf` is bound to, if any.
fn driver_of(bdf: &str) -> Option<String> {
    let link = fs::read_link(format!("{SYSFS_PCI_DEVICES}/{bdf}/driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// Unbinds `bdf` from its driver, if it has one.
fn unbind(bdf: &str) -> Result<(), String> {
    if driver_of(bdf).is_some() {
        write_sysfs(&format!("{SYSFS_PCI_DEVICES}/{bdf}/driver/unbind"), bdf)?;
    }
    match driver_of(bdf) {
        None => Ok(()),
        Some(driver) => Err(format!("{bdf} is still bound to {driver} after unbind")),
    }
}

/// The IOMMU group of `bdf` and every device in it with its driver, for diagnostics.
fn iommu_group(bdf: &str) -> Result<(String, Vec<String>), String> {
    let link = fs::read_link(format!("{SYSFS_PCI_DEVICES}/{bdf}/iommu_group")).map_err(|err| {
        format!(
            "{bdf} has no IOMMU group ({err}): is the IOMMU on? (qemu/run --topology switch-iommu)"
        )
    })?;
    let group = link
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .ok_or_else(|| format!("{bdf}: odd iommu_group link {}", link.display()))?;
    let mut members: Vec<String> =
        fs::read_dir(format!("/sys/kernel/iommu_groups/{group}/devices"))
            .map_err(|err| format!("cannot list IOMMU group {group}: {err}"))?
            .flatten()
            .map(|entry| {
                let member = entry.file_name().to_string_lossy().into_owned();
                let driver = driver_of(&member).unwrap_or_else(|| "no driver".to_owned());
                format!("{member} ({driver})")
            })
            .collect();
    members.sort();
    Ok((group, members))
}

/// An open vfio-pci device in a type1 container. Fields drop in order: device, group,
/// container.
pub(crate) struct Vfio {
    pub(crate) device: OwnedFd,
    _group: File,
    _container: File,
}

/// Moves the HBM device to vfio-pci (the NIC to no driver, so that their shared group is
/// viable) and opens it through the container/group interface.
pub(crate) fn open_vfio(hbm: &str, nic: &str) -> Result<Vfio, String> {
    // Modules on a distribution's kernel (Debian's), built in on the test kernel: a failure
    // to load them shows below, when the device does not bind.
    for module in ["vfio_pci", "vfio_iommu_type1"] {
        let _ = std::process::Command::new("modprobe").arg(module).status();
    }
    unbind(hbm)?;
    unbind(nic)?;
    write_sysfs(
        &format!("{SYSFS_PCI_DEVICES}/{hbm}/driver_override"),
        "vfio-pci",
    )?;
    write_sysfs("/sys/bus/pci/drivers_probe", hbm)?;
    match driver_of(hbm) {
        Some(driver) if driver == "vfio-pci" => {}
        other => {
            return Err(format!(
                "{hbm} did not bind to vfio-pci (driver: {})",
                other.as_deref().unwrap_or("none")
            ))
        }
    }
    let (group, members) = iommu_group(hbm)?;
    let open = |path: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|err| format!("cannot open {path}: {err}"))
    };
    let container = open("/dev/vfio/vfio")?;
    let version = sys::vfio_get_api_version(container.as_fd())
        .map_err(|err| format!("VFIO_GET_API_VERSION failed: {err}"))?;
    if version != sys::VFIO_API_VERSION {
        return Err(format!(
            "VFIO API version {version}, expected {}",
            sys::VFIO_API_VERSION
        ));
    }
    let type1v2 = sys::vfio_check_extension(container.as_fd(), sys::VFIO_TYPE1V2_IOMMU)
        .map_err(|err| format!("VFIO_CHECK_EXTENSION failed: {err}"))?;
    if type1v2 <= 0 {
        return Err("the VFIO container has no type1v2 IOMMU backend".to_owned());
    }
    let group_path = format!("/dev/vfio/{group}");
    let group_file = open(&group_path)?;
    let status = sys::vfio_group_flags(group_file.as_fd())
        .map_err(|err| format!("VFIO_GROUP_GET_STATUS failed: {err}"))?;
    if status & sys::VFIO_GROUP_FLAGS_VIABLE == 0 {
        return Err(format!(
            "IOMMU group {group} is not viable (each device must be on vfio-pci, a DMA-managing driver such as pcieport, or none): {}",
            members.join(", ")
        ));
    }
    sys::vfio_group_set_container(group_file.as_fd(), container.as_fd()).map_err(|err| {
        format!(
            "VFIO_GROUP_SET_CONTAINER failed: {err} (group {group}: {})",
            members.join(", ")
        )
    })?;
    sys::vfio_set_iommu(container.as_fd(), sys::VFIO_TYPE1V2_IOMMU)
        .map_err(|err| format!("VFIO_SET_IOMMU type1v2 failed: {err}"))?;
    let name = CString::new(hbm).map_err(|err| err.to_string())?;
    let device = sys::vfio_group_get_device_fd(group_file.as_fd(), &name)
        .map_err(|err| format!("VFIO_GROUP_GET_DEVICE_FD {hbm} failed: {err}"))?;
    Ok(Vfio {
        device,
        _group: group_file,
        _container: container,
    })
}

/// Moves the HBM device back from vfio-pci to peerdirect and opens it.
fn rebind_peerdirect(hbm: PciAddress) -> Result<Device, String> {
    let bdf = hbm.to_string();
    unbind(&bdf)?;
    write_sysfs(
        &format!("{SYSFS_PCI_DEVICES}/{bdf}/driver_override"),
        "peerdirect",
    )?;
    write_sysfs("/sys/bus/pci/drivers_probe", &bdf)?;
    match driver_of(&bdf) {
        Some(driver) if driver == "peerdirect" => {}
        other => {
            return Err(format!(
                "{bdf} did not bind back to peerdirect (driver: {})",
                other.as_deref().unwrap_or("none")
            ))
        }
    }
    Device::open_index(INDEX).map_err(|err| format!("reopening {bdf}'s device file: {err}"))
}

/// vfio-pci: BAR 2 bytes `0..len` of the HBM device as one-range dma-bufs.
fn bench_vfio(importers: &mut Importers, hbm: PciAddress, sizes: &[u64], found: &mut Found) {
    let vfio = open_vfio(&hbm.to_string(), &importers.nic);
    if let Err(err) = &vfio {
        println!("# vfio-pci: {err}");
    }
    for &len in sizes {
        let dmabuf = vfio
            .as_ref()
            .map_err(|err| format!("vfio-pci setup failed: {err}"))
            .and_then(|vfio| {
                let fd =
                    sys::vfio_dma_buf(vfio.device.as_fd(), HBM_BAR, 0, len).map_err(|err| {
                        format!(
                            "VFIO_DEVICE_FEATURE_DMA_BUF of {} failed: {err}",
                            size_name(len)
                        )
                    })?;
                DmaBuf::from_fd(fd).map_err(|err| err.to_string())
            });
        measure_each(importers, Some(hbm), Exporter::VfioPci, len, dmabuf, found);
    }
}

fn micros(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1000.0)
}

fn ratio(ours: u64, theirs: u64) -> String {
    if theirs == 0 {
        "-".to_owned()
    } else {
        format!("{:.2}", ours as f64 / theirs as f64)
    }
}

/// The table: one line per exporter, max segment and size, failures in place of numbers.
fn table(results: &Results, sizes: &[u64]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<11} {:>10} {:>7} {:>6} {:>10} {:>10} {:>16}",
        "exporter", "max_seg", "size", "nents", "attach µs", "map µs", "unmap+detach µs"
    )];
    for exporter in Exporter::ALL {
        for (seg, _) in MAX_SEGS {
            for &len in sizes {
                let head = format!("{:<11} {seg:>10} {:>7}", exporter.name(), size_name(len));
                let line = match results.get(&(exporter, seg, len)) {
                    Some(Ok(m)) => format!(
                        "{head} {:>6} {:>10} {:>10} {:>16}",
                        m.nents,
                        micros(m.attach_ns),
                        micros(m.map_ns),
                        micros(m.unmap_detach_ns)
                    ),
                    Some(Err(err)) => format!("{head} failed: {err}"),
                    None => format!("{head} not run"),
                };
                lines.push(line);
            }
        }
    }
    lines
}

/// How many cycles one command of a case runs: [`CYCLES`] where peerdirect maps at most
/// [`CYCLES_UP_TO`] entries, else 1 (a map of thousands of entries is long enough to time
/// alone, and many of them would make the run long).
fn cycles_for(len: u64, max_seg: u64) -> u64 {
    if expected_nents(len, max_seg) <= CYCLES_UP_TO {
        CYCLES
    } else {
        1
    }
}

/// The sg entries peerdirect owes an importer: one per `min(len, max segment)`, the max
/// segment rounded down to the page size.
fn expected_nents(len: u64, max_seg: u64) -> u64 {
    len.div_ceil(len.min((max_seg & !(PAGE - 1)).max(PAGE)))
}

/// The longest sg entry: what its 32-bit length holds, page aligned.
const MAX_ENTRY: u64 = u32::MAX as u64 & !(PAGE - 1);

/// The entries a map of `len` bytes owes an importer with `max_seg`: one per
/// `min(len, max_seg)`, but in one IOVA range, where the max segment is moot (the decision
/// in Documentation/exporter.md): one per [`MAX_ENTRY`].
fn owed_nents(len: u64, max_seg: u64, one_iova: bool) -> u64 {
    expected_nents(len, if one_iova { MAX_ENTRY } else { max_seg })
}

impl Measured {
    /// Whether the importer got one IOVA range: its DMA goes through an IOMMU, and the map's
    /// first address is not in `bar`, the HBM BAR's bus addresses.
    fn one_iova(&self, bar: &Range<u64>) -> bool {
        self.importer_iommu == "1" && !bar.contains(&self.dma_first)
    }
}

/// Whether peerdirect meets [`GOAL`] against vfio-pci with a real NIC's max segment, and maps
/// the entries owed ([`owed_nents`]; `bar`: the HBM BAR's bus addresses): `None` where there
/// is no goal (the PCI default) or nothing to compare.
fn goal(
    ours: &Measured,
    vfio: &Measured,
    len: u64,
    max_seg: u64,
    bar: &Range<u64>,
) -> Option<bool> {
    if max_seg < 2 << 30 {
        return None;
    }
    let within = |a: u64, b: u64| b > 0 && a as f64 <= GOAL * b as f64;
    Some(
        within(ours.attach_ns, vfio.attach_ns)
            && within(ours.map_ns, vfio.map_ns)
            && within(ours.unmap_detach_ns, vfio.unmap_detach_ns)
            && ours.nents == owed_nents(len, max_seg, ours.one_iova(bar)),
    )
}

/// peerdirect's times divided by another exporter's, per max segment and size (below 1:
/// peerdirect is faster), and against vfio-pci whether the goal is met (`bar`: the HBM BAR's
/// bus addresses).
fn ratios(results: &Results, sizes: &[u64], bar: &Range<u64>) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<21} {:>10} {:>7} {:>7} {:>7} {:>13} {:>8}",
        "ratio", "max_seg", "size", "attach", "map", "unmap+detach", "goal"
    )];
    for other in [Exporter::VfioPci, Exporter::Udmabuf] {
        for (seg, _) in MAX_SEGS {
            for &len in sizes {
                let name = format!("peerdirect/{}", other.name());
                let head = format!("{name:<21} {seg:>10} {:>7}", size_name(len));
                let (Some(Ok(ours)), Some(Ok(theirs))) = (
                    results.get(&(Exporter::Peerdirect, seg, len)),
                    results.get(&(other, seg, len)),
                ) else {
                    lines.push(format!("{head} -"));
                    continue;
                };
                let verdict = match other {
                    Exporter::VfioPci => goal(ours, theirs, len, seg, bar),
                    _ => None,
                };
                lines.push(format!(
                    "{head} {:>7} {:>7} {:>13} {:>8}",
                    ratio(ours.attach_ns, theirs.attach_ns),
                    ratio(ours.map_ns, theirs.map_ns),
                    ratio(ours.unmap_detach_ns, theirs.unmap_detach_ns),
                    match verdict {
                        Some(true) => "met",
                        Some(false) => "not met",
                        None => "-",
                    }
                ));
            }
        }
    }
    lines
}

/// Whether peerdirect's registration of `len` bytes in `mode` meets its goal: from 1 GiB,
/// within [`REG_GOAL`] of vfio-pci's revocable registration, [`REG_UDMABUF_GOAL`] times
/// faster than udmabuf's in the same mode (when udmabuf could be measured), and with a
/// 1 GiB page where the DMA address and size allow one. `None` below 1 GiB or without vfio.
fn reg_goal(regs: &Registrations, mode: RegMode, len: u64) -> Option<bool> {
    if len < 1 << 30 {
        return None;
    }
    let get = |e: Exporter, m: RegMode| match regs.get(&(e, m, len)) {
        Some(Ok(Some(r))) => Some(r.clone()),
        _ => None,
    };
    let ours = get(Exporter::Peerdirect, mode)?;
    let vfio = get(Exporter::VfioPci, RegMode::Revocable)?;
    let within = ours.reg_ns as f64 <= REG_GOAL * vfio.reg_ns as f64
        && ours.dereg_ns as f64 <= REG_GOAL * vfio.dereg_ns as f64;
    let faster = get(Exporter::Udmabuf, mode)
        .is_none_or(|u| ours.reg_ns as f64 * REG_UDMABUF_GOAL <= u.reg_ns as f64);
    Some(within && faster && ours.pgsz >= vfio.pgsz.min(1 << 30))
}

/// The registration table: one line per mode and size, each exporter's registration and
/// release (page size, blocks), peerdirect's ratios, and the goal.
fn reg_table(regs: &Registrations, sizes: &[u64]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<9} {:>7} {:>30} {:>30} {:>30} {:>11} {:>11} {:>8}",
        "mode",
        "size",
        "peerdirect reg/dereg (pgsz, blocks)",
        "vfio-pci",
        "udmabuf",
        "p/vfio reg",
        "udmabuf/p",
        "goal"
    )];
    for mode in RegMode::ALL {
        for &len in sizes {
            let cell = |e: Exporter| match regs.get(&(e, mode, len)) {
                Some(Ok(Some(r))) => format!(
                    "{}/{} ({}, {})",
                    micros(r.reg_ns),
                    micros(r.dereg_ns),
                    size_name(r.pgsz),
                    r.blocks
                ),
                Some(Ok(None)) => "refused (not revocable)".to_owned(),
                Some(Err(_)) => "failed".to_owned(),
                None => "not run".to_owned(),
            };
            let reg = |e: Exporter, m: RegMode| match regs.get(&(e, m, len)) {
                Some(Ok(Some(r))) => r.reg_ns,
                _ => 0,
            };
            let ours = reg(Exporter::Peerdirect, mode);
            lines.push(format!(
                "{:<9} {:>7} {:>30} {:>30} {:>30} {:>11} {:>11} {:>8}",
                mode.name(),
                size_name(len),
                cell(Exporter::Peerdirect),
                cell(Exporter::VfioPci),
                cell(Exporter::Udmabuf),
                ratio(ours, reg(Exporter::VfioPci, RegMode::Revocable)),
                match (ours, reg(Exporter::Udmabuf, mode)) {
                    (0, _) | (_, 0) => "-".to_owned(),
                    (ours, udmabuf) => ratio(udmabuf, ours),
                },
                match reg_goal(regs, mode, len) {
                    Some(true) => "met",
                    Some(false) => "not met",
                    None => "-",
                }
            ));
        }
    }
    for ((e, m, len), r) in regs {
        if let Err(err) = r {
            lines.push(format!(
                "# {} {} {}: {err}",
                e.name(),
                m.name(),
                size_name(*len)
            ));
        }
    }
    lines.push(format!(
        "# p/vfio: peerdirect's registration time over vfio-pci's revocable one (vfio-pci \
         refuses the pinned path); udmabuf/p: how many times faster peerdirect registers than \
         udmabuf. goal from 1 GiB: within {REG_GOAL}x of vfio-pci (registration and release), \
         at least {REG_UDMABUF_GOAL}x faster than udmabuf, 1 GiB pages where aligned"
    ));
    lines
}

/// Where each exporter's mapping points, as the importer saw it (the first size of each).
fn notes(results: &Results, sizes: &[u64], hbm_bus_addr: u64) -> Vec<String> {
    let mut lines = Vec::new();
    for exporter in Exporter::ALL {
        let of_exporter = || {
            results
                .iter()
                .filter(move |((e, _, len), _)| *e == exporter && sizes.contains(len))
                .filter_map(|(_, m)| m.as_ref().ok())
        };
        let Some(m) = of_exporter().next() else {
            continue;
        };
        let largest = of_exporter().map(|m| m.max_entry).max().unwrap_or(0);
        let over: u64 = of_exporter().map(|m| m.over_max_seg).sum();
        let whence = if m.dma_first == hbm_bus_addr {
            " = the HBM BAR's bus address: P2P through the switch, no IOMMU in the path"
        } else {
            ""
        };
        lines.push(format!(
            "# {}: exp_name={} dma_first={:#x}{whence}; largest sg entry {} bytes, {} entries longer than max_seg (all runs); importer_iommu={}{}",
            exporter.name(),
            m.exp_name,
            m.dma_first,
            largest,
            over,
            m.importer_iommu,
            m.p2p_distance
                .map_or(String::new(), |d| format!("; p2p_distance HBM→NIC {d}"))
        ));
    }
    lines
}

/// Runs the benchmark and prints the table; success iff every case was measured.
pub(crate) fn run() -> ExitCode {
    let setup = (|| {
        let importer = TestModule::load_importer()?;
        let nic = find_nic()?;
        let device = Device::open_index(INDEX).map_err(|err| err.to_string())?;
        let info = device.info().map_err(|err| err.to_string())?;
        Ok::<_, String>((importer, nic, device, info))
    })();
    let (importer, nic, device, info) = match setup {
        Ok(setup) => setup,
        Err(err) => {
            println!("# setup failed: {err}");
            return ExitCode::FAILURE;
        }
    };
    let sizes: Vec<u64> = SIZES
        .into_iter()
        .filter(|&len| len <= info.hbm_bytes)
        .collect();
    println!(
        "# kernel {}",
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|err| format!("unknown ({err})"), |r| r.trim().to_owned())
    );
    println!(
        "# exporters → NIC {nic} (virtio-net) through peerdirect_importer, mode=dynamic \
         (allow_peer2peer + invalidate_mappings: vfio-pci refuses importers it cannot revoke, so \
         all three attach this way); HBM {} ({}, bus address {:#x}); best of {RUNS} commands \
         in each of {ROUNDS} rounds that alternate peerdirect and vfio-pci (udmabuf: one \
         round), a command's time the median of its {CYCLES} cycles where peerdirect maps at \
         most {CYCLES_UP_TO} entries, else its one cycle",
        info.pci_address,
        size_name(info.hbm_bytes),
        info.hbm_bus_addr
    );

    let ibimport = crate::ibimport::load_module();
    if let Err(err) = &ibimport {
        println!("# registrations: {err}");
    }
    let mut importers = Importers {
        importer,
        ibimport,
        nic,
    };
    let mut found = Found::default();
    let mut device = Some(device);
    for round in 0..ROUNDS {
        let device = match device
            .take()
            .map_or_else(|| rebind_peerdirect(info.pci_address), Ok)
        {
            Ok(device) => device,
            Err(err) => {
                println!("# round {}: {err}", round + 1);
                break;
            }
        };
        let mut this = Found::default();
        bench_peerdirect(&mut importers, &device, info.pci_address, &sizes, &mut this);
        if round == 0 {
            bench_udmabuf(&mut importers, &sizes, &mut this);
        }
        // vfio-pci takes the device over: peerdirect must let go of it first.
        drop(device);
        bench_vfio(&mut importers, info.pci_address, &sizes, &mut this);
        found.keep_best(this);
    }
    let Found { results, regs } = found;

    for line in table(&results, &sizes) {
        println!("{line}");
    }
    println!();
    println!(
        "# peerdirect's best time divided by the other exporter's (below 1: peerdirect is faster)"
    );
    let bar = info.hbm_bus_addr..info.hbm_bus_addr + info.hbm_bytes;
    for line in ratios(&results, &sizes, &bar) {
        println!("{line}");
    }
    for line in notes(&results, &sizes, info.hbm_bus_addr) {
        println!("{line}");
    }
    println!(
        "# max_seg is the NIC's DMA max segment size, set by the importer for each attachment: \
         {}. peerdirect cuts its ranges there (rounded down to the page size) where the NIC \
         DMAs to bus addresses, as habanalabs does, and maps them whole through an IOMMU; \
         vfio-pci gives one entry per range (up to 4 GiB); udmabuf's entries are what the \
         IOMMU mapping merged. goal: with a real NIC's max segment, attach, map and \
         unmap+detach each within {GOAL}x of vfio-pci's, and one entry per min(size, max_seg) \
         (in one IOVA range, where the max segment is moot: one per 4 GiB less a page)",
        MAX_SEGS
            .iter()
            .map(|(seg, whose)| format!("{seg} ({whose})"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!();
    println!(
        "# a memory registration as RDMA drivers make one, through ib_core \
         (peerdirect_ibimport bench), the NIC's max segment EFA's ({EFA_MAX_SEG}): get the \
         umem (pinned: EFA's ib_umem_dmabuf_get_pinned_with_dma_device; revocable: irdma's), \
         best page size of 4 KiB..2 GiB, every DMA block walked; then ib_umem_release. Best of \
         {RUNS} in each of {ROUNDS} rounds, µs"
    );
    for line in reg_table(&regs, &sizes) {
        println!("{line}");
    }
    if results.values().all(Result::is_ok) && regs.values().all(Result::is_ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--profile-exporters N`: N attach, map and unmap+detach cycles of a 2 MiB dma-buf by the
/// NIC (dynamic, EFA's max segment), from peerdirect and then from vfio-pci (the same BAR),
/// each exporter's cycles framed by a line `# profile EXPORTER START END` (`CLOCK_MONOTONIC`
/// seconds), so that `scripts/profile-exporters`, which samples the guest with `perf`
/// meanwhile, can tell whose samples are whose. Leaves the HBM device on vfio-pci.
pub(crate) fn profile(cycles: u64) -> ExitCode {
    let run = || -> Result<(), String> {
        let mut importer = TestModule::load_importer()?;
        let nic = find_nic()?;
        let len = 2 * MIB;
        let hbm = {
            let device = Device::open_index(INDEX).map_err(|err| err.to_string())?;
            let hbm = device.info().map_err(|err| err.to_string())?.pci_address;
            let allocation = device
                .alloc(len, None)
                .map_err(|err| format!("alloc: {err}"))?;
            let dmabuf = allocation
                .export(0, len, ExportFlags::CLOEXEC | ExportFlags::RDWR)
                .map_err(|err| format!("export: {err}"))?;
            cycle(&mut importer, &nic, Exporter::Peerdirect, &dmabuf, cycles)?;
            // vfio-pci takes the device over: peerdirect must let go of it first (here).
            hbm
        };
        let vfio = open_vfio(&hbm.to_string(), &nic)?;
        let fd = sys::vfio_dma_buf(vfio.device.as_fd(), HBM_BAR, 0, len)
            .map_err(|err| format!("VFIO_DEVICE_FEATURE_DMA_BUF: {err}"))?;
        let dmabuf = DmaBuf::from_fd(fd).map_err(|err| err.to_string())?;
        cycle(&mut importer, &nic, Exporter::VfioPci, &dmabuf, cycles)
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            println!("# profile: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `CLOCK_MONOTONIC` in seconds: the clock `perf record -k CLOCK_MONOTONIC` stamps samples with
/// (`std::time::Instant` reads it too, but gives no absolute value).
fn monotonic() -> f64 {
    sys::monotonic().map_or(f64::NAN, |(secs, nanos)| secs as f64 + nanos as f64 / 1e9)
}

/// Cycles one profiling command runs in the kernel: the samples fall on the dma-buf calls,
/// not on the command's own parsing and reporting.
const PROFILE_BATCH: u64 = 100;

/// `cycles` imports of `dmabuf` by `nic`, [`PROFILE_BATCH`] per command, framed by their
/// `# profile` line.
fn cycle(
    importer: &mut TestModule,
    nic: &str,
    exporter: Exporter,
    dmabuf: &DmaBuf,
    cycles: u64,
) -> Result<(), String> {
    let start = monotonic();
    let mut left = cycles;
    while left > 0 {
        let batch = left.min(PROFILE_BATCH);
        left -= batch;
        let line = format!(
            "fd={} dev={nic} mode=dynamic max_seg={EFA_MAX_SEG} cycles={batch}",
            dmabuf.as_fd().as_raw_fd()
        );
        let report = importer.command(&line)?;
        let failed = report.int("attach")? != 0
            || report.int("map")? != 0
            || (batch > 1 && report.int("cycles_failed")? != 0);
        if failed {
            return Err(format!("{}: {}", exporter.name(), report.summary()));
        }
    }
    println!(
        "# profile {} {start:.6} {:.6}",
        exporter.name(),
        monotonic()
    );
    Ok(())
}

/// The raw udmabuf and VFIO ioctls, and the monotonic clock: the only `unsafe` code of this
/// benchmark. Each wrapper passes exactly the argument its request takes, and the fds the
/// kernel returns become `OwnedFd`s at once.
mod sys {
    /// `clock_gettime(CLOCK_MONOTONIC)`, as seconds and nanoseconds (rustix's clock would
    /// need its `time` feature, whose vDSO lookup faults under valgrind in the C ABI's test).
    pub(super) fn monotonic() -> std::io::Result<(i64, i64)> {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid, writable `timespec` for the call.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((t.tv_sec, t.tv_nsec))
    }

    use core::ffi::{c_int, c_void, CStr};
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

    use rustix::fs::OFlags;
    use rustix::io::Result;
    use rustix::ioctl::{ioctl, opcode, Ioctl, IoctlOutput, Opcode};

    /// `struct udmabuf_create` (include/uapi/linux/udmabuf.h).
    #[repr(C)]
    struct UdmabufCreate {
        memfd: u32,
        flags: u32,
        offset: u64,
        size: u64,
    }
    const UDMABUF_FLAGS_CLOEXEC: u32 = 0x01;
    const UDMABUF_CREATE: Opcode = opcode::write::<UdmabufCreate>(b'u', 0x42);

    // include/uapi/linux/vfio.h: VFIO_TYPE ';', VFIO_BASE 100; every request is `_IO`.
    pub(super) const VFIO_API_VERSION: c_int = 0;
    pub(super) const VFIO_TYPE1V2_IOMMU: usize = 3;
    pub(super) const VFIO_GROUP_FLAGS_VIABLE: u32 = 1 << 0;
    const VFIO_GET_API_VERSION: Opcode = opcode::none(b';', 100);
    const VFIO_CHECK_EXTENSION: Opcode = opcode::none(b';', 101);
    const VFIO_SET_IOMMU: Opcode = opcode::none(b';', 102);
    const VFIO_GROUP_GET_STATUS: Opcode = opcode::none(b';', 103);
    const VFIO_GROUP_SET_CONTAINER: Opcode = opcode::none(b';', 104);
    const VFIO_GROUP_GET_DEVICE_FD: Opcode = opcode::none(b';', 106);
    const VFIO_DEVICE_FEATURE: Opcode = opcode::none(b';', 117);
    const VFIO_DEVICE_FEATURE_GET: u32 = 1 << 16;
    const VFIO_DEVICE_FEATURE_DMA_BUF: u32 = 11;

    /// `struct vfio_group_status`.
    #[repr(C)]
    struct VfioGroupStatus {
        argsz: u32,
        flags: u32,
    }

    /// `struct vfio_device_feature` whose `data[]` is a `struct vfio_device_feature_dma_buf`
    /// with one `struct vfio_region_dma_range`.
    #[repr(C)]
    struct VfioFeatureDmaBuf {
        argsz: u32,
        flags: u32,
        region_index: u32,
        open_flags: u32,
        dma_buf_flags: u32,
        nr_ranges: u32,
        range_offset: u64,
        range_length: u64,
    }
    // The range must start where the C flexible array does: after six `__u32`s.
    const _: () = assert!(core::mem::offset_of!(VfioFeatureDmaBuf, range_offset) == 24);
    const _: () = assert!(core::mem::size_of::<VfioFeatureDmaBuf>() == 40);

    /// An ioctl whose argument is an integer or a pointer, and whose result is the syscall's
    /// return value (an fd, a version, a yes/no).
    struct Raw {
        opcode: Opcode,
        arg: *mut c_void,
    }

    // SAFETY: `as_ptr` hands the kernel exactly the argument the caller chose; `IS_MUTATING`
    // is true, which never promises more than the truth (the kernel may write through
    // pointer arguments); the output is the return value alone, read from no pointer.
    unsafe impl Ioctl for Raw {
        type Output = c_int;

        const IS_MUTATING: bool = true;

        fn opcode(&self) -> Opcode {
            self.opcode
        }

        fn as_ptr(&mut self) -> *mut c_void {
            self.arg
        }

        unsafe fn output_from_ptr(out: IoctlOutput, _: *mut c_void) -> Result<c_int> {
            Ok(out)
        }
    }

    /// Adopts an fd a successful ioctl just returned.
    ///
    /// # Safety
    ///
    /// `fd` must be a new file descriptor the kernel installed for this call, which nothing
    /// else in the process owns.
    unsafe fn adopt(fd: c_int) -> OwnedFd {
        // SAFETY: the caller's contract: `fd` is open and has no other owner.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    /// `UDMABUF_CREATE`: a dma-buf of bytes `0..size` of `memfd`, close-on-exec.
    pub(super) fn udmabuf_create(
        udmabuf: BorrowedFd<'_>,
        memfd: BorrowedFd<'_>,
        size: u64,
    ) -> Result<OwnedFd> {
        let mut create = UdmabufCreate {
            memfd: memfd.as_raw_fd() as u32,
            flags: UDMABUF_FLAGS_CLOEXEC,
            offset: 0,
            size,
        };
        let request = Raw {
            opcode: UDMABUF_CREATE,
            arg: core::ptr::from_mut(&mut create).cast(),
        };
        // UDMABUF_CREATE takes a `const struct udmabuf_create *`; its `_IOW` size is that of
        // `UdmabufCreate`, the same `repr(C)` layout.
        // SAFETY: the kernel only reads `create`, which lives until the call returns.
        let fd = unsafe { ioctl(udmabuf, request) }?;
        // SAFETY: on success UDMABUF_CREATE returns a new dma-buf fd (dma_buf_fd) that only
        // this call has seen.
        Ok(unsafe { adopt(fd) })
    }

    /// `VFIO_GET_API_VERSION` of a container.
    pub(super) fn vfio_get_api_version(container: BorrowedFd<'_>) -> Result<c_int> {
        let request = Raw {
            opcode: VFIO_GET_API_VERSION,
            arg: core::ptr::null_mut(),
        };
        // SAFETY: VFIO_GET_API_VERSION ignores its argument and touches no user memory.
        unsafe { ioctl(container, request) }
    }

    /// `VFIO_CHECK_EXTENSION`: > 0 when the container supports IOMMU backend `extension`.
    pub(super) fn vfio_check_extension(
        container: BorrowedFd<'_>,
        extension: usize,
    ) -> Result<c_int> {
        let request = Raw {
            opcode: VFIO_CHECK_EXTENSION,
            arg: core::ptr::without_provenance_mut(extension),
        };
        // SAFETY: VFIO_CHECK_EXTENSION takes its argument as an integer, never as a pointer,
        // so no user memory is touched.
        unsafe { ioctl(container, request) }
    }

    /// `VFIO_SET_IOMMU` of a container whose group is set.
    pub(super) fn vfio_set_iommu(container: BorrowedFd<'_>, iommu: usize) -> Result<()> {
        let request = Raw {
            opcode: VFIO_SET_IOMMU,
            arg: core::ptr::without_provenance_mut(iommu),
        };
        // SAFETY: VFIO_SET_IOMMU takes its argument as an integer (the backend type), never
        // as a pointer, so no user memory is touched.
        unsafe { ioctl(container, request) }.map(drop)
    }

    /// `VFIO_GROUP_GET_STATUS`: the group's flags.
    pub(super) fn vfio_group_flags(group: BorrowedFd<'_>) -> Result<u32> {
        let mut status = VfioGroupStatus {
            argsz: core::mem::size_of::<VfioGroupStatus>() as u32,
            flags: 0,
        };
        let request = Raw {
            opcode: VFIO_GROUP_GET_STATUS,
            arg: core::ptr::from_mut(&mut status).cast(),
        };
        // VFIO_GROUP_GET_STATUS takes a `struct vfio_group_status *` (`VfioGroupStatus` has
        // its `repr(C)` layout), reads `argsz` and writes back at most `argsz` bytes.
        // SAFETY: all of them are inside `status`, live and unborrowed; any bits are valid u32s.
        unsafe { ioctl(group, request) }?;
        Ok(status.flags)
    }

    /// `VFIO_GROUP_SET_CONTAINER`.
    pub(super) fn vfio_group_set_container(
        group: BorrowedFd<'_>,
        container: BorrowedFd<'_>,
    ) -> Result<()> {
        let mut fd: i32 = container.as_raw_fd();
        let request = Raw {
            opcode: VFIO_GROUP_SET_CONTAINER,
            arg: core::ptr::from_mut(&mut fd).cast(),
        };
        // SAFETY: VFIO_GROUP_SET_CONTAINER takes an `int32_t *` holding the container's fd and
        // only reads it; `fd` lives until the call returns.
        unsafe { ioctl(group, request) }.map(drop)
    }

    /// `VFIO_GROUP_GET_DEVICE_FD`: the device named `name` (its PCI address).
    pub(super) fn vfio_group_get_device_fd(group: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd> {
        let request = Raw {
            opcode: VFIO_GROUP_GET_DEVICE_FD,
            arg: name.as_ptr().cast_mut().cast(),
        };
        // SAFETY: VFIO_GROUP_GET_DEVICE_FD takes a `char *`, a NUL-terminated name, which the
        // kernel reads (strndup_user) and never writes; `name` is one and outlives the call.
        let fd = unsafe { ioctl(group, request) }?;
        // SAFETY: on success the kernel returns a new device fd that only this call has seen.
        Ok(unsafe { adopt(fd) })
    }

    /// `VFIO_DEVICE_FEATURE` `GET | DMA_BUF`: bytes `offset..offset + length` of region
    /// `region` (a BAR) as a dma-buf, read-write and close-on-exec.
    pub(super) fn vfio_dma_buf(
        device: BorrowedFd<'_>,
        region: u32,
        offset: u64,
        length: u64,
    ) -> Result<OwnedFd> {
        let mut feature = VfioFeatureDmaBuf {
            argsz: core::mem::size_of::<VfioFeatureDmaBuf>() as u32,
            flags: VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_DMA_BUF,
            region_index: region,
            open_flags: (OFlags::RDWR | OFlags::CLOEXEC).bits(),
            dma_buf_flags: 0,
            nr_ranges: 1,
            range_offset: offset,
            range_length: length,
        };
        let request = Raw {
            opcode: VFIO_DEVICE_FEATURE,
            arg: core::ptr::from_mut(&mut feature).cast(),
        };
        // VFIO_DEVICE_FEATURE takes a `struct vfio_device_feature *` followed by the feature's
        // data; for GET of DMA_BUF that is a `struct vfio_device_feature_dma_buf` and
        // `nr_ranges` (1) `struct vfio_region_dma_range`s: `VfioFeatureDmaBuf`'s `repr(C)`
        // layout (checked above). This feature writes no data back.
        // SAFETY: the kernel reads `argsz` bytes, all inside `feature`, live during the call.
        let fd = unsafe { ioctl(device, request) }?;
        // SAFETY: on success the kernel returns a new dma-buf fd (dma_buf_fd) that only this
        // call has seen.
        Ok(unsafe { adopt(fd) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(attach_ns: u64, map_ns: u64, unmap_detach_ns: u64) -> Measured {
        Measured {
            nents: 32,
            max_seg: 65536,
            max_entry: 65536,
            over_max_seg: 0,
            attach_ns,
            map_ns,
            unmap_detach_ns,
            exp_name: "x".to_owned(),
            dma_first: 0xd000_0000,
            importer_iommu: "1".to_owned(),
            p2p_distance: Some(4),
        }
    }

    fn registered(reg_ns: u64, dereg_ns: u64, pgsz: u64) -> Result<Option<Registered>, String> {
        Ok(Some(Registered {
            reg_ns,
            dereg_ns,
            pgsz,
            blocks: 1,
        }))
    }

    #[test]
    fn registration_goal_from_1_gib_against_vfio_revocable_and_udmabuf() {
        const GIB: u64 = 1 << 30;
        let regs = |ours: (u64, u64, u64), udmabuf_ns: u64| {
            let mut regs = Registrations::new();
            for len in [2 * MIB, GIB] {
                let (reg, dereg, pgsz) = ours;
                regs.insert(
                    (Exporter::Peerdirect, RegMode::Pinned, len),
                    registered(reg, dereg, pgsz),
                );
                regs.insert((Exporter::VfioPci, RegMode::Pinned, len), Ok(None));
                regs.insert(
                    (Exporter::VfioPci, RegMode::Revocable, len),
                    registered(100, 50, GIB),
                );
                regs.insert(
                    (Exporter::Udmabuf, RegMode::Pinned, len),
                    registered(udmabuf_ns, 500, 4096),
                );
            }
            regs
        };
        let good = regs((110, 55, GIB), 20_000);
        assert_eq!(reg_goal(&good, RegMode::Pinned, 2 * MIB), None);
        assert_eq!(reg_goal(&good, RegMode::Pinned, GIB), Some(true));
        // No vfio-pci revocable registration to compare with: no verdict.
        assert_eq!(reg_goal(&good, RegMode::Revocable, GIB), None);
        // Too slow against vfio-pci, in registration or release.
        assert_eq!(
            reg_goal(&regs((130, 55, GIB), 20_000), RegMode::Pinned, GIB),
            Some(false)
        );
        assert_eq!(
            reg_goal(&regs((110, 61, GIB), 20_000), RegMode::Pinned, GIB),
            Some(false)
        );
        // Less than 100x faster than udmabuf.
        assert_eq!(
            reg_goal(&regs((110, 55, GIB), 10_000), RegMode::Pinned, GIB),
            Some(false)
        );
        // A smaller page than vfio-pci's 1 GiB.
        assert_eq!(
            reg_goal(&regs((110, 55, 2 * MIB), 20_000), RegMode::Pinned, GIB),
            Some(false)
        );
        let table = reg_table(&good, &[GIB]);
        assert!(table.iter().any(|l| l.contains("refused (not revocable)")));
        assert!(table
            .iter()
            .any(|l| l.starts_with("pinned") && l.contains("met")));
    }

    #[test]
    fn ratios_divide_peerdirect_by_the_other() {
        let mut results = Results::new();
        const SEG: u64 = 64 << 10;
        results.insert(
            (Exporter::Peerdirect, SEG, 2 * MIB),
            Ok(measured(1000, 3000, 500)),
        );
        results.insert(
            (Exporter::VfioPci, SEG, 2 * MIB),
            Ok(measured(500, 1000, 1000)),
        );
        results.insert((Exporter::Udmabuf, SEG, 2 * MIB), Err("no".to_owned()));
        let lines = ratios(&results, &[2 * MIB], &(0xd000_0000..0xe000_0000));
        // A header, then per other exporter one line per max segment.
        assert_eq!(lines.len(), 1 + 2 * MAX_SEGS.len());
        let vfio: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            vfio,
            [
                "peerdirect/vfio-pci",
                "65536",
                "2",
                "MiB",
                "2.00",
                "3.00",
                "0.50",
                "-"
            ]
        );
        assert!(lines[2].ends_with('-'), "{}", lines[2]);
        assert!(lines[4].ends_with('-'), "{}", lines[4]);
    }

    #[test]
    fn goal_needs_a_real_nics_max_segment_every_ratio_within_and_the_entries_owed() {
        const GIB: u64 = 1 << 30;
        let efa = u64::from(u32::MAX);
        let vfio = measured(1000, 1000, 1000);
        let fast = Measured {
            nents: 1,
            ..measured(1200, 1100, 900)
        };
        // `measured`'s first address is the BAR's bus address.
        let bar = 0xd000_0000..0xd000_0000 + 16 * GIB;
        assert_eq!(goal(&fast, &vfio, GIB, 64 << 10, &bar), None);
        assert_eq!(goal(&fast, &vfio, GIB, efa, &bar), Some(true));
        assert_eq!(goal(&fast, &vfio, GIB, 2 * GIB, &bar), Some(true));
        let slow_map = Measured {
            map_ns: 1201,
            ..fast.clone()
        };
        assert_eq!(goal(&slow_map, &vfio, GIB, efa, &bar), Some(false));
        let cut = Measured {
            nents: 2,
            ..fast.clone()
        };
        assert_eq!(goal(&cut, &vfio, GIB, efa, &bar), Some(false));
        // 16 GiB with mlx5's segment: 8 entries by bus address; 5 in one IOVA range (an
        // IOMMU, and an address outside the BAR), where the max segment is moot.
        let bus = |nents| Measured {
            nents,
            ..fast.clone()
        };
        assert_eq!(goal(&bus(8), &vfio, 16 * GIB, 2 * GIB, &bar), Some(true));
        assert_eq!(goal(&bus(5), &vfio, 16 * GIB, 2 * GIB, &bar), Some(false));
        let iova = |nents| Measured {
            nents,
            dma_first: 0xffff_0000_0000,
            ..fast.clone()
        };
        assert_eq!(goal(&iova(5), &vfio, 16 * GIB, 2 * GIB, &bar), Some(true));
        assert_eq!(goal(&iova(8), &vfio, 16 * GIB, 2 * GIB, &bar), Some(false));
        // Outside the BAR without an IOMMU: the physical range, cut at the max segment.
        let direct = Measured {
            importer_iommu: "0".to_owned(),
            ..iova(8)
        };
        assert_eq!(goal(&direct, &vfio, 16 * GIB, 2 * GIB, &bar), Some(true));
        // 16 GiB with EFA's max segment: cut below 4 GiB, at a page boundary.
        assert_eq!(expected_nents(16 * GIB, efa), 5);
        assert_eq!(expected_nents(2 * MIB, 64 << 10), 32);
        assert_eq!(expected_nents(GIB, 2 * GIB), 1);
    }

    #[test]
    fn table_shows_numbers_and_failures() {
        let mut results = Results::new();
        const SEG: u64 = 64 << 10;
        results.insert(
            (Exporter::Peerdirect, SEG, 2 * MIB),
            Ok(measured(1234, 5678, 90)),
        );
        results.insert((Exporter::Udmabuf, SEG, 2 * MIB), Err("boom".to_owned()));
        let lines = table(&results, &[2 * MIB]);
        assert_eq!(lines.len(), 1 + Exporter::ALL.len() * MAX_SEGS.len());
        let peerdirect: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            peerdirect,
            [
                "peerdirect",
                "65536",
                "2",
                "MiB",
                "32",
                "1.23",
                "5.68",
                "0.09"
            ]
        );
        assert!(lines[2].contains("not run"), "{}", lines[2]);
        let udmabuf = 1 + MAX_SEGS.len();
        assert!(
            lines[udmabuf].contains("failed: boom"),
            "{}",
            lines[udmabuf]
        );
    }

    #[test]
    fn few_entries_are_timed_over_many_cycles_in_one_command() {
        const GIB: u64 = 1 << 30;
        // 32 and 64 entries of the PCI default's 64 KiB: many cycles.
        assert_eq!(cycles_for(2 * MIB, 64 << 10), CYCLES);
        assert_eq!(cycles_for(4 * MIB, 64 << 10), CYCLES);
        // 65 and more: one.
        assert_eq!(cycles_for(4 * MIB + 4096, 64 << 10), 1);
        assert_eq!(cycles_for(64 * MIB, 64 << 10), 1);
        // Real NICs' rows: at most 8 entries.
        for seg in [2 * GIB, u32::MAX as u64] {
            for len in SIZES {
                assert_eq!(cycles_for(len, seg), CYCLES, "{len} with {seg}");
            }
        }
    }

    #[test]
    fn bench_exporters_is_a_mode_of_its_own() {
        use clap::Parser;
        let parse = |args: &[&str]| crate::Args::try_parse_from(args);
        assert!(
            parse(&["peerdirect-guest-tests", "--bench-exporters"])
                .unwrap()
                .bench_exporters
        );
        assert!(parse(&["peerdirect-guest-tests", "--bench-exporters", "--lifecycle"]).is_err());
    }
}
