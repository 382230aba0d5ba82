//! The deterministic test pattern that `peerdirect export --pattern/--verify` writes and
//! checks, defined so that anyone can recompute it (tests/system/alloc-export.sh does, in
//! Python).
//!
//! Byte `o` of the pattern with seed `s` is byte `o % 8` of word `o / 8` in little-endian
//! order, and word `i` is output `i` (from 0) of SplitMix64 seeded with `s`, all arithmetic
//! modulo 2^64:
//!
//! ```text
//! z = s + (i + 1) * 0x9e3779b97f4a7c15
//! z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
//! z = (z ^ (z >> 27)) * 0x94d049bb133111eb
//! word = z ^ (z >> 31)
//! ```
//!
//! Each word depends on the seed and its index only, so any range can be made or checked on
//! its own.

use std::ops::Range;

/// Word `index` of the pattern with `seed`.
pub fn word(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with bytes `offset..offset + buf.len()` of the pattern with `seed`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    for (position, piece) in pieces(offset, buf.len()) {
        let start = (position % 8) as usize;
        let bytes = word(seed, position / 8).to_le_bytes();
        buf[piece.clone()].copy_from_slice(&bytes[start..start + piece.len()]);
    }
}

/// The first byte of `data` that differs from bytes `offset..offset + data.len()` of the
/// pattern with `seed`.
pub fn first_mismatch(seed: u64, offset: u64, data: &[u8]) -> Option<Mismatch> {
    pieces(offset, data.len()).find_map(|(position, piece)| {
        let start = (position % 8) as usize;
        let bytes = word(seed, position / 8).to_le_bytes();
        let expected = &bytes[start..start + piece.len()];
        let found = &data[piece];
        let k = (0..found.len()).find(|&k| found[k] != expected[k])?;
        Some(Mismatch {
            offset: position + k as u64,
            expected: expected[k],
            found: found[k],
        })
    })
}

/// A byte that is not what the pattern says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Its offset, counted like the pattern's.
    pub offset: u64,
    /// The pattern's byte.
    pub expected: u8,
    /// The byte found.
    pub found: u8,
}

/// Splits `0..len` into ranges that each lie within one pattern word, given that index 0 is
/// pattern byte `offset`; each comes with the pattern byte it starts at.
fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, Range<usize>)> {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= len {
            return None;
        }
        let position = offset + start as u64;
        let end = (start + 8 - (position % 8) as usize).min(len);
        let piece = start..end;
        start = end;
        Some((position, piece))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_splitmix64_outputs() {
        // SplitMix64's reference outputs for seed 0.
        assert_eq!(word(0, 0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(word(0, 1), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(word(42, 0), 0xbdd7_3226_2feb_6e95);
    }

    #[test]
    fn bytes_are_little_endian_words() {
        let mut buf = [0; 16];
        fill(0, 0, &mut buf);
        assert_eq!(buf[..8], 0xe220_a839_7b1d_cdafu64.to_le_bytes());
        assert_eq!(buf[8..], 0x6e78_9e6a_a1b9_65f4u64.to_le_bytes());
    }

    #[test]
    fn any_range_matches_the_whole() {
        let mut whole = [0; 100];
        fill(7, 0, &mut whole);
        for offset in [0, 1, 7, 8, 9, 15, 33] {
            for len in [0, 1, 2, 7, 8, 9, 17, 50] {
                let mut part = vec![0; len];
                fill(7, offset as u64, &mut part);
                assert_eq!(
                    part,
                    whole[offset..offset + len],
                    "offset {offset} len {len}"
                );
                assert_eq!(first_mismatch(7, offset as u64, &part), None);
            }
        }
    }

    #[test]
    fn seeds_differ() {
        let (mut a, mut b) = ([0; 64], [0; 64]);
        fill(1, 0, &mut a);
        fill(2, 0, &mut b);
        assert_ne!(a, b);
        assert!(first_mismatch(1, 0, &b).is_some());
    }

    #[test]
    fn first_mismatch_finds_the_first_changed_byte() {
        let mut buf = [0; 40];
        fill(9, 4096 + 3, &mut buf);
        let expected = buf[21];
        buf[21] ^= 0x10;
        buf[30] ^= 0x01;
        assert_eq!(
            first_mismatch(9, 4096 + 3, &buf),
            Some(Mismatch {
                offset: 4096 + 3 + 21,
                expected,
                found: expected ^ 0x10,
            })
        );
    }

    #[test]
    fn zeroes_are_not_the_pattern() {
        let zeroes = [0; 4096];
        let mismatch = first_mismatch(0, 0, &zeroes).unwrap();
        assert_eq!(mismatch.offset, 0);
        assert_eq!(mismatch.found, 0);
    }
}
