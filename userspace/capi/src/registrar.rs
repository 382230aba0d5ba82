//! The registrar behind a `pd_domain`: a libfabric domain (`pd_domain_attach`) or an ibverbs
//! protection domain (`pd_domain_attach_verbs`), so that one `pd_regcache` serves both, and
//! what a `pd_mr` reads of either kind of registration.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use pd::cache::{DomainId, RegKey};
use pd::registrar::ibverbs::{IbvMr, IbverbsError, IbverbsRegistrar};
use pd::registrar::libfabric::{DmaBufSource, FabricMr, LibfabricRegistrar};
use pd::{Cause, Errno, RegPath, Registrar};

use crate::error::Failure;

/// A `pd_domain`'s registrar.
pub(crate) enum AnyRegistrar {
    Fabric(LibfabricRegistrar),
    Verbs(IbverbsRegistrar),
}

/// A registration of either kind; a libfabric one with its host-bounce reason for C
/// (`pd_mr_reason`), made once when it is registered rather than by every handle.
pub enum AnyMr {
    Fabric(FabricMr, Option<CString>),
    Verbs(IbvMr),
}

impl From<IbverbsError> for Failure {
    fn from(err: IbverbsError) -> Self {
        let errno = match &err {
            IbverbsError::LibraryNotLoaded { .. } | IbverbsError::MissingSymbol { .. } => {
                Errno::NOSYS
            }
            IbverbsError::NoSuchDevice { .. } => Errno::NODEV,
            // The provider cannot register dma-bufs: the same errno as libfabric's refusal.
            _ if err.is_dma_buf_unsupported() => Errno::OPNOTSUPP,
            _ => err.errno().unwrap_or(Errno::IO),
        };
        Failure::new(errno, err.to_string())
    }
}

impl AnyRegistrar {
    /// Host bounce applies to libfabric domains; ibverbs registrations are always direct.
    pub(crate) fn set_host_bounce(&self, allow: bool) {
        if let Self::Fabric(registrar) = self {
            registrar.set_host_bounce(allow);
        }
    }
}

impl Registrar for AnyRegistrar {
    type Source = DmaBufSource;
    type Mr = AnyMr;
    type Error = Failure;

    fn domain(&self) -> DomainId {
        match self {
            Self::Fabric(registrar) => registrar.domain(),
            Self::Verbs(registrar) => registrar.domain(),
        }
    }

    fn register(&self, source: &DmaBufSource, key: &RegKey) -> Result<AnyMr, Failure> {
        match self {
            Self::Fabric(registrar) => registrar
                .register(source, key)
                .map(|mr| {
                    let reason = match mr.path() {
                        // NUL bytes replaced, so `CString::new` cannot fail.
                        RegPath::HostBounce { reason } => {
                            CString::new(reason.replace('\0', " ")).ok()
                        }
                        _ => None,
                    };
                    AnyMr::Fabric(mr, reason)
                })
                .map_err(Failure::from),
            // At IOVA base_addr + offset for pd_register_dmabuf_at, else the offset.
            Self::Verbs(registrar) => registrar
                .register(source, key)
                .map(AnyMr::Verbs)
                .map_err(Failure::from),
        }
    }

    fn deregister(&self, mr: AnyMr) {
        match (self, mr) {
            (Self::Fabric(registrar), AnyMr::Fabric(mr, _)) => registrar.deregister(mr),
            (Self::Verbs(registrar), AnyMr::Verbs(mr)) => registrar.deregister(mr),
            // A registrar only ever gets back its own kind; either way, dropping releases it.
            (_, mr) => drop(mr),
        }
    }

    fn invalidated(&self, key: &RegKey, mr: &AnyMr, cause: Cause) {
        match (self, mr) {
            (Self::Fabric(registrar), AnyMr::Fabric(mr, _)) => {
                registrar.invalidated(key, mr, cause)
            }
            (Self::Verbs(registrar), AnyMr::Verbs(mr)) => registrar.invalidated(key, mr, cause),
            _ => {}
        }
    }
}

/// Where a peer's RMA reaches a registration.
pub(crate) struct Remote {
    pub(crate) addr: u64,
    pub(crate) key: u64,
}

impl AnyMr {
    /// `fi_mr_key`, or the ibverbs remote key.
    pub(crate) fn key(&self) -> u64 {
        match self {
            Self::Fabric(mr, _) => mr.key(),
            Self::Verbs(mr) => u64::from(mr.rkey),
        }
    }

    /// `fi_mr_desc` (0 for ibverbs: work requests take the local key).
    pub(crate) fn desc(&self) -> usize {
        match self {
            Self::Fabric(mr, _) => mr.desc(),
            Self::Verbs(_) => 0,
        }
    }

    /// The ibverbs local key (0 for libfabric).
    pub(crate) fn lkey(&self) -> u32 {
        match self {
            Self::Fabric(..) => 0,
            Self::Verbs(mr) => mr.lkey,
        }
    }

    pub(crate) fn path(&self) -> &RegPath {
        match self {
            Self::Fabric(mr, _) => mr.path(),
            Self::Verbs(mr) => mr.path(),
        }
    }

    /// Why the registration is host bounce, NUL-terminated; `None` when it is direct.
    pub(crate) fn reason(&self) -> Option<&CStr> {
        match self {
            Self::Fabric(_, reason) => reason.as_deref(),
            Self::Verbs(_) => None,
        }
    }

    /// The address local operations name the registration's first byte by, and its length:
    /// the mapping of the dma-buf for libfabric, the IOVA (`ibv_sge.addr`) for ibverbs (the
    /// caller's base address plus the offset, or the offset). `None` for host bounce.
    pub(crate) fn local(&self) -> Option<(u64, u64)> {
        match self {
            Self::Fabric(mr, _) => mr
                .local()
                .map(|(addr, length)| (addr.as_ptr() as u64, length)),
            Self::Verbs(mr) => Some((mr.iova, mr.length)),
        }
    }

    /// What a peer needs to reach the byte at `offset` of the registration (`virt_addr`: the
    /// libfabric domain uses `FI_MR_VIRT_ADDR`; ibverbs always addresses by IOVA). `None` for
    /// host bounce.
    pub(crate) fn remote(&self, offset: u64, virt_addr: bool) -> Option<Remote> {
        match self {
            Self::Fabric(mr, _) => mr.remote(offset, virt_addr).map(|remote| Remote {
                addr: remote.addr,
                key: remote.key,
            }),
            Self::Verbs(mr) => (offset <= mr.length).then(|| Remote {
                addr: mr.iova + offset,
                key: u64::from(mr.rkey),
            }),
        }
    }

    /// The host staging buffer of a host-bounce registration.
    pub(crate) fn staging(&self) -> Option<(NonNull<u8>, usize)> {
        match self {
            Self::Fabric(mr, _) => mr.staging(),
            Self::Verbs(_) => None,
        }
    }
}
