#!/usr/bin/env bash
# The guest's Debian trixie userland (qemu/run --userland trixie, scripts/build-userland):
# libfabric >= 1.20 with its tcp and shm providers and FI_MR_DMABUF, our binaries and modprobe
# inside the chroot; with --rxe, rxe0 is PORT_ACTIVE and libfabric's verbs provider sees it.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Plan: 8 checks of the first boot (Debian, libfabric version, 2 providers, FI_MR_DMABUF in the
# header and in a program, peerdirect, modprobe), 2 of the --rxe boot.
plan 10
failed=0
# fail DESCRIPTION [DIAGNOSTIC...]: not_ok, remembered for the exit status
fail() { failed=1; not_ok "$@"; }

show() { echo "exit status $(cat "$1.rc" 2>/dev/null || echo none):"; cat "$1.out" 2>/dev/null; }

# Boot 1: the userland alone. Every probe keeps its output and status in the shared folder.
mkdir -p "$work/a"
cat >"$work/a/dmabuf.c" <<'EOF'
/* FI_MR_DMABUF and struct fi_mr_dmabuf from libfabric's headers, linked and run. */
#include <stdio.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#ifndef FI_MR_DMABUF
#error "FI_MR_DMABUF is not defined"
#endif
int main(void)
{
	struct fi_mr_dmabuf dmabuf = { .fd = -1, .offset = 0, .len = 4096, .base_addr = NULL };
	struct fi_mr_attr attr = { .dmabuf = &dmabuf, .iov_count = 1, .iface = FI_HMEM_SYSTEM };
	uint32_t v = fi_version();

	printf("FI_MR_DMABUF=%#llx libfabric %u.%u\n", (unsigned long long)FI_MR_DMABUF,
	       FI_MAJOR(v), FI_MINOR(v));
	return !(attr.dmabuf == &dmabuf && v >= FI_VERSION(1, 20));
}
EOF
cat >"$work/a/probe.sh" <<'EOF'
cd /mnt/host
run() { name=$1; shift; "$@" >"$name.out" 2>&1; echo $? >"$name.rc"; }
run debian cat /etc/debian_version
run version fi_info --version
run list fi_info -l
run header grep -Hn 'FI_MR_DMABUF' /usr/include/rdma/fabric.h /usr/include/rdma/fi_domain.h
run dmabuf sh -c 'gcc -Wall -Werror -o /tmp/dmabuf dmabuf.c $(pkg-config --cflags --libs libfabric) && /tmp/dmabuf'
run devices peerdirect devices --json
run modprobe sh -c 'modprobe rdma_rxe && test -d /sys/module/rdma_rxe && echo rdma_rxe loaded'
exit 3
EOF
out=$(guest --userland trixie --share "$work/a" -- sh /mnt/host/probe.sh 2>&1)
rc=$?
cd "$work/a"
if [ $rc = 3 ] && grep -q '^13\.' debian.out 2>/dev/null; then
	ok "qemu/run --userland trixie runs the command in Debian $(cat debian.out) and exits with its status"
else
	fail "qemu/run --userland trixie runs the command in Debian 13 and exits with its status" \
		"qemu/run exited $rc (expected 3; 99: kernel splat, 98: guest died, 124: timeout)" "$out" "$(show debian)"
fi

ver=$(sed -n 's/^libfabric: \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p' version.out 2>/dev/null)
read -r major minor <<<"$ver"
if [ "$(cat version.rc 2>/dev/null)" = 0 ] && [ -n "$ver" ] &&
	{ [ "$major" -gt 1 ] || { [ "$major" = 1 ] && [ "$minor" -ge 20 ]; }; }; then
	ok "fi_info --version: libfabric $major.$minor >= 1.20"
else
	fail "fi_info --version: libfabric >= 1.20" "$(show version)"
fi

for prov in tcp shm; do
	if [ "$(cat list.rc 2>/dev/null)" = 0 ] && grep -qx "$prov:" list.out; then
		ok "fi_info -l lists the $prov provider"
	else
		fail "fi_info -l lists the $prov provider" "$(show list)"
	fi
done

# libfabric 2.1 defines FI_MR_DMABUF in rdma/fi_domain.h; fabric.h only names it in a comment.
if grep -q '^/usr/include/rdma/[a-z_]*\.h:[0-9]*:#define FI_MR_DMABUF' header.out 2>/dev/null; then
	ok "FI_MR_DMABUF is defined in $(sed -n 's|^\(/usr/include/rdma/[a-z_]*\.h\):[0-9]*:#define FI_MR_DMABUF.*|\1|p' header.out | head -1)"
else
	fail "FI_MR_DMABUF is defined in /usr/include/rdma/fabric.h or fi_domain.h" "$(show header)"
fi

if [ "$(cat dmabuf.rc 2>/dev/null)" = 0 ]; then
	ok "a C program using FI_MR_DMABUF and struct fi_mr_dmabuf builds with gcc and pkg-config and runs: $(tail -1 dmabuf.out)"
else
	fail "a C program using FI_MR_DMABUF and struct fi_mr_dmabuf builds with gcc and pkg-config and runs" "$(show dmabuf)"
fi

if [ "$(cat devices.rc 2>/dev/null)" = 0 ] && jq -e 'length >= 1' devices.out >/dev/null 2>&1; then
	ok "peerdirect (built on bookworm) runs in the userland: devices --json reports the HBM device"
else
	fail "peerdirect (built on bookworm) runs in the userland: devices --json reports the HBM device" "$(show devices)"
fi

if [ "$(cat modprobe.rc 2>/dev/null)" = 0 ]; then
	ok "modprobe rdma_rxe works inside the userland (the guest's modules are bound in)"
else
	fail "modprobe rdma_rxe works inside the userland (the guest's modules are bound in)" "$(show modprobe)"
fi
cd /

# Boot 2: --rxe (rdma_rxe on eth0).
mkdir -p "$work/b"
cat >"$work/b/probe.sh" <<'EOF'
cd /mnt/host
run() { name=$1; shift; "$@" >"$name.out" 2>&1; echo $? >"$name.rc"; }
run devinfo ibv_devinfo -d rxe0
run verbs fi_info -p verbs
EOF
out=$(guest --rxe --share "$work/b" -- sh /mnt/host/probe.sh 2>&1)
rc=$?
cd "$work/b"
if [ $rc = 0 ] && [ "$(cat devinfo.rc 2>/dev/null)" = 0 ] && grep -q 'state:[[:space:]]*PORT_ACTIVE' devinfo.out; then
	ok "--rxe: ibv_devinfo -d rxe0 shows PORT_ACTIVE"
else
	fail "--rxe: ibv_devinfo -d rxe0 shows PORT_ACTIVE" "qemu/run exited $rc" "$out" "$(show devinfo)"
fi

if [ "$(cat verbs.rc 2>/dev/null)" = 0 ] && grep -qE '^[[:space:]]*domain: rxe0$' verbs.out; then
	ok "--rxe: fi_info -p verbs lists domain rxe0 ($(grep -cE '^provider: verbs' verbs.out) entries)"
else
	fail "--rxe: fi_info -p verbs lists domain rxe0" "qemu/run exited $rc" "$(show verbs)"
fi
cd /
exit $failed
