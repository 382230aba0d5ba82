//! `--reseed-rng FILE`: not a test. qemu/init runs it right after a guest is restored from a
//! snapshot (qemu/run): every guest restored from one snapshot starts with the same kernel CRNG
//! state, and the kernel reseeds it only once its seed is old, so each would draw the same
//! "random" bytes at first. The host's random bytes in FILE are credited to the kernel's input
//! pool (`RNDADDENTROPY`) and the CRNG is reseeded from it at once (`RNDRESEEDCRNG`), as a
//! VM generation ID change would (the test kernel has no vmgenid).

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// How many bytes of FILE are used (and credited: they come from the host's getrandom).
const SEED_BYTES: usize = 64;

/// Credits `SEED_BYTES` of `path` to the input pool and reseeds the CRNG; needs CAP_SYS_ADMIN.
pub(crate) fn run(path: &Path) -> Result<(), String> {
    let mut seed = [0u8; SEED_BYTES];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(|e| {
            format!(
                "{}: cannot read {SEED_BYTES} bytes of seed: {e}",
                path.display()
            )
        })?;
    let random = File::options()
        .write(true)
        .open("/dev/urandom")
        .map_err(|e| format!("cannot open /dev/urandom: {e}"))?;
    raw::add_entropy(&random, &seed).map_err(|e| format!("RNDADDENTROPY: {e}"))?;
    raw::reseed_crng(&random).map_err(|e| format!("RNDRESEEDCRNG: {e}"))
}

/// The two ioctls of random(4): the only `unsafe` code of this module.
mod raw {
    use std::os::fd::AsFd;

    use rustix::io::Result;
    use rustix::ioctl::{ioctl, opcode, NoArg, Opcode, Setter};

    use super::SEED_BYTES;

    /// `struct rand_pool_info` with a buffer of `SEED_BYTES`.
    #[repr(C)]
    struct RandPoolInfo {
        entropy_count: i32,
        buf_size: i32,
        buf: [u8; SEED_BYTES],
    }

    /// `RNDADDENTROPY`: `_IOW('R', 0x03, int[2])` (the header's two ints; the buffer follows).
    const RNDADDENTROPY: Opcode = opcode::write::<[i32; 2]>(b'R', 0x03);
    /// `RNDRESEEDCRNG`: `_IO('R', 0x07)`.
    const RNDRESEEDCRNG: Opcode = opcode::none(b'R', 0x07);

    /// Mixes `seed` into the input pool, credited in full (8 bits a byte).
    pub(super) fn add_entropy(random: impl AsFd, seed: &[u8; SEED_BYTES]) -> Result<()> {
        let info = RandPoolInfo {
            entropy_count: (SEED_BYTES * 8) as i32,
            buf_size: SEED_BYTES as i32,
            buf: *seed,
        };
        // SAFETY: RNDADDENTROPY reads a `struct rand_pool_info` (two ints, then `buf_size`
        // bytes) from the pointer and writes nothing; `info` is that layout, `buf_size` is
        // its buffer's length, and it lives until the call returns.
        unsafe { ioctl(random, Setter::<RNDADDENTROPY, RandPoolInfo>::new(info)) }
    }

    /// Reseeds the CRNG from the input pool now.
    pub(super) fn reseed_crng(random: impl AsFd) -> Result<()> {
        // SAFETY: RNDRESEEDCRNG takes no argument and touches no memory of the caller's.
        unsafe { ioctl(random, NoArg::<RNDRESEEDCRNG>::new()) }
    }
}
