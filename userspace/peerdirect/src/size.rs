//! Sizes as people write them: on command lines and in environment variables.
//!
//! Errors say what is wrong with the text without repeating it; callers add the text and where
//! it came from.

/// A number of bytes: a number, then optionally a unit that is a power of 1024. A negative
/// one is refused as such, not as no size.
pub fn parse_size(text: &str) -> Result<u64, String> {
    refuse_negative(text, "a size")?;
    if text.starts_with("0x") || text.starts_with("0X") {
        return parse_number(text);
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        return Err("not a size (a number, then optionally K, M, G or T)".into());
    }
    if unit.starts_with(['.', ',']) {
        return Err(
            "not a whole number (a size in a smaller unit instead: 1536M, not 1.5G)".into(),
        );
    }
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} (K, M, G or T: powers of 1024)"
            ))
        }
    };
    parse_number(number)?
        .checked_mul(1 << shift)
        .ok_or_else(|| "does not fit in 64 bits".into())
}

/// A number: decimal digits, or `0x` and hex digits. A negative one is refused as such.
pub fn parse_number(text: &str) -> Result<u64, String> {
    refuse_negative(text, "a number")?;
    let (digits, radix) = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (text, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err("not a number (decimal, or hex with 0x)".into());
    }
    u64::from_str_radix(digits, radix).map_err(|_| "does not fit in 64 bits".into())
}

/// A minus sign and a digit: a negative number, which neither parser takes. A hyphen before
/// anything else (`--json` given where a size belongs) is left to say it is no number.
fn refuse_negative(text: &str, what: &str) -> Result<(), String> {
    match text.strip_prefix('-') {
        Some(rest) if rest.starts_with(|c: char| c.is_ascii_digit()) => {
            Err(format!("{what} cannot be negative"))
        }
        _ => Ok(()),
    }
}

/// `bytes` in the largest binary unit that keeps it at least 1, with one decimal unless exact.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let exponent = if bytes == 0 { 0 } else { bytes.ilog2() / 10 };
    let unit = 1u64 << (10 * exponent);
    if bytes.is_multiple_of(unit) {
        format!("{} {}", bytes / unit, UNITS[exponent as usize])
    } else {
        format!(
            "{:.1} {}",
            bytes as f64 / unit as f64,
            UNITS[exponent as usize]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_binary_units_and_hex() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert!(parse_size("K").unwrap_err().contains("not a size"));
        assert!(parse_size("4KB").unwrap_err().contains("unknown unit"));
        for fraction in ["1.5G", "1,5G", "0.5"] {
            assert!(
                parse_size(fraction)
                    .unwrap_err()
                    .contains("not a whole number (a size in a smaller unit instead"),
                "{fraction}"
            );
        }
        assert!(parse_size("16777216T")
            .unwrap_err()
            .contains("does not fit"));
        assert_eq!(parse_number("0x2a"), Ok(42));
        assert!(parse_number("4K").unwrap_err().contains("not a number"));
    }

    /// A minus sign before a digit is a negative number, which neither takes; a hyphen before
    /// anything else is no number at all.
    #[test]
    fn negatives_are_refused_as_negative() {
        for text in ["-1", "-4K", "-0x1000", "-1.5G"] {
            assert_eq!(
                parse_size(text),
                Err("a size cannot be negative".into()),
                "{text}"
            );
        }
        for text in ["-7", "-0x2a"] {
            assert_eq!(
                parse_number(text),
                Err("a number cannot be negative".into()),
                "{text}"
            );
        }
        for text in ["-", "-K", "--json"] {
            assert!(
                parse_size(text).unwrap_err().contains("not a size"),
                "{text}"
            );
            assert!(
                parse_number(text).unwrap_err().contains("not a number"),
                "{text}"
            );
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1 KiB");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(human_bytes(16 << 30), "16 GiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
    }
}
