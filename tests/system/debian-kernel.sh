#!/usr/bin/env bash
# peerdirect on the kernel users already have: Debian's own stock trixie-backports kernel and
# modules, unchanged (scripts/debian-kernel), booted under QEMU with peerdirect.ko and the test
# modules built for it the way a user of that kernel builds them (scripts/debian-modules: its
# headers package, the Rust metadata prepared from linux-source, rustc 1.85.1).
# First what the guest is: Debian's kernel, our module loaded into it (only the out-of-tree and
# unsigned taints), Debian's own ib_core and rdma_rxe. Then the guest suites that make sense on
# a distro kernel, each run as it is with PEERDIRECT_KERNEL=debian (qemu/run --kernel debian):
# devices, exporter (alloc-export), CPU mappings, revocation, removal and unload (lifecycle),
# the test importers (importer, pinned), ib_core's own import functions (ibimport), and a
# companion beside Debian's vfio-pci: its removal through the device link, killable, with PCI
# work going on, and its announced reset (companion-revoke). Not
# here: KUnit (Debian builds it as a module we do not ship), kmemleak (Debian has none; the
# suites' --kmemleak scans are skipped), the KASAN races (tests/system/race.sh, on the KASAN
# test kernel) and the peer-memory client (needs the contract-test core's symbols).
# PEERDIRECT_DEBIAN_SUITES="NAME..." runs only those suites after the first checks.
# Plan: this script's own 4 checks of what the guest is, declared first; each suite's TAP is
# relayed with its plan lines as they came (the suite declares them before its checks).
. "$(dirname "$0")/../lib.sh"
# PEERDIRECT_CACHE as the scripts have it, also when this suite runs outside make.
. "$ROOT/scripts/env.sh"
failed=0
fail() { failed=1; not_ok "$@"; }
plan 4
export PEERDIRECT_KERNEL=debian
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

kdir=$("$ROOT/scripts/debian-kernel") || { fail "Debian's kernel packages (scripts/debian-kernel)"; exit 1; }
release=$(cat "$kdir/release") version=$(cat "$kdir/version")
ko=$ROOT/build/kmod-debian/peerdirect.ko
mods=$kdir/modroot/lib/modules/$release

# What the guest runs: Debian's kernel, peerdirect.ko built for it, Debian's RDMA modules.
out=$(guest --rxe -- sh -c 'uname -r; cat /proc/version; cat /proc/sys/kernel/tainted
	for m in peerdirect ib_core rdma_rxe; do
		od -An -tx1 -v /sys/module/$m/notes/.note.gnu.build-id | tr -d " \n" | tail -c 40; echo
	done
	rdma link show rxe0/1 | head -1' 2>"$work/first.err")
rc=$?
# qemu/run's notes (a boot done again) go to stderr, apart from the lines read below.
out+=$'\n'$(cat "$work/first.err")
mapfile -t line <<<"$out"
desc="the guest runs Debian's own kernel: uname -r is $release, /proc/version names Debian $version"
if [ $rc = 0 ] && [ "${line[0]}" = "$release" ] && [[ ${line[1]} == *"Debian $version"* ]]; then
	ok "$desc"
else
	fail "$desc" "qemu/run exited $rc" "$out"
fi
# build_id KO: the GNU build ID of a module file (the kernel shows a loaded one's in sysfs).
build_id() { readelf -n "$1" 2>/dev/null | sed -n 's/^ *Build ID: //p'; }
vermagic=$(modinfo -F vermagic "$ko" 2>&1)
desc="peerdirect.ko built for it has vermagic '$release SMP preempt mod_unload' and is the module the guest loaded (build ID $(build_id "$ko"))"
if [ "${vermagic% }" = "$release SMP preempt mod_unload" ] && [ -n "${line[3]:-}" ] && [ "${line[3]}" = "$(build_id "$ko")" ]; then
	ok "$desc"
else
	fail "$desc" "vermagic: $vermagic" "loaded build ID: ${line[3]:-none}"
fi
# 4096 (O, out-of-tree) + 8192 (E, unsigned): nothing else, no W from a warning, no other taint.
desc="the kernel's taint is out-of-tree and unsigned module (12288) and nothing else"
if [ "${line[2]:-}" = 12288 ]; then ok "$desc"; else fail "$desc" "tainted: ${line[2]:-none}" "$out"; fi
desc="ib_core and rdma_rxe are Debian's own (linux-modules-$release): their build IDs are the package's, and rxe0 is up"
if [ -n "${line[4]:-}" ] && [ "${line[4]}" = "$(build_id "$mods/kernel/drivers/infiniband/core/ib_core.ko")" ] &&
   [ "${line[5]:-}" = "$(build_id "$mods/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko")" ] &&
   [[ ${line[6]:-} == "link rxe0/1 state ACTIVE"* ]]; then
	ok "$desc"
else
	fail "$desc" "$out"
fi

# The suites, unchanged; their TAP lines named after them, numbered in this script, their plan
# lines passed on as they are. Each suite's boots (qemu/run's PEERDIRECT_BOOT_LOG: "KERNEL
# TOPOLOGY NAME" per boot) must all be of Debian's kernel: a suite that asks for a kernel of
# its own would check another kernel under this suite's name.
for suite in ${PEERDIRECT_DEBIAN_SUITES:-devices alloc-export cpu-mapping revoke lifecycle importer pinned ibimport companion-revoke}; do
	echo "# $suite on Debian's kernel"
	: >"$work/$suite.boots"
	PEERDIRECT_BOOT_LOG=$work/$suite.boots bash "$ROOT/tests/system/$suite.sh" >"$work/$suite.tap" 2>&1
	rc=$?
	[ -z "${PEERDIRECT_BOOT_LOG:-}" ] || cat "$work/$suite.boots" >>"$PEERDIRECT_BOOT_LOG"
	n_fail=0
	while IFS= read -r l; do
		case $l in
		"ok "*) ok "debian $release: $suite: $(sed -E 's/^ok [0-9]* ?-? ?//' <<<"$l")" ;;
		"not ok "*) n_fail=$((n_fail + 1)); fail "debian $release: $suite: $(sed -E 's/^not ok [0-9]* ?-? ?//' <<<"$l")" ;;
		"#"*) echo "$l" ;;
		*) if [[ $l =~ ^1\.\.[0-9]+$ ]]; then echo "$l"; else echo "# $l"; fi ;;
		esac
	done <"$work/$suite.tap"
	[ $rc = 0 ] || [ $n_fail != 0 ] || fail "debian $release: $suite exited $rc"
	grep -qE '^1\.\.[0-9]+$' "$work/$suite.tap" || fail "debian $release: $suite declares its plan"
	other=$(grep -v '^debian ' "$work/$suite.boots")
	[ -z "$other" ] || fail "debian $release: $suite: every guest boots Debian's kernel" "boots (kernel topology name):" "$other"
done
exit $failed
