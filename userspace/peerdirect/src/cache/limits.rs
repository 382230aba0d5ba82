//! How much the registration cache keeps: entries and bytes, from the environment.

use crate::size::{parse_number, parse_size};
use serde::Serialize;

/// The environment variable that bounds the number of cached registrations.
pub const MAX_COUNT_VAR: &str = "PEERDIRECT_MR_CACHE_MAX_COUNT";
/// The environment variable that bounds the bytes the cached registrations cover.
pub const MAX_SIZE_VAR: &str = "PEERDIRECT_MR_CACHE_MAX_SIZE";

/// What the cache may hold before it evicts the least recently used registrations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CacheLimits {
    /// Cached registrations at most. 0 disables caching: every request registers, and the
    /// registration is deregistered when its last handle is dropped.
    pub max_count: usize,
    /// Bytes the cached registrations may cover together. A registration larger than this is
    /// made but not cached ([`super::Uncached::TooLarge`]).
    pub max_bytes: u64,
}

impl CacheLimits {
    /// 4096 registrations: four times libfabric's own MR cache default
    /// (`FI_MR_CACHE_MAX_COUNT`, 1024), since an HBM buffer is typically registered in
    /// several domains (one per NIC) and for several sub-ranges.
    pub const DEFAULT_MAX_COUNT: usize = 4096;
    /// 256 GiB: twice the HBM of the largest Gaudi (Gaudi 3, 128 GiB; Gaudi 2 has 96, the first
    /// Gaudi 32), so that a process can keep a device's whole HBM registered in two domains. A
    /// registration larger than this is not cached, so that a runtime registering its whole
    /// pool once (HCL) and finding buffers in it by address would get a registration of each
    /// buffer instead: the default must hold a whole device. HBM stays pinned while it is
    /// registered: lower it to bound that.
    pub const DEFAULT_MAX_BYTES: u64 = 256 << 30;

    /// Reads [`MAX_COUNT_VAR`] and [`MAX_SIZE_VAR`]. Unset or empty variables take the
    /// defaults; anything else must parse (see [`CacheLimits::parse`]).
    pub fn from_env() -> Result<Self, LimitsError> {
        let read = |variable: &'static str| match std::env::var(variable) {
            Ok(value) => Ok(Some(value)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(value)) => Err(LimitsError {
                variable,
                value: value.to_string_lossy().into_owned(),
                problem: "not valid UTF-8".into(),
            }),
        };
        Self::parse(
            read(MAX_COUNT_VAR)?.as_deref(),
            read(MAX_SIZE_VAR)?.as_deref(),
        )
    }

    /// The limits that the values of [`MAX_COUNT_VAR`] and [`MAX_SIZE_VAR`] ask for, `None`
    /// or empty for the default. The count is a number (decimal, or hex with `0x`); the size
    /// a number with an optional unit `K`, `M`, `G` or `T` (powers of 1024, also `KiB` etc.,
    /// any case), e.g. `64G`.
    pub fn parse(max_count: Option<&str>, max_size: Option<&str>) -> Result<Self, LimitsError> {
        let max_count = match max_count.filter(|text| !text.is_empty()) {
            None => Self::DEFAULT_MAX_COUNT,
            Some(text) => parse_number(text)
                .and_then(|count| {
                    usize::try_from(count).map_err(|_| "too large for this machine".to_owned())
                })
                .map_err(|problem| LimitsError::new(MAX_COUNT_VAR, text, problem))?,
        };
        let max_bytes = match max_size.filter(|text| !text.is_empty()) {
            None => Self::DEFAULT_MAX_BYTES,
            Some(text) => {
                parse_size(text).map_err(|problem| LimitsError::new(MAX_SIZE_VAR, text, problem))?
            }
        };
        Ok(Self {
            max_count,
            max_bytes,
        })
    }
}

impl Default for CacheLimits {
    fn default() -> Self {
        Self {
            max_count: Self::DEFAULT_MAX_COUNT,
            max_bytes: Self::DEFAULT_MAX_BYTES,
        }
    }
}

/// An environment variable with a value the cache cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: {problem}; {}", example(variable))]
pub struct LimitsError {
    /// The variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

impl LimitsError {
    fn new(variable: &'static str, value: &str, problem: String) -> Self {
        Self {
            variable,
            value: value.to_owned(),
            problem,
        }
    }
}

fn example(variable: &str) -> String {
    if variable == MAX_SIZE_VAR {
        format!(
            "set it to a size such as {variable}=16G, or unset it for the default ({}G)",
            CacheLimits::DEFAULT_MAX_BYTES >> 30
        )
    } else {
        format!(
            "set it to a number of registrations such as {variable}=1024 (0 disables the cache), or unset it for the default ({})",
            CacheLimits::DEFAULT_MAX_COUNT
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(count: Option<&str>, size: Option<&str>) -> Result<CacheLimits, LimitsError> {
        CacheLimits::parse(count, size)
    }

    #[test]
    fn unset_or_empty_means_the_defaults() {
        let defaults = CacheLimits {
            max_count: 4096,
            max_bytes: 256 << 30,
        };
        assert_eq!(CacheLimits::default(), defaults);
        assert_eq!(parse(None, None).unwrap(), defaults);
        assert_eq!(parse(Some(""), Some("")).unwrap(), defaults);
    }

    #[test]
    fn sizes_take_units_of_1024() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            ("4K", 4 << 10),
            ("4kib", 4 << 10),
            ("512M", 512 << 20),
            ("16G", 16 << 30),
            ("16GiB", 16 << 30),
            ("2t", 2 << 40),
            ("0x1000", 4096),
        ] {
            assert_eq!(parse(None, Some(text)).unwrap().max_bytes, bytes, "{text}");
        }
    }

    #[test]
    fn counts_are_plain_numbers() {
        assert_eq!(parse(Some("0"), None).unwrap().max_count, 0);
        assert_eq!(parse(Some("100"), None).unwrap().max_count, 100);
        assert_eq!(parse(Some("0x40"), None).unwrap().max_count, 64);
    }

    #[test]
    fn bad_values_say_which_variable_and_what_is_wrong() {
        let err = parse(None, Some("12X")).unwrap_err();
        assert_eq!(err.variable, MAX_SIZE_VAR);
        assert_eq!(
            err.to_string(),
            "PEERDIRECT_MR_CACHE_MAX_SIZE=\"12X\": unknown unit \"X\" (K, M, G or T: powers of \
             1024); set it to a size such as PEERDIRECT_MR_CACHE_MAX_SIZE=16G, or unset it for \
             the default (256G)"
        );
        let err = parse(Some("4k"), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "PEERDIRECT_MR_CACHE_MAX_COUNT=\"4k\": not a number (decimal, or hex with 0x); set \
             it to a number of registrations such as PEERDIRECT_MR_CACHE_MAX_COUNT=1024 (0 \
             disables the cache), or unset it for the default (4096)"
        );
        for (size, problem) in [
            ("G", "not a size"),
            ("-1", "a size cannot be negative"),
            ("-4K", "a size cannot be negative"),
            (" 1G", "not a size"),
            ("1 G", "unknown unit \" G\""),
            ("1.5G", "not a whole number"),
            ("0x", "not a number"),
            ("99999999999T", "does not fit in 64 bits"),
            ("18446744073709551616", "does not fit in 64 bits"),
        ] {
            let err = parse(None, Some(size)).unwrap_err();
            assert!(err.problem.contains(problem), "{size}: {err}");
        }
        let err = parse(None, Some("-1")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "PEERDIRECT_MR_CACHE_MAX_SIZE=\"-1\": a size cannot be negative; set it to a size \
             such as PEERDIRECT_MR_CACHE_MAX_SIZE=16G, or unset it for the default (256G)"
        );
        assert_eq!(
            parse(Some("-1"), None).unwrap_err().problem,
            "a number cannot be negative"
        );
        assert!(parse(Some("1e3"), None).is_err());
    }
}
