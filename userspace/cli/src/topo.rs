//! `peerdirect topo`: which PCI devices (RDMA NICs, network devices, other accelerators) can
//! reach each HBM device peer-to-peer, as the kernel decides it, and why not.
//!
//! The peers come from sysfs; the verdict and the facts behind it from the module
//! (`PEERDIRECT_IOC_P2P`, the rule the exporter applies when a driver attaches).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use peerdirect::{Device, P2pMapping, P2pPath, PciAddress};
use serde::Serialize;

use crate::devices::NO_DEVICE;
use crate::size::parse_device;
use crate::table;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this HBM device (N of /dev/peerdirectN); default: every one.
    #[arg(long, allow_hyphen_values = true, value_name = "N", value_parser = parse_device)]
    pub device: Option<u32>,
    /// Ask about this PCI device (DDDD:BB:SS.F; repeatable) instead of the RDMA, network
    /// and accelerator devices found in sysfs.
    #[arg(long = "peer", value_name = "DDDD:BB:SS.F")]
    pub peers: Vec<PciAddress>,
    /// Ask about every PCI function that is not a bridge.
    #[arg(long, conflicts_with = "peers")]
    pub all: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Where sysfs is mounted.
const SYSFS: &str = "/sys";

/// What a PCI device is, for choosing the peers worth asking about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Has an RDMA device (a NIC with its own, or the netdev a soft RDMA device runs over).
    Rdma,
    /// A network controller (PCI class 02).
    Network,
    /// A processing accelerator (class 12), e.g. another Gaudi.
    Accelerator,
    /// Anything else that is not a bridge.
    Other,
}

/// A PCI function as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PciPeer {
    pub pci_address: PciAddress,
    pub vendor_id: u16,
    pub device_id: u16,
    /// The 24-bit class code, `0xCCSSPP`.
    pub class: u32,
    pub kind: Kind,
    pub driver: Option<String>,
    pub netdevs: Vec<String>,
    /// RDMA devices on this function, or soft ones (rxe, siw) over one of its netdevs.
    pub rdma: Vec<String>,
}

/// One peer's row: sysfs's description and the kernel's verdict.
#[derive(Debug, Serialize)]
struct PeerReport {
    #[serde(flatten)]
    peer: PciPeer,
    p2p: bool,
    mapping: Option<P2pMapping>,
    why: String,
    #[serde(flatten)]
    path: P2pPath,
}

#[derive(Debug, Serialize)]
struct DeviceReport {
    device: PathBuf,
    pci_address: PciAddress,
    host_bridge: Option<String>,
    peers: Vec<PeerReport>,
}

pub fn run(args: &Args) -> Result<()> {
    let devices = match args.device {
        Some(index) => vec![Device::open_index(index)?],
        None => peerdirect::devices()?,
    };
    if devices.is_empty() && !args.json {
        eprintln!("peerdirect: {NO_DEVICE}");
        return Ok(());
    }
    let sysfs = Path::new(SYSFS);
    let all = scan(sysfs).context("reading the PCI devices in /sys/bus/pci/devices")?;
    let mut reports = Vec::new();
    for device in &devices {
        let info = device.info()?;
        let peers: Vec<PciPeer> = if args.peers.is_empty() {
            all.iter()
                .filter(|p| p.pci_address != info.pci_address)
                .filter(|p| args.all || p.kind != Kind::Other)
                .cloned()
                .collect()
        } else {
            args.peers
                .iter()
                .map(|a| {
                    all.iter()
                        .find(|p| p.pci_address == *a)
                        .cloned()
                        .unwrap_or_else(|| unknown(*a))
                })
                .collect()
        };
        let mut rows = Vec::new();
        for peer in peers {
            let path = device.p2p(peer.pci_address)?;
            rows.push(PeerReport {
                p2p: path.reachable(),
                mapping: path.mapping(),
                why: path.why(),
                peer,
                path,
            });
        }
        reports.push(DeviceReport {
            device: info.path.clone(),
            pci_address: info.pci_address,
            host_bridge: rows.first().and_then(|r| r.path.host_bridge.clone()),
            peers: rows,
        });
    }
    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &reports).context("writing JSON to stdout")?;
        writeln!(out).context("writing to stdout")?;
    } else {
        write_table(&mut out, &reports)?;
    }
    out.flush().context("writing to stdout")
}

/// A peer named on the command line that sysfs does not list: the module will say ENXIO.
fn unknown(address: PciAddress) -> PciPeer {
    PciPeer {
        pci_address: address,
        vendor_id: 0,
        device_id: 0,
        class: 0,
        kind: Kind::Other,
        driver: None,
        netdevs: Vec::new(),
        rdma: Vec::new(),
    }
}

fn write_table(out: &mut impl Write, reports: &[DeviceReport]) -> Result<()> {
    for (i, report) in reports.iter().enumerate() {
        if i > 0 {
            writeln!(out).context("writing to stdout")?;
        }
        writeln!(
            out,
            "{} ({}), host bridge {}",
            report.device.display(),
            report.pci_address,
            report.host_bridge.as_deref().unwrap_or("unknown")
        )
        .context("writing to stdout")?;
        let rows: Vec<Vec<String>> = report
            .peers
            .iter()
            .map(|r| {
                let names: Vec<&str> = r
                    .peer
                    .netdevs
                    .iter()
                    .chain(&r.peer.rdma)
                    .map(String::as_str)
                    .collect();
                vec![
                    r.peer.pci_address.to_string(),
                    serde_json::to_value(r.peer.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    if names.is_empty() {
                        "-".to_owned()
                    } else {
                        names.join(",")
                    },
                    if r.p2p { "yes" } else { "no" }.to_owned(),
                    r.path
                        .distance
                        .map_or_else(|| "-".to_owned(), |d| d.to_string()),
                    r.why.clone(),
                ]
            })
            .collect();
        table::write(out, &["PEER", "KIND", "NAMES", "P2P", "HOPS", "WHY"], &rows)?;
    }
    Ok(())
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

fn read_hex(path: &Path) -> Option<u32> {
    let text = read_trimmed(path)?;
    u32::from_str_radix(text.trim_start_matches("0x"), 16).ok()
}

fn dir_names(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// The PCI function at or above the sysfs device `link` resolves to (a netdev's `device` may
/// be a virtio device below its PCI function), if any.
fn pci_function_of(link: &Path) -> Option<PciAddress> {
    let target = fs::canonicalize(link).ok()?;
    target
        .ancestors()
        .find_map(|dir| dir.file_name()?.to_str()?.parse().ok())
}

/// Every PCI function in `sysfs` that is not a bridge, in address order, with the netdevs
/// and RDMA devices on it.
pub fn scan(sysfs: &Path) -> io::Result<Vec<PciPeer>> {
    let mut peers = Vec::new();
    let devices = sysfs.join("bus/pci/devices");
    for name in dir_names(&devices) {
        let Ok(address) = name.parse::<PciAddress>() else {
            continue;
        };
        let dir = devices.join(&name);
        let class = read_hex(&dir.join("class")).unwrap_or(0);
        if class >> 16 == 0x06 {
            continue; // bridges: host, ISA, PCI-to-PCI, ...
        }
        peers.push(PciPeer {
            pci_address: address,
            // CAST: sysfs prints 16-bit IDs.
            vendor_id: read_hex(&dir.join("vendor")).unwrap_or(0) as u16,
            device_id: read_hex(&dir.join("device")).unwrap_or(0) as u16,
            class,
            kind: match class >> 16 {
                0x02 => Kind::Network,
                0x12 => Kind::Accelerator,
                _ => Kind::Other,
            },
            driver: fs::read_link(dir.join("driver"))
                .ok()
                .and_then(|l| l.file_name().and_then(|n| n.to_str()).map(str::to_owned)),
            netdevs: Vec::new(),
            rdma: Vec::new(),
        });
    }
    let class_net = sysfs.join("class/net");
    let mut netdev_function = Vec::new();
    for netdev in dir_names(&class_net) {
        if let Some(address) = pci_function_of(&class_net.join(&netdev).join("device")) {
            if let Some(peer) = peers.iter_mut().find(|p| p.pci_address == address) {
                peer.netdevs.push(netdev.clone());
                netdev_function.push((netdev, address));
            }
        }
    }
    // An RDMA device sits on its PCI function, or (rxe, siw) runs over a netdev: `parent`.
    let class_ib = sysfs.join("class/infiniband");
    for ibdev in dir_names(&class_ib) {
        let dir = class_ib.join(&ibdev);
        let address = pci_function_of(&dir.join("device")).or_else(|| {
            let parent = read_trimmed(&dir.join("parent"))?;
            netdev_function
                .iter()
                .find(|(netdev, _)| *netdev == parent)
                .map(|(_, address)| *address)
        });
        if let Some(peer) = address.and_then(|a| peers.iter_mut().find(|p| p.pci_address == a)) {
            peer.rdma.push(ibdev);
            peer.kind = Kind::Rdma;
        }
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    /// A sysfs with a host bridge, a switch port, an HBM device, a virtio NIC carrying a soft
    /// RDMA device, a NIC with its own RDMA device, and a SATA controller.
    fn fake_sysfs(name: &str) -> TempDir {
        let root =
            std::env::temp_dir().join(format!("peerdirect-topo-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let pci = root.join("devices/pci0000:00");
        let functions = [
            ("0000:00:00.0", "0x060000", "0x8086", "0x29c0", ""),
            ("0000:01:00.0", "0x060400", "0x104c", "0x8232", ""),
            ("0000:03:00.0", "0x050000", "0x1af4", "0x1110", "peerdirect"),
            ("0000:04:00.0", "0x020000", "0x1af4", "0x1041", "virtio-pci"),
            ("0000:05:00.0", "0x020700", "0x15b3", "0x101b", "mlx5_core"),
            ("0000:00:1f.2", "0x010601", "0x8086", "0x2922", "ahci"),
        ];
        for (bdf, class, vendor, device, driver) in functions {
            let dir = pci.join(bdf);
            write(&dir.join("class"), &format!("{class}\n"));
            write(&dir.join("vendor"), &format!("{vendor}\n"));
            write(&dir.join("device"), &format!("{device}\n"));
            if !driver.is_empty() {
                let drv = root.join("bus/pci/drivers").join(driver);
                fs::create_dir_all(&drv).unwrap();
                symlink(&drv, dir.join("driver")).unwrap();
            }
            fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
            symlink(&dir, root.join("bus/pci/devices").join(bdf)).unwrap();
        }
        // The virtio NIC's netdev, with rxe0 over it.
        let virtio = pci.join("0000:04:00.0/virtio0");
        fs::create_dir_all(virtio.join("net/eth0")).unwrap();
        fs::create_dir_all(root.join("class/net")).unwrap();
        symlink(virtio.join("net/eth0"), root.join("class/net/eth0")).unwrap();
        symlink(&virtio, virtio.join("net/eth0/device")).unwrap();
        write(
            &root.join("devices/virtual/infiniband/rxe0/parent"),
            "eth0\n",
        );
        fs::create_dir_all(root.join("class/infiniband")).unwrap();
        symlink(
            root.join("devices/virtual/infiniband/rxe0"),
            root.join("class/infiniband/rxe0"),
        )
        .unwrap();
        // mlx5_0 on its own function.
        let mlx = pci.join("0000:05:00.0");
        fs::create_dir_all(mlx.join("infiniband/mlx5_0")).unwrap();
        symlink(&mlx, mlx.join("infiniband/mlx5_0/device")).unwrap();
        symlink(
            mlx.join("infiniband/mlx5_0"),
            root.join("class/infiniband/mlx5_0"),
        )
        .unwrap();
        TempDir(root)
    }

    #[test]
    fn scan_finds_functions_and_rdma_devices() {
        let sysfs = fake_sysfs("scan");
        let peers = scan(&sysfs.0).unwrap();
        let summary: Vec<_> = peers
            .iter()
            .map(|p| {
                (
                    p.pci_address.to_string(),
                    p.kind,
                    p.netdevs.clone(),
                    p.rdma.clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("0000:00:1f.2".to_owned(), Kind::Other, vec![], vec![]),
                ("0000:03:00.0".to_owned(), Kind::Other, vec![], vec![]),
                (
                    "0000:04:00.0".to_owned(),
                    Kind::Rdma,
                    vec!["eth0".to_owned()],
                    vec!["rxe0".to_owned()]
                ),
                (
                    "0000:05:00.0".to_owned(),
                    Kind::Rdma,
                    vec![],
                    vec!["mlx5_0".to_owned()]
                ),
            ]
        );
        let nic = &peers[2];
        assert_eq!(
            (nic.vendor_id, nic.device_id, nic.class),
            (0x1af4, 0x1041, 0x020000)
        );
        assert_eq!(nic.driver.as_deref(), Some("virtio-pci"));
    }

    #[test]
    fn scan_of_an_empty_sysfs_is_empty() {
        let root =
            std::env::temp_dir().join(format!("peerdirect-topo-empty-{}", std::process::id()));
        assert!(scan(&root).unwrap().is_empty());
    }
}
