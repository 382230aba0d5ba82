//! `peerdirect alloc`: allocate HBM, show where it landed, free it again.

use std::io::{self, Write};

use anyhow::{Context, Result};
use peerdirect::{Allocation, Device};
use serde_json::{json, Value};

use crate::size::{check_alloc_size, human_bytes, parse_align, parse_device, parse_size};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Bytes to allocate (K, M, G, T: powers of 1024); rounded up to the page size.
    #[arg(long, allow_hyphen_values = true, value_name = "SIZE", value_parser = parse_size)]
    pub size: u64,
    /// Alignment in the HBM BAR: a power of two of at least 4K [default: 2M].
    #[arg(long, allow_hyphen_values = true, value_name = "A", value_parser = parse_align)]
    pub align: Option<u64>,
    /// The HBM device: N of /dev/peerdirectN.
    #[arg(long, allow_hyphen_values = true, value_name = "N", value_parser = parse_device, default_value = "0")]
    pub device: u32,
    /// Print a JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let device = Device::open_index(args.device)?;
    check_alloc_size(&device, args.size)?;
    let allocation = device.alloc(args.size, args.align)?;
    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &allocation_json(&allocation))
            .context("writing JSON to stdout")?;
        writeln!(out).context("writing to stdout")?;
    } else {
        writeln!(out, "{}; freed on exit", describe_allocation(&allocation))
            .context("writing to stdout")?;
    }
    out.flush().context("writing to stdout")?;
    allocation.free()?;
    Ok(())
}

/// `{"device", "handle", "hbm_offset", "length"}`.
fn allocation_json(allocation: &Allocation<'_>) -> Value {
    json!({
        "device": allocation.device().path(),
        "handle": allocation.handle(),
        "hbm_offset": allocation.hbm_offset(),
        "length": allocation.length(),
    })
}

/// "/dev/peerdirect0: handle 1, 4096 bytes (4 KiB) at HBM offset 0x200000".
fn describe_allocation(allocation: &Allocation<'_>) -> String {
    format!(
        "{}: handle {}, {} bytes ({}) at HBM offset {:#x}",
        allocation.device().path().display(),
        allocation.handle(),
        allocation.length(),
        human_bytes(allocation.length()),
        allocation.hbm_offset()
    )
}
