//! `peerdirect doctor`: what a host needs for HBM-to-NIC transfers, checked one by one, each
//! with what to do about it: the module and its devices, a NIC that can reach the HBM
//! peer-to-peer (the kernel's verdict, as `topo` gives it), libfabric with `FI_MR_DMABUF`,
//! the locked-memory limit, and the settings Habana's documentation asks for when Gaudi
//! uses host NICs (`RDMAV_FORK_SAFE=1`; `FI_EFA_USE_DEVICE_RDMA=1` with EFA).
//!
//! `module_build`: the peerdirect.ko modprobe would load for the running kernel (its
//! `modules.dep` entry, as DKMS or `make install` put it there) must have been built for that
//! kernel: its vermagic's release is `uname -r`, and the rustc that built it (`.comment`) is
//! the kernel's (`CONFIG_RUSTC_VERSION_TEXT` of /boot/config-RELEASE or the headers'
//! `.config`). When the module is loaded, its build id (or srcversion) from /sys/module tells
//! whether it is that file or an older build (`module_file` reads both).
//! `doctor --kernel RELEASE` checks the module installed for another kernel, e.g. one about to
//! be booted.
//!
//! With an EFA device (skipped without one):
//! - `efa_libfabric`: libfabric 2.5.0's efa provider refuses `FI_MR_DMABUF` registrations
//!   of `FI_HMEM_SYSTEM` memory, which is how HBM is registered (fixed in 2.5.1). `fi_version()`
//!   has no patch level, so the release comes from `fi_info --version` ("libfabric: X.Y.Z",
//!   when `fi_info` is on `PATH` and reports the same major.minor), else from the file name
//!   of the `libfabric.so.1` this process mapped: upstream builds it with libtool's
//!   `-version-info C:R:A` as `libfabric.so.1.A.R`, and since 1.11 every release has its own
//!   age (2.x: A = 26 + minor, so 2.5 is 31) and a patch release's revision is its patch
//!   level (2.5.0 is `libfabric.so.1.31.0`, 2.5.1 `libfabric.so.1.31.1`, as is 2.5.1rc1, which
//!   still has the bug). Neither: the patch level is unknown, a warning.
//! - `efa_shm`: `FI_EFA_ENABLE_SHM_TRANSFER` (libfabric's default 1) makes the efa fabric
//!   hand transfers between processes of one host to libfabric's shm provider, which treats
//!   the HBM registration as host memory: a warning unless libfabric reads it as 0.
//! - `efa_fabric`: whether `FI_PROVIDER` lets libfabric use the efa provider, and its
//!   `efa-direct` fabric (libfabric >= 2.1; a fabric name of the efa provider, asked for with
//!   `fabric_attr->name`, not a provider name `FI_PROVIDER` can select).
//!
//! With a verbs NIC, i.e. an RDMA device that is not EFA (mlx5, irdma, rxe; skipped without):
//! - `verbs_kernel`: `ib_umem_dmabuf_get` in /proc/kallsyms, the kernel's dma-buf import for
//!   MRs, and the test libfabric's verbs provider itself makes (`vrb_os_mem_support`); the
//!   names are listed to every user, only the addresses are hidden.
//! - `verbs_use_dmabuf`: `FI_VERBS_USE_DMABUF` false turns the verbs provider's
//!   `FI_MR_DMABUF` off.
//! - `verbs_odp`: `FI_VERBS_USE_ODP` true makes the verbs provider ask for on-demand paging
//!   on `FI_HMEM_SYSTEM` registrations, dma-buf ones included, which the kernel refuses.
//! - `verbs_dmabuf_mr`: whether each verbs device takes dma-buf MRs at all, found by trying
//!   one rather than from a driver or version list: a page of a fresh allocation of the first
//!   HBM device (of a companion: the first page of its BAR), exported and registered with `ibv_reg_dmabuf_mr` (as libfabric's verbs
//!   provider registers `FI_MR_DMABUF`), then released. A refusal is a warning: transfers
//!   still work, through host staging.
//!
//! `fi_mr_dmabuf`: what `peerdirect register --provider P` does with HBM, tried through
//! libfabric and the provider a job will use, with the crate's registrar: P's fabric and
//! domain opened as `register` opens them (`FI_EP_RDM`, tagged), one page of a fresh
//! allocation of the first HBM device (of a companion: the first page of its BAR) exported, mapped and registered with
//! `fi_mr_regattr(FI_MR_DMABUF)`, then released. P is `doctor --provider`, else `FI_PROVIDER`
//! when it names one provider, else the provider of the host's RDMA NIC (`efa` for an EFA
//! device, `verbs;ofi_rxm` for a verbs NIC); with none of these it is skipped. The path the
//! registration took is the answer: `dma_buf` is ok, host bounce (the provider refused, with
//! its reason) a warning, any other error a failure (`register` fails the same way). No such
//! provider (`fi_getinfo`: no data) fails when `--provider` named it (what the user asked to
//! check; `register` fails alike) and skips it when it was picked for the user (`FI_PROVIDER`,
//! the NIC's); no HBM device or no usable libfabric skips it. A
//! software provider (tcp, udp, shm) takes `FI_MR_DMABUF` without using the fd: it reaches
//! the memory through this process's CPU mapping (`base_addr`), so its `dma_buf` says nothing
//! of a NIC, and the check says so.
//!
//! libfabric also reads its variables from `libfabric.conf` in its sysconfdir; these checks
//! read the environment only.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::register::{bind_endpoint, hbm_export};
use anyhow::{Context, Result};
use peerdirect::registrar::libfabric;
use peerdirect::{Allocation, Device, DmaBuf, Errno, ExportFlags, Provider, RegPath};
use serde::Serialize;

use crate::devices::NO_DEVICE;
use crate::provider::{core_provider, SOFTWARE_PROVIDERS};
use crate::topo::{self, Kind, PciPeer};

mod module_file;
use module_file::Build;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of a list.
    #[arg(long)]
    pub json: bool,
    /// Check the peerdirect.ko installed for this kernel release instead of the running
    /// kernel's (e.g. one about to be booted).
    #[arg(long, value_name = "RELEASE", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub kernel: Option<String>,
    /// The libfabric provider whose FI_MR_DMABUF registration of HBM to try, as `register
    /// --provider` names it ("verbs;ofi_rxm", efa, tcp); one libfabric does not offer fails
    /// the check. Default: FI_PROVIDER when it names one provider, else the provider of this
    /// host's RDMA NIC (either skipped when libfabric does not offer it).
    #[arg(long, value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub provider: Option<String>,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// Does not apply to this host (e.g. EFA settings without an EFA device).
    Skip,
    /// Works, but slower or fragile: see `fix`.
    Warn,
    /// HBM cannot reach a NIC this way: see `fix`.
    Fail,
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    /// What to do, for `warn` and `fail`.
    pub fix: Option<String>,
}

impl Check {
    fn new(name: &'static str, status: Status, detail: impl Into<String>) -> Self {
        Self {
            name,
            status,
            detail: detail.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// Why `/dev/peerdirect*` could not be read (`peerdirect::devices`).
#[derive(Debug, Clone)]
pub struct Unreadable {
    /// The error, with its hint.
    pub message: String,
    /// Whether permission was denied (`EACCES`, `EPERM`): the fix is then the group to join.
    pub denied: bool,
}

/// What the checks look at, gathered from the host (or made up by a test).
#[derive(Debug, Default)]
pub struct Host {
    /// Whether /sys/module/peerdirect exists.
    pub module_loaded: bool,
    /// The kernel release the installed module must match: the running kernel's, or
    /// `doctor --kernel`'s; empty when it could not be read.
    pub release: String,
    /// Whether `release` is the running kernel's (only then does the loaded module count).
    pub release_is_running: bool,
    /// The peerdirect.ko of `release`'s modules.dep.
    pub installed: Installed,
    /// The loaded module's srcversion and build id (/sys/module/peerdirect).
    pub loaded_build: Build,
    /// `CONFIG_RUSTC_VERSION_TEXT` of `release` (/boot/config-RELEASE or its headers).
    pub kernel_rustc: Option<String>,
    /// Per HBM device: its node, and per RDMA-capable peer its P2P verdict.
    pub devices: Vec<DeviceView>,
    /// Why the devices could not be read, if they could not.
    pub devices_error: Option<Unreadable>,
    /// The PCI functions sysfs lists (not bridges).
    pub peers: Vec<PciPeer>,
    /// `libfabric::version()`, or why it is unusable (`Err`).
    pub libfabric: Option<Result<String, String>>,
    /// The environment variables the checks read.
    pub env: HashMap<String, String>,
    /// RLIMIT_MEMLOCK's soft limit from /proc/self/limits: bytes, or `Some(None)` for
    /// unlimited; `None` when it could not be read.
    pub memlock: Option<Option<u64>>,
    /// The release `fi_info --version` reports on its "libfabric: " line (e.g. "2.5.0", or
    /// "2.1.0amzn3.0" with a build id); `None` without `fi_info` on `PATH` or without an
    /// EFA device (only the EFA checks need it).
    pub fi_info_release: Option<String>,
    /// The path of the libfabric library this process mapped (from /proc/self/maps), e.g.
    /// /usr/lib/x86_64-linux-gnu/libfabric.so.1.27.0; `None` when none is mapped.
    pub libfabric_file: Option<String>,
    /// Whether /proc/kallsyms lists `ib_umem_dmabuf_get`: `None` when it could not be read
    /// or without a verbs NIC (only the verbs checks need it).
    pub kallsyms_dmabuf: Option<bool>,
    /// Per verbs RDMA device, whether `ibv_reg_dmabuf_mr` of a peerdirect dma-buf worked (or
    /// its error); `Err` when no registration could be tried (why); `None` without a verbs
    /// NIC.
    pub verbs_probe: Option<Result<Vec<Tried>, String>>,
    /// The libfabric provider `fi_mr_dmabuf` tries, and what chose it; `None` when nothing
    /// names one (no `--provider`, no `FI_PROVIDER` of one provider, no RDMA NIC).
    pub provider: Option<Chosen>,
    /// What `fi_mr_regattr(FI_MR_DMABUF)` of a page of HBM through `provider` did; `None` when
    /// it was not tried (no provider, libfabric unusable, no HBM device).
    pub fabric_probe: Option<Probed>,
}

/// The provider `fi_mr_dmabuf` tries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    /// As `fi_getinfo`'s `prov_name` (and `register --provider`) takes it.
    pub name: String,
    /// What chose it: "--provider", "FI_PROVIDER", or the NIC it is the provider of.
    pub by: String,
}

/// What a `FI_MR_DMABUF` registration of HBM through a provider did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    /// `fi_getinfo` found no such provider (its error): none of that name, or none with the
    /// endpoints `register` opens, or hidden by `FI_PROVIDER`.
    NoProvider(String),
    /// Registered: the provider and domain `fi_getinfo` named, and the path the registration
    /// took (`HostBounce` with the provider's refusal).
    Registered {
        provider: String,
        domain: String,
        path: RegPath,
    },
    /// Anything else failed (opening the domain, an endpoint, the registration itself with an
    /// error that is not a refusal): the error, as `register` reports it.
    Failed(String),
}

/// A verbs device's name, and whether `ibv_reg_dmabuf_mr` of HBM worked there (or its error).
pub type Tried = (String, Result<(), String>);

/// The peerdirect.ko installed for a kernel release.
#[derive(Debug, Default)]
pub enum Installed {
    /// Not looked for: no kernel release.
    #[default]
    Unknown,
    /// Not in the release's modules.dep, or no modules.dep: why.
    Missing(String),
    /// The file modprobe loads, and what it says (or why it could not be read).
    File {
        path: String,
        build: Result<Build, String>,
    },
}

/// One HBM device as the checks see it.
#[derive(Debug)]
pub struct DeviceView {
    pub path: String,
    pub hbm_bytes: u64,
    pub revoked: bool,
    /// `(peer, reachable, why)` for each RDMA peer.
    pub rdma_paths: Vec<(String, bool, String)>,
}

/// The environment variables `checks` reads.
const ENV: [&str; 6] = [
    "RDMAV_FORK_SAFE",
    "FI_EFA_USE_DEVICE_RDMA",
    "FI_EFA_ENABLE_SHM_TRANSFER",
    "FI_PROVIDER",
    "FI_VERBS_USE_DMABUF",
    "FI_VERBS_USE_ODP",
];

/// The kernel symbol of dma-buf MRs (drivers/infiniband/core/umem_dmabuf.c, Linux >= 5.12),
/// the one libfabric's verbs provider looks for in /proc/kallsyms.
const UMEM_DMABUF: &str = "ib_umem_dmabuf_get";

/// How long `fi_info --version` may take.
const FI_INFO_TIMEOUT: Duration = Duration::from_secs(5);

impl Host {
    /// Reads this host; the installed module is checked against `kernel`, by default the
    /// running kernel, and `FI_MR_DMABUF` tried through `provider` (by default the one
    /// [`choose_provider`] picks).
    pub fn gather(kernel: Option<&str>, provider: Option<&str>) -> Self {
        let sysfs = Path::new("/sys");
        let running = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|r| r.trim().to_owned())
            .unwrap_or_default();
        let release = kernel.map_or_else(|| running.clone(), str::to_owned);
        let peers = topo::scan(sysfs).unwrap_or_default();
        // First: it maps libfabric.so.1 (for good), whose file name /proc/self/maps then gives.
        let libfabric = libfabric::version().map_err(|e| e.to_string());
        let efa = peers.iter().any(is_efa);
        let mut host = Host {
            module_loaded: sysfs.join("module/peerdirect").exists(),
            installed: installed(Path::new("/lib/modules"), &release),
            loaded_build: loaded_build(&sysfs.join("module/peerdirect")),
            kernel_rustc: kernel_rustc(&release),
            release_is_running: !release.is_empty() && release == running,
            release,
            libfabric: Some(libfabric),
            libfabric_file: std::fs::read_to_string("/proc/self/maps")
                .ok()
                .and_then(|maps| libfabric_file_of(&maps)),
            fi_info_release: if efa { fi_info_release() } else { None },
            kallsyms_dmabuf: if peers.iter().any(is_verbs) {
                kallsyms_lists(Path::new("/proc/kallsyms"), UMEM_DMABUF)
            } else {
                None
            },
            env: ENV
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
                .collect(),
            memlock: std::fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|text| memlock_of(&text)),
            ..Host::default()
        };
        host.provider = choose_provider(provider, &host.env, &peers);
        let libfabric_usable = matches!(host.libfabric, Some(Ok(_)));
        let verbs: Vec<&str> = peers
            .iter()
            .filter(|p| is_verbs(p))
            .flat_map(|p| p.rdma.iter().map(String::as_str))
            .collect();
        match peerdirect::devices() {
            Ok(devices) => {
                for device in &devices {
                    host.devices.push(view(device, &peers));
                }
                if !verbs.is_empty() {
                    host.verbs_probe = Some(match devices.first() {
                        Some(device) => probe_verbs(device, &verbs),
                        None => Err(NO_DEVICE.to_owned()),
                    });
                }
                if let (Some(chosen), Some(device), true) =
                    (&host.provider, devices.first(), libfabric_usable)
                {
                    host.fabric_probe = Some(probe_fabric(device, &chosen.name));
                }
            }
            Err(e) => {
                if !verbs.is_empty() {
                    host.verbs_probe = Some(Err(e.to_string()));
                }
                host.devices_error = Some(Unreadable {
                    message: e.to_string(),
                    denied: matches!(e.errno(), Some(Errno::ACCESS | Errno::PERM)),
                });
            }
        }
        host.peers = peers;
        host
    }
}

/// A page of `device` for the probes to register, exported: a fresh allocation's; on a
/// companion, which has no allocator (its owner's runtime allocates), the first page of its
/// BAR, exported as `peerdirect companion export` exports a range (which needs CAP_SYS_ADMIN).
/// The allocation, if any, is freed when dropped.
fn page_of(device: &Device) -> Result<(Option<Allocation<'_>>, DmaBuf)> {
    const PAGE: u64 = 4096;
    if device.info()?.provider == Provider::Companion {
        let dma_buf = device
            .export_range(0, PAGE, ExportFlags::CLOEXEC | ExportFlags::RDWR)
            .context("exporting the first page of the companion's BAR")?;
        return Ok((None, dma_buf));
    }
    let (allocation, dma_buf) = hbm_export(device, PAGE)?;
    Ok((Some(allocation), dma_buf))
}

/// Registers a page of `device` ([`page_of`]) with `ibv_reg_dmabuf_mr` on each of
/// `nics`, with the access libfabric's verbs provider asks for an RMA target, and releases
/// it: each device's outcome, or why nothing could be tried.
fn probe_verbs(device: &Device, nics: &[&str]) -> Result<Vec<Tried>, String> {
    use peerdirect::cache::{Access, ByteRange};
    use peerdirect::registrar::ibverbs::IbverbsRegistrar;
    const PAGE: u64 = 4096;
    let (_allocation, dma_buf) = page_of(device).map_err(|e| format!("{e:#}"))?;
    let range = ByteRange::new(0, PAGE).map_err(|e| e.to_string())?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    Ok(nics
        .iter()
        .map(|&nic| {
            let outcome = IbverbsRegistrar::open(nic)
                .and_then(|verbs| verbs.register_range(&dma_buf, range, access).map(drop))
                .map_err(|e| e.to_string());
            (nic.to_owned(), outcome)
        })
        .collect())
}

/// The provider `fi_mr_dmabuf` tries, as a user expects it: the one named (`--provider`),
/// else `FI_PROVIDER` when it names one provider (a list or an exclusion names none, but
/// libfabric still applies it to what the probe asks for), else the provider of the host's
/// RDMA NIC: `efa` for an EFA device, `verbs;ofi_rxm` for a verbs NIC (libfabric's verbs
/// provider has reliable-datagram endpoints, which `register` opens, only under ofi_rxm).
pub fn choose_provider(
    named: Option<&str>,
    env: &HashMap<String, String>,
    peers: &[PciPeer],
) -> Option<Chosen> {
    let chosen = |name: &str, by: String| {
        Some(Chosen {
            name: name.to_owned(),
            by,
        })
    };
    if let Some(name) = named {
        return chosen(name, "--provider".to_owned());
    }
    if let Some(filter) = env.get("FI_PROVIDER") {
        let one = filter.trim();
        if !one.is_empty() && !one.starts_with('^') && !one.contains(',') {
            return chosen(one, "FI_PROVIDER".to_owned());
        }
    }
    let rdma = |p: &PciPeer| {
        p.rdma
            .first()
            .cloned()
            .unwrap_or_else(|| p.pci_address.to_string())
    };
    if let Some(efa) = peers.iter().find(|p| is_efa(p)) {
        return chosen(
            "efa",
            format!("the provider of the EFA device {}", rdma(efa)),
        );
    }
    let nic = peers.iter().find(|p| is_verbs(p))?;
    chosen(
        "verbs;ofi_rxm",
        format!("the provider of the verbs NIC {}", rdma(nic)),
    )
}

/// Registers a page of `device` ([`page_of`]) through `provider` as `peerdirect
/// register --provider` does (its fabric and domain, the crate's libfabric registrar with its
/// host-bounce fallback, an endpoint bound where the domain has `FI_MR_ENDPOINT`), and
/// releases it: the path it took, or what failed.
fn probe_fabric(device: &Device, provider: &str) -> Probed {
    use peerdirect::registrar::libfabric::{Fabric, LibfabricError, LibfabricRegistrar};
    let fabric = match Fabric::open(provider, None) {
        Ok(fabric) => fabric,
        Err(
            e @ LibfabricError::Call {
                call: "fi_getinfo", ..
            },
        ) if e.errno() == Some(Errno::NODATA) => return Probed::NoProvider(e.to_string()),
        Err(e) => return Probed::Failed(e.to_string()),
    };
    let caps = fabric.caps().clone();
    match register_page(&LibfabricRegistrar::new(fabric), device) {
        Ok(path) => Probed::Registered {
            provider: caps.provider,
            domain: caps.domain,
            path,
        },
        Err(e) => Probed::Failed(e),
    }
}

/// A page of `device` ([`page_of`]), exported, mapped and registered through
/// `registrar` with the access `register` asks for, then released: the path it took.
fn register_page(
    registrar: &peerdirect::registrar::libfabric::LibfabricRegistrar,
    device: &Device,
) -> Result<RegPath, String> {
    use peerdirect::cache::{Access, ByteRange, RegKey};
    use peerdirect::registrar::libfabric::MappedDmaBuf;
    use peerdirect::Registrar;
    const PAGE: u64 = 4096;
    // As `register` does: a domain with FI_MR_ENDPOINT binds registrations to an endpoint.
    bind_endpoint(registrar).map_err(|e| format!("{e:#}"))?;
    let (_allocation, dma_buf) = page_of(device).map_err(|e| format!("{e:#}"))?;
    let export = device
        .export_id(&dma_buf)
        .map_err(|e| format!("fstat of its dma-buf: {e}"))?;
    // Mapped, as `register` maps it: software providers use the mapping, host bounce copies
    // through it.
    let hbm = MappedDmaBuf::new(dma_buf).map_err(|e| e.to_string())?;
    let key = RegKey {
        domain: registrar.domain(),
        export,
        range: ByteRange::new(0, PAGE).map_err(|e| e.to_string())?,
        access: Access::all(),
    };
    let mr = registrar.register(&hbm, &key).map_err(|e| e.to_string())?;
    let path = mr.path().clone();
    registrar.deregister(mr);
    Ok(path)
}

/// The peerdirect.ko modprobe loads for `release`: the entry of `modules`/RELEASE/modules.dep.
fn installed(modules: &Path, release: &str) -> Installed {
    if release.is_empty() {
        return Installed::Unknown;
    }
    let dir = modules.join(release);
    let dep = dir.join("modules.dep");
    let text = match std::fs::read_to_string(&dep) {
        Ok(text) => text,
        Err(e) => return Installed::Missing(format!("cannot read {}: {e}", dep.display())),
    };
    match module_file::modules_dep_entry(&text, "peerdirect") {
        None => Installed::Missing(format!("{} lists no peerdirect.ko", dep.display())),
        Some(entry) => {
            let path = dir.join(entry);
            Installed::File {
                path: path.display().to_string(),
                build: module_file::read(&path)
                    .and_then(|elf| module_file::build_of(&elf))
                    .map_err(|e| format!("{e:#}")),
            }
        }
    }
}

/// The loaded module's srcversion and build id, from its sysfs directory.
fn loaded_build(module: &Path) -> Build {
    Build {
        srcversion: std::fs::read_to_string(module.join("srcversion"))
            .ok()
            .map(|s| s.trim().to_owned()),
        build_id: std::fs::read(module.join("notes/.note.gnu.build-id"))
            .ok()
            .and_then(|notes| module_file::build_id_of(&notes)),
        ..Build::default()
    }
}

/// `CONFIG_RUSTC_VERSION_TEXT` of kernel `release`: from /boot/config-RELEASE (the image
/// package's) or its headers' `.config`.
fn kernel_rustc(release: &str) -> Option<String> {
    if release.is_empty() {
        return None;
    }
    [
        format!("/boot/config-{release}"),
        format!("/lib/modules/{release}/build/.config"),
    ]
    .iter()
    .find_map(|path| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|config| module_file::config_rustc(&config))
    })
}

fn view(device: &Device, peers: &[PciPeer]) -> DeviceView {
    let hbm_bytes = device.info().map_or(0, |i| i.hbm_bytes);
    let rdma_paths = peers
        .iter()
        .filter(|p| p.kind == Kind::Rdma)
        .map(|p| {
            let name = format!("{} ({})", p.pci_address, p.rdma.join(","));
            match device.p2p(p.pci_address) {
                Ok(path) => (name, path.reachable(), path.why()),
                Err(e) => (name, false, e.to_string()),
            }
        })
        .collect();
    DeviceView {
        path: device.path().display().to_string(),
        hbm_bytes,
        revoked: device.is_revoked(),
        rdma_paths,
    }
}

/// RLIMIT_MEMLOCK's soft limit from /proc/self/limits text: `Some(Some(bytes))`,
/// `Some(None)` for unlimited, `None` when the line is missing or unreadable.
pub fn memlock_of(limits: &str) -> Option<Option<u64>> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    match line["Max locked memory".len()..]
        .split_whitespace()
        .next()?
    {
        "unlimited" => Some(None),
        soft => soft.parse().ok().map(Some),
    }
}

/// The path of the first libfabric library in /proc/self/maps text.
pub fn libfabric_file_of(maps: &str) -> Option<String> {
    maps.lines()
        .filter_map(|line| line.find('/').map(|i| &line[i..]))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libfabric.so"))
        })
        .map(str::to_owned)
}

/// Runs `fi_info --version` (if on `PATH`) and returns its "libfabric: " line's value: the
/// release of the library fi_info loaded (`fi_tostr(FI_TYPE_VERSION)`: VERSION and BUILD_ID).
fn fi_info_release() -> Option<String> {
    let mut child = Command::new("fi_info")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + FI_INFO_TIMEOUT;
    // Its three short lines fit in the pipe: wait first, then read.
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut text = String::new();
    child.stdout.take()?.read_to_string(&mut text).ok()?;
    fi_info_release_of(&text)
}

/// The value of the "libfabric: " line of `fi_info --version` output.
pub fn fi_info_release_of(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("libfabric:"))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// Whether a line of the file lists `symbol` (libfabric's own test: a substring match);
/// `None` when the file cannot be read.
fn kallsyms_lists(path: &Path, symbol: &str) -> Option<bool> {
    let mut reader = BufReader::new(File::open(path).ok()?);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Some(false),
            Ok(_) => {
                if line.windows(symbol.len()).any(|w| w == symbol.as_bytes()) {
                    return Some(true);
                }
            }
            Err(_) => return None,
        }
    }
}

fn is_efa(p: &PciPeer) -> bool {
    p.driver.as_deref() == Some("efa")
}

/// An RDMA device that libfabric drives with its verbs provider: any but EFA.
fn is_verbs(p: &PciPeer) -> bool {
    p.kind == Kind::Rdma && !is_efa(p)
}

/// A libfabric release as `fi_info --version` prints it: `major.minor.patch` and whatever
/// follows (a pre-release such as "rc1", or a build id such as "amzn3.0").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    pub suffix: String,
}

impl Release {
    pub fn parse(text: &str) -> Option<Self> {
        let end = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let mut numbers = text[..end].split('.').map(str::parse::<u32>);
        let (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch))) =
            (numbers.next(), numbers.next(), numbers.next())
        else {
            return None;
        };
        Some(Self {
            major,
            minor,
            patch,
            suffix: text[end..].to_owned(),
        })
    }
}

/// `(age, revision)` of an upstream `libfabric.so.1.A.R` file name.
pub fn soname_numbers(file_name: &str) -> Option<(u32, u32)> {
    let mut parts = file_name.strip_prefix("libfabric.so.1.")?.split('.');
    let age = parts.next()?.parse().ok()?;
    let revision = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((age, revision))
}

/// The libtool age upstream gives a major.minor release (Makefile.am's `-version-info`; the
/// pattern holds from 1.11 to 2.6).
pub fn upstream_age(major: u32, minor: u32) -> Option<u32> {
    match (major, minor) {
        (1, 11..) => Some(minor + 3),
        (2, _) => Some(26 + minor),
        _ => None,
    }
}

/// `major.minor` of `fi_version()`'s text.
fn api_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Whether libfabric reads a boolean variable as true (`Some(true)`), false, or not at all
/// (`None`: it warns and keeps its default), as src/var.c's `fi_parse_bool` does.
pub fn fi_bool(value: &str) -> Option<bool> {
    let any = |words: [&str; 3]| words.iter().any(|w| value.eq_ignore_ascii_case(w));
    if value == "0" || any(["false", "no", "off"]) {
        Some(false)
    } else if value == "1" || any(["true", "yes", "on"]) {
        Some(true)
    } else {
        None
    }
}

/// Whether C's `strtol(value, NULL, 0)`, as libfabric reads its integer variables, gives 0
/// (it does for "0", "0x0", "00", but also for "false" or "": no digits).
pub fn strtol_is_zero(value: &str) -> bool {
    let s = value.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None if s.starts_with('0') => (s, 8),
        None => (s, 10),
    };
    digits
        .chars()
        .take_while(|c| c.is_digit(radix))
        .all(|c| c == '0')
}

/// Whether libfabric's `FI_PROVIDER` filter (src/fabric.c: comma-separated names, any case,
/// `^` negates; a layered "efa;x" keeps the core provider efa) lets the efa provider in.
pub fn provider_filter_allows_efa(filter: &str) -> bool {
    let (negated, names) = match filter.strip_prefix('^') {
        Some(names) => (true, names),
        None => (false, filter),
    };
    let exact = names.split(',').any(|n| n.eq_ignore_ascii_case("efa"));
    let layered = names
        .split(',')
        .any(|n| n.len() > 4 && n.is_char_boundary(4) && n[..4].eq_ignore_ascii_case("efa;"));
    if negated {
        !exact
    } else {
        exact || layered
    }
}

fn human(bytes: u64) -> String {
    crate::size::human_bytes(bytes)
}

/// The checks, in the order a person would fix things.
pub fn checks(host: &Host) -> Vec<Check> {
    let mut out = Vec::new();
    out.push(if host.module_loaded {
        Check::new("module", Status::Ok, "peerdirect.ko is loaded")
    } else {
        Check::new("module", Status::Fail, "peerdirect.ko is not loaded")
            .fix("modprobe peerdirect (installed by the peerdirect-dkms package or make install), or insmod peerdirect.ko")
    });
    out.push(module_build(host));

    let hbm_total: u64 = host.devices.iter().map(|d| d.hbm_bytes).sum();
    out.push(match (&host.devices_error, host.devices.as_slice()) {
        (Some(e), _) if e.denied => Check::new("devices", Status::Fail, e.message.clone())
            .fix("join the group peerdirect, which the udev rule of the peerdirect-dkms package or of make install gives /dev/peerdirect* (adduser $USER peerdirect, then log in again), or run as root"),
        // Its message says what to do, where there is something to say (Error::hint).
        (Some(e), _) => Check::new("devices", Status::Fail, e.message.clone()),
        (None, []) => Check::new("devices", Status::Fail, "no /dev/peerdirectN").fix(NO_DEVICE),
        (None, devices) if devices.iter().any(|d| d.revoked) => Check::new(
            "devices",
            Status::Fail,
            format!(
                "{} is being removed (its status page says revoked)",
                devices
                    .iter()
                    .find(|d| d.revoked)
                    .map_or("", |d| d.path.as_str())
            ),
        )
        .fix("wait for the device to be bound again, then reopen it"),
        (None, devices) => Check::new(
            "devices",
            Status::Ok,
            format!(
                "{} HBM device(s), {} in all: {}",
                devices.len(),
                human(hbm_total),
                devices
                    .iter()
                    .map(|d| d.path.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    });

    let rdma: Vec<&PciPeer> = host.peers.iter().filter(|p| p.kind == Kind::Rdma).collect();
    out.push(if host.devices.is_empty() {
        Check::new("p2p", Status::Skip, "no HBM device to check")
    } else if rdma.is_empty() {
        Check::new("p2p", Status::Warn, "no RDMA device on this host (/sys/class/infiniband)")
            .fix("load the NIC's RDMA driver (efa, mlx5_ib, irdma; rdma_rxe for testing); without one, only host-bounce paths of software providers remain")
    } else {
        let unreachable: Vec<String> = host
            .devices
            .iter()
            .filter(|d| !d.rdma_paths.iter().any(|(_, ok, _)| *ok))
            .map(|d| {
                let why = d
                    .rdma_paths
                    .first()
                    .map_or(String::new(), |(peer, _, why)| format!(": {peer}: {why}"));
                format!("{} reaches no RDMA NIC{why}", d.path)
            })
            .collect();
        if unreachable.is_empty() {
            let pairs: Vec<String> = host
                .devices
                .iter()
                .map(|d| {
                    let peers: Vec<&str> = d
                        .rdma_paths
                        .iter()
                        .filter(|(_, ok, _)| *ok)
                        .map(|(peer, _, _)| peer.as_str())
                        .collect();
                    format!("{} -> {}", d.path, peers.join(", "))
                })
                .collect();
            Check::new("p2p", Status::Ok, format!("peer-to-peer: {}", pairs.join("; ")))
        } else {
            Check::new("p2p", Status::Fail, unreachable.join("; ")).fix(
                "see `peerdirect topo`: place HBM and NIC below one PCIe switch, or lift the ACS redirect it names",
            )
        }
    });

    out.push(match host.libfabric.clone().unwrap_or_else(|| Err("not checked".into())) {
        Ok(version) => Check::new(
            "libfabric",
            Status::Ok,
            format!("libfabric {version} (FI_MR_DMABUF needs 1.20)"),
        ),
        Err(e) => Check::new("libfabric", Status::Warn, e).fix(
            "install libfabric >= 1.20 (Debian trixie: libfabric1) to register HBM through libfabric; ibverbs works without it",
        ),
    });

    out.push(match host.memlock {
        None => Check::new("memlock", Status::Skip, "cannot read /proc/self/limits"),
        Some(None) => Check::new("memlock", Status::Ok, "locked memory: unlimited"),
        Some(Some(limit)) if limit >= hbm_total.max(64 << 20) => Check::new(
            "memlock",
            Status::Ok,
            format!("locked memory limit {}", human(limit)),
        ),
        Some(Some(limit)) => Check::new(
            "memlock",
            Status::Warn,
            format!(
                "locked memory limit {} (ulimit -l): registrations of host memory (staging, the runtime's own buffers) fail beyond it",
                human(limit)
            ),
        )
        .fix("ulimit -l unlimited, or memlock unlimited in /etc/security/limits.conf (EFA's and Habana's documentation ask for it)"),
    });

    out.push(match host.env.get("RDMAV_FORK_SAFE").map(String::as_str) {
        Some("1") => Check::new("fork_safe", Status::Ok, "RDMAV_FORK_SAFE=1"),
        other => Check::new(
            "fork_safe",
            Status::Warn,
            format!(
                "RDMAV_FORK_SAFE is {}: a fork() of the training process can corrupt registered memory",
                other.map_or("unset".to_owned(), |v| format!("{v:?}"))
            ),
        )
        .fix("export RDMAV_FORK_SAFE=1 (Habana's documentation asks for it with host NICs)"),
    });

    let efa = host.peers.iter().any(is_efa);
    out.push(match (efa, host.env.get("FI_EFA_USE_DEVICE_RDMA").map(String::as_str)) {
        (false, _) => Check::new("efa_device_rdma", Status::Skip, "no EFA device"),
        (true, Some("1")) => Check::new("efa_device_rdma", Status::Ok, "FI_EFA_USE_DEVICE_RDMA=1"),
        (true, other) => Check::new(
            "efa_device_rdma",
            Status::Warn,
            format!(
                "FI_EFA_USE_DEVICE_RDMA is {}: libfabric's EFA provider may not use the NIC's RDMA read for HBM",
                other.map_or("unset".to_owned(), |v| format!("{v:?}"))
            ),
        )
        .fix("export FI_EFA_USE_DEVICE_RDMA=1"),
    });
    if efa {
        out.push(efa_libfabric(host));
        out.push(efa_shm(host));
        out.push(efa_fabric(host));
    } else {
        for name in ["efa_libfabric", "efa_shm", "efa_fabric"] {
            out.push(Check::new(name, Status::Skip, "no EFA device"));
        }
    }

    let verbs: Vec<String> = host
        .peers
        .iter()
        .filter(|p| is_verbs(p))
        .flat_map(|p| p.rdma.iter().cloned())
        .collect();
    if verbs.is_empty() {
        for name in [
            "verbs_kernel",
            "verbs_use_dmabuf",
            "verbs_odp",
            "verbs_dmabuf_mr",
        ] {
            out.push(Check::new(
                name,
                Status::Skip,
                "no verbs RDMA device (one that is not EFA)",
            ));
        }
    } else {
        out.extend(verbs_checks(host, &verbs.join(", ")));
        out.push(verbs_dmabuf_mr(host));
    }
    out.push(fi_mr_dmabuf(host));
    out
}

/// `fi_mr_regattr(FI_MR_DMABUF)` of a page of HBM through the provider a job will use.
fn fi_mr_dmabuf(host: &Host) -> Check {
    const NAME: &str = "fi_mr_dmabuf";
    let Some(chosen) = &host.provider else {
        return Check::new(
            NAME,
            Status::Skip,
            "no libfabric provider to try: none named (doctor --provider NAME, or FI_PROVIDER naming one) and no RDMA NIC to take its provider (efa, verbs;ofi_rxm)",
        );
    };
    let asked = format!("{} ({})", chosen.name, chosen.by);
    let register = format!("peerdirect register --provider '{}'", chosen.name);
    let probed = match &host.fabric_probe {
        Some(probed) => probed,
        None if !matches!(host.libfabric, Some(Ok(_))) => {
            return Check::new(
                NAME,
                Status::Skip,
                format!("{asked}: libfabric is not usable (see the libfabric check)"),
            )
        }
        None => {
            return Check::new(
                NAME,
                Status::Skip,
                format!("{asked}: no HBM device to register a page of (see the devices check)"),
            )
        }
    };
    match probed {
        Probed::NoProvider(e) => {
            let missing = format!("{asked}: libfabric offers no such provider with the reliable-datagram tagged endpoints (FI_EP_RDM) {register} opens: {e}");
            let hidden = match host.env.get("FI_PROVIDER") {
                Some(filter) if chosen.by != "FI_PROVIDER" => {
                    format!(" (FI_PROVIDER={filter:?} hides the providers it does not let in)")
                }
                _ => String::new(),
            };
            const LIST: &str = "`fi_info -l` lists the providers (verbs has such endpoints only under ofi_rxm: 'verbs;ofi_rxm')";
            // Named on the command line, it is what the user asked to check, and `register`
            // fails with it alike: a failure. Chosen for them (the NIC's provider, or
            // FI_PROVIDER's), it is a guess at what a job uses, which may open other
            // endpoints than the FI_EP_RDM ones tried here, or be built without that
            // provider and use another: nothing to check.
            if chosen.by == "--provider" {
                Check::new(NAME, Status::Fail, missing)
                    .fix(format!("name a provider libfabric has{hidden}: {LIST}"))
            } else {
                Check::new(NAME, Status::Skip, format!("{missing}{hidden}; {LIST}"))
            }
        }
        Probed::Failed(e) => {
            let efa = core_provider(&chosen.name) == "efa";
            Check::new(
                NAME,
                Status::Fail,
                format!("{asked}: {e}: {register} fails the same way; this is not a refusal of dma-bufs, which host bounce would answer, so HBM cannot be registered through this provider"),
            )
            .fix(if efa {
                "libfabric 2.5.0's efa provider answers FI_MR_DMABUF of FI_HMEM_SYSTEM memory with EINVAL (see efa_libfabric): upgrade to libfabric >= 2.5.1; otherwise the error names the call that failed".to_owned()
            } else {
                format!("the error names the libfabric call that failed; `fi_info -p '{}' -v` shows what the provider offers (RDMA devices: permissions of /dev/infiniband/uverbs*; the memlock check)", chosen.name)
            })
        }
        Probed::Registered {
            provider,
            domain,
            path: RegPath::HostBounce { reason },
        } => {
            let fix = match core_provider(provider).as_str() {
                "verbs" => "the verbs checks above say why (verbs_kernel, verbs_use_dmabuf, verbs_dmabuf_mr): the NIC's driver must import dma-bufs (mlx5, irdma, bnxt_re, efa; soft-RoCE and siw do not, Documentation/rdma.md)".to_owned(),
                "efa" => "see the efa checks above; the efa driver and rdma-core must import dma-bufs (ibv_reg_dmabuf_mr)".to_owned(),
                _ => "name the provider of a NIC whose driver imports dma-bufs (--provider or FI_PROVIDER: 'verbs;ofi_rxm' over mlx5, irdma or bnxt_re; efa)".to_owned(),
            };
            Check::new(
                NAME,
                Status::Warn,
                format!("{provider} (domain {domain}; {}) refuses a page of HBM: {reason}. {register} and the C ABI fall back to host bounce: every transfer is staged through a registered host buffer and copied by the CPU, and the NIC never reaches HBM", chosen.by),
            )
            .fix(fix)
        }
        Probed::Registered {
            provider,
            domain,
            path,
        } => {
            let core = core_provider(provider);
            let what = if SOFTWARE_PROVIDERS.contains(&core.as_str()) {
                format!("direct in libfabric's terms only: {core} is a software provider, which takes FI_MR_DMABUF without using the fd; it reads and writes the page at base_addr, this process's CPU mapping of the dma-buf, and moves it with the CPU, so no NIC imported it (to try a NIC, name its provider: --provider 'verbs;ofi_rxm' or efa)")
            } else if core == "verbs" || core == "efa" {
                format!("the {core} provider hands the fd to ibv_reg_dmabuf_mr, so {domain} imported the dma-buf and reaches HBM itself")
            } else {
                "the provider was handed the dma-buf's fd; whether its device imports it is the provider's own business".to_owned()
            };
            Check::new(
                NAME,
                Status::Ok,
                format!(
                    "{provider} (domain {domain}; {}): fi_mr_regattr(FI_MR_DMABUF) of a page of HBM took path {}, nothing staged, as {register} registers it: {what}",
                    chosen.by,
                    if *path == RegPath::DmaBuf { "dma_buf" } else { "peer_mem_va" },
                ),
            )
        }
    }
}

/// `ibv_reg_dmabuf_mr` of a peerdirect dma-buf tried on each verbs device.
fn verbs_dmabuf_mr(host: &Host) -> Check {
    const NAME: &str = "verbs_dmabuf_mr";
    match &host.verbs_probe {
        None => Check::new(NAME, Status::Skip, "no verbs RDMA device (one that is not EFA)"),
        Some(Err(why)) => Check::new(
            NAME,
            Status::Warn,
            format!("could not try ibv_reg_dmabuf_mr of HBM: {why}"),
        )
        .fix("what failed is said above: with no HBM device, load peerdirect.ko and bind one (see the devices check); otherwise follow the error's own hint; then run doctor again"),
        Some(Ok(tried)) => {
            let (took, refused): (Vec<_>, Vec<_>) = tried.iter().partition(|(_, r)| r.is_ok());
            let took: Vec<&str> = took.iter().map(|(nic, _)| nic.as_str()).collect();
            if refused.is_empty() {
                Check::new(
                    NAME,
                    Status::Ok,
                    format!("ibv_reg_dmabuf_mr of a page of HBM works on {}: libfabric's verbs provider registers FI_MR_DMABUF there and the NIC reaches HBM directly", took.join(", ")),
                )
            } else {
                let why: Vec<String> = refused
                    .iter()
                    .map(|(nic, r)| format!("{nic}: {}", r.as_ref().err().map_or("", String::as_str)))
                    .collect();
                Check::new(
                    NAME,
                    Status::Warn,
                    format!("ibv_reg_dmabuf_mr of a page of HBM refused ({}){}: libfabric's verbs provider falls back to host staging on those devices", why.join("; "), if took.is_empty() { String::new() } else { format!("; it works on {}", took.join(", ")) }),
                )
                .fix("use an RDMA device whose driver imports dma-bufs (mlx5, irdma, bnxt_re, efa); soft-RoCE and siw do not (Documentation/rdma.md)")
            }
        }
    }
}

/// The installed peerdirect.ko against the kernel: built for its release, by its rustc, and
/// the loaded module that very file.
fn module_build(host: &Host) -> Check {
    const NAME: &str = "module_build";
    let release = host.release.as_str();
    let install = format!("install the peerdirect-dkms package (DKMS builds peerdirect.ko for each kernel, with its headers), or make install KDIR=/lib/modules/{release}/build");
    let rebuild = format!("rebuild it for {release}: dkms autoinstall -k {release} (peerdirect-dkms; needs linux-headers-{release}), or make install KDIR=/lib/modules/{release}/build");
    let loaded = host.module_loaded && host.release_is_running;
    let (path, build) = match &host.installed {
        Installed::Unknown => {
            return Check::new(
                NAME,
                Status::Skip,
                "cannot read the kernel release (/proc/sys/kernel/osrelease)",
            )
        }
        Installed::Missing(why) if loaded => {
            return Check::new(
                NAME,
                Status::Warn,
                format!("peerdirect is loaded, but {why}: it was loaded from elsewhere (insmod), and modprobe, boots and kernel upgrades will not find it"),
            )
            .fix(install)
        }
        Installed::Missing(why) => {
            return Check::new(
                NAME,
                Status::Fail,
                format!("no peerdirect.ko is installed for kernel {release}: {why}"),
            )
            .fix(install)
        }
        Installed::File {
            path,
            build: Err(e),
        } => {
            return Check::new(NAME, Status::Warn, format!("cannot read {path}: {e}"))
                .fix("make it readable (run doctor as root; install the decompressor named above), or compare `modinfo -F vermagic peerdirect` with `uname -r` yourself")
        }
        Installed::File {
            path,
            build: Ok(build),
        } => (path, build),
    };
    let vermagic = build.vermagic.as_deref().unwrap_or("none");
    let rustc = build
        .rustc
        .as_deref()
        .unwrap_or("no rustc named in .comment");
    let facts = format!("{path}: vermagic \"{vermagic}\", built by {rustc}");
    if build.release() != Some(release) {
        return Check::new(
            NAME,
            Status::Fail,
            format!(
                "{facts}; it was built for kernel {}, not {release}, which refuses to load it",
                build.release().unwrap_or("(none)")
            ),
        )
        .fix(rebuild);
    }
    let module_rustc = build.rustc.as_deref().and_then(module_file::rustc_version);
    let kernel_rustc = host.kernel_rustc.as_deref();
    match (module_rustc, kernel_rustc) {
        (Some(module), Some(kernel)) if module_file::rustc_version(kernel) != Some(module) => {
            return Check::new(
                NAME,
                Status::Fail,
                format!("{facts}; kernel {release} was built by {kernel}: Rust has no stable ABI, so its modules must be built by the same rustc"),
            )
            .fix(format!("{rebuild}, with the kernel's rustc first in PATH"));
        }
        _ => {}
    }
    let same_rustc = if kernel_rustc.is_some() && module_rustc.is_some() {
        " (the kernel's too)"
    } else {
        ""
    };
    let facts = format!("{facts}{same_rustc}");
    if !host.release_is_running {
        return Check::new(
            NAME,
            Status::Ok,
            format!("{facts}; {release} is not the running kernel, so the loaded module is not compared"),
        );
    }
    if !host.module_loaded {
        return Check::new(NAME, Status::Ok, format!("{facts}; not loaded"));
    }
    let same = |kind: &'static str, loaded: &Option<String>, file: &Option<String>| {
        Some((kind, loaded.clone()?, file.clone()?))
    };
    match same("srcversion", &host.loaded_build.srcversion, &build.srcversion)
        .or_else(|| same("build id", &host.loaded_build.build_id, &build.build_id))
    {
        Some((kind, loaded, file)) if loaded == file => Check::new(
            NAME,
            Status::Ok,
            format!("{facts}; loaded, and the loaded module is this file ({kind} {file})"),
        ),
        Some((kind, loaded, file)) => Check::new(
            NAME,
            Status::Warn,
            format!("{facts}; the loaded module is another build ({kind} {loaded}, the file's {file}): it was loaded before the file was replaced"),
        )
        .fix("load the installed one when no process has a device open: rmmod peerdirect && modprobe peerdirect (or reboot)"),
        None => Check::new(
            NAME,
            Status::Ok,
            format!("{facts}; loaded (no build id or srcversion of both to tell whether it is this file)"),
        ),
    }
}

/// What is unset or set to what, for a detail.
fn setting(host: &Host, var: &str) -> String {
    match host.env.get(var) {
        None => format!("{var} is unset"),
        Some(v) => format!("{var}={v:?}"),
    }
}

/// libfabric 2.5.0's efa provider and `FI_MR_DMABUF` of `FI_HMEM_SYSTEM` memory.
fn efa_libfabric(host: &Host) -> Check {
    const NAME: &str = "efa_libfabric";
    const BUG: &str = "its efa provider refuses FI_MR_DMABUF registrations of FI_HMEM_SYSTEM memory, which is how HBM is registered (fixed in 2.5.1)";
    const UPGRADE: &str = "upgrade to libfabric >= 2.5.1 (or a 2.5.0 build with upstream commit 6ca213f1, \"prov/efa: Skip dmabuf supported check for explicit mr call\")";
    let Some(Ok(version)) = &host.libfabric else {
        return Check::new(
            NAME,
            Status::Skip,
            "libfabric is not usable (see the libfabric check)",
        );
    };
    if api_version(version) != Some((2, 5)) {
        return Check::new(
            NAME,
            Status::Ok,
            format!("libfabric {version}, not 2.5.0, whose efa provider refuses FI_MR_DMABUF registrations of FI_HMEM_SYSTEM memory"),
        );
    }
    let mut unknown = Vec::new();
    let from_fi_info = match host.fi_info_release.as_deref() {
        None => {
            unknown.push("no fi_info on PATH".to_owned());
            None
        }
        Some(text) => match Release::parse(text) {
            Some(r) if (r.major, r.minor) == (2, 5) => Some((text, r)),
            _ => {
                unknown.push(format!(
                    "fi_info --version reports libfabric {text}, another installation than the libfabric 2.5 this process loads"
                ));
                None
            }
        },
    };
    let file = host.libfabric_file.as_deref().unwrap_or_default();
    let file_name = Path::new(file)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let from_file = match soname_numbers(file_name) {
        Some((age, revision)) if Some(age) == upstream_age(2, 5) => Some(revision),
        _ if file.is_empty() => {
            unknown.push("no libfabric file in /proc/self/maps".to_owned());
            None
        }
        _ => {
            unknown.push(format!(
                "{file} does not follow upstream's numbering of 2.5 (libfabric.so.1.31.PATCH)"
            ));
            None
        }
    };
    match (from_fi_info, from_file) {
        (Some((text, r)), Some(revision)) if r.patch != revision => Check::new(
            NAME,
            Status::Warn,
            format!(
                "fi_info --version reports libfabric {text}, but this process loads {file}, upstream's file name of 2.5.{revision}: two installations? If the one an application loads is 2.5.0, {BUG}"
            ),
        )
        .fix("find which libfabric.so.1 the application loads (ldd, LD_LIBRARY_PATH, /opt/amazon/efa/lib) and make it libfabric >= 2.5.1"),
        (Some((text, r)), _) => {
            if r.patch == 0 || (r.patch == 1 && r.suffix.starts_with("rc")) {
                Check::new(NAME, Status::Fail, format!("libfabric {text} (fi_info --version): {BUG}"))
                    .fix(UPGRADE)
            } else {
                Check::new(
                    NAME,
                    Status::Ok,
                    format!("libfabric {text} (fi_info --version): its efa provider registers FI_MR_DMABUF of FI_HMEM_SYSTEM memory (2.5.0 refuses it)"),
                )
            }
        }
        (None, Some(0)) => Check::new(
            NAME,
            Status::Fail,
            format!("libfabric 2.5.0 ({file}: upstream's libtool numbering names 2.5.R libfabric.so.1.31.R): {BUG}"),
        )
        .fix(UPGRADE),
        (None, Some(revision)) => Check::new(
            NAME,
            Status::Ok,
            format!(
                "libfabric 2.5.{revision} ({file}: upstream's libtool numbering names 2.5.R libfabric.so.1.31.R){}: 2.5.0's efa provider refuses FI_MR_DMABUF of FI_HMEM_SYSTEM memory",
                if revision == 1 { "; 2.5.1rc1 has the same name and 2.5.0's bug, `fi_info --version` tells them apart" } else { "" }
            ),
        ),
        (None, None) => Check::new(
            NAME,
            Status::Warn,
            format!(
                "libfabric 2.5, patch level unknown (fi_version() has none; {}): if it is 2.5.0, {BUG}",
                unknown.join("; ")
            ),
        )
        .fix("check the release with `fi_info --version` (package libfabric-bin) or the package manager (dpkg -s libfabric1, rpm -q libfabric); if it is 2.5.0, upgrade to libfabric >= 2.5.1"),
    }
}

/// `FI_EFA_ENABLE_SHM_TRANSFER`: libfabric's shm provider for peers on this host.
fn efa_shm(host: &Host) -> Check {
    const NAME: &str = "efa_shm";
    match host.env.get("FI_EFA_ENABLE_SHM_TRANSFER").map(String::as_str) {
        Some(v) if strtol_is_zero(v) => Check::new(
            NAME,
            Status::Ok,
            format!(
                "FI_EFA_ENABLE_SHM_TRANSFER={v:?}{}: the efa fabric reaches peers on this host through the NIC too, not through libfabric's shm provider",
                if v == "0" { "" } else { ", which libfabric reads as 0" }
            ),
        ),
        other => Check::new(
            NAME,
            Status::Warn,
            format!(
                "{} (libfabric's default is 1): the efa fabric hands transfers between processes on this host to libfabric's shm provider, which treats the HBM registration as host memory and copies it with the CPU instead of the NIC (efa-direct does not use shm)",
                match other {
                    None => "FI_EFA_ENABLE_SHM_TRANSFER is unset".to_owned(),
                    Some(v) => format!("FI_EFA_ENABLE_SHM_TRANSFER={v:?}"),
                }
            ),
        )
        .fix("export FI_EFA_ENABLE_SHM_TRANSFER=0"),
    }
}

/// The efa provider through `FI_PROVIDER`, and its efa-direct fabric.
fn efa_fabric(host: &Host) -> Check {
    const NAME: &str = "efa_fabric";
    const ASK: &str = "ask fi_getinfo for the fabric by name: hints->fabric_attr->name = \"efa-direct\" (fi_info -p efa -f efa-direct)";
    if let Some(filter) = host.env.get("FI_PROVIDER") {
        if !provider_filter_allows_efa(filter) {
            let direct = filter
                .trim_start_matches('^')
                .split(',')
                .any(|n| n.eq_ignore_ascii_case("efa-direct"));
            return if direct {
                Check::new(
                    NAME,
                    Status::Warn,
                    format!("FI_PROVIDER={filter:?} hides the efa provider: FI_PROVIDER filters provider names, and efa-direct is a fabric of the efa provider, not a provider"),
                )
                .fix(format!("set FI_PROVIDER=efa or unset it, and {ASK}"))
            } else {
                Check::new(
                    NAME,
                    Status::Warn,
                    format!("FI_PROVIDER={filter:?} hides the efa provider: libfabric will not use the EFA NIC"),
                )
                .fix("add efa to FI_PROVIDER (FI_PROVIDER=efa), or unset it")
            };
        }
    }
    let Some(Ok(version)) = &host.libfabric else {
        return Check::new(
            NAME,
            Status::Skip,
            "libfabric is not usable (see the libfabric check)",
        );
    };
    let provider = setting(host, "FI_PROVIDER");
    if api_version(version).is_some_and(|v| v < (2, 1)) {
        return Check::new(
            NAME,
            Status::Warn,
            format!("{provider}; libfabric {version} has only the efa fabric, whose wire protocols copy small and medium messages through host packet buffers with the CPU; the efa-direct fabric (libfabric >= 2.1) hands every transfer to the NIC"),
        )
        .fix("upgrade to libfabric >= 2.1, then ask fi_getinfo for the efa-direct fabric (hints->fabric_attr->name = \"efa-direct\")");
    }
    Check::new(
        NAME,
        Status::Ok,
        format!("{provider}, so the efa provider is used; libfabric {version} has its efa-direct fabric, where the NIC makes every transfer itself (no wire protocols, no shm): {ASK}"),
    )
}

/// The verbs provider's dma-buf MRs: the kernel's support, `FI_VERBS_USE_DMABUF`, ODP.
fn verbs_checks(host: &Host, nics: &str) -> [Check; 3] {
    let kernel = match host.kallsyms_dmabuf {
        Some(true) => Check::new(
            "verbs_kernel",
            Status::Ok,
            format!("{UMEM_DMABUF} is in /proc/kallsyms (the test libfabric's verbs provider makes): the kernel's ib_core can import dma-bufs as MRs; the driver of {nics} must implement them too (verbs_dmabuf_mr tries one)"),
        ),
        Some(false) => Check::new(
            "verbs_kernel",
            Status::Fail,
            format!("{UMEM_DMABUF} is not in /proc/kallsyms: the kernel's ib_core cannot import dma-bufs (needs Linux >= 5.12 with CONFIG_INFINIBAND_USER_MEM and CONFIG_DMA_SHARED_BUFFER), so ibv_reg_dmabuf_mr fails for {nics} and libfabric's verbs provider refuses FI_MR_DMABUF (FI_ENOSYS): HBM reaches the NIC only through host staging"),
        )
        .fix("run a kernel >= 5.12 built with CONFIG_INFINIBAND_USER_MEM=y (it selects CONFIG_DMA_SHARED_BUFFER)"),
        None => Check::new(
            "verbs_kernel",
            Status::Warn,
            format!("cannot read /proc/kallsyms: whether ib_core imports dma-bufs ({UMEM_DMABUF}) is unknown, and libfabric's verbs provider, which reads the same file, then turns FI_MR_DMABUF off for {nics}"),
        )
        .fix("mount /proc and keep /proc/kallsyms readable (a kernel with CONFIG_KALLSYMS; containers: do not mask it)"),
    };
    let use_dmabuf = match host.env.get("FI_VERBS_USE_DMABUF").map(|v| (v, fi_bool(v))) {
        Some((v, Some(false))) => Check::new(
            "verbs_use_dmabuf",
            Status::Fail,
            format!("FI_VERBS_USE_DMABUF={v:?}: libfabric's verbs provider refuses FI_MR_DMABUF registrations (FI_ENOSYS), so HBM takes the host-bounce path"),
        )
        .fix("unset FI_VERBS_USE_DMABUF (libfabric's default is on when the kernel has ib_umem_dmabuf_get)"),
        Some((v, None)) => Check::new(
            "verbs_use_dmabuf",
            Status::Ok,
            format!("FI_VERBS_USE_DMABUF={v:?} is not a boolean libfabric reads: it keeps its default, dma-buf MRs on"),
        ),
        _ => Check::new(
            "verbs_use_dmabuf",
            Status::Ok,
            format!("{}: libfabric's verbs provider keeps dma-buf MRs on", setting(host, "FI_VERBS_USE_DMABUF")),
        ),
    };
    let odp = match host.env.get("FI_VERBS_USE_ODP").map(|v| (v, fi_bool(v))) {
        Some((v, Some(true))) => Check::new(
            "verbs_odp",
            Status::Warn,
            format!("FI_VERBS_USE_ODP={v:?}: on a NIC with on-demand paging (mlx5) libfabric's verbs provider adds IBV_ACCESS_ON_DEMAND to FI_HMEM_SYSTEM registrations, FI_MR_DMABUF ones included, and the kernel refuses on-demand access for dma-buf MRs (EINVAL)"),
        )
        .fix("unset FI_VERBS_USE_ODP (or set it to 0) for processes that register HBM: dma-buf MRs must not use ODP"),
        _ => Check::new(
            "verbs_odp",
            Status::Ok,
            format!("{}: dma-buf MRs are registered without on-demand paging", setting(host, "FI_VERBS_USE_ODP")),
        ),
    };
    [kernel, use_dmabuf, odp]
}

pub fn run(args: &Args) -> Result<()> {
    let checks = checks(&Host::gather(
        args.kernel.as_deref(),
        args.provider.as_deref(),
    ));
    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &checks).context("writing JSON to stdout")?;
        writeln!(out).context("writing to stdout")?;
    } else {
        for c in &checks {
            let status = serde_json::to_value(c.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_uppercase))
                .unwrap_or_default();
            writeln!(out, "{status:<5} {:<16} {}", c.name, c.detail)
                .context("writing to stdout")?;
            if let Some(fix) = &c.fix {
                writeln!(out, "      {:<16} fix: {fix}", "").context("writing to stdout")?;
            }
        }
    }
    out.flush().context("writing to stdout")?;
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(checks: &[Check], name: &str) -> Status {
        checks.iter().find(|c| c.name == name).unwrap().status
    }

    fn nic(driver: &str, rdma: &str) -> PciPeer {
        PciPeer {
            pci_address: "0000:04:00.0".parse().unwrap(),
            vendor_id: 0x1d0f,
            device_id: 0xefa1,
            class: 0x020000,
            kind: Kind::Rdma,
            driver: Some(driver.to_owned()),
            netdevs: vec![],
            rdma: vec![rdma.to_owned()],
        }
    }

    const RELEASE: &str = "7.3.4+deb13-amd64";
    const DKMS_PATH: &str = "/lib/modules/7.3.4+deb13-amd64/updates/dkms/peerdirect.ko.xz";

    /// What Debian's DKMS build of peerdirect.ko says, as `module_file` reads it.
    fn dkms_build() -> Build {
        module_file::build_of(&module_file::tests::debian_module(&[0xb5, 0x56])).unwrap()
    }

    fn healthy() -> Host {
        Host {
            module_loaded: true,
            release: RELEASE.into(),
            release_is_running: true,
            installed: Installed::File {
                path: DKMS_PATH.into(),
                build: Ok(dkms_build()),
            },
            loaded_build: Build {
                build_id: Some("b556".into()),
                ..Build::default()
            },
            kernel_rustc: Some(
                "rustc 1.85.1 (4eb161250 2025-03-15) (built from a source tarball)".into(),
            ),
            devices: vec![DeviceView {
                path: "/dev/peerdirect0".into(),
                hbm_bytes: 32 << 30,
                revoked: false,
                rdma_paths: vec![("0000:04:00.0 (efa_0)".into(), true, "below a switch".into())],
            }],
            peers: vec![nic("efa", "efa_0")],
            libfabric: Some(Ok("2.1".into())),
            env: [
                ("RDMAV_FORK_SAFE", "1"),
                ("FI_EFA_USE_DEVICE_RDMA", "1"),
                ("FI_EFA_ENABLE_SHM_TRANSFER", "0"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            memlock: Some(None),
            devices_error: None,
            fi_info_release: Some("2.1.0".into()),
            libfabric_file: Some("/usr/lib/x86_64-linux-gnu/libfabric.so.1.27.0".into()),
            kallsyms_dmabuf: None,
            verbs_probe: None,
            provider: Some(Chosen {
                name: "efa".into(),
                by: "the provider of the EFA device efa_0".into(),
            }),
            fabric_probe: Some(Probed::Registered {
                provider: "efa".into(),
                domain: "efa_0-rdm".into(),
                path: RegPath::DmaBuf,
            }),
        }
    }

    /// The checks of `host` with `name`.
    fn check(host: &Host, name: &str) -> Check {
        checks(host).into_iter().find(|c| c.name == name).unwrap()
    }

    fn set(host: &mut Host, var: &str, value: &str) {
        host.env.insert(var.to_owned(), value.to_owned());
    }

    /// `healthy()` with libfabric 2.5 and what tells its patch level.
    fn efa_2_5(fi_info: Option<&str>, file: Option<&str>) -> Host {
        Host {
            libfabric: Some(Ok("2.5".into())),
            fi_info_release: fi_info.map(str::to_owned),
            libfabric_file: file.map(str::to_owned),
            ..healthy()
        }
    }

    /// A host like the rxe guest of tests/system/fabric.sh: rxe0 over a virtio NIC.
    fn rxe_guest() -> Host {
        let mut nic = nic("virtio-pci", "rxe0");
        nic.vendor_id = 0x1af4;
        nic.device_id = 0x1041;
        let mut host = healthy();
        host.peers = vec![nic];
        host.devices[0].rdma_paths =
            vec![("0000:04:00.0 (rxe0)".into(), true, "below a switch".into())];
        host.env = [("RDMAV_FORK_SAFE", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        host.fi_info_release = None;
        host.kallsyms_dmabuf = Some(true);
        host.verbs_probe = Some(Ok(vec![("rxe0".into(), Ok(()))]));
        host.provider = choose_provider(None, &host.env, &host.peers);
        host.fabric_probe = Some(Probed::Registered {
            provider: "verbs;ofi_rxm".into(),
            domain: "rxe0".into(),
            path: RegPath::DmaBuf,
        });
        host
    }

    const EFA_CHECKS: [&str; 3] = ["efa_libfabric", "efa_shm", "efa_fabric"];
    const VERBS_CHECKS: [&str; 4] = [
        "verbs_kernel",
        "verbs_use_dmabuf",
        "verbs_odp",
        "verbs_dmabuf_mr",
    ];

    #[test]
    fn a_healthy_efa_host_passes_everything() {
        let checks = checks(&healthy());
        assert_eq!(checks.len(), 16);
        for c in &checks {
            let expected = if VERBS_CHECKS.contains(&c.name) {
                Status::Skip
            } else {
                Status::Ok
            };
            assert_eq!(c.status, expected, "{c:?}");
            assert!(c.fix.is_none(), "{c:?}");
        }
    }

    #[test]
    fn an_rxe_guest_passes_what_fabric_sh_asserts() {
        let checks = checks(&rxe_guest());
        for name in [
            "module",
            "module_build",
            "devices",
            "p2p",
            "libfabric",
            "fork_safe",
            "memlock",
        ] {
            assert_eq!(status(&checks, name), Status::Ok, "{name}");
        }
        for name in ["efa_device_rdma"].into_iter().chain(EFA_CHECKS) {
            assert_eq!(status(&checks, name), Status::Skip, "{name}");
        }
        for name in VERBS_CHECKS.into_iter().chain(["fi_mr_dmabuf"]) {
            assert_eq!(status(&checks, name), Status::Ok, "{name}");
        }
        assert!(checks.iter().all(|c| c.status != Status::Fail));
        let libfabric = checks.iter().find(|c| c.name == "libfabric").unwrap();
        assert!(
            libfabric.detail.starts_with("libfabric 2."),
            "{}",
            libfabric.detail
        );
        let kernel = checks.iter().find(|c| c.name == "verbs_kernel").unwrap();
        assert!(kernel.detail.contains("rxe0"), "{}", kernel.detail);
    }

    #[test]
    fn efa_libfabric_2_5_0_fails_and_2_5_1_passes() {
        let so = |r: u32| format!("/opt/amazon/efa/lib/libfabric.so.1.31.{r}");
        // fi_info's release.
        let c = check(&efa_2_5(Some("2.5.0"), None), "efa_libfabric");
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail.contains("libfabric 2.5.0 (fi_info --version)"),
            "{}",
            c.detail
        );
        assert!(c.fix.unwrap().contains("upgrade to libfabric >= 2.5.1"));
        let c = check(
            &efa_2_5(Some("2.5.0amzn1.0"), Some(&so(0))),
            "efa_libfabric",
        );
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert_eq!(
            check(&efa_2_5(Some("2.5.1rc1"), Some(&so(1))), "efa_libfabric").status,
            Status::Fail
        );
        let c = check(&efa_2_5(Some("2.5.1"), Some(&so(1))), "efa_libfabric");
        assert_eq!((c.status, c.fix), (Status::Ok, None));
        assert_eq!(
            check(&efa_2_5(Some("2.5.2"), None), "efa_libfabric").status,
            Status::Ok
        );
        // The loaded file's name, without fi_info.
        let c = check(&efa_2_5(None, Some(&so(0))), "efa_libfabric");
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail
                .starts_with("libfabric 2.5.0 (/opt/amazon/efa/lib/libfabric.so.1.31.0"),
            "{}",
            c.detail
        );
        assert!(c.fix.unwrap().contains(">= 2.5.1"));
        let c = check(&efa_2_5(None, Some(&so(1))), "efa_libfabric");
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains("2.5.1rc1"), "{}", c.detail);
        // fi_info of another installation does not count.
        let c = check(&efa_2_5(Some("2.6.0"), Some(&so(0))), "efa_libfabric");
        assert_eq!(c.status, Status::Fail, "{c:?}");
    }

    #[test]
    fn efa_libfabric_2_5_of_unknown_patch_level_warns() {
        for host in [
            efa_2_5(None, None),
            efa_2_5(None, Some("/usr/lib64/libfabric.so.1")),
            efa_2_5(Some("2.4.0"), Some("/usr/lib64/libfabric.so.1.30.0")),
        ] {
            let c = check(&host, "efa_libfabric");
            assert_eq!(c.status, Status::Warn, "{c:?}");
            assert!(c.detail.contains("patch level unknown"), "{}", c.detail);
            assert!(c.detail.contains("if it is 2.5.0"), "{}", c.detail);
            let fix = c.fix.unwrap();
            assert!(
                fix.contains("fi_info --version") && fix.contains(">= 2.5.1"),
                "{fix}"
            );
        }
        let c = check(&efa_2_5(None, None), "efa_libfabric");
        assert!(c.detail.contains("no fi_info on PATH"), "{}", c.detail);
        // Two installations that disagree.
        let c = check(
            &efa_2_5(Some("2.5.0"), Some("/usr/lib/libfabric.so.1.31.1")),
            "efa_libfabric",
        );
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("two installations"), "{}", c.detail);
        assert!(c.fix.unwrap().contains(">= 2.5.1"));
    }

    #[test]
    fn efa_libfabric_other_versions_pass_and_no_efa_skips() {
        assert_eq!(check(&healthy(), "efa_libfabric").status, Status::Ok);
        let mut host = healthy();
        host.libfabric = Some(Err("libfabric.so.1 not found".into()));
        assert_eq!(check(&host, "efa_libfabric").status, Status::Skip);
        let mut host = efa_2_5(Some("2.5.0"), None);
        host.peers.clear();
        let c = check(&host, "efa_libfabric");
        assert_eq!(
            (c.status, c.detail.as_str()),
            (Status::Skip, "no EFA device")
        );
    }

    #[test]
    fn efa_shm_transfer_must_be_off() {
        let mut host = healthy();
        assert_eq!(check(&host, "efa_shm").status, Status::Ok);
        // libfabric reads it with strtol: words are 0, even "yes".
        for word in ["false", "yes"] {
            set(&mut host, "FI_EFA_ENABLE_SHM_TRANSFER", word);
            let c = check(&host, "efa_shm");
            assert_eq!(c.status, Status::Ok);
            assert!(
                c.detail.contains("which libfabric reads as 0"),
                "{}",
                c.detail
            );
        }
        for value in [None, Some("1"), Some("0x1")] {
            match value {
                None => host.env.remove("FI_EFA_ENABLE_SHM_TRANSFER"),
                Some(v) => host
                    .env
                    .insert("FI_EFA_ENABLE_SHM_TRANSFER".into(), v.into()),
            };
            let c = check(&host, "efa_shm");
            assert_eq!(c.status, Status::Warn, "{c:?}");
            assert!(c.detail.contains("shm provider"), "{}", c.detail);
            assert_eq!(
                c.fix.as_deref(),
                Some("export FI_EFA_ENABLE_SHM_TRANSFER=0")
            );
        }
        host.peers.clear();
        assert_eq!(check(&host, "efa_shm").status, Status::Skip);
    }

    #[test]
    fn efa_fabric_wants_the_efa_provider_and_names_efa_direct() {
        let mut host = healthy();
        for filter in [
            None,
            Some("efa"),
            Some("EFA,tcp"),
            Some("efa;ofi_rxm"),
            Some("^tcp"),
        ] {
            if let Some(f) = filter {
                set(&mut host, "FI_PROVIDER", f);
            }
            let c = check(&host, "efa_fabric");
            assert_eq!(c.status, Status::Ok, "{c:?}");
            assert!(
                c.detail.contains("fabric_attr->name = \"efa-direct\""),
                "{}",
                c.detail
            );
        }
        set(&mut host, "FI_PROVIDER", "efa-direct");
        let c = check(&host, "efa_fabric");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("not a provider"), "{}", c.detail);
        let fix = c.fix.unwrap();
        assert!(
            fix.contains("FI_PROVIDER=efa") && fix.contains("efa-direct"),
            "{fix}"
        );
        for filter in ["tcp", "^efa", "verbs;ofi_rxm"] {
            set(&mut host, "FI_PROVIDER", filter);
            let c = check(&host, "efa_fabric");
            assert_eq!(c.status, Status::Warn, "{c:?}");
            assert!(c.fix.unwrap().contains("add efa to FI_PROVIDER"));
        }
        let mut host = healthy();
        host.libfabric = Some(Ok("2.0".into()));
        let c = check(&host, "efa_fabric");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.fix.unwrap().contains("libfabric >= 2.1"));
        host.peers.clear();
        assert_eq!(check(&host, "efa_fabric").status, Status::Skip);
    }

    #[test]
    fn verbs_dmabuf_mr_says_which_devices_took_the_registration() {
        let mut host = rxe_guest();
        let c = check(&host, "verbs_dmabuf_mr");
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains("works on rxe0"), "{}", c.detail);
        assert!(c.fix.is_none());

        let refusal = "ibv_reg_dmabuf_mr on rxe0 (provider rxe): Operation not supported";
        host.verbs_probe = Some(Ok(vec![
            ("rxe0".into(), Err(refusal.into())),
            ("mlx5_0".into(), Ok(())),
        ]));
        let c = check(&host, "verbs_dmabuf_mr");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.detail.contains(&format!("rxe0: {refusal}")),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("it works on mlx5_0"), "{}", c.detail);
        assert!(c.fix.as_deref().unwrap().contains("mlx5"), "{c:?}");

        host.verbs_probe = Some(Err("no HBM device".into()));
        let c = check(&host, "verbs_dmabuf_mr");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("no HBM device"), "{}", c.detail);

        host.peers.clear();
        host.verbs_probe = None;
        assert_eq!(check(&host, "verbs_dmabuf_mr").status, Status::Skip);
    }

    #[test]
    fn fi_mr_dmabuf_direct_says_the_nic_imported_the_dma_buf() {
        let host = rxe_guest();
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!((c.status, c.fix.as_deref()), (Status::Ok, None), "{c:?}");
        assert_eq!(
            c.detail,
            "verbs;ofi_rxm (domain rxe0; the provider of the verbs NIC rxe0): fi_mr_regattr(FI_MR_DMABUF) of a page of HBM took path dma_buf, nothing staged, as peerdirect register --provider 'verbs;ofi_rxm' registers it: the verbs provider hands the fd to ibv_reg_dmabuf_mr, so rxe0 imported the dma-buf and reaches HBM itself"
        );
        let c = check(&healthy(), "fi_mr_dmabuf");
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail.contains("so efa_0-rdm imported the dma-buf"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn fi_mr_dmabuf_of_tcp_is_direct_in_libfabric_terms_only() {
        let mut host = rxe_guest();
        set(&mut host, "FI_PROVIDER", "tcp");
        host.provider = choose_provider(None, &host.env, &host.peers);
        host.fabric_probe = Some(Probed::Registered {
            provider: "tcp".into(),
            domain: "lo".into(),
            path: RegPath::DmaBuf,
        });
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!((c.status, c.fix.as_deref()), (Status::Ok, None), "{c:?}");
        assert!(
            c.detail.starts_with("tcp (domain lo; FI_PROVIDER): fi_mr_regattr(FI_MR_DMABUF) of a page of HBM took path dma_buf"),
            "{}",
            c.detail
        );
        for said in [
            "direct in libfabric's terms only",
            "takes FI_MR_DMABUF without using the fd",
            "this process's CPU mapping of the dma-buf",
            "no NIC imported it",
        ] {
            assert!(c.detail.contains(said), "{said}: {}", c.detail);
        }
        assert!(!c.detail.contains("reaches HBM itself"), "{}", c.detail);
    }

    #[test]
    fn fi_mr_dmabuf_bounce_warns_with_the_providers_reason() {
        let mut host = rxe_guest();
        let reason = "verbs;ofi_rxm: fi_mr_regattr(FI_MR_DMABUF): Operation not supported (-95)";
        host.fabric_probe = Some(Probed::Registered {
            provider: "verbs;ofi_rxm".into(),
            domain: "rxe0".into(),
            path: RegPath::HostBounce {
                reason: reason.into(),
            },
        });
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.detail.starts_with(&format!(
                "verbs;ofi_rxm (domain rxe0; the provider of the verbs NIC rxe0) refuses a page of HBM: {reason}. peerdirect register --provider 'verbs;ofi_rxm' and the C ABI fall back to host bounce"
            )),
            "{}",
            c.detail
        );
        let fix = c.fix.unwrap();
        assert!(
            fix.contains("verbs_dmabuf_mr") && fix.contains("mlx5"),
            "{fix}"
        );
        // Another provider's fix names the NIC providers instead.
        host.provider = choose_provider(Some("tcp"), &host.env, &host.peers);
        host.fabric_probe = Some(Probed::Registered {
            provider: "tcp".into(),
            domain: "lo".into(),
            path: RegPath::HostBounce {
                reason: reason.into(),
            },
        });
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("(domain lo; --provider)"), "{}", c.detail);
        assert!(c.fix.unwrap().contains("'verbs;ofi_rxm' over mlx5"));
        assert!(checks(&host).iter().all(|c| c.status != Status::Fail));
    }

    /// A provider chosen for the user (the NIC's, FI_PROVIDER's) that libfabric lacks is
    /// skipped; one the user named fails (`fi_mr_dmabuf_fails_a_provider_named_...`).
    #[test]
    fn fi_mr_dmabuf_skips_a_missing_provider_and_fails_other_errors() {
        let mut host = rxe_guest();
        host.fabric_probe = Some(Probed::NoProvider(
            "verbs;ofi_rxm: fi_getinfo: No data available (-61)".into(),
        ));
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!((c.status, c.fix.as_deref()), (Status::Skip, None), "{c:?}");
        assert!(
            c.detail.starts_with("verbs;ofi_rxm (the provider of the verbs NIC rxe0): libfabric offers no such provider with the reliable-datagram tagged endpoints (FI_EP_RDM) peerdirect register --provider 'verbs;ofi_rxm' opens: verbs;ofi_rxm: fi_getinfo: No data available (-61); `fi_info -l`"),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("'verbs;ofi_rxm'"), "{}", c.detail);
        assert!(checks(&host).iter().all(|c| c.status != Status::Fail));
        // FI_PROVIDER's choice is the user's environment, not a request of doctor's: skipped.
        set(&mut host, "FI_PROVIDER", "verbs");
        host.provider = choose_provider(None, &host.env, &host.peers);
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!((c.status, c.fix.as_deref()), (Status::Skip, None), "{c:?}");
        assert!(
            c.detail.starts_with("verbs (FI_PROVIDER): "),
            "{}",
            c.detail
        );
        host.env.remove("FI_PROVIDER");
        host.provider = choose_provider(None, &host.env, &host.peers);
        // A filter that hides it is named.
        set(&mut host, "FI_PROVIDER", "^verbs");
        assert!(check(&host, "fi_mr_dmabuf")
            .detail
            .contains("(FI_PROVIDER=\"^verbs\" hides the providers it does not let in)"));
        // Any other error: register fails alike, no fallback.
        let mut host = healthy();
        host.fabric_probe = Some(Probed::Failed(
            "efa: fi_mr_regattr(FI_MR_DMABUF): Invalid argument (-22)".into(),
        ));
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail.starts_with("efa (the provider of the EFA device efa_0): efa: fi_mr_regattr(FI_MR_DMABUF): Invalid argument (-22): peerdirect register --provider 'efa' fails the same way"),
            "{}",
            c.detail
        );
        assert!(c.fix.unwrap().contains("efa_libfabric"));
    }

    /// `doctor --provider bogus`: the user asked for that provider, and `register --provider
    /// bogus` fails the same way, so libfabric not offering it is a failure (doctor exits 1)
    /// that names it and says how to list those libfabric has.
    #[test]
    fn fi_mr_dmabuf_fails_a_provider_named_on_the_command_line_that_libfabric_lacks() {
        let mut host = rxe_guest();
        host.provider = choose_provider(Some("bogus"), &host.env, &host.peers);
        host.fabric_probe = Some(Probed::NoProvider(
            "bogus: fi_getinfo: No data available (-61)".into(),
        ));
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail.starts_with("bogus (--provider): libfabric offers no such provider with the reliable-datagram tagged endpoints (FI_EP_RDM) peerdirect register --provider 'bogus' opens: bogus: fi_getinfo: No data available (-61)"),
            "{}",
            c.detail
        );
        let fix = c.fix.unwrap();
        assert!(fix.contains("`fi_info -l` lists the providers"), "{fix}");
        assert!(fix.contains("'verbs;ofi_rxm'"), "{fix}");
        assert!(!fix.contains("FI_PROVIDER="), "{fix}");
        // A filter in the environment that hides it is named in the fix.
        set(&mut host, "FI_PROVIDER", "^bogus");
        let fix = check(&host, "fi_mr_dmabuf").fix.unwrap();
        assert!(
            fix.contains("FI_PROVIDER=\"^bogus\" hides the providers it does not let in"),
            "{fix}"
        );
        assert_eq!(
            checks(&host)
                .iter()
                .filter(|c| c.status == Status::Fail)
                .map(|c| c.name)
                .collect::<Vec<_>>(),
            ["fi_mr_dmabuf"]
        );
    }

    #[test]
    fn fi_mr_dmabuf_skips_without_a_device_a_provider_or_libfabric() {
        let mut host = rxe_guest();
        host.devices.clear();
        host.fabric_probe = None;
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!(
            (c.status, c.detail.as_str()),
            (
                Status::Skip,
                "verbs;ofi_rxm (the provider of the verbs NIC rxe0): no HBM device to register a page of (see the devices check)"
            )
        );
        host.libfabric = Some(Err("libfabric.so.1 not found".into()));
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!(c.status, Status::Skip, "{c:?}");
        assert!(c
            .detail
            .ends_with("libfabric is not usable (see the libfabric check)"));
        host.provider = None;
        let c = check(&host, "fi_mr_dmabuf");
        assert_eq!(c.status, Status::Skip, "{c:?}");
        assert!(
            c.detail.starts_with("no libfabric provider to try"),
            "{}",
            c.detail
        );
        assert_eq!(
            status(&checks(&Host::default()), "fi_mr_dmabuf"),
            Status::Skip
        );
    }

    #[test]
    fn the_provider_tried_is_the_one_a_job_would_use() {
        let env = |filter: Option<&str>| -> HashMap<String, String> {
            filter
                .map(|f| ("FI_PROVIDER".to_owned(), f.to_owned()))
                .into_iter()
                .collect()
        };
        let name = |c: Option<Chosen>| c.map(|c| (c.name, c.by));
        let rxe = rxe_guest().peers;
        let efa = healthy().peers;
        let both: Vec<PciPeer> = rxe.iter().chain(&efa).cloned().collect();
        let pair = |n: &str, by: &str| Some((n.to_owned(), by.to_owned()));
        assert_eq!(
            name(choose_provider(Some("tcp"), &env(Some("efa")), &both)),
            pair("tcp", "--provider")
        );
        assert_eq!(
            name(choose_provider(None, &env(Some("verbs;ofi_rxm")), &efa)),
            pair("verbs;ofi_rxm", "FI_PROVIDER")
        );
        // A list or an exclusion names no provider: the NIC's.
        for filter in [None, Some("tcp,verbs"), Some("^tcp"), Some("")] {
            assert_eq!(
                name(choose_provider(None, &env(filter), &rxe)),
                pair("verbs;ofi_rxm", "the provider of the verbs NIC rxe0"),
                "{filter:?}"
            );
        }
        assert_eq!(
            name(choose_provider(None, &env(None), &both)),
            pair("efa", "the provider of the EFA device efa_0")
        );
        assert_eq!(choose_provider(None, &env(None), &[]), None);
    }

    #[test]
    fn verbs_kernel_needs_ib_umem_dmabuf_get() {
        let mut host = rxe_guest();
        assert_eq!(check(&host, "verbs_kernel").status, Status::Ok);
        host.kallsyms_dmabuf = Some(false);
        let c = check(&host, "verbs_kernel");
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail
                .contains("the kernel's ib_core cannot import dma-bufs (needs Linux >= 5.12"),
            "{}",
            c.detail
        );
        assert!(c.fix.unwrap().contains("CONFIG_INFINIBAND_USER_MEM"));
        host.kallsyms_dmabuf = None;
        let c = check(&host, "verbs_kernel");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.fix.unwrap().contains("/proc/kallsyms"));
    }

    #[test]
    fn verbs_use_dmabuf_must_not_be_off() {
        let mut host = rxe_guest();
        assert_eq!(check(&host, "verbs_use_dmabuf").status, Status::Ok);
        for on in ["1", "yes", "sure"] {
            set(&mut host, "FI_VERBS_USE_DMABUF", on);
            assert_eq!(check(&host, "verbs_use_dmabuf").status, Status::Ok, "{on}");
        }
        for off in ["0", "off", "FALSE", "no"] {
            set(&mut host, "FI_VERBS_USE_DMABUF", off);
            let c = check(&host, "verbs_use_dmabuf");
            assert_eq!(c.status, Status::Fail, "{c:?}");
            assert!(c.fix.unwrap().starts_with("unset FI_VERBS_USE_DMABUF"));
        }
    }

    #[test]
    fn verbs_odp_must_stay_off() {
        let mut host = rxe_guest();
        assert_eq!(check(&host, "verbs_odp").status, Status::Ok);
        set(&mut host, "FI_VERBS_USE_ODP", "0");
        assert_eq!(check(&host, "verbs_odp").status, Status::Ok);
        for on in ["1", "true", "On"] {
            set(&mut host, "FI_VERBS_USE_ODP", on);
            let c = check(&host, "verbs_odp");
            assert_eq!(c.status, Status::Warn, "{c:?}");
            assert!(c.detail.contains("IBV_ACCESS_ON_DEMAND"), "{}", c.detail);
            assert!(c.fix.unwrap().contains("dma-buf MRs must not use ODP"));
        }
    }

    #[test]
    fn verbs_checks_skip_without_a_verbs_nic() {
        let mut host = healthy(); // EFA only
        host.kallsyms_dmabuf = Some(false);
        set(&mut host, "FI_VERBS_USE_DMABUF", "0");
        set(&mut host, "FI_VERBS_USE_ODP", "1");
        for name in VERBS_CHECKS {
            assert_eq!(check(&host, name).status, Status::Skip, "{name}");
        }
        host.peers.push(rxe_guest().peers.remove(0));
        host.verbs_probe = rxe_guest().verbs_probe;
        for name in VERBS_CHECKS {
            assert_ne!(check(&host, name).status, Status::Skip, "{name}");
        }
    }

    #[test]
    fn version_facts_parse() {
        let out = "/usr/bin/fi_info: 2.1.0\nlibfabric: 2.1.0amzn3.0\nlibfabric api: 2.1\n";
        assert_eq!(fi_info_release_of(out).as_deref(), Some("2.1.0amzn3.0"));
        assert_eq!(fi_info_release_of("fi_info: 2.1.0\n"), None);
        let r = Release::parse("2.1.0amzn3.0").unwrap();
        assert_eq!(
            (r.major, r.minor, r.patch, r.suffix.as_str()),
            (2, 1, 0, "amzn3.0")
        );
        assert_eq!(Release::parse("2.5.1rc1").unwrap().suffix, "rc1");
        assert_eq!(Release::parse("2.5"), None);
        let maps = "7f00-7f01 r--p 00000000 08:01 123  /usr/lib/x86_64-linux-gnu/libc.so.6\n\
7f02-7f03 r-xp 00001000 08:01 456  /usr/lib/x86_64-linux-gnu/libfabric.so.1.27.0\n";
        assert_eq!(
            libfabric_file_of(maps).as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libfabric.so.1.27.0")
        );
        assert_eq!(
            libfabric_file_of("7f00-7f01 rw-p 00000000 00:00 0  [heap]\n"),
            None
        );
        assert_eq!(soname_numbers("libfabric.so.1.31.0"), Some((31, 0)));
        assert_eq!(soname_numbers("libfabric.so.1"), None);
        assert_eq!(soname_numbers("libfabric.so.1.31.0.bak"), None);
        // Upstream's Makefile.am -version-info C:R:A of each release: libfabric.so.1.A.R.
        for (major, minor, age) in [
            (1, 11, 14),
            (1, 20, 23),
            (1, 22, 25),
            (2, 0, 26),
            (2, 1, 27),
            (2, 3, 29),
            (2, 5, 31),
            (2, 6, 32),
        ] {
            assert_eq!(upstream_age(major, minor), Some(age), "{major}.{minor}");
        }
        assert_eq!(upstream_age(1, 10), None);
    }

    #[test]
    fn libfabric_variables_read_as_libfabric_reads_them() {
        for (value, zero) in [
            ("0", true),
            ("00", true),
            ("0x0", true),
            (" -0", true),
            ("false", true),
            ("", true),
            ("1", false),
            ("0x10", false),
            ("07", false),
            ("+3", false),
        ] {
            assert_eq!(strtol_is_zero(value), zero, "{value:?}");
        }
        assert_eq!(fi_bool("0"), Some(false));
        assert_eq!(fi_bool("Off"), Some(false));
        assert_eq!(fi_bool("YES"), Some(true));
        assert_eq!(fi_bool("2"), None);
        assert!(provider_filter_allows_efa("efa"));
        assert!(provider_filter_allows_efa("tcp,EFA"));
        assert!(provider_filter_allows_efa("efa;ofi_rxm"));
        assert!(provider_filter_allows_efa("^tcp"));
        assert!(provider_filter_allows_efa("^efa;ofi_rxm"));
        assert!(!provider_filter_allows_efa("^efa"));
        assert!(!provider_filter_allows_efa("efa-direct"));
        assert!(!provider_filter_allows_efa("tcp"));
        assert!(!provider_filter_allows_efa(""));
    }

    #[test]
    fn kallsyms_is_searched_by_name() {
        let path =
            std::env::temp_dir().join(format!("peerdirect-doctor-kallsyms-{}", std::process::id()));
        std::fs::write(
            &path,
            "0000000000000000 T ib_umem_get\t[ib_core]\n0000000000000000 T ib_umem_dmabuf_get\t[ib_core]\n",
        )
        .unwrap();
        assert_eq!(kallsyms_lists(&path, UMEM_DMABUF), Some(true));
        std::fs::write(&path, "0000000000000000 T ib_umem_get\t[ib_core]\n").unwrap();
        assert_eq!(kallsyms_lists(&path, UMEM_DMABUF), Some(false));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(kallsyms_lists(&path, UMEM_DMABUF), None);
    }

    #[test]
    fn each_problem_is_named_with_its_fix() {
        let mut host = healthy();
        host.env.clear();
        host.memlock = Some(Some(8 << 20));
        host.libfabric = Some(Err("libfabric.so.1 not found".into()));
        host.devices[0].rdma_paths[0] =
            ("0000:04:00.0 (efa_0)".into(), false, "ACS redirect".into());
        let checks = checks(&host);
        assert_eq!(status(&checks, "module"), Status::Ok);
        assert_eq!(status(&checks, "p2p"), Status::Fail);
        assert_eq!(status(&checks, "libfabric"), Status::Warn);
        assert_eq!(status(&checks, "memlock"), Status::Warn);
        assert_eq!(status(&checks, "fork_safe"), Status::Warn);
        assert_eq!(status(&checks, "efa_device_rdma"), Status::Warn);
        for c in checks.iter().filter(|c| c.status >= Status::Warn) {
            assert!(c.fix.is_some(), "{c:?}");
        }
        let p2p = checks.iter().find(|c| c.name == "p2p").unwrap();
        assert!(p2p
            .detail
            .contains("reaches no RDMA NIC: 0000:04:00.0 (efa_0): ACS redirect"));
        let memlock = checks.iter().find(|c| c.name == "memlock").unwrap();
        assert!(memlock.detail.contains("8 MiB"), "{}", memlock.detail);
    }

    /// The group to join is given /dev/peerdirect* by the udev rule of either install.
    #[test]
    fn devices_that_cannot_be_opened_say_to_join_the_group() {
        let mut host = healthy();
        host.devices.clear();
        host.devices_error = Some(Unreadable {
            message: "open /dev/peerdirect0: Permission denied (os error 13)".into(),
            denied: true,
        });
        let devices = check(&host, "devices");
        assert_eq!(devices.status, Status::Fail);
        assert_eq!(
            devices.fix.as_deref(),
            Some(
                "join the group peerdirect, which the udev rule of the peerdirect-dkms package or \
                 of make install gives /dev/peerdirect* (adduser $USER peerdirect, then log in \
                 again), or run as root"
            )
        );
    }

    /// A file that is no peerdirect device is not a matter of the group: no fix but its
    /// message's own.
    #[test]
    fn devices_that_cannot_be_read_for_another_reason_are_not_told_to_join_the_group() {
        let mut host = healthy();
        host.devices.clear();
        host.devices_error = Some(Unreadable {
            message: "info /dev/peerdirect0: Inappropriate ioctl for device (os error 25)".into(),
            denied: false,
        });
        let devices = check(&host, "devices");
        assert_eq!(devices.status, Status::Fail);
        assert_eq!(devices.fix, None);
    }

    #[test]
    fn no_module_no_devices_no_nics() {
        let bare = checks(&Host::default());
        assert_eq!(status(&bare, "module"), Status::Fail);
        assert_eq!(status(&bare, "devices"), Status::Fail);
        assert_eq!(status(&bare, "p2p"), Status::Skip);
        assert_eq!(status(&bare, "libfabric"), Status::Warn);
        assert_eq!(status(&bare, "efa_device_rdma"), Status::Skip);
        let mut host = healthy();
        host.peers.clear();
        assert_eq!(status(&checks(&host), "p2p"), Status::Warn);
        assert_eq!(status(&checks(&host), "efa_device_rdma"), Status::Skip);
        host.devices[0].revoked = true;
        assert_eq!(status(&checks(&host), "devices"), Status::Fail);
    }

    #[test]
    fn module_build_names_the_file_its_kernel_rustc_and_the_loaded_build() {
        let c = check(&healthy(), "module_build");
        assert_eq!((c.status, c.fix.as_deref()), (Status::Ok, None));
        assert_eq!(
            c.detail,
            format!("{DKMS_PATH}: vermagic \"{RELEASE} SMP preempt mod_unload\", built by rustc version 1.85.1 (4eb161250 2025-03-15) (built from a source tarball) (the kernel's too); loaded, and the loaded module is this file (build id b556)")
        );
        let mut host = healthy();
        host.module_loaded = false;
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Ok);
        assert!(c.detail.ends_with("; not loaded"), "{}", c.detail);
        // srcversion, when both have one, is compared first.
        let mut host = healthy();
        host.loaded_build.srcversion = Some("A1".into());
        if let Installed::File { build: Ok(b), .. } = &mut host.installed {
            b.srcversion = Some("A1".into());
        }
        assert!(check(&host, "module_build")
            .detail
            .contains("(srcversion A1)"));
        // Nothing to compare: said, not guessed.
        host.loaded_build = Build::default();
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.detail.contains("no build id or srcversion"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn module_build_for_another_kernel_fails_with_the_rebuild() {
        let mut host = healthy();
        host.release = "7.4.1+deb13-amd64".into();
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail.contains(&format!(
                "built for kernel {RELEASE}, not 7.4.1+deb13-amd64"
            )),
            "{}",
            c.detail
        );
        let fix = c.fix.unwrap();
        assert!(
            fix.contains("dkms autoinstall -k 7.4.1+deb13-amd64")
                && fix.contains("make install KDIR=/lib/modules/7.4.1+deb13-amd64/build"),
            "{fix}"
        );
        // Another rustc than the kernel's.
        let mut host = healthy();
        host.kernel_rustc = Some("rustc 1.88.0 (6b00bc388 2025-06-23)".into());
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(c.detail.contains("built by rustc 1.88.0"), "{}", c.detail);
        assert!(c.fix.unwrap().contains("the kernel's rustc first in PATH"));
        // The kernel's rustc unknown: not compared.
        host.kernel_rustc = None;
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(!c.detail.contains("the kernel's too"), "{}", c.detail);
    }

    #[test]
    fn module_build_warns_of_a_stale_load_and_of_modules_outside_modules_dep() {
        let mut host = healthy();
        host.loaded_build.build_id = Some("0bad".into());
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.detail
                .contains("another build (build id 0bad, the file's b556)"),
            "{}",
            c.detail
        );
        assert!(c
            .fix
            .unwrap()
            .contains("rmmod peerdirect && modprobe peerdirect"));
        // Another release than the running one: the loaded module does not count.
        host.release_is_running = false;
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail.contains("is not the running kernel"),
            "{}",
            c.detail
        );
        // As in the test guest: insmod of a file modules.dep does not list.
        let mut host = healthy();
        host.installed = Installed::Missing(format!(
            "/lib/modules/{RELEASE}/modules.dep lists no peerdirect.ko"
        ));
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.detail.contains("loaded from elsewhere (insmod)"),
            "{}",
            c.detail
        );
        assert!(c.fix.unwrap().contains("peerdirect-dkms"));
        host.module_loaded = false;
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail.starts_with(&format!(
                "no peerdirect.ko is installed for kernel {RELEASE}"
            )),
            "{}",
            c.detail
        );
        host.installed = Installed::File {
            path: DKMS_PATH.into(),
            build: Err("`xz -dc` cannot run (install xz-utils)".into()),
        };
        let c = check(&host, "module_build");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("install xz-utils"), "{}", c.detail);
    }

    #[test]
    fn the_installed_module_is_found_through_modules_dep() {
        let modules =
            std::env::temp_dir().join(format!("peerdirect-doctor-lib-{}", std::process::id()));
        let dir = modules.join(RELEASE);
        std::fs::create_dir_all(dir.join("updates/dkms")).unwrap();
        assert!(matches!(installed(&modules, ""), Installed::Unknown));
        let missing = |i: Installed| match i {
            Installed::Missing(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(missing(installed(&modules, RELEASE)).starts_with("cannot read"));
        std::fs::write(dir.join("modules.dep"), "kernel/fs/fuse/fuse.ko.xz:\n").unwrap();
        assert!(missing(installed(&modules, RELEASE)).ends_with("lists no peerdirect.ko"));
        std::fs::write(
            dir.join("modules.dep"),
            "kernel/fs/fuse/fuse.ko.xz:\nupdates/dkms/peerdirect.ko:\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("updates/dkms/peerdirect.ko"),
            module_file::tests::debian_module(&[0xb5, 0x56]),
        )
        .unwrap();
        match installed(&modules, RELEASE) {
            Installed::File { path, build } => {
                assert_eq!(
                    path,
                    dir.join("updates/dkms/peerdirect.ko").display().to_string()
                );
                assert_eq!(build.unwrap(), dkms_build());
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&modules).unwrap();
    }

    #[test]
    fn memlock_comes_from_proc_limits() {
        let limits =
            "Limit                     Soft Limit           Hard Limit           Units     \n\
Max open files            1024                 524288               files     \n\
Max locked memory         8388608              8388608              bytes     \n";
        assert_eq!(memlock_of(limits), Some(Some(8 << 20)));
        let unlimited =
            "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(memlock_of(unlimited), Some(None));
        assert_eq!(memlock_of(""), None);
        assert_eq!(memlock_of("Max locked memory    lots"), None);
    }
}
