//! `peerdirect register`: allocate HBM, export it and register it with a libfabric provider
//! through the registration cache; print the path the registration took (and why, for host
//! bounce), its key and the cache's counters.

use std::io::{self, Write};
use std::sync::Arc;

use anyhow::{Context, Result};
use peerdirect::cache::{Access, ByteRange, ExportId, RegCache};
use peerdirect::registrar::libfabric::{
    self, Fabric, LibfabricError, LibfabricRegistrar, MappedDmaBuf, MrEndpoint,
};
use peerdirect::{Allocation, Device, DmaBuf, ExportFlags, RegPath};
use serde_json::json;

use crate::size::{human_bytes, parse_device, parse_size};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The libfabric provider, as `fi_info -p` names it: tcp, shm, "verbs;ofi_rxm", ...
    #[arg(long, value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub provider: String,
    /// Bytes of HBM to allocate and register (K, M, G, T: powers of 1024).
    #[arg(long, allow_hyphen_values = true, value_name = "SIZE", value_parser = parse_size, default_value = "8M")]
    pub size: u64,
    /// Bind the provider to this local address (FI_SOURCE), e.g. 127.0.0.1.
    #[arg(long, value_name = "ADDR")]
    pub node: Option<String>,
    /// The HBM device: N of /dev/peerdirectN.
    #[arg(long, allow_hyphen_values = true, value_name = "N", value_parser = parse_device, default_value = "0")]
    pub device: u32,
    /// Print a JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Where the domain has `FI_MR_ENDPOINT`, names an endpoint of our own for `registrar`'s
/// registrations to be bound to (the registrar keeps it open as long as it and the
/// registrations need it); elsewhere does nothing.
pub(crate) fn bind_endpoint(registrar: &LibfabricRegistrar) -> Result<()> {
    if registrar.fabric().caps().mr_endpoint {
        let endpoint = registrar
            .fabric()
            .endpoint()
            .context("an endpoint to bind registrations to (FI_MR_ENDPOINT)")?;
        registrar.set_endpoint(Some(MrEndpoint::of(&endpoint)))?;
    }
    Ok(())
}

/// A fresh allocation of `size` bytes of `device`'s HBM, exported whole (read-write).
pub(crate) fn hbm_export(device: &Device, size: u64) -> Result<(Allocation<'_>, DmaBuf)> {
    let allocation = device
        .alloc(size, None)
        .with_context(|| format!("allocating {} of HBM", human_bytes(size)))?;
    let dma_buf = allocation
        .export(0, 0, ExportFlags::CLOEXEC | ExportFlags::RDWR)
        .context("exporting it")?;
    Ok((allocation, dma_buf))
}

/// What path `dma_buf` means for `provider`: whether a NIC imported the dma-buf.
fn dma_buf_path(provider: &str) -> String {
    let core = crate::provider::core_provider(provider);
    let what = if crate::provider::SOFTWARE_PROVIDERS.contains(&core.as_str()) {
        format!("{core} is a software provider: it moves the bytes with the CPU through this process's mapping of HBM, and no NIC imports the dma-buf")
    } else if core == "verbs" || core == "efa" {
        "the NIC imported the dma-buf and reaches HBM directly".to_owned()
    } else {
        "the provider was handed the dma-buf's fd".to_owned()
    };
    format!("dma_buf (FI_MR_DMABUF: {what})")
}

pub fn run(args: &Args) -> Result<()> {
    // libfabric first: on a host without it, that is the thing to fix.
    let fabric = Fabric::open(&args.provider, args.node.as_deref()).map_err(|e| match &e {
        LibfabricError::Call {
            call: "fi_getinfo", ..
        } if e.errno() == Some(peerdirect::Errno::NODATA) => anyhow::anyhow!(
            "{e}: libfabric offers no provider {:?} with the reliable-datagram tagged endpoints \
             (FI_EP_RDM) this command opens{}; `fi_info -l` lists the providers (verbs has such \
             endpoints only under ofi_rxm: 'verbs;ofi_rxm')",
            args.provider,
            args.node
                .as_deref()
                .map(|node| format!(" bound to {node} (--node names an address of this host)"))
                .unwrap_or_default(),
        ),
        _ => e.into(),
    })?;
    let version = libfabric::version()?;
    let caps = fabric.caps().clone();
    let registrar = Arc::new(LibfabricRegistrar::new(fabric));
    bind_endpoint(&registrar)?;
    let device = Device::open_index(args.device)?;
    crate::size::check_alloc_size(&device, args.size)?;
    let (allocation, dma_buf) = hbm_export(&device, args.size)?;
    let export = ExportId::of_dma_buf(args.device, &dma_buf)
        .with_context(|| format!("fstat of dma-buf of {}", device.path().display()))?;
    let hbm = MappedDmaBuf::new(dma_buf)?;
    let cache = RegCache::from_env()?;
    let range = ByteRange::new(0, allocation.length())?;
    let mr = cache.get(&registrar, &hbm, export, range, Access::all())?;
    // A second request inside the first: served by the cache.
    let again = cache.get(&registrar, &hbm, export, range, Access::LOCAL_READ)?;
    let stats = cache.stats();
    let path = mr.mr().path().clone();
    let mut out = io::stdout().lock();
    if args.json {
        let value = json!({
            "provider": caps.provider,
            "domain": caps.domain,
            "libfabric": version,
            "caps": caps,
            "length": allocation.length(),
            "registration": {
                "path": path,
                "key": mr.mr().key(),
                "desc": mr.mr().desc(),
                "staging_bytes": mr.mr().staging_bytes(),
                "uncached": mr.uncached(),
            },
            "second_request_hit": stats.hits == 1 && again.mr().key() == mr.mr().key(),
            "cache": stats,
            "paths": registrar.path_stats(),
        });
        serde_json::to_writer_pretty(&mut out, &value).context("writing JSON to stdout")?;
        writeln!(out).context("writing to stdout")?;
    } else {
        let how = match &path {
            RegPath::DmaBuf => dma_buf_path(&caps.provider),
            RegPath::PeerMemVa => "peer_mem_va".to_owned(),
            RegPath::HostBounce { reason } => {
                format!("host_bounce (staged through host memory) because {reason}")
            }
        };
        writeln!(
            out,
            "{} of HBM on {} registered with libfabric {version} provider {} domain {}\npath: {how}\nkey: {:#x}\ncache: {} hits, {} misses, {} entries",
            human_bytes(allocation.length()),
            device.path().display(),
            caps.provider,
            caps.domain,
            mr.mr().key(),
            stats.hits,
            stats.misses,
            stats.entries,
        )
        .context("writing to stdout")?;
    }
    out.flush().context("writing to stdout")?;
    drop((again, mr));
    cache.invalidate_export(export);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::dma_buf_path;

    /// Path dma_buf says whether a NIC imported the dma-buf: not for a software provider.
    #[test]
    fn the_dma_buf_path_says_whether_a_nic_imported_it() {
        assert!(dma_buf_path("tcp").contains("tcp is a software provider"));
        assert!(!dma_buf_path("tcp").contains("reaches HBM"));
        assert!(dma_buf_path("shm").contains("no NIC imports the dma-buf"));
        assert!(dma_buf_path("verbs;ofi_rxm").contains("the NIC imported the dma-buf"));
        assert!(dma_buf_path("efa").contains("reaches HBM directly"));
        assert!(dma_buf_path("psm3").contains("handed the dma-buf's fd"));
    }
}
