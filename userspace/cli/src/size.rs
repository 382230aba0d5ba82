//! Byte counts and numbers on the command line and in output.

/// Parses a byte count: decimal digits with an optional binary unit (`K`, `M`, `G`, `T`, any
/// case, optionally followed by `iB`: powers of 1024), or `0x` and hex digits.
///
/// The options that take one (or a number) are declared with `allow_hyphen_values`, so that
/// `--size -1` reaches this parser, which says (as the crate's does) that a size cannot be
/// negative, instead of clap taking `-1` for an unknown flag.
pub fn parse_size(text: &str) -> Result<u64, String> {
    peerdirect::size::parse_size(text).map_err(|problem| format!("{text:?}: {problem}"))
}

/// Parses a number: decimal digits, or `0x` and hex digits; not a negative one.
pub fn parse_number(text: &str) -> Result<u64, String> {
    peerdirect::size::parse_number(text).map_err(|problem| format!("{text:?}: {problem}"))
}

/// Parses a device number, N of /dev/peerdirectN: a number ([`parse_number`]) of 32 bits.
pub fn parse_device(text: &str) -> Result<u32, String> {
    const WHAT: &str = "a device is N of /dev/peerdirectN, such as 0";
    let number = parse_number(text).map_err(|problem| format!("{problem}; {WHAT}"))?;
    u32::try_from(number).map_err(|_| format!("{text:?}: does not fit in 32 bits; {WHAT}"))
}

/// Parses a number of seconds ([`parse_number`]).
pub fn parse_seconds(text: &str) -> Result<u64, String> {
    parse_number(text).map_err(|problem| format!("{problem}; give whole seconds, 0 for none"))
}

/// Parses an alignment: a byte count ([`parse_size`]) that is a power of two of at least the
/// page size (4 KiB).
pub fn parse_align(text: &str) -> Result<u64, String> {
    let align = parse_size(text)?;
    if align.is_power_of_two() && align >= 4096 {
        Ok(align)
    } else {
        Err(format!(
            "{text:?}: an alignment is a power of two of at least 4K (4096)"
        ))
    }
}

/// Checks a `--size` of HBM to allocate on `device` before asking the module, which would say
/// only that the length or the alignment is wrong: at least 1 byte, at most the device's HBM.
pub fn check_alloc_size(device: &peerdirect::Device, size: u64) -> anyhow::Result<()> {
    let hbm = device.info()?.hbm_bytes;
    if size == 0 || size > hbm {
        anyhow::bail!(
            "--size {}: ask for 1 byte to the {} of HBM {} has",
            human_bytes(size),
            human_bytes(hbm),
            device.path().display()
        );
    }
    Ok(())
}

/// `bytes` in the largest binary unit that keeps it at least 1, with one decimal unless exact.
pub use peerdirect::size::human_bytes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_binary_units() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            ("4K", 4096),
            ("4k", 4096),
            ("4KiB", 4096),
            ("64K", 64 << 10),
            ("2M", 2 << 20),
            ("2mib", 2 << 20),
            ("1G", 1 << 30),
            ("3T", 3 << 40),
            ("0x1000", 4096),
            ("0X200000", 2 << 20),
            ("16777215T", 16777215 << 40),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn bad_sizes_are_refused() {
        for (text, problem) in [
            ("", "not a size"),
            ("K", "not a size"),
            ("-1", "cannot be negative"),
            ("4.5M", "not a whole number"),
            ("4X", "unknown unit"),
            ("4KB", "unknown unit"),
            ("4 K", "unknown unit"),
            ("0x", "not a number"),
            ("0x1K", "not a number"),
            ("16777216T", "does not fit in 64 bits"),
            ("18446744073709551616", "does not fit in 64 bits"),
        ] {
            let err = parse_size(text).unwrap_err();
            assert!(err.contains(problem), "{text:?}: {err}");
        }
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn negative_sizes_and_numbers_say_so() {
        for text in ["-1", "-4K", "-0x1000"] {
            let err = parse_size(text).unwrap_err();
            assert_eq!(err, format!("{text:?}: a size cannot be negative"));
        }
        assert_eq!(
            parse_align("-4K").unwrap_err(),
            "\"-4K\": a size cannot be negative"
        );
        assert_eq!(
            parse_number("-7").unwrap_err(),
            "\"-7\": a number cannot be negative"
        );
        // A hyphen without digits is no number at all.
        assert!(parse_size("--json").unwrap_err().contains("not a size"));
        assert!(parse_size("-").unwrap_err().contains("not a size"));
    }

    #[test]
    fn alignments_are_powers_of_two_of_at_least_4k() {
        assert_eq!(parse_align("4K"), Ok(4096));
        assert_eq!(parse_align("2M"), Ok(2 << 20));
        for text in ["0", "3K", "2K", "6M"] {
            let err = parse_align(text).unwrap_err();
            assert!(
                err.contains("a power of two of at least 4K"),
                "{text:?}: {err}"
            );
        }
        assert!(parse_align("x").unwrap_err().contains("not a size"));
    }

    #[test]
    fn numbers_are_decimal_or_hex() {
        assert_eq!(parse_number("42"), Ok(42));
        assert_eq!(parse_number("0x2a"), Ok(42));
        assert_eq!(parse_number("0xFFFFFFFFFFFFFFFF"), Ok(u64::MAX));
        assert!(parse_number("4K").is_err());
        assert!(parse_number("0x10000000000000000").is_err());
        assert!(parse_number("+1").is_err());
    }
}
