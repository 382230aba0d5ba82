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
    /// `PEERDIRECT_IOC_INFO`.
    Info,
    /// A command without argument, `_IO(PEERDIRECT_IOCTL_TYPE, nr)`.
    Command(u8),
}

impl fmt::Display for Operation {
    /// Reads as a verb phrase in front of a path: "open /dev/peerdirect0".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::List => f.write_str("list"),
            Self::Open => f.write_str("open"),
            Self::Info => f.write_str("PEERDIRECT_IOC_INFO on"),
            Self::Command(nr) => write!(
                f,
                "ioctl _IO({:#x}, {nr:#x}) on",
                crate::uapi::PEERDIRECT_IOCTL_TYPE
            ),
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
    /// A raw request whose `size` claims more bytes than its buffer holds; never sent.
    #[error(
        "{} {}: request size {size} exceeds its {capacity}-byte buffer; not sent",
        Operation::Info, .path.display()
    )]
    RequestTooLarge {
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

impl Error {
    pub(crate) fn os(operation: Operation, path: &Path, errno: Errno) -> Self {
        Self::Os {
            operation,
            path: path.to_owned(),
            errno,
        }
    }

    /// The errno, if a system call failed.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Os { errno, .. } => Some(*errno),
            Self::UnknownValue { .. } | Self::RequestTooLarge { .. } => None,
        }
    }

    /// What the user can do about it, when there is something to say.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            Self::Os {
                operation, errno, ..
            } => hint(*operation, *errno),
            Self::UnknownValue { .. } => Some(UPDATE_HINT),
            Self::RequestTooLarge { .. } => None,
        }
    }
}

fn hint(operation: Operation, errno: Errno) -> Option<&'static str> {
    use Operation::*;
    Some(match (operation, errno) {
        (_, Errno::ACCESS | Errno::PERM) => {
            "permission denied: run as root, or give your user access to /dev/peerdirect* (e.g. with a udev rule)"
        }
        (Open, Errno::NOENT | Errno::NXIO | Errno::NODEV) => {
            "is peerdirect.ko loaded and the HBM device bound? see README"
        }
        (Info | Command(_), Errno::NODEV) => {
            "the HBM device was unbound from peerdirect while open: reopen it once it is bound again"
        }
        (Info | Command(_), Errno::NOTTY) => {
            "not a peerdirect device, or the peerdirect module is too old for this tool"
        }
        (Info, Errno::TOOBIG | Errno::INVAL | Errno::OPNOTSUPP) => {
            "ABI mismatch between this tool and the loaded peerdirect module: build both from the same tree"
        }
        _ => return None,
    })
}

/// Formats as "; <hint>" or as nothing.
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
