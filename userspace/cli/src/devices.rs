//! `peerdirect devices`: list the HBM devices.

use std::io::{self, Write};

use anyhow::{Context, Result};
use peerdirect::DeviceInfo;

use crate::size::human_bytes;
use crate::table;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print a JSON array of device objects instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub const NO_DEVICE: &str =
    "no peerdirect device found: load peerdirect.ko and bind the HBM device \
to it (echo peerdirect > /sys/bus/pci/devices/DDDD:BB:SS.F/driver_override; \
echo DDDD:BB:SS.F > /sys/bus/pci/drivers_probe); see README";

pub fn run(args: &Args) -> Result<()> {
    let infos = peerdirect::device_infos()?;
    let mut out = io::stdout().lock();
    if args.json {
        write_json(&mut out, &infos)?;
    } else if infos.is_empty() {
        eprintln!("peerdirect: {NO_DEVICE}");
    } else {
        write_table(&mut out, &infos)?;
    }
    out.flush().context("writing to stdout")
}

fn write_json(out: &mut impl Write, infos: &[DeviceInfo]) -> Result<()> {
    serde_json::to_writer_pretty(&mut *out, infos).context("writing JSON to stdout")?;
    writeln!(out).context("writing to stdout")
}

fn write_table(out: &mut impl Write, infos: &[DeviceInfo]) -> Result<()> {
    let rows: Vec<Vec<String>> = infos
        .iter()
        .map(|info| {
            vec![
                info.path.display().to_string(),
                info.pci_address.to_string(),
                format!("{:04x}:{:04x}", info.vendor_id, info.device_id),
                info.bar_index.to_string(),
                format!("{} ({} bytes)", human_bytes(info.hbm_bytes), info.hbm_bytes),
                format!("{:#x}", info.hbm_bus_addr),
                info.numa_node
                    .map_or_else(|| "-".to_owned(), |node| node.to_string()),
                provider(info),
            ]
        })
        .collect();
    table::write(
        out,
        &[
            "DEVICE",
            "PCI",
            "ID",
            "BAR",
            "HBM",
            "BUS ADDRESS",
            "NUMA",
            "PROVIDER",
        ],
        &rows,
    )
}

/// "owned", or "companion of DRIVER" for a device another driver owns.
pub fn provider(info: &DeviceInfo) -> String {
    match (info.provider, &info.driver) {
        (peerdirect::Provider::Companion, Some(driver)) => format!("companion of {driver}"),
        (peerdirect::Provider::Companion, None) => "companion (no driver)".to_owned(),
        (provider, _) => provider.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use peerdirect::uapi;
    use serde_json::json;

    use super::*;

    fn info(index: u32, numa_node: i32) -> DeviceInfo {
        let raw = uapi::peerdirect_info {
            size: uapi::PEERDIRECT_INFO_SIZE_VER0,
            hbm_bytes: 16 << 30,
            hbm_bus_addr: 0x38_0000_0000,
            hbm_phys_addr: 0x38_0000_0000,
            bar_index: 2,
            numa_node,
            pci_domain: 0,
            pci_bus: 0,
            pci_slot: 4,
            pci_func: 0,
            vendor_id: 0x1b36,
            device_id: 0x0010,
            index,
            provider: uapi::PEERDIRECT_PROVIDER_OWNED,
            ..Default::default()
        };
        DeviceInfo::from_raw(&peerdirect::device_path(index), &raw).unwrap()
    }

    fn companion(index: u32, numa_node: i32) -> DeviceInfo {
        DeviceInfo {
            provider: peerdirect::Provider::Companion,
            driver: Some("vfio-pci".to_owned()),
            ..info(index, numa_node)
        }
    }

    fn json_of(infos: &[DeviceInfo]) -> serde_json::Value {
        let mut out = Vec::new();
        write_json(&mut out, infos).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn json_shape() {
        assert_eq!(
            json_of(&[info(0, -1), companion(1, 1)]),
            json!([
                {
                    "path": "/dev/peerdirect0",
                    "index": 0,
                    "pci_address": "0000:00:04.0",
                    "vendor_id": 0x1b36,
                    "device_id": 0x0010,
                    "bar_index": 2,
                    "hbm_bytes": 17179869184u64,
                    "hbm_bus_addr": 0x38_0000_0000u64,
                    "hbm_phys_addr": 0x38_0000_0000u64,
                    "numa_node": null,
                    "provider": "owned",
                    "driver": null
                },
                {
                    "path": "/dev/peerdirect1",
                    "index": 1,
                    "pci_address": "0000:00:04.0",
                    "vendor_id": 0x1b36,
                    "device_id": 0x0010,
                    "bar_index": 2,
                    "hbm_bytes": 17179869184u64,
                    "hbm_bus_addr": 0x38_0000_0000u64,
                    "hbm_phys_addr": 0x38_0000_0000u64,
                    "numa_node": 1,
                    "provider": "companion",
                    "driver": "vfio-pci"
                }
            ])
        );
    }

    #[test]
    fn no_devices_is_an_empty_json_array() {
        let mut out = Vec::new();
        write_json(&mut out, &[]).unwrap();
        assert_eq!(out, b"[]\n");
    }

    #[test]
    fn table() {
        let mut out = Vec::new();
        write_table(&mut out, &[info(0, -1), companion(1, 1)]).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "DEVICE            PCI           ID         BAR  HBM                         BUS ADDRESS   NUMA  PROVIDER",
                "/dev/peerdirect0  0000:00:04.0  1b36:0010  2    16 GiB (17179869184 bytes)  0x3800000000  -     owned",
                "/dev/peerdirect1  0000:00:04.0  1b36:0010  2    16 GiB (17179869184 bytes)  0x3800000000  1     companion of vfio-pci",
            ]
        );
    }
}
