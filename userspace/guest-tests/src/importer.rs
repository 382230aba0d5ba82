//! `--importer`: peerdirect's dma-bufs as an RDMA NIC sees them. The test module
//! `peerdirect_importer.ko` (tests/kmod) attaches a dma-buf to the guest's NIC (virtio-net) the
//! way ib_core does for mlx5 (dynamic), EFA (pinned) and irdma (pinned, revocable), maps it and
//! reports the sg table; this checks the result against the kernel's own P2P verdict for the
//! HBM device and the NIC, and prints the times and sg entry counts as `# timing:` lines.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::ValueEnum;
use peerdirect::{Allocation, Device, DeviceInfo, DmaBuf, ExportFlags};

use crate::support::{
    expect_eq, find_nic, size_name, wait_for, write_sysfs, Outcome, Tap, SYSFS_PCI_DEVICES,
};
use crate::testmod::{Report, TestModule, IMPORTER as MODULE};
use crate::INDEX;

/// The PCIe layout the guest was booted with (`qemu/run --topology`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Topology {
    /// HBM and NIC below one PCIe switch: P2P allowed.
    Switch,
    /// HBM and NIC on separate root ports: P2P refused.
    Split,
    /// `split` with intel-iommu: whatever the kernel decides.
    Iommu,
    /// HBM and NIC as two functions below one root port whose ACS redirect the kernel turns
    /// on for intel-iommu: P2P refused.
    Acs,
    /// `iommu` with a CPU the kernel trusts for P2P through the host bridge (AMD Zen): P2P
    /// allowed, the NIC reaching the BAR through the IOMMU, one IOVA range per mapping.
    HostBridge,
    /// `host-bridge` without the IOMMU: P2P allowed, the NIC reaching the BAR at its physical
    /// address (`dma_map_phys`), which on q35 is its bus address.
    HostBridgeDirect,
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Switch => "switch",
            Self::Split => "split",
            Self::Iommu => "iommu",
            Self::Acs => "acs",
            Self::HostBridge => "host-bridge",
            Self::HostBridgeDirect => "host-bridge-direct",
        })
    }
}

const EOPNOTSUPP: i64 = 95;
const MIB: u64 = 1 << 20;
/// Attachments per case: the first is checked in full, all must agree, times are the best.
const RUNS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Dynamic,
    Pinned,
    Revocable,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Dynamic, Mode::Pinned, Mode::Revocable];

    fn name(self) -> &'static str {
        match self {
            Self::Dynamic => "dynamic",
            Self::Pinned => "pinned",
            Self::Revocable => "revocable",
        }
    }

    fn pins(self) -> bool {
        self != Self::Dynamic
    }
}

fn errno_text(value: i64) -> String {
    match -value {
        0 => "0".to_owned(),
        95 => "-EOPNOTSUPP".to_owned(),
        22 => "-EINVAL".to_owned(),
        19 => "-ENODEV".to_owned(),
        1 => "-EPERM".to_owned(),
        16 => "-EBUSY".to_owned(),
        12 => "-ENOMEM".to_owned(),
        _ => value.to_string(),
    }
}

/// Everything the cases share.
struct Setup {
    topology: Topology,
    importer: TestModule,
    device: Device,
    info: DeviceInfo,
    nic: String,
}

fn setup(topology: Topology) -> Result<Setup, String> {
    let importer = TestModule::load_importer()?;
    let nic = find_nic()?;
    let device = Device::open_index(INDEX).map_err(|err| err.to_string())?;
    let info = device.info().map_err(|err| err.to_string())?;
    Ok(Setup {
        topology,
        importer,
        device,
        info,
        nic,
    })
}

/// An exported range of a fresh allocation: the dma-buf and where it lies in the BAR.
struct Exported<'d> {
    /// Kept so that the allocation outlives the test's use of it (the dma-buf holds it too).
    _allocation: Allocation<'d>,
    dmabuf: DmaBuf,
    /// Offset of the exported range from the start of the HBM BAR.
    bar_offset: u64,
}

/// Allocates `alloc_len` bytes of HBM and exports `len` bytes of it from `offset`.
fn export(device: &Device, alloc_len: u64, offset: u64, len: u64) -> Result<Exported<'_>, String> {
    let allocation = device
        .alloc(alloc_len, None)
        .map_err(|err| format!("alloc of {} failed: {err}", size_name(alloc_len)))?;
    let hbm_offset = allocation.hbm_offset();
    let dmabuf = allocation
        .export(offset, len, ExportFlags::CLOEXEC | ExportFlags::RDWR)
        .map_err(|err| format!("export of {} failed: {err}", size_name(len)))?;
    Ok(Exported {
        _allocation: allocation,
        dmabuf,
        bar_offset: hbm_offset + offset,
    })
}

/// One attachment case: what to attach and how.
struct Case {
    mode: Mode,
    alloc_len: u64,
    offset: u64,
    len: u64,
    /// Extra words for the command line (`p2p=0`, `mode=static` replaces the mode).
    extra: &'static str,
}

impl Case {
    /// An import of a whole export of `len` bytes, which is its allocation's.
    fn whole(mode: Mode, len: u64, extra: &'static str) -> Self {
        Self {
            mode,
            alloc_len: len,
            offset: 0,
            len,
            extra,
        }
    }

    /// The cycles one command runs (`cycles=N` in [`Case::extra`]; the benchmark's way to
    /// time many cycles at once), if more than the one it always runs.
    fn cycles(&self) -> Option<u64> {
        self.extra
            .split_whitespace()
            .find_map(|word| word.strip_prefix("cycles="))
            .and_then(|n| n.parse().ok())
    }

    fn command(&self, setup: &Setup, fd: i32) -> String {
        let mode = if self.extra.contains("mode=") {
            String::new()
        } else {
            format!(" mode={}", self.mode.name())
        };
        format!(
            "fd={fd} dev={} hbm={}{mode} {}",
            setup.nic, setup.info.pci_address, self.extra
        )
        .trim_end()
        .to_owned()
    }
}

/// What the kernel's P2P rules say about HBM → NIC, as the importer module reported it.
fn p2p_allowed(report: &Report) -> Result<bool, String> {
    Ok(report.int("p2p_distance")? >= 0)
}

/// Runs `case` [`RUNS`] times, checks the first result against the P2P verdict and that all
/// runs agree, and prints the best times.
fn run_case(setup: &mut Setup, case: &Case) -> Outcome {
    let exported = export(&setup.device, case.alloc_len, case.offset, case.len)?;
    let line = case.command(setup, exported.dmabuf.as_fd().as_raw_fd());
    let mut reports = Vec::new();
    for _ in 0..RUNS {
        reports.push(setup.importer.command(&line)?);
    }
    let first = &reports[0];
    let allowed = p2p_allowed(first)?;
    match (setup.topology, allowed) {
        (Topology::Switch, false) => {
            return Err(format!(
                "the kernel refuses P2P between HBM and NIC behind one switch (p2p_distance={}): the harness's topology is wrong",
                first.get("p2p_distance")?
            ))
        }
        (Topology::HostBridge | Topology::HostBridgeDirect, false) => {
            return Err(format!(
                "the kernel refuses P2P through the host bridge of an AMD Zen CPU (p2p_distance={}): the harness's topology is wrong",
                first.get("p2p_distance")?
            ))
        }
        (Topology::Split | Topology::Acs, true) => {
            return Err(format!(
                "the kernel allows P2P between HBM and NIC on separate root ports or below an ACS-redirecting one (p2p_distance={}): the harness's topology is wrong",
                first.get("p2p_distance")?
            ))
        }
        _ => {}
    }
    let expected_first = match setup.topology {
        // Behind a shared switch the NIC DMAs straight to the BAR's bus addresses; through a
        // host bridge without an IOMMU, to its physical addresses, the same on q35.
        Topology::Switch | Topology::HostBridgeDirect => {
            Some(setup.info.hbm_bus_addr + exported.bar_offset)
        }
        // Through the host bridge an IOMMU may hand out IOVAs instead.
        Topology::Split | Topology::Iommu | Topology::Acs | Topology::HostBridge => None,
    };
    if allowed {
        check_mapped(first, case, expected_first)?;
        // Past 4 GiB, the longest entry: the cut must stay within the NIC's max segment.
        if case.len >= 4 << 30 {
            expect_eq(
                "entries over the max segment",
                0,
                first.uint("over_max_seg")?,
            )?;
        }
        if let Some(cycles) = case.cycles() {
            for report in &reports {
                check_cycles(report, cycles)?;
            }
        }
        // Through the IOMMU the range is one IOVA range: one entry, whatever the NIC's max
        // segment (Documentation/exporter.md).
        if setup.topology == Topology::HostBridge {
            expect_eq("nents through the IOMMU", 1, first.uint("nents")?)?;
        }
    } else {
        check_refused(first)?;
    }
    // Every run alike. Through an IOMMU that includes the IOVA: an unmap frees it at once
    // (`dma_iova_destroy`), where one left to the IOMMU's flush queue gives the next map
    // another.
    for (i, report) in reports.iter().enumerate().skip(1) {
        for key in ["attach", "pin", "map", "nents", "dma_first", "dma_total"] {
            expect_eq(
                &format!("run {} of {RUNS}: {key}", i + 1),
                first.value(key),
                report.value(key),
            )?;
        }
    }
    print_timing(setup.topology, case, &reports);
    Ok(())
}

/// P2P allowed: attach, pin and map succeed and the sg table is one contiguous range of the
/// exported length at the expected address, in no more entries than the NIC's segment limit
/// forces.
fn check_mapped(report: &Report, case: &Case, expected_first: Option<u64>) -> Outcome {
    for key in ["attach", "pin", "map"] {
        if key == "pin" && !case.mode.pins() {
            continue;
        }
        let value = report.int(key)?;
        if value != 0 {
            return Err(format!(
                "P2P is allowed (p2p_distance={}), but {key} failed with {}\n{}",
                report.get("p2p_distance")?,
                errno_text(value),
                report.summary()
            ));
        }
    }
    expect_eq("dma_total", case.len, report.uint("dma_total")?)?;
    expect_eq("contiguous", 1, report.int("contiguous")?)?;
    expect_eq("unaligned entries", 0, report.int("unaligned")?)?;
    if let Some(expected) = expected_first {
        let got = report.uint("dma_first")?;
        if got != expected {
            return Err(format!(
                "dma_first: expected {expected:#x} (hbm_bus_addr + hbm_offset + export offset), got {got:#x}"
            ));
        }
    }
    let nents = report.uint("nents")?;
    let max_seg = report.uint("max_seg")?.max(1);
    let most = case.len.div_ceil(max_seg).max(1);
    if nents == 0 || nents > most {
        return Err(format!(
            "nents: expected 1..={most} (ceil({} / max_seg {max_seg})), got {nents}",
            case.len
        ));
    }
    Ok(())
}

/// `cycles=N`: every cycle after the reported one mapped as many entries (the module checks
/// it), and each step's median over the N cycles is reported.
fn check_cycles(report: &Report, cycles: u64) -> Outcome {
    if report.int("cycles_failed")? != 0 {
        return Err(format!(
            "cycles={cycles}: {}",
            report.get("cycles_error").unwrap_or("a cycle failed")
        ));
    }
    expect_eq("cycles", cycles, report.uint("cycles")?)?;
    for key in ["attach_ns_p50", "map_ns_p50", "unmap_detach_ns_p50"] {
        if report.uint(key)? == 0 {
            return Err(format!("cycles={cycles}: {key}=0: no time measured"));
        }
    }
    Ok(())
}

/// P2P refused: the exporter must refuse the attachment itself, with EOPNOTSUPP.
fn check_refused(report: &Report) -> Outcome {
    let attach = report.int("attach")?;
    if attach == -EOPNOTSUPP {
        return Ok(());
    }
    Err(format!(
        "P2P is refused (p2p_distance={}): expected attach to fail with -EOPNOTSUPP, got {}{}",
        report.get("p2p_distance")?,
        errno_text(attach),
        match report.value("map") {
            Some(map) => format!(", and map={map}"),
            None => String::new(),
        }
    ))
}

fn print_timing(topology: Topology, case: &Case, reports: &[Report]) {
    let best = |key: &str| {
        reports
            .iter()
            .filter_map(|report| report.uint(key).ok())
            .min()
            .map_or("-".to_owned(), |ns| ns.to_string())
    };
    let first = &reports[0];
    let field = |key: &str| first.value(key).unwrap_or("-").to_owned();
    println!(
        "# timing: topology={topology} mode={} size={} offset={:#x} p2p_distance={} importer_iommu={} attach={} pin={} map={} nents={} max_entry={} max_seg={} attach_ns={} pin_ns={} map_ns={} unmap_detach_ns={} (best of {RUNS})",
        first.value("mode").unwrap_or(case.mode.name()),
        size_name(case.len),
        case.offset,
        field("p2p_distance"),
        field("importer_iommu"),
        field("attach"),
        field("pin"),
        field("map"),
        field("nents"),
        field("max_entry"),
        field("max_seg"),
        best("attach_ns"),
        best("pin_ns"),
        best("map_ns"),
        best("unmap_detach_ns"),
    );
}

/// An importer that cannot take P2P memory (no `allow_peer2peer`, or a static `dma_buf_attach`)
/// is refused at attach with EOPNOTSUPP in every topology.
fn run_non_p2p(setup: &mut Setup, case: &Case) -> Outcome {
    let exported = export(&setup.device, case.alloc_len, case.offset, case.len)?;
    let line = case.command(setup, exported.dmabuf.as_fd().as_raw_fd());
    let report = setup.importer.command(&line)?;
    expect_eq("peer2peer", 0, report.int("peer2peer").unwrap_or(0))?;
    let attach = report.int("attach")?;
    if attach != -EOPNOTSUPP {
        return Err(format!(
            "expected attach to fail with -EOPNOTSUPP, got {}\n{}",
            errno_text(attach),
            report.summary()
        ));
    }
    Ok(())
}

/// `PEERDIRECT_IOC_P2P` about the NIC gives the distance the importer module computes itself
/// (`pci_p2pdma_distance_many`), and path facts that fit the topology.
fn run_p2p_query(setup: &mut Setup) -> Outcome {
    let exported = export(&setup.device, 2 * MIB, 0, 2 * MIB)?;
    let case = Case {
        mode: Mode::Dynamic,
        alloc_len: 2 * MIB,
        offset: 0,
        len: 2 * MIB,
        extra: "",
    };
    let line = case.command(setup, exported.dmabuf.as_fd().as_raw_fd());
    let module_distance = setup.importer.command(&line)?.int("p2p_distance")?;
    let nic = setup.nic.parse()?;
    let path = setup.device.p2p(nic).map_err(|err| err.to_string())?;
    let ours = path.distance.map_or(-1, i64::from);
    if ours != module_distance {
        return Err(format!(
            "PEERDIRECT_IOC_P2P says distance {ours}, the importer module {module_distance}: {path:?}"
        ));
    }
    let facts_fit = match setup.topology {
        Topology::Switch => path.common_bridge.is_some() && path.acs_bridge.is_none(),
        Topology::Split | Topology::Iommu | Topology::HostBridge | Topology::HostBridgeDirect => {
            path.common_bridge.is_none()
        }
        Topology::Acs => path.common_bridge.is_some() && path.acs_bridge == path.common_bridge,
    };
    if !facts_fit {
        return Err(format!(
            "the path facts do not fit the {} topology: {path:?}",
            setup.topology
        ));
    }
    println!("# {}: {}", setup.topology, path.why());
    Ok(())
}

/// A held attachment keeps its range: dropping the dma-buf fd and the allocation does not
/// make the range free for a new allocation until the importer lets go.
/// A read-only export, mapped by the NIC in each direction.
fn run_read_only(setup: &mut Setup) -> Outcome {
    const EACCES: i64 = 13;
    let allocation = setup
        .device
        .alloc(2 * MIB, None)
        .map_err(|err| format!("alloc of 2 MiB failed: {err}"))?;
    let dmabuf = allocation
        .export(0, 0, ExportFlags::CLOEXEC)
        .map_err(|err| format!("export failed: {err}"))?;
    for (dir, map) in [
        ("to_device", 0),
        ("bidir", -EACCES),
        ("from_device", -EACCES),
    ] {
        let line = format!(
            "fd={} dev={} mode=dynamic dir={dir}",
            dmabuf.as_fd().as_raw_fd(),
            setup.nic
        );
        setup
            .importer
            .command(&line)?
            .expect(&[("attach", 0), ("map", map)])
            .map_err(|err| format!("dir={dir}: {err}"))?;
    }
    Ok(())
}

fn run_held(setup: &mut Setup) -> Outcome {
    let len = 2 * MIB;
    let exported = export(&setup.device, len, 0, len)?;
    let case = Case::whole(Mode::Dynamic, len, "hold=1");
    let line = case.command(setup, exported.dmabuf.as_fd().as_raw_fd());
    let report = setup.importer.command(&line)?;
    check_mapped(
        &report,
        &case,
        Some(setup.info.hbm_bus_addr + exported.bar_offset),
    )?;
    let id = report.uint("id")?;
    let held_offset = exported.bar_offset;
    let listed = check_debugfs_exports(setup, held_offset, len, report.uint("nents")?);
    drop(exported);

    let again = export(&setup.device, len, 0, len);
    let status = setup.importer.command(&format!("status id={id}"));
    let release = setup.importer.command(&format!("release id={id}"));
    let again = again?;
    if again.bar_offset == held_offset {
        return Err(format!(
            "a new allocation got the range at {held_offset:#x} while an importer still had it mapped"
        ));
    }
    let status = status?;
    expect_eq("mapped while held", 1, status.int("mapped")?)?;
    expect_eq("invalidations while held", 0, status.int("invalidations")?)?;
    let release = release?;
    expect_eq("invalidations at release", 0, release.int("invalidations")?)?;
    listed
}

/// The device's debugfs `exports` lists the export at `bar_offset` of `len` bytes with the
/// NIC's attachment under it: revocable (dynamic mode), not pinned, mapped in `nents` entries.
/// The P2P verdict cache's counts in debugfs `stats`: verdicts asked of the kernel, and
/// importers whose verdict it keeps.
fn verdict_counts() -> Result<(u64, u64), String> {
    let path = format!("/sys/kernel/debug/peerdirect/peerdirect{INDEX}/stats");
    let text = std::fs::read_to_string(&path).map_err(|err| format!("read {path}: {err}"))?;
    let stats = Report::parse("debugfs stats", &text, ':');
    Ok((
        stats.uint("p2p_verdicts_asked")?,
        stats.uint("p2p_verdicts_kept")?,
    ))
}

/// The NIC, known to the verdict cache, is deleted (sysfs `remove`): the cache forgets its
/// verdict at once (the PCI bus notifier reaches it), and after a rescan its attach asks the
/// kernel again. A cache that kept the verdict would hand it to whatever device the address
/// names next.
fn run_forgotten_verdict(setup: &mut Setup) -> Outcome {
    let len = 2 * MIB;
    let exported = export(&setup.device, len, 0, len)?;
    let case = Case::whole(Mode::Dynamic, len, "");
    let line = case.command(setup, exported.dmabuf.as_fd().as_raw_fd());
    let attach = |importer: &mut TestModule| -> Outcome {
        let report = importer.command(&line)?;
        check_mapped(&report, &case, None)
    };
    attach(&mut setup.importer)?;
    let (asked, kept) = verdict_counts()?;
    expect_eq("p2p_verdicts_kept once the NIC attached", 1, kept)?;
    attach(&mut setup.importer)?;
    expect_eq(
        "p2p_verdicts_asked after another attach (a hit)",
        asked,
        verdict_counts()?.0,
    )?;
    let nic_dir = format!("{SYSFS_PCI_DEVICES}/{}", setup.nic);
    write_sysfs(&format!("{nic_dir}/remove"), "1")?;
    let removed = verdict_counts();
    // Always rescanned, so that the cases after this one have their NIC.
    write_sysfs("/sys/bus/pci/rescan", "1")?;
    wait_for(Duration::from_secs(10), || Path::new(&nic_dir).exists())
        .map_err(|secs| format!("{nic_dir} is not back {secs} s after a rescan"))?;
    expect_eq("p2p_verdicts_kept once the NIC is deleted", 0, removed?.1)?;
    attach(&mut setup.importer)?;
    let (asked_again, kept_again) = verdict_counts()?;
    expect_eq(
        "p2p_verdicts_asked after the rescanned NIC's attach (a miss)",
        asked + 1,
        asked_again,
    )?;
    expect_eq("p2p_verdicts_kept after it", 1, kept_again)
}

/// Cycles [`run_leaves_nothing`] runs in one command.
const LEAK_CYCLES: u64 = 2000;

/// How many more objects the kernel's kmalloc caches may hold after [`LEAK_CYCLES`] cycles
/// than before: one leaked per map would be [`LEAK_CYCLES`].
const LEAK_SLACK: u64 = 200;

/// The kernel's kmalloc caches' objects in use (`/proc/slabinfo`).
fn kmalloc_objects() -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/slabinfo")
        .map_err(|err| format!("read /proc/slabinfo: {err}"))?;
    text.lines()
        .filter(|line| line.starts_with("kmalloc-"))
        .map(|line| {
            line.split_whitespace()
                .nth(1)
                .and_then(|active| active.parse::<u64>().ok())
                .ok_or_else(|| format!("/proc/slabinfo: no object count in {line:?}"))
        })
        .sum()
}

/// [`LEAK_CYCLES`] dynamic attach, map, unmap and detach cycles of 2 MiB leave no memory
/// behind (the dma-buf core's own helper, which map used through the host bridge until it
/// filled its own table there too, leaked each map's scatterlist array).
fn run_leaves_nothing(setup: &mut Setup) -> Outcome {
    let len = 2 * MIB;
    let exported = export(&setup.device, len, 0, len)?;
    let case = Case::whole(Mode::Dynamic, len, "max_seg=4294967295 cycles=2000");
    debug_assert_eq!(case.cycles(), Some(LEAK_CYCLES));
    let line = case.command(setup, exported.dmabuf.as_fd().as_raw_fd());
    let before = kmalloc_objects()?;
    let report = setup.importer.command(&line)?;
    let after = kmalloc_objects()?;
    check_mapped(&report, &case, None)?;
    check_cycles(&report, LEAK_CYCLES)?;
    let grown = after.saturating_sub(before);
    if grown > LEAK_SLACK {
        return Err(format!(
            "kmalloc objects in use: {before} before {LEAK_CYCLES} cycles, {after} after (+{grown}): a map's memory is not freed"
        ));
    }
    Ok(())
}

/// Errors DMA-API debugging has found since boot: an unmap of an address that was never
/// mapped (or of another length or direction) is one.
/// DMA-API debugging's debugfs directory (`CONFIG_DMA_API_DEBUG`).
const DMA_API_DEBUG: &str = "/sys/kernel/debug/dma-api";

fn dma_api_errors() -> Result<u64, String> {
    let disabled = format!("{DMA_API_DEBUG}/disabled");
    match std::fs::read_to_string(&disabled) {
        Ok(text) if text.trim() == "N" => {}
        Ok(text) => return Err(format!("{disabled}: {text:?}: DMA-API debugging is off")),
        Err(err) => {
            return Err(format!(
                "read {disabled}: {err} (the test kernel has DMA_API_DEBUG)"
            ))
        }
    }
    let path = format!("{DMA_API_DEBUG}/error_count");
    let text = std::fs::read_to_string(&path)
        .map_err(|err| format!("read {path}: {err} (the test kernel has DMA_API_DEBUG)"))?;
    text.trim()
        .parse()
        .map_err(|err| format!("{path}: {text:?}: {err}"))
}

/// A dynamic and a pinned import, each rewriting its sg table's addresses before the unmap:
/// the exporter must unmap the range it mapped, which DMA-API debugging checks (an unmap of
/// the rewritten address is an error it counts, and WARNs about the first).
fn run_scribbled(setup: &mut Setup) -> Outcome {
    let before = dma_api_errors()?;
    for mode in [Mode::Dynamic, Mode::Pinned] {
        let len = 2 * MIB;
        let exported = export(&setup.device, len, 0, len)?;
        let case = Case::whole(mode, len, "scribble=1");
        let line = case.command(setup, exported.dmabuf.as_fd().as_raw_fd());
        let report = setup.importer.command(&line)?;
        check_mapped(
            &report,
            &case,
            Some(setup.info.hbm_bus_addr + exported.bar_offset),
        )?;
        expect_eq(
            &format!("{} import: entries rewritten", mode.name()),
            report.uint("nents")?,
            report.uint("scribbled")?,
        )?;
    }
    let after = dma_api_errors()?;
    if after != before {
        return Err(format!(
            "DMA-API debug errors: {before} before, {after} after: the exporter unmapped an address the importer wrote, not the one it mapped (see the kernel log)"
        ));
    }
    Ok(())
}

fn check_debugfs_exports(setup: &Setup, bar_offset: u64, len: u64, nents: u64) -> Outcome {
    let path = format!("/sys/kernel/debug/peerdirect/peerdirect{INDEX}/exports");
    let text = std::fs::read_to_string(&path).map_err(|err| format!("read {path}: {err}"))?;
    let export = format!("offset={bar_offset:#x} length={len:#x}");
    let attachment = format!(
        "  importer={} revocable pinned=0 mapped_entries={nents}",
        setup.nic
    );
    let mut lines = text.lines().skip_while(|l| !l.ends_with(&export));
    if lines.next().is_none() {
        return Err(format!("{path} has no export with {export}:\n{text}"));
    }
    if !lines
        .take_while(|l| l.starts_with("  "))
        .any(|l| l == attachment)
    {
        return Err(format!(
            "{path} does not list {attachment:?} under the export:\n{text}"
        ));
    }
    Ok(())
}

/// Prints TAP for the `--importer` mode; success iff every test passed.
pub(crate) fn run(topology: Topology) -> ExitCode {
    let setup = setup(topology);
    let sizes: Vec<u64> = match &setup {
        Ok(setup) if setup.info.hbm_bytes >= 2 << 30 => vec![2 * MIB, 64 * MIB, 1 << 30],
        _ => vec![2 * MIB, 64 * MIB],
    };

    let mut cases: Vec<(String, Case)> = Vec::new();
    for &len in &sizes {
        for mode in Mode::ALL {
            cases.push((
                format!(
                    "{topology}: {mode} attach of {} agrees with the kernel's P2P verdict",
                    size_name(len),
                    mode = mode.name()
                ),
                Case {
                    mode,
                    alloc_len: len,
                    offset: 0,
                    len,
                    extra: "",
                },
            ));
        }
    }
    // Real RDMA NICs' max segment (the importer sets it for the attachment): one entry.
    for (extra, whose) in [
        ("max_seg=2147483648", "mlx5's (2 GiB)"),
        ("max_seg=4294967295", "EFA's (UINT_MAX)"),
    ] {
        cases.push((
            format!("{topology}: dynamic attach of 64 MiB by a NIC with {whose} max segment agrees with the kernel's P2P verdict (mapped: one sg entry)"),
            Case {
                mode: Mode::Dynamic,
                alloc_len: 64 * MIB,
                offset: 0,
                len: 64 * MIB,
                extra,
            },
        ));
    }
    // Longer than an entry holds (4 GiB less a page), with EFA's max segment: the range goes
    // whole and the entries' own limit makes the two entries.
    if matches!(&setup, Ok(setup) if setup.info.hbm_bytes >= 8 << 30) {
        cases.push((
            format!("{topology}: pinned attach of 5 GiB by a NIC with EFA's max segment agrees with the kernel's P2P verdict (mapped: two entries, none over the max segment)"),
            Case::whole(Mode::Pinned, 5 << 30, "max_seg=4294967295"),
        ));
    }
    // EFA's own way: pinned. Many cycles in one command, as the benchmark times them.
    cases.push((
        format!("{topology}: pinned attach of 64 MiB by a NIC with EFA's max segment, 20 cycles in one command, agrees with the kernel's P2P verdict (each cycle maps one entry; the medians are reported)"),
        Case::whole(Mode::Pinned, 64 * MIB, "max_seg=4294967295 cycles=20"),
    ));
    cases.push((
        format!("{topology}: dynamic attach of 2 MiB at offset 0x101000 of a 64 MiB allocation agrees with the kernel's P2P verdict (mapped: starts at that offset)"),
        Case {
            mode: Mode::Dynamic,
            alloc_len: 64 * MIB,
            offset: 0x10_1000,
            len: 2 * MIB,
            extra: "",
        },
    ));
    let non_p2p = [
        (
            format!(
                "{topology}: a dynamic importer without allow_peer2peer is refused (EOPNOTSUPP)"
            ),
            Case {
                mode: Mode::Dynamic,
                alloc_len: 2 * MIB,
                offset: 0,
                len: 2 * MIB,
                extra: "p2p=0",
            },
        ),
        (
            format!("{topology}: a static importer (dma_buf_attach) is refused (EOPNOTSUPP)"),
            Case {
                mode: Mode::Dynamic,
                alloc_len: 2 * MIB,
                offset: 0,
                len: 2 * MIB,
                extra: "mode=static",
            },
        ),
    ];
    let held = topology == Topology::Switch;
    let held_description = format!(
        "{topology}: debugfs exports lists the held attachment (importer, revocable, mapped entries); a held mapping keeps its range after its dma-buf and allocation are dropped"
    );
    let read_only = format!(
        "{topology}: a read-only export (no PEERDIRECT_EXPORT_RDWR) maps only for the NIC to read: dir=to_device maps; bidir and from_device fail with EACCES"
    );
    let forgotten = format!(
        "{topology}: the NIC deleted (sysfs remove), the P2P verdict cache forgets its verdict at once; rescanned, its attach asks the kernel again (debugfs stats)"
    );
    // Where P2P is allowed: by bus address and through the host bridge (an IOVA range, or
    // one dma_map_phys range).
    let leak = matches!(
        topology,
        Topology::Switch | Topology::HostBridge | Topology::HostBridgeDirect
    )
    .then(|| {
        format!("{topology}: {LEAK_CYCLES} dynamic map and unmap cycles of 2 MiB in one command leave no memory behind (kmalloc objects in use grow by at most {LEAK_SLACK})")
    });
    // Where the exporter unmaps with dma_unmap_phys, which takes the address to unmap, and
    // the kernel checks what is unmapped (DMA-API debugging: the test kernels, not Debian's).
    let checked = Path::new(DMA_API_DEBUG).exists();
    let scribbled = (topology == Topology::HostBridgeDirect && checked).then(|| {
        format!("{topology}: an importer that rewrites its sg table's DMA addresses before unmapping does not change what the exporter unmaps (the DMA-API debug error count stays the same)")
    });
    let unload = format!("{MODULE} unloads");
    let p2p_query = format!(
        "{topology}: PEERDIRECT_IOC_P2P about the NIC gives the importer module's own pci_p2pdma_distance_many, with path facts that fit the topology"
    );

    let mut tap = Tap::plan(
        1 + cases.len()
            + non_p2p.len()
            + 3 * usize::from(held)
            + usize::from(leak.is_some())
            + usize::from(scribbled.is_some())
            + 2,
    );
    let setup_description =
        format!("{MODULE} loads, the NIC (virtio-net) is found, /dev/peerdirect0 answers INFO");
    let mut setup = match setup {
        Ok(setup) => {
            tap.report(&setup_description, &Ok(()));
            println!(
                "# HBM {} (bus address {:#x}, {}), NIC {}",
                setup.info.pci_address,
                setup.info.hbm_bus_addr,
                size_name(setup.info.hbm_bytes),
                setup.nic
            );
            setup
        }
        Err(err) => {
            tap.report(&setup_description, &Err(err));
            let skipped = Err("not run: setup failed".to_owned());
            for (description, _) in cases.iter().chain(non_p2p.iter()) {
                tap.report(description, &skipped);
            }
            if held {
                tap.report(&held_description, &skipped);
                tap.report(&read_only, &skipped);
                tap.report(&forgotten, &skipped);
            }
            if let Some(leak) = &leak {
                tap.report(leak, &skipped);
            }
            if let Some(scribbled) = &scribbled {
                tap.report(scribbled, &skipped);
            }
            tap.report(&p2p_query, &skipped);
            tap.report(&unload, &skipped);
            return tap.finish();
        }
    };

    for (description, case) in &cases {
        tap.report(description, &run_case(&mut setup, case));
    }
    for (description, case) in &non_p2p {
        tap.report(description, &run_non_p2p(&mut setup, case));
    }
    if held {
        tap.report(&held_description, &run_held(&mut setup));
        tap.report(&read_only, &run_read_only(&mut setup));
        tap.report(&forgotten, &run_forgotten_verdict(&mut setup));
    }
    if let Some(leak) = &leak {
        tap.report(leak, &run_leaves_nothing(&mut setup));
    }
    if let Some(scribbled) = &scribbled {
        tap.report(scribbled, &run_scribbled(&mut setup));
    }
    tap.report(&p2p_query, &run_p2p_query(&mut setup));
    drop(setup);
    tap.report(&unload, &rmmod());
    tap.finish()
}

fn rmmod() -> Outcome {
    let output = Command::new("rmmod")
        .arg(MODULE)
        .output()
        .map_err(|err| format!("cannot run rmmod: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "rmmod {MODULE} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(text: &str) -> Report {
        Report::parse("the importer", text, '=')
    }

    #[test]
    fn report_parses_key_value_lines() {
        let report = report("attach=0\nmap=-95\ndma_first=0xd0000000\nnoise\nnents=1\n");
        assert_eq!(report.int("attach"), Ok(0));
        assert_eq!(report.int("map"), Ok(-95));
        assert_eq!(report.uint("dma_first"), Ok(0xd000_0000));
        assert_eq!(report.uint("nents"), Ok(1));
        assert!(report.get("pin").unwrap_err().contains("no pin="));
    }

    fn case(len: u64) -> Case {
        Case {
            mode: Mode::Pinned,
            alloc_len: len,
            offset: 0,
            len,
            extra: "",
        }
    }

    #[test]
    fn mapped_accepts_one_contiguous_range_at_the_bar() {
        let report = report(
            "attach=0\npin=0\nmap=0\nnents=1\ndma_first=0xd0200000\ndma_total=2097152\ncontiguous=1\nunaligned=0\nmax_seg=65536\n",
        );
        assert_eq!(
            check_mapped(&report, &case(2 * MIB), Some(0xd020_0000)),
            Ok(())
        );
        let err = check_mapped(&report, &case(2 * MIB), Some(0xd000_0000)).unwrap_err();
        assert!(err.contains("dma_first"), "{err}");
    }

    #[test]
    fn mapped_refuses_one_entry_per_page() {
        let report = report(
            "attach=0\npin=0\nmap=0\nnents=512\ndma_first=0xd0000000\ndma_total=2097152\ncontiguous=1\nunaligned=0\nmax_seg=65536\n",
        );
        let err = check_mapped(&report, &case(2 * MIB), None).unwrap_err();
        assert!(err.contains("nents"), "{err}");
    }

    #[test]
    fn mapped_reports_a_failed_pin() {
        let report = report("p2p_distance=4\nattach=0\npin=-95\n");
        let err = check_mapped(&report, &case(2 * MIB), None).unwrap_err();
        assert!(err.contains("pin failed with -EOPNOTSUPP"), "{err}");
    }

    #[test]
    fn refused_wants_eopnotsupp_at_attach() {
        assert_eq!(
            check_refused(&report("p2p_distance=-1\nattach=-95\n")),
            Ok(())
        );
        let err = check_refused(&report("p2p_distance=-1\nattach=0\nmap=-22\n")).unwrap_err();
        assert!(err.contains("got 0, and map=-22"), "{err}");
    }

    #[test]
    fn importer_mode_takes_a_topology() {
        use clap::Parser;
        let parse = |args: &[&str]| crate::Args::try_parse_from(args);
        assert!(parse(&["peerdirect-guest-tests", "--importer"]).is_err());
        assert!(parse(&["peerdirect-guest-tests", "--topology", "split"]).is_err());
        assert!(parse(&["peerdirect-guest-tests", "--importer", "--topology", "mesh"]).is_err());
        let args = parse(&[
            "peerdirect-guest-tests",
            "--importer",
            "--topology",
            "iommu",
        ])
        .unwrap();
        assert!(args.importer);
        assert_eq!(args.topology, Some(Topology::Iommu));
    }
}
