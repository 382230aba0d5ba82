//! Sizes as people write them: on command lines and in environment variables.
//!
//! Errors say what is wrong with the text without repeating it; callers add the text and where
//! it came from.

/// A number of bytes: a number, then optionally a unit that is a power of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
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

/// A number: decimal digits, or `0x` and hex digits.
pub fn parse_number(text: &str) -> Result<u64, String> {
    let (digits, radix) = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (text, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err("not a number (decimal, or hex with 0x)".into());
    }
    u64::from_str_radix(digits, radix).map_err(|_| "does not fit in 64 bits".into())
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
        assert!(parse_size("16777216T")
            .unwrap_err()
            .contains("does not fit"));
        assert_eq!(parse_number("0x2a"), Ok(42));
        assert!(parse_number("4K").unwrap_err().contains("not a number"));
    }
}
