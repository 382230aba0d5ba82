//! `peerdirect companion add|remove|list`: serve the HBM BAR of a PCI device another driver
//! owns (habanalabs on a DL1 host) beside that driver, as /dev/peerdirectN.

use std::io::{self, Write};

use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Context, Result};
use peerdirect::{Control, Device, ExportFlags, PciAddress, Provider};
use serde_json::json;

use crate::hold::Watch;
use crate::size::{parse_device, parse_number, parse_seconds, parse_size};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Serve the HBM BAR of PCI device DDDD:BB:SS.F as a companion /dev/peerdirectN (root,
    /// and the module loaded with companion=1); prints the device node.
    Add {
        /// The PCI device, DDDD:BB:SS.F (lspci -D).
        device: PciAddress,
        /// The BAR that holds HBM, 0-5; without it, the one peerdirect knows for the device
        /// (Gaudi: 4).
        #[arg(long, allow_hyphen_values = true, value_parser = clap::value_parser!(u8).range(0..=5))]
        bar: Option<u8>,
    },
    /// Stop serving a companion device: everything exported from it is revoked first.
    Remove {
        /// The PCI device, DDDD:BB:SS.F.
        device: PciAddress,
    },
    /// Before the companion's owner resets the device (the PCI core tells only the owner's
    /// driver): revoke everything exported from it and refuse new exports until reset-done.
    ResetPrepare {
        /// The PCI device, DDDD:BB:SS.F.
        device: PciAddress,
    },
    /// After the owner's reset that reset-prepare announced: exports work again.
    ResetDone {
        /// The PCI device, DDDD:BB:SS.F.
        device: PciAddress,
    },
    /// Export a range of a companion's BAR (memory its owner's runtime allocated) as a
    /// dma-buf; optionally write and check a pattern through its mapping, and hold it.
    Export {
        /// The companion device: N of /dev/peerdirectN.
        #[arg(long, allow_hyphen_values = true, value_name = "N", value_parser = parse_device, default_value = "0")]
        device: u32,
        /// Start of the range in the BAR, a multiple of the page size.
        #[arg(long, allow_hyphen_values = true, value_name = "O", value_parser = parse_size)]
        bar_offset: u64,
        /// Bytes, a multiple of the page size.
        #[arg(long, allow_hyphen_values = true, value_name = "SIZE", value_parser = parse_size)]
        size: u64,
        /// Write the pattern with SEED over the range (exports it read-write).
        #[arg(long, allow_hyphen_values = true, value_name = "SEED", value_parser = parse_number)]
        pattern: Option<u64>,
        /// Check that the range holds the pattern with SEED (after --pattern, if given).
        #[arg(long, allow_hyphen_values = true, value_name = "SEED", value_parser = parse_number)]
        verify: Option<u64>,
        /// Keep the dma-buf for SECONDS after printing; ends at once with an error if the
        /// module revokes it meanwhile.
        #[arg(long, allow_hyphen_values = true, value_name = "SECONDS", value_parser = parse_seconds, default_value = "0")]
        hold: u64,
    },
    /// List the companion devices.
    List {
        /// Print a JSON array of device objects (as `peerdirect devices --json`).
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: &Args) -> Result<()> {
    let mut out = io::stdout().lock();
    match &args.command {
        Command::Add { device, bar } => {
            let index = Control::open()?.add_companion(*device, *bar)?;
            writeln!(out, "{}", peerdirect::device_path(index).display())?;
        }
        Command::Remove { device } => Control::open()?.remove_companion(*device)?,
        Command::ResetPrepare { device } => Control::open()?.companion_reset_prepare(*device)?,
        Command::ResetDone { device } => Control::open()?.companion_reset_done(*device)?,
        Command::Export {
            device,
            bar_offset,
            size,
            pattern,
            verify,
            hold,
        } => {
            let device = Device::open_index(*device)?;
            let mut flags = ExportFlags::CLOEXEC;
            if pattern.is_some() {
                flags |= ExportFlags::RDWR;
            }
            let watch = Watch::before_export(&device, true);
            let dma_buf = device.export_range(*bar_offset, *size, flags)?;
            let written = pattern
                .map(|seed| crate::export::write_pattern(&dma_buf, seed))
                .transpose()?;
            let verified = verify
                .map(|seed| crate::export::verify_pattern(&dma_buf, seed))
                .transpose()?;
            let report = json!({
                "device": device.path(),
                "bar_offset": bar_offset,
                "length": dma_buf.length(),
                "fd": dma_buf.as_fd().as_raw_fd(),
                "writable": flags.contains(ExportFlags::RDWR),
                "pattern": pattern.map(|seed| json!({"seed": seed, "bytes_written": written})),
                "verify": verified.as_ref().map(|v| json!({
                    "seed": v.seed,
                    "bytes_verified": v.bytes,
                    "mismatch": v.mismatch.map(|m| m.offset),
                })),
            });
            serde_json::to_writer_pretty(&mut out, &report).context("writing JSON")?;
            writeln!(out)?;
            out.flush().context("writing to stdout")?;
            watch.hold(*hold)?;
            if verified.is_some_and(|v| v.mismatch.is_some()) {
                return Err(crate::export::VerifyFailed.into());
            }
        }
        Command::List { json } => {
            let infos = peerdirect::device_infos()?
                .into_iter()
                .filter(|info| info.provider == Provider::Companion)
                .collect::<Vec<_>>();
            if *json {
                serde_json::to_writer_pretty(&mut out, &infos).context("writing JSON")?;
                writeln!(out)?;
            } else {
                for info in &infos {
                    writeln!(
                        out,
                        "{}  {}  BAR{}  {}",
                        info.path.display(),
                        info.pci_address,
                        info.bar_index,
                        crate::devices::provider(info)
                    )?;
                }
            }
        }
    }
    out.flush().context("writing to stdout")
}
