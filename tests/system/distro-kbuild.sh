#!/usr/bin/env bash
# peerdirect.ko for the kernel users already have: Debian's stock trixie-backports kernel.
# In a Debian trixie chroot holding that kernel's headers package (linux-headers-*-amd64, which
# has no Rust metadata), its linux-source tarball and the toolchain it was built with (rustc
# 1.85.1, the kernel's minimum Rust; gcc-14), built by scripts/build-userland trixie-kbuild,
# `make module KDIR=/usr/src/linux-headers-RELEASE` is run as a user of that host would run it:
# scripts/prepare-kbuild rebuilds the Rust metadata once (cached in $PEERDIRECT_CACHE/kbuild),
# then peerdirect.ko builds with rustc 1.85.1, and with clippy 1.85 and warnings as errors.
# Checked: its vermagic is the release's, every
# Rust symbol it imports is in Debian's own Module.symvers with the same crate hash, and a
# rustc that is not the kernel's is refused with what to install. Booting Debian's kernel with
# the module built this way, and the guest suites on it: tests/system/debian-kernel.sh.
. "$(dirname "$0")/../lib.sh"
# PEERDIRECT_CACHE as the scripts have it, also when this suite runs outside make.
. "$ROOT/scripts/env.sh"
# Plan: the chroot, the build, the clippy build, vermagic, the symbols, another rustc refused.
plan 6
failed=0
fail() { failed=1; not_ok "$@"; }

root=$("$ROOT/scripts/build-userland" trixie-kbuild) || {
	fail "the trixie-kbuild chroot (Debian's stock kernel headers and toolchain)" "scripts/build-userland trixie-kbuild failed"
	exit 1
}
headers=$(cd "$root" && ls -d usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1)
release=${headers#usr/src/linux-headers-}
rustc=$(chroot "$root" rustc --version 2>&1)
want=$(sed -n 's/^CONFIG_RUSTC_VERSION_TEXT="\(.*\)"$/\1/p' "$root/$headers/.config" 2>/dev/null)
desc="Debian's headers for $release (no Rust metadata) and the kernel's rustc in the chroot: $rustc"
if [ -n "$release" ] && [ ! -e "$root/$headers/rust/libkernel.rmeta" ] && [ "$rustc" = "$want" ]; then
	ok "$desc"
else
	fail "$desc" "headers: ${headers:-none}; the kernel wants '$want'; has rmeta: $([ -e "$root/$headers/rust/libkernel.rmeta" ] && echo yes || echo no)"
fi

# The project read-only at /peerdirect, the kbuild cache shared with the host's, and a scratch
# build directory: nothing of the host's build/ is touched.
work=$(mktemp -d)
mnt=()
cleanup() {
	local m
	for m in "${mnt[@]}"; do umount "$m" 2>/dev/null || umount -l "$m"; done
	rm -rf "$work"
}
trap cleanup EXIT
bind() { # bind SRC DEST [ro]
	mkdir -p "$2"
	mount --bind "$1" "$2" && mnt=("$2" "${mnt[@]}")
	[ "${3:-}" != ro ] || mount -o remount,bind,ro "$2"
}
mkdir -p "$PEERDIRECT_CACHE/kbuild" "$work/build"
bind "$ROOT" "$root/peerdirect" ro
bind "$PEERDIRECT_CACHE/kbuild" "$root/cache/kbuild"
bind "$work" "$root/work"
bind /proc "$root/proc"
in_root() {
	chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
		PEERDIRECT_CACHE=/cache "$@"
}

in_root make -C /peerdirect BUILD=/work/build module KDIR="/$headers" >"$work/make.log" 2>&1
rc=$?
ko=$work/build/kmod/peerdirect.ko
desc="make module KDIR=/$headers on that host prepares the Rust metadata (once; cached) and builds peerdirect.ko with $rustc"
if [ $rc = 0 ] && [ -f "$ko" ]; then
	ok "$desc"
	grep '^\[peerdirect\]' "$work/make.log" | sed 's/^/# /'
else
	fail "$desc" "make exited $rc" "$(tail -30 "$work/make.log")"
fi

# The kernel community's lint with the kernel's minimum Rust: clippy 1.85 (trixie's
# rust-clippy), Rust and C warnings as errors, as make test does with rustup's toolchain.
tree=$(in_root /peerdirect/scripts/prepare-kbuild "/$headers" 2>/dev/null)
in_root /peerdirect/scripts/build-module /peerdirect /work/lint "$tree" CLIPPY=1 \
	KRUSTFLAGS=-Dwarnings KCFLAGS=-Werror >"$work/lint.log" 2>&1
rc=$?
desc="peerdirect.ko builds with CLIPPY=1 and warnings as errors with $(in_root clippy-driver --version 2>&1 | head -1) (the kernel's minimum Rust)"
if [ $rc = 0 ] && [ -f "$work/lint/peerdirect.ko" ]; then
	ok "$desc"
else
	fail "$desc" "exit $rc" "$(tail -30 "$work/lint.log")"
fi

vermagic=$(in_root modinfo -F vermagic /work/build/kmod/peerdirect.ko 2>&1)
desc="modinfo vermagic of the module is the stock kernel's release: $release SMP preempt mod_unload"
if [ "$vermagic" = "$release SMP preempt mod_unload " ] || [ "$vermagic" = "$release SMP preempt mod_unload" ]; then
	ok "$desc"
else
	fail "$desc" "vermagic: '$vermagic'"
fi

# Every Rust symbol the module imports (core, kernel, pin_init: their crate hashes are in the
# mangled names) is exported by Debian's own kernel under that very name.
imports=$(in_root nm -u /work/build/kmod/peerdirect.ko 2>/dev/null | awk '$1 == "U" && $2 ~ /^_R/ {print $2}' | sort -u)
missing=$(comm -23 <(echo "$imports") <(awk '{print $2}' "$root/$headers/Module.symvers" | sort -u))
n=$(echo "$imports" | grep -c .)
desc="each of the $n Rust symbols peerdirect.ko imports is in Debian's Module.symvers with the same crate hash"
if [ "$n" -gt 20 ] && [ -z "$missing" ]; then
	ok "$desc"
else
	fail "$desc" "missing: $(echo "$missing" | head -5 | tr '\n' ' ')"
fi

# A rustc that is not the kernel's: refused before anything is built, saying what to install.
mkdir -p "$work/wrong"
printf '#!/bin/sh\necho "rustc 1.95.0 (59807616e 2026-04-14)"\n' >"$work/wrong/rustc"
chmod +x "$work/wrong/rustc"
out=$(chroot "$root" /usr/bin/env -i PATH=/work/wrong:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
	PEERDIRECT_CACHE=/work/cache /peerdirect/scripts/prepare-kbuild "/$headers" 2>&1)
rc=$?
desc="prepare-kbuild with another rustc (1.95.0) stops before building and names the kernel's rustc and what to install"
if [ $rc != 0 ] && grep -qF "$want" <<<"$out" && grep -q 'apt install rustc rust-src bindgen' <<<"$out" &&
	[ ! -e "$work/cache/kbuild" ]; then
	ok "$desc"
else
	fail "$desc" "exit $rc" "$out"
fi
exit $failed
