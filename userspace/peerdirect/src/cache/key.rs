//! What a registration is keyed by: the domain it lives in, the export it maps, the byte range
//! of that export and the access it grants.

use std::fmt;

use serde::Serialize;

use crate::invalidation::ExportId;

/// The network domain a registration lives in: an `fi_domain`, an ibverbs protection domain,
/// the host-bounce pool. Opaque to the cache; a [`super::Registrar`] picks it, e.g. the
/// address of the domain object, and must not reuse it while registrations in it live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DomainId(pub u64);

impl DomainId {
    /// An id no other domain of the process has had: what the crate's registrars use, so that
    /// a domain closed and another made at the same address are never the same to a cache.
    pub fn unique() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// A non-empty byte range within an export: `offset..offset + length`, ending at or below
/// 2^64 - 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ByteRange {
    offset: u64,
    length: u64,
}

impl ByteRange {
    /// `offset..offset + length`.
    pub const fn new(offset: u64, length: u64) -> Result<Self, RangeError> {
        if length == 0 {
            return Err(RangeError::Empty { offset });
        }
        if offset.checked_add(length).is_none() {
            return Err(RangeError::Overflow { offset, length });
        }
        Ok(Self { offset, length })
    }

    /// Where it starts.
    pub const fn offset(self) -> u64 {
        self.offset
    }

    /// How many bytes it has; never 0.
    pub const fn length(self) -> u64 {
        self.length
    }

    /// One past its last byte.
    pub const fn end(self) -> u64 {
        self.offset + self.length
    }

    /// Whether every byte of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.offset <= other.offset && other.end() <= self.end()
    }
}

impl fmt::Display for ByteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}..{:#x}", self.offset, self.end())
    }
}

/// A byte range that cannot be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Zero bytes.
    #[error("empty byte range at offset {offset:#x}: a registration needs at least one byte")]
    Empty {
        /// The offset asked for.
        offset: u64,
    },
    /// `offset + length` does not fit in 64 bits.
    #[error("byte range {offset:#x} + {length:#x} does not fit in 64 bits")]
    Overflow {
        /// The offset asked for.
        offset: u64,
        /// The length asked for.
        length: u64,
    },
}

bitflags::bitflags! {
    /// What a registration lets the NIC do with the memory. Each registrar translates these
    /// into its own flags (`FI_READ | FI_REMOTE_WRITE ...`, `IBV_ACCESS_*`). A registration
    /// with more access serves requests for less.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct Access: u8 {
        /// Local operations read from it (sends, RDMA write sources).
        const LOCAL_READ = 1 << 0;
        /// Local operations write into it (receives, RDMA read targets).
        const LOCAL_WRITE = 1 << 1;
        /// Peers read from it with RDMA read.
        const REMOTE_READ = 1 << 2;
        /// Peers write into it with RDMA write.
        const REMOTE_WRITE = 1 << 3;
    }
}

/// One registration's identity: the cache hands an entry out for a request with the same
/// domain and export, no more access and a range inside the entry's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegKey {
    /// The domain it lives in.
    pub domain: DomainId,
    /// The export it maps.
    pub export: ExportId,
    /// The bytes of the export it maps.
    pub range: ByteRange,
    /// What it allows.
    pub access: Access,
}

impl RegKey {
    /// Whether a registration of `self` can serve a request for `request`.
    pub fn serves(&self, request: &RegKey) -> bool {
        self.domain == request.domain
            && self.export == request.export
            && self.access.contains(request.access)
            && self.range.contains(request.range)
    }
}

impl fmt::Display for RegKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "domain {:#x} device {} dma-buf inode {} bytes {} access {:?}",
            self.domain.0,
            self.export.device(),
            self.export.dma_buf_inode(),
            self.range,
            self.access
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DmaBuf;

    fn range(offset: u64, length: u64) -> ByteRange {
        ByteRange::new(offset, length).unwrap()
    }

    #[test]
    fn ranges_are_non_empty_and_fit_in_64_bits() {
        assert_eq!(
            ByteRange::new(4096, 0),
            Err(RangeError::Empty { offset: 4096 })
        );
        assert_eq!(
            ByteRange::new(u64::MAX, 1),
            Err(RangeError::Overflow {
                offset: u64::MAX,
                length: 1
            })
        );
        assert_eq!(range(u64::MAX - 1, 1).end(), u64::MAX);
        assert_eq!(
            ByteRange::new(0, 0).unwrap_err().to_string(),
            "empty byte range at offset 0x0: a registration needs at least one byte"
        );
        assert_eq!(range(0x1000, 0x2000).to_string(), "0x1000..0x3000");
    }

    #[test]
    fn containment_includes_both_ends() {
        let outer = range(4096, 8192);
        assert!(outer.contains(outer));
        assert!(outer.contains(range(4096, 1)));
        assert!(outer.contains(range(12287, 1)));
        assert!(!outer.contains(range(4095, 2)));
        assert!(!outer.contains(range(12287, 2)));
        assert!(!range(4096, 1).contains(outer));
    }

    #[test]
    fn a_key_serves_less_access_on_a_sub_range_only() {
        let rw = Access::LOCAL_READ | Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let key = RegKey {
            domain: DomainId(7),
            export: ExportId::new(0, 42),
            range: range(0, 1 << 20),
            access: rw,
        };
        let request = RegKey {
            range: range(4096, 4096),
            access: Access::LOCAL_READ,
            ..key
        };
        assert!(key.serves(&request));
        assert!(!request.serves(&key));
        assert!(!key.serves(&RegKey {
            access: Access::REMOTE_READ,
            ..request
        }));
        assert!(!key.serves(&RegKey {
            domain: DomainId(8),
            ..request
        }));
        assert!(!key.serves(&RegKey {
            export: ExportId::new(1, 42),
            ..request
        }));
        assert!(!key.serves(&RegKey {
            export: ExportId::new(0, 43),
            ..request
        }));
    }

    #[test]
    fn a_file_has_an_identity() {
        let path =
            std::env::temp_dir().join(format!("peerdirect-cache-key-{}", std::process::id()));
        std::fs::write(&path, [0; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let inode = std::os::unix::fs::MetadataExt::ino(&file.metadata().unwrap());
        let dma_buf = DmaBuf::from_fd(file.into()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let id = ExportId::of_dma_buf(3, &dma_buf).unwrap();
        assert_eq!(id, ExportId::new(3, inode));
        assert_eq!((id.device(), id.dma_buf_inode()), (3, inode));
    }
}
