//! `peerdirect doctor`: what a host needs for HBM-to-NIC transfers, checked one by one, each
//! with what to do about it: the module and its devices, a NIC that can reach the HBM
//! peer-to-peer (the kernel's verdict, as `topo` gives it), libfabric with `FI_MR_DMABUF`,
//! the locked-memory limit, and the settings Habana's documentation asks for when Gaudi
//! uses host NICs (`RDMAV_FORK_SAFE=1`; `FI_EFA_USE_DEVICE_RDMA=1` with EFA).

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;

use anyhow::{Context, Result};
use peerdirect::registrar::libfabric;
use peerdirect::Device;
use serde::Serialize;

use crate::devices::NO_DEVICE;
use crate::topo::{self, Kind, PciPeer};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of a list.
    #[arg(long)]
    pub json: bool,
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

/// What the checks look at, gathered from the host (or made up by a test).
#[derive(Debug, Default)]
pub struct Host {
    /// Whether /sys/module/peerdirect exists.
    pub module_loaded: bool,
    /// Per HBM device: its node, and per RDMA-capable peer its P2P verdict.
    pub devices: Vec<DeviceView>,
    /// Why the devices could not be read, if they could not.
    pub devices_error: Option<String>,
    /// The PCI functions sysfs lists (not bridges).
    pub peers: Vec<PciPeer>,
    /// `libfabric::version()`, or why it is unusable (`Err`).
    pub libfabric: Option<Result<String, String>>,
    /// The environment variables the checks read.
    pub env: HashMap<String, String>,
    /// RLIMIT_MEMLOCK's soft limit from /proc/self/limits: bytes, or `Some(None)` for
    /// unlimited; `None` when it could not be read.
    pub memlock: Option<Option<u64>>,
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
const ENV: [&str; 2] = ["RDMAV_FORK_SAFE", "FI_EFA_USE_DEVICE_RDMA"];

impl Host {
    /// Reads this host.
    pub fn gather() -> Self {
        let sysfs = Path::new("/sys");
        let peers = topo::scan(sysfs).unwrap_or_default();
        let mut host = Host {
            module_loaded: sysfs.join("module/peerdirect").exists(),
            libfabric: Some(libfabric::version().map_err(|e| e.to_string())),
            env: ENV
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
                .collect(),
            memlock: std::fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|text| memlock_of(&text)),
            ..Host::default()
        };
        match peerdirect::devices() {
            Ok(devices) => {
                for device in &devices {
                    host.devices.push(view(device, &peers));
                }
            }
            Err(e) => host.devices_error = Some(e.to_string()),
        }
        host.peers = peers;
        host
    }
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
            .fix("modprobe peerdirect (after make install), or insmod peerdirect.ko")
    });

    let hbm_total: u64 = host.devices.iter().map(|d| d.hbm_bytes).sum();
    out.push(match (&host.devices_error, host.devices.as_slice()) {
        (Some(e), _) => Check::new("devices", Status::Fail, e.clone())
            .fix("run as root, or give your user access to /dev/peerdirect*"),
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

    let efa = host
        .peers
        .iter()
        .any(|p| p.driver.as_deref() == Some("efa"));
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
    out
}

pub fn run(args: &Args) -> Result<()> {
    let checks = checks(&Host::gather());
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

    fn healthy() -> Host {
        Host {
            module_loaded: true,
            devices: vec![DeviceView {
                path: "/dev/peerdirect0".into(),
                hbm_bytes: 32 << 30,
                revoked: false,
                rdma_paths: vec![("0000:04:00.0 (efa_0)".into(), true, "below a switch".into())],
            }],
            peers: vec![nic("efa", "efa_0")],
            libfabric: Some(Ok("2.1".into())),
            env: [("RDMAV_FORK_SAFE", "1"), ("FI_EFA_USE_DEVICE_RDMA", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            memlock: Some(None),
            devices_error: None,
        }
    }

    #[test]
    fn a_healthy_efa_host_passes_everything() {
        let checks = checks(&healthy());
        assert!(checks.iter().all(|c| c.status == Status::Ok), "{checks:#?}");
        assert_eq!(checks.len(), 7);
        assert!(checks.iter().all(|c| c.fix.is_none()));
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
