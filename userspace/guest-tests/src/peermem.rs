//! `--peermem switch|split`: the contract test of peerdirect's PeerDirect peer-memory client
//! (kmod/peer_mem.c). Upstream ib_core has no peer-memory API, so the test-only module
//! `peerdirect_peermem_core.ko` (tests/kmod) provides it with the MLNX_OFED `peer_mem.h`
//! contract and drives the client from this process, which mmaps a peerdirect dma-buf:
//! acquire, get_pages, dma_map for the NIC, invalidate when the device is unbound, release.
//! It is not ib_core: this checks the client against the contract, not an RDMA stack.
//!
//! Boot with `qemu/run --no-bind`: the core module must be loaded before peerdirect.ko (which
//! looks the API up at load time), so this loads both, binds the HBM device and unloads both.

use std::ffi::c_void;
use std::fs;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::thread;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use peerdirect::{Device, DeviceInfo, DmaBuf, ExportFlags};
use rustix::mm::{MapFlags, ProtFlags};

use crate::removal::Unbinding;
use crate::support::{expect_eq, insmod, pci_devices, Outcome, Tap, NIC_IDS, SYSFS_PCI_DEVICES};
use crate::testmod::{Report, TestModule};
use crate::{INDEX, SYSFS_DRIVER};

/// The PCIe layout the guest was booted with (`qemu/run --topology`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Topology {
    /// HBM and NIC below one PCIe switch: P2P allowed.
    Switch,
    /// HBM and NIC on separate root ports: P2P refused.
    Split,
}

const CORE_MODULE: &str = "peerdirect_peermem_core";
const CORE_PATH: &str = "/lib/peerdirect/tests/peerdirect_peermem_core.ko";
const PEERDIRECT_PATH: &str = "/lib/peerdirect/peerdirect.ko";
const CLIENT_MODULE: &str = "peerdirect_peermem";
const CLIENT_PATH: &str = "/lib/peerdirect/peerdirect_peermem.ko";
const RUN_FILE: &str = "/sys/kernel/debug/peerdirect_peermem_core/run";
/// The HBM stand-in (ivshmem-plain) and the NIC (virtio-net, legacy and modern).
const HBM_ID: (&str, &str) = ("0x1af4", "0x1110");
const MIB: u64 = 1 << 20;
const EXPORT_LEN: u64 = 4 * MIB;
const EOPNOTSUPP: i64 = 95;
const EACCES: i64 = 13;
/// The log lines of a registration: the client module's and the core's.
const CLIENT_LOG: &str = "PeerDirect peer-memory client \"peerdirect\" registered with ib_core";
const CORE_LOG: &str = "contract test: peer-memory client \"peerdirect\" version \"1\" registered";
const UNBIND_TIMEOUT: Duration = Duration::from_secs(120);

/// A shared mapping of a whole dma-buf at a 2 MiB-aligned address (what a runtime that wants
/// huge pages in its MRs does), unmapped on drop. The memory is only ever named by address.
struct AlignedMap {
    ptr: *mut c_void,
    len: usize,
}

impl AlignedMap {
    fn new(dmabuf: &DmaBuf, writable: bool) -> Result<Self, String> {
        const ALIGN: usize = 2 << 20;
        let len = usize::try_from(dmabuf.length()).map_err(|err| err.to_string())?;
        let reserve = len + ALIGN;
        // SAFETY: a fresh inaccessible anonymous mapping at an address of the kernel's choice
        // aliases nothing.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                reserve,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|err| format!("reserving {reserve} bytes of address space failed: {err}"))?;
        let aligned = (base as usize).next_multiple_of(ALIGN);
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: [aligned, aligned + len) lies inside the reservation made above, which
        // nothing else uses; MAP_FIXED replaces that part of it.
        let mapped = unsafe {
            rustix::mm::mmap(
                aligned as *mut c_void,
                len,
                prot,
                MapFlags::SHARED | MapFlags::FIXED,
                dmabuf.as_fd(),
                0,
            )
        };
        // The reservation's parts before and after the mapping (all of it on failure).
        let head = aligned - base as usize;
        let tail_start = aligned + len;
        let tail = base as usize + reserve - tail_start;
        let unmap = |start: usize, n: usize| {
            if n > 0 {
                // SAFETY: [start, start + n) is part of our own reservation, unused.
                let _ = unsafe { rustix::mm::munmap(start as *mut c_void, n) };
            }
        };
        match mapped {
            Ok(ptr) => {
                unmap(base as usize, head);
                unmap(tail_start, tail);
                Ok(Self { ptr, len })
            }
            Err(err) => {
                unmap(base as usize, reserve);
                Err(format!("mmap of the dma-buf failed: {err}"))
            }
        }
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for AlignedMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping, never lent out.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

/// What the steps share.
struct State {
    nic: String,
    core: Option<TestModule>,
    device: Option<Device>,
    info: Option<DeviceInfo>,
    /// The 4 MiB RDWR dma-buf, its offset in the BAR, and its aligned mapping.
    dmabuf: Option<DmaBuf>,
    bar_offset: u64,
    map: Option<AlignedMap>,
    /// The registration kept across unbind.
    id: Option<u64>,
}

impl State {
    fn core(&mut self) -> Result<&mut TestModule, String> {
        self.core
            .as_mut()
            .ok_or_else(|| "no core module".to_owned())
    }

    fn info(&self) -> Result<&DeviceInfo, String> {
        self.info
            .as_ref()
            .ok_or_else(|| "peerdirect0 is not open".to_owned())
    }

    fn map_addr(&self) -> Result<u64, String> {
        self.map
            .as_ref()
            .map(AlignedMap::addr)
            .ok_or_else(|| "no mapping".to_owned())
    }
}

type Step = (String, fn(&mut State) -> Outcome);

fn steps(topology: Topology) -> Vec<Step> {
    let mut steps: Vec<Step> = vec![
        (
            format!("insmod {CORE_MODULE}.ko (contract-test stand-in for MLNX_OFED ib_core's peer-memory API)"),
            load_core,
        ),
        (
            "peerdirect.ko loads after it and binds the HBM device".to_owned(),
            load_peerdirect,
        ),
        (
            format!("{CLIENT_MODULE}.ko, linked against the core's plain EXPORT_SYMBOL API (as MLNX_OFED exports it), loads and registers the client"),
            load_client,
        ),
        (
            "alloc + export (RDWR) 4 MiB, mmap at a 2 MiB-aligned address".to_owned(),
            export_and_map,
        ),
        (
            "plain process memory is not the client's: acquire gives 0".to_owned(),
            not_ours,
        ),
    ];
    match topology {
        Topology::Switch => steps.extend([
            (
                "register the mapping: acquired, page_size 2 MiB, 2 pages, dma_map for the NIC at hbm_bus_addr + offset, contiguous".to_owned(),
                register_whole as fn(&mut State) -> Outcome,
            ),
            (
                "register 1 MiB at +64 KiB: page_size 64 KiB, 16 pages, DMA at the sub-range, release".to_owned(),
                register_sub_range,
            ),
            (
                "a read-only mapping refuses get_pages for writing (-EACCES)".to_owned(),
                read_only_refuses_write,
            ),
            (
                "unbinding peerdirect while registered completes, and the client called the core's invalidate (invalidated=1, unmapped, pages put)".to_owned(),
                unbind_invalidates,
            ),
            ("release of the invalidated registration".to_owned(), release_invalidated),
        ]),
        Topology::Split => steps.push((
            "no P2P path HBM -> NIC: acquired, but dma_map fails with -EOPNOTSUPP (the exporter's refusal)".to_owned(),
            register_refused,
        )),
    }
    steps.push((
        format!("rmmod {CLIENT_MODULE} (client unregistered), then peerdirect and the core module"),
        unload,
    ));
    steps
}

pub(crate) fn run(topology: Topology) -> ExitCode {
    let steps = steps(topology);
    let mut tap = Tap::plan(steps.len());
    let mut state = State {
        nic: String::new(),
        core: None,
        device: None,
        info: None,
        dmabuf: None,
        bar_offset: 0,
        map: None,
        id: None,
    };
    let mut failed = false;
    let last = steps.len() - 1;
    for (i, (description, step)) in steps.iter().enumerate() {
        // After a failure, only the unload (last) runs: a best effort to leave no module behind.
        let outcome = if failed && i != last {
            Err("not run: an earlier step failed".to_owned())
        } else {
            step(&mut state)
        };
        failed |= outcome.is_err();
        tap.report(description, &outcome);
    }
    tap.finish()
}

/// rmmod, retried for a few seconds: closed files are released asynchronously.
fn rmmod(module: &str) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let output = Command::new("rmmod")
            .arg(module)
            .output()
            .map_err(|err| format!("cannot run rmmod: {err}"))?;
        if output.status.success() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "rmmod {module} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        thread::sleep(Duration::from_millis(200));
    }
}

fn module_loaded(module: &str) -> bool {
    Path::new("/sys/module").join(module).exists()
}

fn dmesg() -> Result<String, String> {
    let output = Command::new("dmesg")
        .output()
        .map_err(|err| format!("cannot run dmesg: {err}"))?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn load_core(s: &mut State) -> Outcome {
    if module_loaded("peerdirect") {
        return Err("peerdirect.ko is already loaded: boot with qemu/run --no-bind".to_owned());
    }
    let nics = pci_devices(&NIC_IDS)?;
    s.nic = match nics.as_slice() {
        [nic] => nic.clone(),
        _ => return Err(format!("expected one virtio-net device, found {nics:?}")),
    };
    insmod(CORE_PATH)?;
    s.core = Some(TestModule::open(CORE_MODULE, RUN_FILE)?);
    Ok(())
}

fn load_peerdirect(s: &mut State) -> Outcome {
    let hbms = pci_devices(&[HBM_ID])?;
    if hbms.is_empty() {
        return Err("no HBM device (ivshmem 1af4:1110)".to_owned());
    }
    for hbm in &hbms {
        let path = format!("{SYSFS_PCI_DEVICES}/{hbm}/driver_override");
        fs::write(&path, "peerdirect").map_err(|err| format!("writing {path}: {err}"))?;
    }
    insmod(PEERDIRECT_PATH)?;
    let path = peerdirect::device_path(INDEX);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(format!("{} did not appear", path.display()));
        }
        thread::sleep(Duration::from_millis(100));
    }
    let device = Device::open_index(INDEX).map_err(|err| err.to_string())?;
    s.info = Some(device.info().map_err(|err| err.to_string())?);
    s.device = Some(device);
    Ok(())
}

fn load_client(_: &mut State) -> Outcome {
    insmod(CLIENT_PATH)?;
    let log = dmesg()?;
    for line in [CLIENT_LOG, CORE_LOG] {
        if !log.contains(line) {
            return Err(format!("the kernel log has no line with '{line}'"));
        }
    }
    Ok(())
}

fn export_and_map(s: &mut State) -> Outcome {
    let device = s.device.as_ref().ok_or("peerdirect0 is not open")?;
    let allocation = device
        .alloc(EXPORT_LEN, None)
        .map_err(|err| format!("alloc of 4 MiB failed: {err}"))?;
    s.bar_offset = allocation.hbm_offset();
    let dmabuf = allocation
        .export(0, EXPORT_LEN, ExportFlags::RDWR | ExportFlags::CLOEXEC)
        .map_err(|err| format!("export failed: {err}"))?;
    // The dma-buf holds the allocation; its handle is freed with the file.
    allocation.into_handle();
    s.map = Some(AlignedMap::new(&dmabuf, true)?);
    s.dmabuf = Some(dmabuf);
    Ok(())
}

fn register_line(s: &State, addr: u64, size: u64, extra: &str) -> String {
    format!("register addr={addr:#x} size={size} dev={} {extra}", s.nic)
        .trim_end()
        .to_owned()
}

fn not_ours(s: &mut State) -> Outcome {
    let plain = vec![0x5au8; MIB as usize];
    let line = register_line(s, plain.as_ptr() as u64, MIB, "");
    let report = s.core()?.command(&line)?;
    report.expect(&[("acquired", 0)])?;
    report.expect(&[("acquire", 0)])?;
    if report.value("id").is_some() {
        return Err(format!("a registration was kept: {}", report.summary()));
    }
    Ok(())
}

/// Checks a mapped registration: page size, pages, and one contiguous DMA range at
/// `expected_first` of `len` bytes.
fn check_mapped(report: &Report, page_size: u64, len: u64, expected_first: u64) -> Outcome {
    report.expect(&[("acquired", 1)])?;
    report.expect(&[("get_pages", 0)])?;
    expect_eq("page_size", page_size, report.uint("page_size")?)?;
    expect_eq("nents", len / page_size, report.uint("nents")?)?;
    report.expect(&[("dma_map", 0)])?;
    let nmap = report.uint("nmap")?;
    if nmap == 0 || nmap > len / page_size {
        return Err(format!(
            "nmap: expected 1..={}, got {nmap}",
            len / page_size
        ));
    }
    expect_eq("contiguous", 1, report.int("contiguous")?)?;
    expect_eq("dma_total", len, report.uint("dma_total")?)?;
    let first = report.uint("dma_first")?;
    if first != expected_first {
        return Err(format!(
            "dma_first: expected {expected_first:#x} (hbm_bus_addr + BAR offset), got {first:#x}"
        ));
    }
    Ok(())
}

fn register_whole(s: &mut State) -> Outcome {
    let addr = s.map_addr()?;
    let expected = s.info()?.hbm_bus_addr + s.bar_offset;
    let line = register_line(s, addr, EXPORT_LEN, "");
    let report = s.core()?.command(&line)?;
    check_mapped(&report, 2 * MIB, EXPORT_LEN, expected)?;
    let id = report.uint("id")?;
    s.id = Some(id);
    let status = s.core()?.command(&format!("status id={id}"))?;
    status.expect(&[("invalidated", 0)])?;
    status.expect(&[("mapped", 1)])
}

fn register_sub_range(s: &mut State) -> Outcome {
    const OFFSET: u64 = 64 << 10;
    let addr = s.map_addr()? + OFFSET;
    let expected = s.info()?.hbm_bus_addr + s.bar_offset + OFFSET;
    let line = register_line(s, addr, MIB, "");
    let report = s.core()?.command(&line)?;
    check_mapped(&report, 64 << 10, MIB, expected)?;
    let id = report.uint("id")?;
    let released = s.core()?.command(&format!("release id={id}"))?;
    released.expect(&[("released", 1)])
}

fn read_only_refuses_write(s: &mut State) -> Outcome {
    let device = s.device.as_ref().ok_or("peerdirect0 is not open")?;
    let core = s.core.as_mut().ok_or("no core module")?;
    let allocation = device
        .alloc(2 * MIB, None)
        .map_err(|err| format!("alloc of 2 MiB failed: {err}"))?;
    let dmabuf = allocation
        .export(0, 2 * MIB, ExportFlags::CLOEXEC)
        .map_err(|err| format!("export failed: {err}"))?;
    let map = AlignedMap::new(&dmabuf, false)?;
    let line = |write: u8| {
        format!(
            "register addr={:#x} size={} dev={} write={write}",
            map.addr(),
            2 * MIB,
            s.nic
        )
    };
    let report = core.command(&line(1))?;
    report.expect(&[("acquired", 1)])?;
    report.expect(&[("get_pages", -EACCES)])?;
    let report = core.command(&line(0))?;
    report.expect(&[("dma_map", 0)])?;
    let id = report.uint("id")?;
    core.command(&format!("release id={id}"))?
        .expect(&[("released", 1)])
}

fn unbind_invalidates(s: &mut State) -> Outcome {
    let id = s.id.ok_or("no registration")?;
    let bdf = s.info()?.pci_address.to_string();
    Unbinding::start(&bdf)
        .finish(UNBIND_TIMEOUT)
        .map_err(|err| format!("{err}: the removal waits for a mapping the core never released"))?;
    if Path::new(&format!("{SYSFS_DRIVER}/{bdf}")).exists() {
        return Err(format!("{bdf} is still bound after unbind"));
    }
    let status = s.core()?.command(&format!("status id={id}"))?;
    status.expect(&[("invalidated", 1)])?;
    status.expect(&[("invalidations", 1)])?;
    status.expect(&[("mapped", 0)])?;
    status.expect(&[("pages", 0)])
}

fn release_invalidated(s: &mut State) -> Outcome {
    let id = s.id.take().ok_or("no registration")?;
    s.core()?
        .command(&format!("release id={id}"))?
        .expect(&[("released", 1)])
}

fn register_refused(s: &mut State) -> Outcome {
    let addr = s.map_addr()?;
    let line = register_line(s, addr, EXPORT_LEN, "");
    let report = s.core()?.command(&line)?;
    report.expect(&[("acquired", 1)])?;
    report.expect(&[("get_pages", 0)])?;
    expect_eq("page_size", 2 * MIB, report.uint("page_size")?)?;
    report.expect(&[("dma_map", -EOPNOTSUPP)])?;
    if report.value("id").is_some() {
        return Err(format!(
            "a failed registration was kept: {}",
            report.summary()
        ));
    }
    Ok(())
}

fn unload(s: &mut State) -> Outcome {
    // Whatever is still registered (after a failure), then every file of peerdirect's.
    if let Some(core) = s.core.as_mut() {
        core.command("release all")?;
    }
    s.map = None;
    s.dmabuf = None;
    s.info = None;
    s.device = None;
    if module_loaded(CLIENT_MODULE) {
        rmmod(CLIENT_MODULE)?;
    }
    if !dmesg()?.contains("peerdirect_peermem_core: peer-memory client unregistered") {
        return Err("the core module did not log the client's unregistration".to_owned());
    }
    if module_loaded("peerdirect") {
        rmmod("peerdirect")?;
    }
    s.core = None;
    rmmod(CORE_MODULE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(text: &str) -> Report {
        Report::parse(CORE_MODULE, text, '=')
    }

    #[test]
    fn report_parses_numbers_and_fails_on_mismatch() {
        let report = report("acquired=1\ndma_map=-95\ndma_first=0x1000\nnoise\n");
        assert_eq!(report.int("dma_map").unwrap(), -95);
        assert_eq!(report.uint("dma_first").unwrap(), 0x1000);
        assert!(report.expect(&[("acquired", 1)]).is_ok());
        let err = report.expect(&[("acquired", 0)]).unwrap_err();
        assert!(err.contains("expected 0, got 1"), "{err}");
        assert!(report.get("id").is_err());
    }

    #[test]
    fn check_mapped_rejects_a_wrong_address_and_page_size() {
        let good = report(
            "acquired=1\nget_pages=0\npage_size=2097152\nnents=2\ndma_map=0\nnmap=1\ncontiguous=1\ndma_total=4194304\ndma_first=0xc0000000\n",
        );
        assert!(check_mapped(&good, 2 * MIB, 4 * MIB, 0xc000_0000).is_ok());
        assert!(check_mapped(&good, 2 * MIB, 4 * MIB, 0xc020_0000).is_err());
        assert!(check_mapped(&good, 64 << 10, 4 * MIB, 0xc000_0000).is_err());
    }

    #[test]
    fn each_topology_loads_and_unloads() {
        for topology in [Topology::Switch, Topology::Split] {
            let steps = steps(topology);
            assert!(steps[0].0.contains("insmod"));
            assert!(steps.last().unwrap().0.starts_with("rmmod"));
        }
        assert!(steps(Topology::Split)
            .iter()
            .any(|(d, _)| d.contains("EOPNOTSUPP")));
    }
}
