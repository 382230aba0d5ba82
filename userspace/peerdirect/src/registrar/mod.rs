//! Registrars: they turn a range of a [`crate::DmaBuf`] into memory a NIC can use, each
//! implementing [`crate::cache::Registrar`] so that a [`crate::RegCache`] decides when.
//!
//! Libraries are loaded at run time (`dlopen`), so one binary runs on hosts with or without
//! libfabric or rdma-core. Every registration says which path it took ([`RegPath`]); a
//! fallback is never silent.
//!
//! Submodules, one per way of registering:
//! - `libfabric`: `fi_mr_regattr` with `FI_MR_DMABUF` (libfabric >= 1.20), and the host-bounce
//!   fallback when a provider refuses dma-buf registrations;
//! - `ibverbs`: `ibv_reg_dmabuf_mr`.

pub mod libfabric;

pub mod ibverbs;

use serde::Serialize;

/// How a registration reaches the memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "path", rename_all = "snake_case")]
pub enum RegPath {
    /// The NIC was given the dma-buf itself (`FI_MR_DMABUF`, `ibv_reg_dmabuf_mr`): it DMAs to
    /// and from HBM directly.
    DmaBuf,
    /// The NIC was given a user virtual address that maps HBM, resolved by a PeerDirect
    /// peer-memory client in the kernel (legacy MLNX_OFED-style stacks).
    PeerMemVa,
    /// The NIC could not take the memory directly; data is staged through a registered host
    /// buffer and copied through the dma-buf's mapping. `reason` says why (the provider's
    /// refusal), so the slow path is never taken silently.
    HostBounce {
        /// Why direct registration was refused.
        reason: String,
    },
}

impl RegPath {
    /// Whether the NIC reaches HBM without a host copy.
    pub fn is_direct(&self) -> bool {
        !matches!(self, Self::HostBounce { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_serialize_with_their_reason() {
        let bounce = RegPath::HostBounce {
            reason: "verbs: fi_mr_regattr(FI_MR_DMABUF): Operation not supported".into(),
        };
        assert!(!bounce.is_direct());
        assert!(RegPath::DmaBuf.is_direct());
        assert_eq!(
            serde_json::to_string(&bounce).unwrap(),
            r#"{"path":"host_bounce","reason":"verbs: fi_mr_regattr(FI_MR_DMABUF): Operation not supported"}"#
        );
        assert_eq!(
            serde_json::to_string(&RegPath::DmaBuf).unwrap(),
            r#"{"path":"dma_buf"}"#
        );
    }
}
