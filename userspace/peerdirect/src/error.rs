//! What went wrong, on which device node, and what to do about it.

use std::fmt;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

/// What the crate was doing when a system call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Listing the device nodes of a directory (normally `/dev`).
    List,
    /// Opening a device node.
    Open,
    /// Opening the control device (`/dev/peerdirect-ctl`).
    OpenControl,
    /// `PEERDIRECT_IOC_INFO`.
    Info,
    /// A command without argument, `_IO(PEERDIRECT_IOCTL_TYPE, nr)`.
    Command(u8),
    /// `PEERDIRECT_IOC_ALLOC`.
    Alloc,
    /// `PEERDIRECT_IOC_FREE`.
    Free,
    /// `PEERDIRECT_IOC_EXPORT`.
    Export,
    /// `PEERDIRECT_IOC_P2P`.
    P2p,
    /// `PEERDIRECT_IOC_EXPORT_RANGE`.
    ExportRange,
    /// `PEERDIRECT_IOC_COMPANION_ADD`.
    CompanionAdd,
    /// `PEERDIRECT_IOC_COMPANION_REMOVE`.
    CompanionRemove,
    /// `PEERDIRECT_IOC_COMPANION_RESET_PREPARE`.
    CompanionResetPrepare,
    /// `PEERDIRECT_IOC_COMPANION_RESET_DONE`.
    CompanionResetDone,
    /// Finding the size of a dma-buf (`lseek(SEEK_END)`).
    Size,
    /// Taking a reference of a caller's dma-buf fd (`fstatfs`, `F_DUPFD_CLOEXEC`).
    Adopt,
    /// `mmap` of a dma-buf.
    Mmap,
    /// `DMA_BUF_IOCTL_SYNC`.
    Sync,
    /// `DMA_BUF_SET_NAME`.
    SetName,
    /// Reading a device's debugfs statistics.
    Stats,
}

impl fmt::Display for Operation {
    /// Reads as a verb phrase in front of a path: "open /dev/peerdirect0".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::List => f.write_str("list"),
            Self::Open | Self::OpenControl => f.write_str("open"),
            Self::Info => f.write_str("PEERDIRECT_IOC_INFO on"),
            Self::Command(nr) => write!(
                f,
                "ioctl _IO({:#x}, {nr:#x}) on",
                crate::uapi::PEERDIRECT_IOCTL_TYPE
            ),
            Self::Alloc => f.write_str("PEERDIRECT_IOC_ALLOC on"),
            Self::Free => f.write_str("PEERDIRECT_IOC_FREE on"),
            Self::Export => f.write_str("PEERDIRECT_IOC_EXPORT on"),
            Self::P2p => f.write_str("PEERDIRECT_IOC_P2P on"),
            Self::ExportRange => f.write_str("PEERDIRECT_IOC_EXPORT_RANGE on"),
            Self::CompanionAdd => f.write_str("PEERDIRECT_IOC_COMPANION_ADD on"),
            Self::CompanionRemove => f.write_str("PEERDIRECT_IOC_COMPANION_REMOVE on"),
            Self::CompanionResetPrepare => f.write_str("PEERDIRECT_IOC_COMPANION_RESET_PREPARE on"),
            Self::CompanionResetDone => f.write_str("PEERDIRECT_IOC_COMPANION_RESET_DONE on"),
            Self::Size => f.write_str("lseek SEEK_END on"),
            Self::Adopt => f.write_str("duplicating"),
            Self::Mmap => f.write_str("mmap"),
            Self::Sync => f.write_str("DMA_BUF_IOCTL_SYNC on"),
            Self::SetName => f.write_str("DMA_BUF_SET_NAME on"),
            Self::Stats => f.write_str("read"),
        }
    }
}

/// Errors of the peerdirect crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed.
    #[error("{operation} {}: {errno}{}", .path.display(), HintSuffix(hint(*.operation, *.errno)))]
    Os {
        /// What was being done.
        operation: Operation,
        /// The device node (or directory) it was done on.
        path: PathBuf,
        /// The error the kernel returned.
        errno: Errno,
    },
    /// The module reported a value this crate does not know, e.g. a newer provider.
    #[error(
        "{} {}: the module reported {field} = {value}, which this version of the peerdirect crate does not know; {UPDATE_HINT}",
        Operation::Info, .path.display()
    )]
    UnknownValue {
        /// The device node.
        path: PathBuf,
        /// The `struct peerdirect_info` field.
        field: &'static str,
        /// Its value.
        value: i64,
    },
    /// A system call on a dma-buf failed.
    #[error("{operation} dma-buf fd {fd}: {errno}{}", HintSuffix(hint(*.operation, *.errno)))]
    DmaBuf {
        /// What was being done.
        operation: Operation,
        /// The dma-buf's file descriptor.
        fd: i32,
        /// The error the kernel returned.
        errno: Errno,
    },
    /// The module answered a command with a value that cannot be right.
    #[error(
        "{operation} {}: the module answered {field} = {value}, which cannot be right; this is a bug in peerdirect.ko",
        .path.display()
    )]
    InvalidReply {
        /// The command.
        operation: Operation,
        /// The device node.
        path: PathBuf,
        /// The field of the command's struct.
        field: &'static str,
        /// Its value.
        value: i64,
    },
    /// The statistics file says something this crate cannot read.
    #[error("{} {}: {problem}; {UPDATE_HINT}", Operation::Stats, .path.display())]
    BadStats {
        /// The statistics file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// There is no debugfs where the statistics should be.
    #[error(
        "{} {}: debugfs is not mounted at {}; {DEBUGFS_HINT}",
        Operation::Stats, .path.display(), .debugfs.display()
    )]
    DebugfsNotMounted {
        /// The statistics file.
        path: PathBuf,
        /// Where debugfs should be mounted.
        debugfs: PathBuf,
    },
    /// A raw request whose `size` claims more bytes than its buffer holds; never sent.
    #[error(
        "{operation} {}: request size {size} exceeds its {capacity}-byte buffer; not sent",
        .path.display()
    )]
    RequestTooLarge {
        /// The command.
        operation: Operation,
        /// The device node.
        path: PathBuf,
        /// The request's `size` field.
        size: u32,
        /// The bytes the request buffer holds.
        capacity: usize,
    },
}

const UPDATE_HINT: &str =
    "the module is newer than this tool: update the peerdirect userspace tools";
const DEBUGFS_HINT: &str = "mount it (as root): mount -t debugfs none /sys/kernel/debug";

impl Error {
    pub(crate) fn os(operation: Operation, path: &Path, errno: Errno) -> Self {
        Self::Os {
            operation,
            path: path.to_owned(),
            errno,
        }
    }

    pub(crate) fn dma_buf(operation: Operation, fd: i32, errno: Errno) -> Self {
        Self::DmaBuf {
            operation,
            fd,
            errno,
        }
    }

    /// The errno, if a system call failed.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Os { errno, .. } | Self::DmaBuf { errno, .. } => Some(*errno),
            Self::UnknownValue { .. }
            | Self::InvalidReply { .. }
            | Self::BadStats { .. }
            | Self::DebugfsNotMounted { .. }
            | Self::RequestTooLarge { .. } => None,
        }
    }

    /// What the user can do about it, when there is something to say.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            Self::Os {
                operation, errno, ..
            }
            | Self::DmaBuf {
                operation, errno, ..
            } => hint(*operation, *errno),
            Self::UnknownValue { .. } | Self::BadStats { .. } => Some(UPDATE_HINT),
            Self::DebugfsNotMounted { .. } => Some(DEBUGFS_HINT),
            Self::InvalidReply { .. } | Self::RequestTooLarge { .. } => None,
        }
    }
}

fn hint(operation: Operation, errno: Errno) -> Option<&'static str> {
    use Operation::*;
    Some(match (operation, errno) {
        (Adopt, Errno::INVAL) => {
            "the fd is not a dma-buf (its file system is not dmabuf): pass the fd its exporter returned"
        }
        (Adopt, Errno::BADF) => {
            "the fd is not open: pass an open fd of the dma-buf (to name a dma-buf again after closing the fd it was registered by, keep another fd of it open)"
        }
        (Mmap, Errno::ACCESS) => {
            "the dma-buf was exported read-only: export it with ExportFlags::RDWR (PEERDIRECT_EXPORT_RDWR) to map it writable"
        }
        (Stats, Errno::ACCESS | Errno::PERM) => "debugfs is readable by root only: run as root",
        (OpenControl, Errno::ACCESS | Errno::PERM) => {
            "the control device is for administrators: run as root"
        }
        (OpenControl, Errno::NOENT | Errno::NXIO | Errno::NODEV) => {
            "no control device: load the module (modprobe peerdirect companion=1)"
        }
        (ExportRange, Errno::OPNOTSUPP) => {
            "only a companion device exports ranges of its BAR (peerdirect companion add); on a device peerdirect owns, allocate and export"
        }
        (ExportRange, Errno::PERM) => {
            "exporting a companion's memory needs CAP_SYS_ADMIN: the caller vouches that the device's owner allocated that range"
        }
        (ExportRange, Errno::INVAL) => {
            "the BAR offset and length must be multiples of the page size, the length above 0, and the range inside the BAR"
        }
        (ExportRange, Errno::OVERFLOW) => "offset + length does not fit in 64 bits",
        (Export | ExportRange, Errno::BUSY) => {
            "the device is being reset, which revokes every export until it is done: try again once it is done (a companion's reset ends with a reset-done for each reset-prepare)"
        }
        (Alloc, Errno::OPNOTSUPP) => {
            "a companion device has no allocator: the driver that owns it (see peerdirect devices) owns its memory; with another device, this tool and the loaded module disagree on the ABI: build both from the same tree"
        }
        (CompanionResetDone, Errno::INVAL) => {
            "no reset of that companion was announced (companion reset-prepare), or it is done already"
        }
        (CompanionResetPrepare, Errno::NODEV) => {
            "the companion is being removed: there is nothing left to revoke"
        }
        (CompanionAdd | CompanionRemove | CompanionResetPrepare | CompanionResetDone, Errno::OPNOTSUPP) => {
            "companion mode is off: load the module with companion=1 (modprobe peerdirect companion=1)"
        }
        (
            CompanionAdd | CompanionRemove | CompanionResetPrepare | CompanionResetDone,
            Errno::PERM | Errno::ACCESS,
        ) => {
            "companion devices are for administrators: run as root (CAP_SYS_ADMIN)"
        }
        (CompanionAdd, Errno::NXIO) => {
            "no PCI device has that address: list them with lspci -D or in /sys/bus/pci/devices"
        }
        (CompanionAdd, Errno::BUSY) => {
            "peerdirect is that device's driver already (see peerdirect devices): a device is either peerdirect's or a companion"
        }
        (CompanionAdd, Errno::EXIST) => "that device is a companion already (see peerdirect devices)",
        (CompanionAdd, Errno::NODEV) => {
            "no driver owns that device (or its driver is unbinding): a companion serves a BAR beside the driver that owns it (habanalabs), so bind that driver first; or let peerdirect own the device instead (its driver_override, README)"
        }
        (CompanionRemove, Errno::INTR) => {
            "the removal was interrupted while it waited for pinned registrations: the companion stays, its exports revoked; the kernel log names the processes that hold them: end them, then remove it again"
        }
        (CompanionAdd, Errno::INVAL) => {
            "the HBM BAR must be a memory BAR 0-5 of the device of at least a page (not a register BAR); name it with --bar (only Gaudi devices have a default)"
        }
        (
            CompanionRemove | CompanionResetPrepare | CompanionResetDone,
            Errno::NOENT,
        ) => "that device is not a companion (see peerdirect devices)",
        (Mmap, Errno::PERM) => {
            "a device file's status page is read-only: map it with PROT_READ (Device::status)"
        }
        (_, Errno::ACCESS | Errno::PERM) => {
            "permission denied: where peerdirect is installed (the peerdirect-dkms package, or make install), its udev rule gives /dev/peerdirect* to the group peerdirect: join it (adduser $USER peerdirect, then log in again), or run as root"
        }
        (Open, Errno::NOENT | Errno::NXIO | Errno::NODEV) => {
            "is peerdirect.ko loaded and the HBM device bound? see README"
        }
        (P2p, Errno::NXIO) => {
            "no PCI device has that address: list them with lspci -D or in /sys/bus/pci/devices"
        }
        (P2p, Errno::INVAL) => {
            "the PCI slot must be below 32 and the function below 8; otherwise this tool and the loaded module disagree on the ABI: build both from the same tree"
        }
        (Info | Command(_) | Alloc | Free | Export | ExportRange | P2p, Errno::NODEV) => {
            "the HBM device was unbound from peerdirect, or the companion removed, while open: reopen it once it is bound again (a companion added again with peerdirect companion add is a new /dev/peerdirectN)"
        }
        (Info | Command(_) | Alloc | Free | Export | P2p, Errno::NOTTY) => {
            "not a peerdirect device, or the peerdirect module is too old for this tool"
        }
        (Alloc, Errno::NOMEM) => {
            "HBM is full or too fragmented for this size/alignment; free allocations or ask for less"
        }
        (Alloc, Errno::INVAL) => {
            "the length must be between 1 and the HBM size, the alignment 0 (2 MiB) or a power of two of at least 4096"
        }
        (Free | Export, Errno::NOENT) => {
            "handle not owned by this open file (freed already, or made by another file)"
        }
        (Export, Errno::INVAL) => {
            "offset and length must be multiples of the page size and lie inside the allocation"
        }
        (Export, Errno::OVERFLOW) => "offset + length does not fit in 64 bits",
        (Export, Errno::MFILE | Errno::NFILE) => {
            "too many open files: close some, or raise the limit (ulimit -n)"
        }
        (Info | Alloc | Free | Export | P2p, Errno::TOOBIG | Errno::INVAL | Errno::OPNOTSUPP) => {
            "ABI mismatch between this tool and the loaded peerdirect module: build both from the same tree"
        }
        (Mmap, Errno::NOMEM) => "not enough address space for the mapping: map a smaller dma-buf",
        (Mmap | Sync, Errno::NODEV) => {
            "the exporter revoked the dma-buf (its device was reset, unbound or removed): its memory is gone; export it again once the device is back"
        }
        (Sync, Errno::INVAL) => {
            "DMA_BUF_IOCTL_SYNC flags must ask for READ and/or WRITE, optionally with END, nothing else"
        }
        (SetName, Errno::INVAL) => "a dma-buf name has at most 31 bytes, none of them NUL",
        (Stats, Errno::NOENT) => {
            "no debugfs entry for this device: is peerdirect.ko loaded, the device bound, and the kernel built with CONFIG_DEBUG_FS?"
        }
        _ => return None,
    })
}

/// Formats as `"; <hint>"` or as nothing.
struct HintSuffix(Option<&'static str>);

impl fmt::Display for HintSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(hint) => write!(f, "; {hint}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(operation: Operation, errno: Errno) -> Error {
        Error::os(operation, Path::new("/dev/peerdirect0"), errno)
    }

    #[test]
    fn open_enoent_asks_whether_the_module_is_loaded() {
        let err = os(Operation::Open, Errno::NOENT);
        assert_eq!(err.errno(), Some(Errno::NOENT));
        assert_eq!(
            err.hint(),
            Some("is peerdirect.ko loaded and the HBM device bound? see README")
        );
        let msg = err.to_string();
        assert!(msg.starts_with("open /dev/peerdirect0: "), "{msg}");
        assert!(
            msg.ends_with("; is peerdirect.ko loaded and the HBM device bound? see README"),
            "{msg}"
        );
    }

    #[test]
    fn permission_errors_point_at_permissions() {
        for operation in [Operation::Open, Operation::Info, Operation::List] {
            for errno in [Errno::ACCESS, Errno::PERM] {
                let hint = os(operation, errno).hint().unwrap();
                assert!(
                    hint.starts_with("permission denied"),
                    "{operation:?} {errno:?}: {hint}"
                );
            }
        }
    }

    #[test]
    fn enotty_means_not_a_peerdirect_device() {
        let err = os(Operation::Info, Errno::NOTTY);
        assert!(err.hint().unwrap().contains("not a peerdirect device"));
        assert!(err
            .to_string()
            .starts_with("PEERDIRECT_IOC_INFO on /dev/peerdirect0: "));
    }

    #[test]
    fn info_argument_errors_mean_abi_mismatch() {
        for errno in [Errno::TOOBIG, Errno::INVAL, Errno::OPNOTSUPP] {
            let hint = os(Operation::Info, errno).hint().unwrap();
            assert!(hint.starts_with("ABI mismatch"), "{errno:?}: {hint}");
        }
    }

    #[test]
    fn unexplained_errors_have_no_hint() {
        let err = os(Operation::Info, Errno::FAULT);
        assert_eq!(err.hint(), None);
        assert!(!err.to_string().contains(';'), "{err}");
        assert_eq!(os(Operation::Open, Errno::NOTTY).hint(), None);
    }

    #[test]
    fn command_names_the_opcode() {
        let err = os(Operation::Command(0x7f), Errno::NOTTY);
        assert!(
            err.to_string()
                .starts_with("ioctl _IO(0xbd, 0x7f) on /dev/peerdirect0: "),
            "{err}"
        );
    }

    #[test]
    fn alloc_enomem_says_hbm_is_full() {
        let err = os(Operation::Alloc, Errno::NOMEM);
        assert_eq!(
            err.hint(),
            Some("HBM is full or too fragmented for this size/alignment; free allocations or ask for less")
        );
        assert!(err
            .to_string()
            .starts_with("PEERDIRECT_IOC_ALLOC on /dev/peerdirect0: "));
    }

    #[test]
    fn enoent_on_a_handle_means_not_owned() {
        for operation in [Operation::Free, Operation::Export] {
            let hint = os(operation, Errno::NOENT).hint().unwrap();
            assert_eq!(
                hint,
                "handle not owned by this open file (freed already, or made by another file)"
            );
        }
        // For ALLOC, ENOENT is not about handles.
        assert_eq!(os(Operation::Alloc, Errno::NOENT).hint(), None);
    }

    /// Both ways of installing, the peerdirect-dkms package and `make install`, install the
    /// udev rule and the group that a permission error tells the user to join.
    #[test]
    fn permission_denied_names_the_group_of_either_install() {
        for operation in [Operation::Open, Operation::Alloc] {
            let hint = os(operation, Errno::ACCESS).hint().unwrap();
            assert_eq!(
                hint,
                "permission denied: where peerdirect is installed (the peerdirect-dkms package, \
                 or make install), its udev rule gives /dev/peerdirect* to the group \
                 peerdirect: join it (adduser $USER peerdirect, then log in again), or run as \
                 root"
            );
        }
    }

    /// An export refused while the device resets says so, and that trying again works.
    #[test]
    fn exports_refused_during_a_reset_say_to_try_again() {
        for operation in [Operation::Export, Operation::ExportRange] {
            let hint = os(operation, Errno::BUSY).hint().unwrap();
            assert!(
                hint.contains("being reset") && hint.contains("try again"),
                "{hint}"
            );
        }
    }

    #[test]
    fn companion_commands_say_what_to_do() {
        let hint = |operation, errno| os(operation, errno).hint().unwrap();
        assert!(hint(Operation::CompanionAdd, Errno::OPNOTSUPP).contains("companion=1"));
        assert!(hint(Operation::CompanionRemove, Errno::PERM).contains("CAP_SYS_ADMIN"));
        assert!(hint(Operation::CompanionAdd, Errno::NXIO).contains("lspci -D"));
        assert!(hint(Operation::CompanionAdd, Errno::BUSY).contains("driver already"));
        assert!(hint(Operation::CompanionAdd, Errno::EXIST).contains("already"));
        assert!(hint(Operation::CompanionAdd, Errno::NODEV).contains("bind that driver first"));
        assert!(hint(Operation::CompanionRemove, Errno::INTR).contains("remove it again"));
        assert!(hint(Operation::CompanionResetDone, Errno::INVAL).contains("reset-prepare"));
        assert!(hint(Operation::CompanionResetPrepare, Errno::NOENT).contains("not a companion"));
        assert!(hint(Operation::CompanionAdd, Errno::INVAL).contains("--bar"));
        assert!(hint(Operation::CompanionRemove, Errno::NOENT).contains("not a companion"));
        assert!(hint(Operation::OpenControl, Errno::ACCESS).contains("run as root"));
        assert!(hint(Operation::OpenControl, Errno::NOENT).contains("companion=1"));
        assert!(hint(Operation::ExportRange, Errno::OPNOTSUPP).contains("only a companion"));
        assert!(hint(Operation::ExportRange, Errno::PERM).contains("CAP_SYS_ADMIN"));
        assert!(hint(Operation::ExportRange, Errno::INVAL).contains("page size"));
        assert!(hint(Operation::ExportRange, Errno::OVERFLOW).contains("64 bits"));
        // Open of a device node keeps its own hint.
        assert!(hint(Operation::Open, Errno::ACCESS).contains("group peerdirect"));
    }

    #[test]
    fn argument_errors_of_the_hbm_commands() {
        assert!(os(Operation::Alloc, Errno::INVAL)
            .hint()
            .unwrap()
            .contains("power of two"));
        assert!(os(Operation::Export, Errno::INVAL)
            .hint()
            .unwrap()
            .contains("page size"));
        assert!(os(Operation::Export, Errno::OVERFLOW)
            .hint()
            .unwrap()
            .contains("64 bits"));
        for operation in [Operation::Alloc, Operation::Free, Operation::Export] {
            for errno in [Errno::TOOBIG, Errno::OPNOTSUPP] {
                let hint = os(operation, errno).hint().unwrap();
                if (operation, errno) == (Operation::Alloc, Errno::OPNOTSUPP) {
                    // A companion device's answer first, the ABI's after it.
                    assert!(
                        hint.starts_with("a companion device has no allocator")
                            && hint.contains("disagree on the ABI"),
                        "{hint}"
                    );
                    continue;
                }
                assert!(
                    hint.starts_with("ABI mismatch"),
                    "{operation:?} {errno:?}: {hint}"
                );
            }
            let hint = os(operation, Errno::NODEV).hint().unwrap();
            assert!(hint.contains("unbound"), "{operation:?}: {hint}");
        }
        assert!(os(Operation::Free, Errno::INVAL)
            .hint()
            .unwrap()
            .starts_with("ABI mismatch"));
    }

    #[test]
    fn read_only_mapping_says_to_export_rdwr() {
        let err = Error::dma_buf(Operation::Mmap, 5, Errno::ACCESS);
        assert_eq!(err.errno(), Some(Errno::ACCESS));
        let msg = err.to_string();
        assert!(msg.starts_with("mmap dma-buf fd 5: "), "{msg}");
        assert!(msg.contains("exported read-only"), "{msg}");
        assert!(err.hint().unwrap().contains("RDWR"));
    }

    #[test]
    fn dma_buf_command_errors() {
        let err = Error::dma_buf(Operation::Sync, 7, Errno::INVAL);
        assert!(err
            .to_string()
            .starts_with("DMA_BUF_IOCTL_SYNC on dma-buf fd 7: "));
        assert!(err.hint().unwrap().contains("READ and/or WRITE"));
        let err = Error::dma_buf(Operation::SetName, 7, Errno::INVAL);
        assert!(err.hint().unwrap().contains("31 bytes"));
        // A revoked dma-buf (a reset, an unbind, a removal) refuses both.
        for operation in [Operation::Mmap, Operation::Sync] {
            let hint = Error::dma_buf(operation, 7, Errno::NODEV).hint().unwrap();
            assert!(hint.contains("revoked the dma-buf"), "{hint}");
            assert!(hint.contains("export it again"), "{hint}");
        }
        assert_eq!(
            Error::dma_buf(Operation::Size, 7, Errno::SPIPE).hint(),
            None
        );
        // A caller's fd closed before it is named again (pd_regcache_invalidate_dmabuf).
        let err = Error::dma_buf(Operation::Adopt, 4, Errno::BADF);
        assert!(
            err.to_string().starts_with("duplicating dma-buf fd 4: "),
            "{err}"
        );
        assert!(err.hint().unwrap().contains("keep another fd of it open"));
    }

    #[test]
    fn stats_errors_say_what_to_do() {
        let path = Path::new("/sys/kernel/debug/peerdirect/peerdirect0/stats");
        let err = Error::os(Operation::Stats, path, Errno::ACCESS);
        assert_eq!(
            err.hint(),
            Some("debugfs is readable by root only: run as root")
        );
        let err = Error::os(Operation::Stats, path, Errno::NOENT);
        assert!(err.hint().unwrap().contains("CONFIG_DEBUG_FS"));
        let err = Error::DebugfsNotMounted {
            path: path.to_owned(),
            debugfs: "/sys/kernel/debug".into(),
        };
        assert_eq!(err.errno(), None);
        assert_eq!(
            err.to_string(),
            format!(
                "read {}: debugfs is not mounted at /sys/kernel/debug; {DEBUGFS_HINT}",
                path.display()
            )
        );
    }

    #[test]
    fn invalid_reply_blames_the_module() {
        let err = Error::InvalidReply {
            operation: Operation::Export,
            path: "/dev/peerdirect0".into(),
            field: "fd",
            value: -1,
        };
        assert_eq!(err.errno(), None);
        assert_eq!(
            err.to_string(),
            "PEERDIRECT_IOC_EXPORT on /dev/peerdirect0: the module answered fd = -1, which cannot be right; this is a bug in peerdirect.ko"
        );
    }

    #[test]
    fn unknown_value_says_to_update() {
        let err = Error::UnknownValue {
            path: "/dev/peerdirect0".into(),
            field: "provider",
            value: 7,
        };
        assert_eq!(err.errno(), None);
        assert_eq!(err.hint(), Some(UPDATE_HINT));
        assert_eq!(
            err.to_string(),
            format!("PEERDIRECT_IOC_INFO on /dev/peerdirect0: the module reported provider = 7, which this version of the peerdirect crate does not know; {UPDATE_HINT}")
        );
    }
}
