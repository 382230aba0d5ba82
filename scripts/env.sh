# Shared settings for peerdirect's scripts; sourced, not run.
# Everything expensive lives in $PEERDIRECT_CACHE (outside the repo, never committed),
# keyed by the versions that produced it.

PEERDIRECT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERDIRECT_CACHE=${PEERDIRECT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/peerdirect}

# Pinned tool versions (the kernel is the newest linux-source-7.x the archive offers).
LIBCLANG_WHEEL_VERSION=18.1.1
BINDGEN_VERSION=0.73.2
KERNEL_SERIES=7
# clang/lld/llvm from bookworm for the KASAN flavour of the test kernel (Rust + KASAN needs the
# C side built by clang; scripts/build-kernel kasan builds with LLVM=-$LLVM_VERSION).
LLVM_VERSION=19

TOOLS=$PEERDIRECT_CACHE/tools
RUSTC_VERSION=$(rustc --version 2>/dev/null | awk '{print $2}')

log() { printf '[peerdirect] %s\n' "$*" >&2; }
die() { printf '[peerdirect] error: %s\n' "$*" >&2; exit 1; }

# The Rust-for-Linux build environment; olddefconfig silently drops CONFIG_RUST without it.
rust_env() {
	export LIBCLANG_PATH=$TOOLS/libclang-$LIBCLANG_WHEEL_VERSION/lib
	export RUST_LIB_SRC=$TOOLS/rust-src-$RUSTC_VERSION/usr/src/rustc-$RUSTC_VERSION/library
	export PATH=$TOOLS/bindgen-$BINDGEN_VERSION/bin:$PATH
}
