//! `peerdirect devices`: list the HBM devices.

use std::io::{self, Write};

use anyhow::{Context, Result};
use peerdirect::DeviceInfo;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print a JSON array of device objects instead of a table.
    #[arg(long)]
    pub json: bool,
}

const NO_DEVICE: &str = "no peerdirect device found: load peerdirect.ko and bind the HBM device \
to it (echo peerdirect > /sys/bus/pci/devices/DDDD:BB:SS.F/driver_override; \
echo DDDD:BB:SS.F > /sys/bus/pci/drivers_probe); see README";

pub fn run(args: &Args) -> Result<()> {
    let infos = peerdirect::devices()?
        .iter()
        .map(|device| device.info())
        .collect::<Result<Vec<_>, _>>()?;
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
    let header = ["DEVICE", "PCI", "ID", "BAR", "HBM", "BUS ADDRESS", "NUMA"].map(String::from);
    let rows: Vec<[String; 7]> = infos
        .iter()
        .map(|info| {
            [
                info.path.display().to_string(),
                info.pci_address.to_string(),
                format!("{:04x}:{:04x}", info.vendor_id, info.device_id),
                info.bar_index.to_string(),
                format!("{} ({} bytes)", human_bytes(info.hbm_bytes), info.hbm_bytes),
                format!("{:#x}", info.hbm_bus_addr),
                info.numa_node
                    .map_or_else(|| "-".to_owned(), |node| node.to_string()),
            ]
        })
        .collect();
    let mut widths = [0; 7];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<_> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end()).context("writing to stdout")?;
    }
    Ok(())
}

/// `bytes` in the largest binary unit that keeps it at least 1, with one decimal unless exact.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let exponent = if bytes == 0 { 0 } else { bytes.ilog2() / 10 };
    let unit = 1u64 << (10 * exponent);
    if bytes.is_multiple_of(unit) {
        format!("{} {}", bytes / unit, UNITS[exponent as usize])
    } else {
        format!(
            "{:.1} {}",
            bytes as f64 / unit as f64,
            UNITS[exponent as usize]
        )
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

    fn json_of(infos: &[DeviceInfo]) -> serde_json::Value {
        let mut out = Vec::new();
        write_json(&mut out, infos).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn json_shape() {
        assert_eq!(
            json_of(&[info(0, -1), info(1, 1)]),
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
                    "provider": "owned"
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
                    "provider": "owned"
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
        write_table(&mut out, &[info(0, -1), info(1, 1)]).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "DEVICE            PCI           ID         BAR  HBM                         BUS ADDRESS   NUMA",
                "/dev/peerdirect0  0000:00:04.0  1b36:0010  2    16 GiB (17179869184 bytes)  0x3800000000  -",
                "/dev/peerdirect1  0000:00:04.0  1b36:0010  2    16 GiB (17179869184 bytes)  0x3800000000  1",
            ]
        );
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1 KiB");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(human_bytes(16 << 30), "16 GiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
    }
}
