#!/usr/bin/env bash
# HCL's own path: libfabric's verbs provider (verbs;ofi_rxm, libfabric 2.1 in the trixie
# userland) registering peerdirect dma-bufs with FI_MR_DMABUF directly, on the test kernel's
# dma-buf capable soft-RoCE (qemu/run --rxe-dmabuf: qemu/patches/0002 and qemu/rdma-core's
# provider; rxe copies with the CPU through peerdirect's vmap where a NIC would DMA, so this
# proves the software path, not P2P routing, IOMMU or PCIe ordering: Documentation/rdma.md).
#
# One boot on the test kernel, 8 GiB of HBM in a backing file the host reads afterwards:
# - `peerdirect register --provider 'verbs;ofi_rxm' --json`: path dma_buf, no staging;
# - userspace/capi/examples/hcl_pool.c on verbs;ofi_rxm, built against the installed C ABI
#   (make install into a staging tree) with trixie's gcc: HCL's registration pattern, a 4 GiB
#   pool registered once by its fd alone at a device virtual address mapped nowhere in the
#   process, 1,000 buffers found in it by device address, 1 MiB sent between two of them
#   while no address of the pool is mapped in the process (peerdirect's debugfs shows the NIC
#   attached to the pool, pinned), and the one-word flush buffer read by fi_read;
# - `peerdirect-guest-tests --fabric 'verbs;ofi_rxm' --direct`: every registration dma_buf with
#   nothing staged; tagged exchanges, two transfers at once, a truncated receive, a udmabuf,
#   fi_read from host memory into HBM, and fi_read and fi_write HBM to HBM;
# - `peerdirect doctor`: its verbs_dmabuf_mr probe finds rxe0 takes dma-buf MRs, and its
#   fi_mr_dmabuf probe (the provider it picks for rxe0: verbs;ofi_rxm) that a page of HBM
#   registers through libfabric with FI_MR_DMABUF on path dma_buf.
# On the host, every destination the guest reports (the receivers, both RMA destinations,
# hcl_pool's) is checked in the backing file with tests/hbm-pattern.
# Then Debian's stock kernel with the same patched provider: its rxe has no
# reg_user_mr_dmabuf, so the registration falls back to host bounce with the provider's reason,
# and `peerdirect doctor --provider 'verbs;ofi_rxm'` warns of it with that reason.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
hbm=/dev/shm/peerdirect-verbs-direct-$$
trap 'rm -rf "$work" "$hbm"' EXIT
# Plan: the builds (1); after the test kernel's boot: register (1), hcl_pool (1), doctor's
# verbs checks (1) and its fi_mr_dmabuf (1), on the host each of the 4 receivers' HBM (4), the
# three RMA destinations (fi_read from host memory and from HBM, fi_write into HBM: 3) and
# hcl_pool's (1); the Debian kernel's register (1) and doctor (1).
# peerdirect-guest-tests declares its own, relayed.
receivers=4
plan $((1 + 1 + 1 + 2 + receivers + 3 + 1 + 2))
failed=0
fail() { failed=1; not_ok "$@"; }

# The C ABI as a user installs it, and hcl_pool built against it (in the guests' userland).
share=$work/share
mkdir -p "$share"
cp "$ROOT/userspace/capi/examples/hcl_pool.c" "$share/"
desc="make install into a staging tree, and trixie's gcc builds hcl_pool.c (C99, -Werror) with pkg-config --cflags --libs peerdirect libfabric"
if out=$(capi_install "$share") &&
	out=$(in_capi "$share" 'gcc -std=c99 -pedantic -Wall -Wextra -Werror -o /tmp/hcl_pool hcl_pool.c $(pkg-config --cflags --libs peerdirect libfabric) && cp /tmp/hcl_pool .' 2>&1); then
	ok "$desc"
else
	fail "$desc" "$out"
fi

# register first and the guest tests last: each program's HBM is freed when it exits, and
# the next one's allocations start where the last began; what the host checks must be the
# last written there (hcl_pool's destination lies 1 GiB into its pool, above the guest tests'
# ranges).
cat >"$share/direct.sh" <<'EOS'
cd /mnt/host
peerdirect register --provider 'verbs;ofi_rxm' --json >register.json 2>register.err
echo $? >register.rc
FI_UNIVERSE_SIZE=64 LD_LIBRARY_PATH=/mnt/host/stage/usr/local/lib ./hcl_pool 'verbs;ofi_rxm' >pool.out 2>&1
echo $? >pool.rc
peerdirect-guest-tests --fabric 'verbs;ofi_rxm' --direct >tap.out 2>&1
echo $? >tap.rc
RDMAV_FORK_SAFE=1 peerdirect doctor --json >doctor.json 2>doctor.err
echo $? >doctor.rc
EOS
out=$(guest --rxe-dmabuf --hbm 8G --hbm-backing "$hbm" --share "$share" --timeout 900 -- sh /mnt/host/direct.sh 2>&1)
rc=$?
if [ $rc != 0 ] || [ ! -s "$share/tap.out" ]; then
	fail "guest --rxe-dmabuf runs register, hcl_pool and peerdirect-guest-tests --fabric 'verbs;ofi_rxm' --direct" \
		"qemu/run exited $rc" "$out"
fi

desc="peerdirect register --provider 'verbs;ofi_rxm' --json on the dma-buf capable rxe: path dma_buf, nothing staged, no host bounce counted"
if [ "$(cat "$share/register.rc" 2>/dev/null)" = 0 ] &&
	jq -e '.registration.path.path == "dma_buf" and .registration.staging_bytes == 0
		and .paths.dma_buf == 1 and .paths.host_bounce == 0 and .second_request_hit' "$share/register.json" >/dev/null 2>&1; then
	ok "$desc: key $(jq .registration.key "$share/register.json"), domain $(jq -r .domain "$share/register.json")"
else
	fail "$desc" "$(cat "$share/register.json" "$share/register.err" 2>/dev/null)"
fi

desc="hcl_pool on verbs;ofi_rxm (HCL's pattern): the 4 GiB pool registered once at a device address mapped nowhere in the process, path dma_buf; 1,000 buffers found by device address hit that registration; with the pool's registration evicted from a cache of one entry, a buffer found by address registers the whole pool again and a second buffer hits it; 1 MiB sent between two of them while no address of the pool is mapped in the process, the NIC attached to the pool and pinned (peerdirect's debugfs); the one-word flush buffer read with fi_read"
if [ "$(cat "$share/pool.rc" 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' "$share/pool.out" &&
	grep -q '^ok - the 4 GiB pool registered once at 0x100000000000 (a device address, mapped nowhere in the process) on verbs;ofi_rxm: path dma_buf' "$share/pool.out" &&
	grep -q '^ok - 1000 buffers looked up by address .*: 1000 cache hits on the one registration, each at its address and offset, its handle in the caller.s pd_mr_storage$' "$share/pool.out" &&
	grep -q '^ok - bytes past the pool.s end, and an address outside it: ENOENT' "$share/pool.out" &&
	grep -q '^ok - the pool.s registration evicted (a cache of one entry, its handle released): a buffer found by address registers the whole pool again (offset 0x40001000 in it), and a buffer 2 GiB away is a hit on that registration$' "$share/pool.out" &&
	grep -q '^ok - verbs;ofi_rxm sent 1048576 bytes .* with no address of the pool mapped in the process (the NIC moved them: peerdirect.s debugfs lists the pool.s importer=.* pinned=1' "$share/pool.out" &&
	grep -q '^ok - the one-word flush buffer .* read with fi_read into pool + 2 GiB + 4096: 0x68736c662d4c4348$' "$share/pool.out"; then
	ok "$desc"
	sed 's/^/# /' "$share/pool.out"
else
	fail "$desc" "exit status $(cat "$share/pool.rc" 2>/dev/null || echo none)" "$(cat "$share/pool.out" 2>/dev/null)"
fi

desc="peerdirect doctor on the dma-buf capable rxe: verbs_dmabuf_mr ok (ibv_reg_dmabuf_mr of a page of HBM works on rxe0), every verbs check ok, exit status 0"
if [ "$(cat "$share/doctor.rc" 2>/dev/null)" = 0 ] &&
	jq -e 'def s(n): map(select(.name == n))[0];
		(s("verbs_dmabuf_mr").status == "ok") and (s("verbs_dmabuf_mr").detail | test("works on rxe0"))
		and (s("verbs_kernel").status == "ok") and (s("verbs_use_dmabuf").status == "ok")
		and (s("verbs_odp").status == "ok")' "$share/doctor.json" >/dev/null 2>&1; then
	ok "$desc: $(jq -r 'map(select(.name == "verbs_dmabuf_mr"))[0].detail' "$share/doctor.json")"
else
	fail "$desc" "$(cat "$share/doctor.json" "$share/doctor.err" 2>/dev/null)"
fi
desc="peerdirect doctor on the dma-buf capable rxe picks verbs;ofi_rxm for rxe0: fi_mr_dmabuf ok, a page of HBM registered through libfabric with FI_MR_DMABUF on path dma_buf, rxe0 importing the dma-buf"
if [ "$(cat "$share/doctor.rc" 2>/dev/null)" = 0 ] &&
	jq -e 'map(select(.name == "fi_mr_dmabuf"))[0] | .status == "ok" and .fix == null
		and (.detail | test("^verbs;ofi_rxm \\(domain rxe0; the provider of the verbs NIC rxe0\\): fi_mr_regattr\\(FI_MR_DMABUF\\) of a page of HBM took path dma_buf, nothing staged")
			and test("so rxe0 imported the dma-buf"))' "$share/doctor.json" >/dev/null 2>&1; then
	ok "$desc"
	jq -r 'map(select(.name == "fi_mr_dmabuf"))[0].detail | "# " + .' "$share/doctor.json"
else
	fail "$desc" "$(jq -c 'map(select(.name == "fi_mr_dmabuf"))[0]' "$share/doctor.json" 2>/dev/null)" "$(cat "$share/doctor.err" 2>/dev/null)"
fi

relay <"$share/tap.out" || failed=1
[ "$(cat "$share/tap.rc" 2>/dev/null)" = 0 ] || failed=1

# host_check WHAT "OFFSET LENGTH SEED": the backing file holds the pattern there.
host_check() {
	local offset length seed
	read -r offset length seed <<<"$2"
	if [ -n "$seed" ] && diag=$("$ROOT/tests/hbm-pattern" check "$hbm" "$offset" "$length" "$seed" 2>&1); then
		ok "host: $1 (backing file at $offset, $((length >> 10)) KiB) holds its source's pattern"
	else
		fail "host: $1 holds its source's pattern" "reported: '$2'" "${diag:-}"
	fi
}
mapfile -t reported < <(hbm_reported "$share/tap.out" receiver-hbm)
for n in $(seq $receivers); do
	host_check "after verbs transfer $n the receiver's HBM" "${reported[n - 1]:-}"
done
[ ${#reported[@]} = $receivers ] ||
	fail "host: the guest reported the HBM of $receivers receivers, got ${#reported[@]}"
mapfile -t reported < <(hbm_reported "$share/tap.out" rma-hbm)
host_check "the HBM fi_read filled from a peer's host memory" "${reported[0]:-}"
host_check "the HBM fi_read filled from a peer's HBM" "${reported[1]:-}"
[ ${#reported[@]} = 2 ] || fail "host: the guest reported 2 HBM destinations of fi_read, got ${#reported[@]}"
host_check "the peer's HBM fi_write filled" "$(hbm_reported "$share/tap.out" rma-write-hbm)"
host_check "hcl_pool's destination buffer (pool + 1 GiB + 777)" "$(hbm_reported "$share/pool.out" hbm-dst)"

# Debian's stock kernel, the patched provider bound alike: the kernel's rxe refuses.
rm -f "$share"/register.* "$share"/doctor.*
cat >"$share/debian.sh" <<'EOS'
cd /mnt/host
peerdirect register --provider 'verbs;ofi_rxm' --json >register.json 2>register.err
echo $? >register.rc
RDMAV_FORK_SAFE=1 peerdirect doctor --provider 'verbs;ofi_rxm' --json >doctor.json 2>doctor.err
echo $? >doctor.rc
EOS
out=$(guest --kernel debian --rxe-dmabuf --share "$share" -- sh /mnt/host/debian.sh 2>&1)
rc=$?
desc="Debian's kernel (its rxe has no reg_user_mr_dmabuf), the patched provider bound: peerdirect register --provider 'verbs;ofi_rxm' falls back to host_bounce with the provider's reason (fi_mr_regattr(FI_MR_DMABUF): EOPNOTSUPP)"
if [ $rc = 0 ] && [ "$(cat "$share/register.rc" 2>/dev/null)" = 0 ] &&
	jq -e '.registration.path.path == "host_bounce" and (.registration.path.reason | test("fi_mr_regattr\\(FI_MR_DMABUF\\): Operation not supported"))
		and .registration.staging_bytes > 0' "$share/register.json" >/dev/null 2>&1; then
	ok "$desc: $(jq -r .registration.path.reason "$share/register.json")"
else
	fail "$desc" "qemu/run exited $rc" "$(cat "$share/register.json" "$share/register.err" 2>/dev/null)" "$out"
fi
desc="Debian's kernel: peerdirect doctor --provider 'verbs;ofi_rxm' warns that fi_mr_dmabuf will bounce, with the provider's reason (fi_mr_regattr(FI_MR_DMABUF): Operation not supported) and the verbs checks' fix; doctor exits 0"
if [ "$(cat "$share/doctor.rc" 2>/dev/null)" = 0 ] &&
	jq -e 'map(select(.name == "fi_mr_dmabuf"))[0] | .status == "warn"
		and (.detail | test("^verbs;ofi_rxm \\(domain rxe0; --provider\\) refuses a page of HBM: verbs;ofi_rxm: fi_mr_regattr\\(FI_MR_DMABUF\\): Operation not supported")
			and test("fall back to host bounce"))
		and (.fix | test("verbs_dmabuf_mr"))' "$share/doctor.json" >/dev/null 2>&1; then
	ok "$desc"
	jq -r 'map(select(.name == "fi_mr_dmabuf"))[0] | "# " + .detail, "# fix: " + .fix' "$share/doctor.json"
else
	fail "$desc" "exit status $(cat "$share/doctor.rc" 2>/dev/null || echo none)" \
		"$(jq -c 'map(select(.status == "fail" or .name == "fi_mr_dmabuf"))' "$share/doctor.json" 2>/dev/null)" "$(cat "$share/doctor.err" 2>/dev/null)"
fi
exit $failed
