//! `peerdirect stats`: what the module has allocated and exported, per HBM device.

use std::io::{self, Write};

use anyhow::{Context, Result};
use peerdirect::{DeviceInfo, Stats};
use serde_json::{json, Value};

use crate::devices::NO_DEVICE;
use crate::size::human_bytes;
use crate::table;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print a JSON array of objects instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let mut all = Vec::new();
    for info in peerdirect::device_infos()? {
        let stats = Stats::read(info.index)?;
        all.push((info, stats));
    }
    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &to_json(&all)).context("writing JSON to stdout")?;
        writeln!(out).context("writing to stdout")?;
    } else if all.is_empty() {
        eprintln!("peerdirect: {NO_DEVICE}");
    } else {
        write_table(&mut out, &all)?;
    }
    out.flush().context("writing to stdout")
}

fn to_json(all: &[(DeviceInfo, Stats)]) -> Value {
    all.iter()
        .map(|(info, stats)| {
            json!({
                "path": info.path,
                "index": info.index,
                "pci_address": info.pci_address,
                "hbm_bytes": stats.hbm_bytes,
                "allocations": stats.allocations,
                "allocated_bytes": stats.allocated_bytes,
                "exports": stats.exports,
            })
        })
        .collect()
}

fn write_table(out: &mut impl Write, all: &[(DeviceInfo, Stats)]) -> Result<()> {
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|(info, stats)| {
            vec![
                info.path.display().to_string(),
                human_bytes(stats.hbm_bytes),
                stats.allocations.to_string(),
                format!(
                    "{} ({} bytes)",
                    human_bytes(stats.allocated_bytes),
                    stats.allocated_bytes
                ),
                stats.exports.to_string(),
            ]
        })
        .collect();
    table::write(
        out,
        &["DEVICE", "HBM", "ALLOCATIONS", "ALLOCATED", "EXPORTS"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use peerdirect::uapi;

    use super::*;

    fn entry(index: u32, allocations: u64) -> (DeviceInfo, Stats) {
        let raw = uapi::peerdirect_info {
            size: uapi::PEERDIRECT_INFO_SIZE_VER0,
            hbm_bytes: 256 << 20,
            pci_bus: 3,
            index,
            provider: uapi::PEERDIRECT_PROVIDER_OWNED,
            ..Default::default()
        };
        let info =
            DeviceInfo::from_raw(Path::new(&format!("/dev/peerdirect{index}")), &raw).unwrap();
        let stats = Stats {
            allocations,
            allocated_bytes: allocations << 21,
            exports: 1,
            hbm_bytes: 256 << 20,
        };
        (info, stats)
    }

    #[test]
    fn json_shape() {
        assert_eq!(
            to_json(&[entry(0, 2)]),
            json!([{
                "path": "/dev/peerdirect0",
                "index": 0,
                "pci_address": "0000:03:00.0",
                "hbm_bytes": 268435456,
                "allocations": 2,
                "allocated_bytes": 4194304,
                "exports": 1
            }])
        );
        assert_eq!(to_json(&[]), json!([]));
    }

    #[test]
    fn table() {
        let mut out = Vec::new();
        write_table(&mut out, &[entry(0, 2), entry(1, 0)]).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap().lines().collect::<Vec<_>>(),
            [
                "DEVICE            HBM      ALLOCATIONS  ALLOCATED              EXPORTS",
                "/dev/peerdirect0  256 MiB  2            4 MiB (4194304 bytes)  1",
                "/dev/peerdirect1  256 MiB  0            0 B (0 bytes)          1",
            ]
        );
    }
}
