#!/usr/bin/env bash
# The libfabric registrar in the trixie userland (libfabric 2.1): `peerdirect-guest-tests
# --fabric tcp` (path dma_buf through FI_MR_DMABUF, a tagged HBM-to-HBM exchange between two
# endpoints, 10,000 register/deregister cycles without fd or dma-buf leaks with the cache on
# and off, a registration over 4 GiB with --hbm 8G), `peerdirect register --provider tcp
# --json` and `FI_PROVIDER=tcp peerdirect doctor` (its fi_mr_dmabuf: dma_buf through tcp, which
# uses the CPU mapping, no NIC), `doctor --provider bogus` (fails); then under --rxe, `--fabric 'verbs;ofi_rxm'`: both registrations take host_bounce
# with the provider's reason and the same exchange runs through the staging buffers. After
# each exchange the receiver's HBM is checked on the host in the --hbm-backing file. Last,
# `peerdirect doctor` on the rxe host: passing (its fi_mr_dmabuf a warning: verbs;ofi_rxm
# bounces, with the provider's reason), warning (no RDMAV_FORK_SAFE) and failing (device
# unbound). Then the tcp cases again on a companion device (--companion: ranges of
# its BAR exported with EXPORT_RANGE, the device bound to vfio-pci), checked the same way.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
hbm=/dev/shm/peerdirect-fabric-$$
hbm_rxe=/dev/shm/peerdirect-fabric-rxe-$$
hbm_companion=/dev/shm/peerdirect-fabric-companion-$$
trap 'rm -rf "$work" "$hbm" "$hbm_rxe" "$hbm_companion"' EXIT
failed=0
fail() { failed=1; not_ok "$@"; }
# Plan: this script's own checks, declared first: after the tcp boot, register (1), its text
# output and its refusal of an unknown provider (1), doctor's fi_mr_dmabuf through tcp (1) and
# its failure for an unknown provider named with --provider (1), each of the 4 receivers' HBM on the host (4) and fi_read's (1);
# after the rxe boot, each receiver's HBM (4), register (1) and doctor (5); after the companion
# boot, each receiver's HBM (4) and fi_read's (1). The three runs of peerdirect-guest-tests
# --fabric declare their own, passed through by relay.
receivers=4
plan $(((1 + 1 + 1 + 1 + receivers + 1) + (receivers + 1 + 5) + (receivers + 1)))

cat >"$work/tcp.sh" <<'EOS'
cd /mnt/host
peerdirect register --provider tcp --node 127.0.0.1 --json >register.json 2>register.err
echo $? >register.rc
peerdirect register --provider tcp --node 127.0.0.1 >register.txt 2>&1
echo $? >register-txt.rc
peerdirect register --provider bogus >register-bogus.txt 2>&1
echo $? >register-bogus.rc
peerdirect doctor --provider bogus --json >doctor-bogus.json 2>doctor-bogus.err
echo $? >doctor-bogus.rc
FI_PROVIDER=tcp RDMAV_FORK_SAFE=1 peerdirect doctor --json >doctor-tcp.json 2>doctor-tcp.err
echo $? >doctor-tcp.rc
peerdirect-guest-tests --fabric tcp >tap.out 2>&1
echo $? >tap.rc
EOS
out=$(guest --userland trixie --hbm 8G --hbm-backing "$hbm" --share "$work" -- sh /mnt/host/tcp.sh 2>&1)
rc=$?
if [ $rc != 0 ] || [ ! -s "$work/tap.out" ]; then
	fail "guest --userland trixie --hbm 8G runs peerdirect-guest-tests --fabric tcp" "qemu/run exited $rc" "$out"
fi
relay <"$work/tap.out" || failed=1
if [ "$(cat "$work/tap.rc" 2>/dev/null)" != 0 ]; then failed=1; fi

if [ "$(cat "$work/register.rc" 2>/dev/null)" = 0 ] &&
	jq -e '.provider == "tcp" and .registration.path.path == "dma_buf" and .paths.dma_buf == 1 and .second_request_hit' "$work/register.json" >/dev/null 2>&1; then
	ok "peerdirect register --provider tcp --json: path $(jq -c .registration.path "$work/register.json"), key $(jq .registration.key "$work/register.json"), libfabric $(jq -r .libfabric "$work/register.json")"
else
	fail "peerdirect register --provider tcp --json reports path dma_buf" "$(cat "$work/register.json" "$work/register.err" 2>/dev/null)"
fi
# The text says tcp moves the bytes with the CPU: no NIC reaches HBM. An unknown provider is
# refused with what to do.
desc="peerdirect register --provider tcp says path dma_buf with no NIC importing the dma-buf (tcp, a software provider, copies with the CPU); --provider bogus exits 1 saying that libfabric offers no such provider and how to list them"
if [ "$(cat "$work/register-txt.rc" 2>/dev/null)" = 0 ] &&
	grep -q '^path: dma_buf (FI_MR_DMABUF: tcp is a software provider: it moves the bytes with the CPU through this process.s mapping of HBM, and no NIC imports the dma-buf)$' "$work/register.txt" &&
	[ "$(cat "$work/register-bogus.rc" 2>/dev/null)" = 1 ] &&
	grep -q 'libfabric offers no provider "bogus" with the reliable-datagram tagged endpoints (FI_EP_RDM) this command opens; `fi_info -l` lists the providers' "$work/register-bogus.txt"; then
	ok "$desc"
else
	fail "$desc" "$(cat "$work/register.txt" "$work/register-bogus.txt" 2>/dev/null)"
fi
# tcp takes FI_MR_DMABUF and ignores the fd: it reaches the page through the CPU mapping
# (base_addr). doctor must call that direct in libfabric's terms only, never a NIC's import.
desc="FI_PROVIDER=tcp peerdirect doctor: fi_mr_dmabuf tries tcp (FI_PROVIDER's), path dma_buf, ok, and says tcp takes FI_MR_DMABUF without using the fd, through this process's CPU mapping of the dma-buf: no NIC imported it"
if jq -e 'map(select(.name == "fi_mr_dmabuf"))[0] | .status == "ok" and .fix == null
		and (.detail | test("^tcp \\(domain [^;]+; FI_PROVIDER\\): fi_mr_regattr\\(FI_MR_DMABUF\\) of a page of HBM took path dma_buf, nothing staged")
			and test("direct in libfabric.s terms only: tcp is a software provider, which takes FI_MR_DMABUF without using the fd")
			and test("CPU mapping of the dma-buf") and test("no NIC imported it")
			and (test("imported the dma-buf|reaches HBM itself") | not))' "$work/doctor-tcp.json" >/dev/null 2>&1; then
	ok "$desc"
	jq -r 'map(select(.name == "fi_mr_dmabuf"))[0].detail | "# " + .' "$work/doctor-tcp.json"
else
	fail "$desc" "exit status $(cat "$work/doctor-tcp.rc" 2>/dev/null || echo none)" \
		"$(jq -c 'map(select(.name == "fi_mr_dmabuf"))[0]' "$work/doctor-tcp.json" 2>/dev/null)" "$(cat "$work/doctor-tcp.err" 2>/dev/null)"
fi
# A provider the user names that libfabric does not have is a failure of doctor's, as it is
# of register's: not a skip with exit 0.
desc="peerdirect doctor --provider bogus: fi_mr_dmabuf fails, naming bogus and that libfabric offers no such provider, its fix saying that fi_info -l lists them; doctor exits 1"
if [ "$(cat "$work/doctor-bogus.rc" 2>/dev/null)" = 1 ] &&
	jq -e 'map(select(.name == "fi_mr_dmabuf"))[0] | .status == "fail"
		and (.detail | startswith("bogus (--provider): libfabric offers no such provider"))
		and (.fix | test("`fi_info -l` lists the providers"))' "$work/doctor-bogus.json" >/dev/null 2>&1 &&
	grep -q '^peerdirect: [0-9]* check(s) failed$' "$work/doctor-bogus.err"; then
	ok "$desc"
	jq -r 'map(select(.name == "fi_mr_dmabuf"))[0] | "# " + .detail, "# fix: " + .fix' "$work/doctor-bogus.json"
else
	fail "$desc" "exit status $(cat "$work/doctor-bogus.rc" 2>/dev/null || echo none)" \
		"$(jq -c 'map(select(.status == "fail"))' "$work/doctor-bogus.json" 2>/dev/null)" "$(cat "$work/doctor-bogus.err" 2>/dev/null)"
fi

# receiver_hbm PROVIDER BACKING: each receiver's HBM of the guest's transfers (their "#
# receiver-hbm" lines in tap.out: the exchange, two concurrent transfers, the exchange after a
# truncated receive), read on the host: the sender's pattern (independent SplitMix64).
# Always $receivers checks, one per receiver the guest should have reported; fewer or more
# reported fail a check of their own.
receiver_hbm() {
	local offset length seed n reported=()
	mapfile -t reported < <(hbm_reported "$work/tap.out" receiver-hbm)
	for n in $(seq $receivers); do
		read -r offset length seed <<<"${reported[n - 1]:-}"
		if [ -n "$seed" ] && "$ROOT/tests/hbm-pattern" check "$2" "$offset" "$length" "$seed"; then
			ok "host: after $1 transfer $n the receiver's HBM (backing file at $offset, $((length >> 20)) MiB) holds the sender's pattern"
		else
			fail "host: after $1 transfer $n the receiver's HBM holds the sender's pattern" "offset '$offset' length '$length' seed '$seed'"
		fi
	done
	[ ${#reported[@]} = $receivers ] || fail "host: the guest reported the HBM of $receivers receivers for $1 (the exchange, two concurrent transfers, the exchange after a truncated receive), got ${#reported[@]}"
}
receiver_hbm tcp "$hbm"
# rma_hbm WHAT BACKING: the HBM that tcp's fi_read filled (its "# rma-hbm" line in tap.out).
rma_hbm() {
	local offset length seed
	read -r offset length seed < <(hbm_reported "$work/tap.out" rma-hbm)
	if [ -n "$offset" ] && "$ROOT/tests/hbm-pattern" check "$2" "$offset" "$length" "$seed"; then
		ok "host: the HBM that $1's fi_read filled (backing file at $offset, $((length >> 20)) MiB) holds the peer's bytes"
	else
		fail "host: the HBM that $1's fi_read filled holds the peer's bytes" "offset '$offset' length '$length'"
	fi
}
rma_hbm tcp "$hbm"

rm -f "$work"/*.out "$work"/*.rc
cat >"$work/rxe.sh" <<'EOS'
cd /mnt/host
peerdirect-guest-tests --fabric 'verbs;ofi_rxm' >tap.out 2>&1
echo $? >tap.rc
peerdirect register --provider 'verbs;ofi_rxm' --json >register.json 2>register.err
echo $? >register.rc
RDMAV_FORK_SAFE=1 peerdirect doctor --json >doctor-ok.json 2>doctor-ok.err
echo $? >doctor-ok.rc
env -u RDMAV_FORK_SAFE peerdirect doctor >doctor-warn.txt 2>&1
echo $? >doctor-warn.rc
RDMAV_FORK_SAFE=1 FI_VERBS_USE_DMABUF=0 FI_VERBS_USE_ODP=1 peerdirect doctor --json >doctor-verbs.json 2>doctor-verbs.err
echo $? >doctor-verbs.rc
# Last: with the HBM device unbound, the devices check fails and so does doctor.
for d in /sys/bus/pci/drivers/peerdirect/0000:*; do echo "${d##*/}" >/sys/bus/pci/drivers/peerdirect/unbind; done
RDMAV_FORK_SAFE=1 peerdirect doctor --json >doctor-fail.json 2>doctor-fail.err
echo $? >doctor-fail.rc
EOS
out=$(guest --rxe --hbm-backing "$hbm_rxe" --share "$work" -- sh /mnt/host/rxe.sh 2>&1)
rc=$?
if [ $rc != 0 ] || [ ! -s "$work/tap.out" ]; then
	fail "guest --rxe runs peerdirect-guest-tests --fabric 'verbs;ofi_rxm'" "qemu/run exited $rc" "$out"
fi
relay <"$work/tap.out" || failed=1
if [ "$(cat "$work/tap.rc" 2>/dev/null)" != 0 ]; then failed=1; fi
receiver_hbm "'verbs;ofi_rxm'" "$hbm_rxe"
if [ "$(cat "$work/register.rc" 2>/dev/null)" = 0 ] &&
	jq -e '.registration.path.path == "host_bounce" and (.registration.path.reason | test("FI_MR_DMABUF"))' "$work/register.json" >/dev/null 2>&1; then
	ok "peerdirect register --provider 'verbs;ofi_rxm' --json: $(jq -c .registration.path "$work/register.json")"
else
	fail "peerdirect register --provider 'verbs;ofi_rxm' --json reports host_bounce with a reason" "$(cat "$work/register.json" "$work/register.err" 2>/dev/null)"
fi
desc="peerdirect doctor --json on rxe with RDMAV_FORK_SAFE=1: module, devices, p2p (rxe0's NIC below the switch), libfabric 2.1, fork_safe ok; memlock checked; rxe is a verbs NIC: the kernel's ib_umem_dmabuf_get found in /proc/kallsyms, FI_VERBS_USE_DMABUF and FI_VERBS_USE_ODP as they should be; ibv_reg_dmabuf_mr of a page of HBM tried on rxe0 and refused by Debian's rxe provider, a warning naming the error; no EFA, so the EFA checks are skipped"
if [ "$(cat "$work/doctor-ok.rc" 2>/dev/null)" = 0 ] &&
	jq -e 'def s(n): map(select(.name == n))[0];
		(s("module").status == "ok") and (s("devices").status == "ok")
		and (s("p2p").status == "ok") and (s("p2p").detail | test("rxe0"))
		and (s("libfabric").status == "ok") and (s("libfabric").detail | test("^libfabric 2\\."))
		and (s("fork_safe").status == "ok") and (s("memlock").status | test("^(ok|warn)$"))
		and (s("efa_device_rdma").status == "skip") and (s("efa_libfabric").status == "skip")
		and (s("efa_shm").status == "skip") and (s("efa_fabric").status == "skip")
		and (s("verbs_kernel").status == "ok") and (s("verbs_kernel").detail | test("ib_umem_dmabuf_get"))
		and (s("verbs_use_dmabuf").status == "ok") and (s("verbs_odp").status == "ok")
		and (s("verbs_dmabuf_mr").status == "warn") and (s("verbs_dmabuf_mr").detail | test("rxe0: .*Operation not supported"))
		and (s("verbs_dmabuf_mr").fix | test("mlx5"))' "$work/doctor-ok.json" >/dev/null 2>&1; then
	ok "$desc: $(jq -r 'map(select(.name == "p2p"))[0].detail' "$work/doctor-ok.json")"
else
	fail "$desc" "$(cat "$work/doctor-ok.json" "$work/doctor-ok.err" 2>/dev/null)"
fi
desc="peerdirect doctor on rxe picks verbs;ofi_rxm for rxe0: fi_mr_dmabuf warns that the registration falls back to host bounce, with the provider's reason (fi_mr_regattr(FI_MR_DMABUF): Operation not supported) and the verbs checks' fix"
if [ "$(cat "$work/doctor-ok.rc" 2>/dev/null)" = 0 ] &&
	jq -e 'map(select(.name == "fi_mr_dmabuf"))[0] | .status == "warn"
		and (.detail | test("^verbs;ofi_rxm \\(domain rxe0; the provider of the verbs NIC rxe0\\) refuses a page of HBM: verbs;ofi_rxm: fi_mr_regattr\\(FI_MR_DMABUF\\): Operation not supported")
			and test("fall back to host bounce"))
		and (.fix | test("verbs_dmabuf_mr"))' "$work/doctor-ok.json" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(jq -c 'map(select(.name == "fi_mr_dmabuf"))[0]' "$work/doctor-ok.json" 2>/dev/null)" "$(cat "$work/doctor-ok.err" 2>/dev/null)"
fi
desc="peerdirect doctor without RDMAV_FORK_SAFE: fork_safe is a warning with its fix, and doctor still exits 0"
if [ "$(cat "$work/doctor-warn.rc" 2>/dev/null)" = 0 ] &&
	grep -q '^WARN  fork_safe .*RDMAV_FORK_SAFE is unset' "$work/doctor-warn.txt" &&
	grep -q 'fix: export RDMAV_FORK_SAFE=1' "$work/doctor-warn.txt"; then
	ok "$desc"
else
	fail "$desc" "$(cat "$work/doctor-warn.txt" 2>/dev/null)"
fi
desc="peerdirect doctor with FI_VERBS_USE_DMABUF=0 and FI_VERBS_USE_ODP=1 on rxe: the first fails and the second warns, each with its fix, exit status 1"
if [ "$(cat "$work/doctor-verbs.rc" 2>/dev/null)" = 1 ] &&
	jq -e 'def s(n): map(select(.name == n))[0];
		(s("verbs_use_dmabuf").status == "fail") and (s("verbs_use_dmabuf").fix | test("FI_VERBS_USE_DMABUF"))
		and (s("verbs_odp").status == "warn") and (s("verbs_odp").fix | test("FI_VERBS_USE_ODP"))
		and (s("verbs_kernel").status == "ok")' "$work/doctor-verbs.json" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(cat "$work/doctor-verbs.json" "$work/doctor-verbs.err" 2>/dev/null)"
fi
desc="peerdirect doctor after the HBM device is unbound: the devices check fails with the binding recipe, exit status 1"
if [ "$(cat "$work/doctor-fail.rc" 2>/dev/null)" = 1 ] &&
	jq -e 'map(select(.name == "devices"))[0] | .status == "fail" and (.fix | test("driver_override"))' "$work/doctor-fail.json" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(cat "$work/doctor-fail.json" "$work/doctor-fail.err" 2>/dev/null)"
fi
# The same tcp cases on a companion device (Documentation/companion.md): the HBM device bound
# to vfio-pci as its owner, peerdirect loaded with companion=1 and the device named; the HBM
# comes from ranges of its BAR exported with EXPORT_RANGE instead of allocations.
rm -f "$work"/*.out "$work"/*.rc
cat >"$work/companion.sh" <<'EOS'
cd /mnt/host
hbm=0000:03:00.0
echo vfio-pci >/sys/bus/pci/devices/$hbm/driver_override
echo $hbm >/sys/bus/pci/drivers_probe
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
peerdirect companion add $hbm --bar 2 >companion.add 2>&1
peerdirect-guest-tests --fabric tcp --companion >tap.out 2>&1
echo $? >tap.rc
EOS
out=$(guest --topology switch-iommu --no-bind --userland trixie --hbm 8G --hbm-backing "$hbm_companion" \
	--share "$work" -- sh /mnt/host/companion.sh 2>&1)
rc=$?
if [ $rc != 0 ] || [ ! -s "$work/tap.out" ]; then
	fail "guest (HBM device on vfio-pci, a companion) runs peerdirect-guest-tests --fabric tcp --companion" \
		"qemu/run exited $rc" "$out" "$(cat "$work/companion.add" 2>/dev/null)"
fi
relay "companion: " <"$work/tap.out" || failed=1
if [ "$(cat "$work/tap.rc" 2>/dev/null)" != 0 ]; then failed=1; fi
receiver_hbm "tcp on a companion" "$hbm_companion"
rma_hbm "tcp on a companion" "$hbm_companion"

exit $failed
