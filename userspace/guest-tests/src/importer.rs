//! `--importer`: peerdirect's dma-bufs as an RDMA NIC sees them. The test module
//! `peerdirect_importer.ko` (tests/kmod) attaches a dma-buf to the guest's NIC (virtio-net) the
//! way ib_core does for mlx5 (dynamic), EFA (pinned) and irdma (pinned, revocable), maps it and
//! reports the sg table; this checks the result against the kernel's own P2P verdict for the
//! HBM device and the NIC, and prints the times and sg entry counts as `# timing:` lines.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::process::{Command, ExitCode};

use clap::ValueEnum;
use peerdirect::{Allocation, Device, DeviceInfo, DmaBuf, ExportFlags};

use crate::{expect_eq, Outcome, Tap, INDEX};

/// The PCIe layout the guest was booted with (`qemu/run --topology`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Topology {
    /// HBM and NIC below one PCIe switch: P2P allowed.
    Switch,
    /// HBM and NIC on separate root ports: P2P refused.
    Split,
    /// `split` with intel-iommu: whatever the kernel decides.
    Iommu,
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Switch => "switch",
            Self::Split => "split",
            Self::Iommu => "iommu",
        })
    }
}

const MODULE: &str = "peerdirect_importer";
const MODULE_PATH: &str = "/lib/peerdirect/tests/peerdirect_importer.ko";
const RUN_FILE: &str = "/sys/kernel/debug/peerdirect_importer/run";
const SYSFS_PCI_DEVICES: &str = "/sys/bus/pci/devices";
/// virtio-net: legacy and modern device IDs.
const NIC_IDS: [(&str, &str); 2] = [("0x1af4", "0x1000"), ("0x1af4", "0x1041")];
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

/// What the importer module answered: its `key=value` lines.
#[derive(Debug, Default)]
struct Report(BTreeMap<String, String>);

impl Report {
    fn parse(text: &str) -> Self {
        Self(
            text.lines()
                .filter_map(|line| line.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Result<&str, String> {
        self.0
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| format!("the importer reported no {key}= ({})", self.summary()))
    }

    fn int(&self, key: &str) -> Result<i64, String> {
        let value = self.get(key)?;
        value
            .parse()
            .map_err(|_| format!("{key}={value} is not a number"))
    }

    fn uint(&self, key: &str) -> Result<u64, String> {
        let value = self.get(key)?;
        match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => value.parse(),
        }
        .map_err(|_| format!("{key}={value} is not a number"))
    }

    /// An errno-style result (`attach=-95`) as a name for messages.
    fn errno_of(&self, key: &str) -> Result<i64, String> {
        self.int(key)
    }

    /// Every line on one line, for diagnostics.
    fn summary(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
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

/// The module's debugfs file, open for commands.
struct Importer {
    file: File,
}

impl Importer {
    /// Loads the module unless it is loaded already, and opens its command file.
    fn load() -> Result<Self, String> {
        if !Path::new(RUN_FILE).exists() {
            let output = Command::new("insmod")
                .arg(MODULE_PATH)
                .output()
                .map_err(|err| format!("cannot run insmod: {err}"))?;
            if !output.status.success() {
                return Err(format!(
                    "insmod {MODULE_PATH} failed: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(RUN_FILE)
            .map_err(|err| format!("cannot open {RUN_FILE}: {err}"))?;
        Ok(Self { file })
    }

    /// Sends one command line. A refused write (a malformed command, no such fd, device or
    /// id) is an `Err` carrying the module's `error=` line.
    fn command(&mut self, line: &str) -> Result<Report, String> {
        let written = self.file.write(line.as_bytes());
        let mut text = String::new();
        self.file
            .read_to_string(&mut text)
            .map_err(|err| format!("reading the result of '{line}' failed: {err}"))?;
        match written {
            Ok(n) if n == line.len() => Ok(Report::parse(&text)),
            Ok(n) => Err(format!("'{line}': short write ({n} bytes)")),
            Err(err) => Err(format!("'{line}' was refused: {err}; {}", text.trim())),
        }
    }
}

/// The PCI address of the guest's only virtio-net function.
fn find_nic() -> Result<String, String> {
    let read = |path: &Path| fs::read_to_string(path).map(|s| s.trim().to_owned());
    let mut nics = Vec::new();
    let entries = fs::read_dir(SYSFS_PCI_DEVICES)
        .map_err(|err| format!("cannot list {SYSFS_PCI_DEVICES}: {err}"))?;
    for entry in entries.flatten() {
        let dir = entry.path();
        let (Ok(vendor), Ok(device)) = (read(&dir.join("vendor")), read(&dir.join("device")))
        else {
            continue;
        };
        if NIC_IDS.contains(&(vendor.as_str(), device.as_str())) {
            nics.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    nics.sort();
    match nics.as_slice() {
        [nic] => Ok(nic.clone()),
        [] => Err(format!("no virtio-net PCI device in {SYSFS_PCI_DEVICES}")),
        _ => Err(format!("more than one virtio-net device: {nics:?}")),
    }
}

/// Everything the cases share.
struct Setup {
    topology: Topology,
    importer: Importer,
    device: Device,
    info: DeviceInfo,
    nic: String,
}

fn setup(topology: Topology) -> Result<Setup, String> {
    let importer = Importer::load()?;
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
        .export(offset, len, ExportFlags::CLOEXEC)
        .map_err(|err| format!("export of {} failed: {err}", size_name(len)))?;
    Ok(Exported {
        _allocation: allocation,
        dmabuf,
        bar_offset: hbm_offset + offset,
    })
}

fn size_name(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes:#x} bytes")
    }
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
        (Topology::Split, true) => {
            return Err(format!(
                "the kernel allows P2P between HBM and NIC on separate root ports (p2p_distance={}): the harness's topology is wrong",
                first.get("p2p_distance")?
            ))
        }
        _ => {}
    }
    let expected_first = match setup.topology {
        // Behind a shared switch the NIC DMAs straight to the BAR's bus addresses.
        Topology::Switch => Some(setup.info.hbm_bus_addr + exported.bar_offset),
        // Through the host bridge an IOMMU may hand out IOVAs instead.
        Topology::Split | Topology::Iommu => None,
    };
    if allowed {
        check_mapped(first, case, expected_first)?;
    } else {
        check_refused(first)?;
    }
    for (i, report) in reports.iter().enumerate().skip(1) {
        for key in ["attach", "pin", "map", "nents", "dma_first", "dma_total"] {
            expect_eq(
                &format!("run {} of {RUNS}: {key}", i + 1),
                first.0.get(key),
                report.0.get(key),
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
        let value = report.errno_of(key)?;
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

/// P2P refused: the exporter must refuse the attachment itself, with EOPNOTSUPP.
fn check_refused(report: &Report) -> Outcome {
    let attach = report.errno_of("attach")?;
    if attach == -EOPNOTSUPP {
        return Ok(());
    }
    Err(format!(
        "P2P is refused (p2p_distance={}): expected attach to fail with -EOPNOTSUPP, got {}{}",
        report.get("p2p_distance")?,
        errno_text(attach),
        match report.0.get("map") {
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
    let field = |key: &str| first.0.get(key).map_or("-", String::as_str).to_owned();
    println!(
        "# timing: topology={topology} mode={} size={} offset={:#x} p2p_distance={} importer_iommu={} attach={} pin={} map={} nents={} max_entry={} max_seg={} attach_ns={} pin_ns={} map_ns={} unmap_detach_ns={} (best of {RUNS})",
        first.0.get("mode").map_or(case.mode.name(), String::as_str),
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
    let attach = report.errno_of("attach")?;
    if attach != -EOPNOTSUPP {
        return Err(format!(
            "expected attach to fail with -EOPNOTSUPP, got {}\n{}",
            errno_text(attach),
            report.summary()
        ));
    }
    Ok(())
}

/// A held attachment keeps its range: dropping the dma-buf fd and the allocation does not
/// make the range free for a new allocation until the importer lets go.
fn run_held(setup: &mut Setup) -> Outcome {
    let len = 2 * MIB;
    let exported = export(&setup.device, len, 0, len)?;
    let case = Case {
        mode: Mode::Dynamic,
        alloc_len: len,
        offset: 0,
        len,
        extra: "hold=1",
    };
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
    let unload = format!("{MODULE} unloads");

    let mut tap = Tap::plan(1 + cases.len() + non_p2p.len() + usize::from(held) + 1);
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
            }
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
    }
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

    #[test]
    fn report_parses_key_value_lines() {
        let report = Report::parse("attach=0\nmap=-95\ndma_first=0xd0000000\nnoise\nnents=1\n");
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
        let report = Report::parse(
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
        let report = Report::parse(
            "attach=0\npin=0\nmap=0\nnents=512\ndma_first=0xd0000000\ndma_total=2097152\ncontiguous=1\nunaligned=0\nmax_seg=65536\n",
        );
        let err = check_mapped(&report, &case(2 * MIB), None).unwrap_err();
        assert!(err.contains("nents"), "{err}");
    }

    #[test]
    fn mapped_reports_a_failed_pin() {
        let report = Report::parse("p2p_distance=4\nattach=0\npin=-95\n");
        let err = check_mapped(&report, &case(2 * MIB), None).unwrap_err();
        assert!(err.contains("pin failed with -EOPNOTSUPP"), "{err}");
    }

    #[test]
    fn refused_wants_eopnotsupp_at_attach() {
        assert_eq!(
            check_refused(&Report::parse("p2p_distance=-1\nattach=-95\n")),
            Ok(())
        );
        let err =
            check_refused(&Report::parse("p2p_distance=-1\nattach=0\nmap=-22\n")).unwrap_err();
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

    #[test]
    fn size_names() {
        assert_eq!(size_name(2 * MIB), "2 MiB");
        assert_eq!(size_name(1 << 30), "1 GiB");
        assert_eq!(size_name(0x1000), "0x1000 bytes");
    }
}
