#!/usr/bin/env bash
# The libfabric registrar in the trixie userland (libfabric 2.1): `peerdirect-guest-tests
# --fabric tcp` (path dma_buf through FI_MR_DMABUF, a tagged HBM-to-HBM exchange between two
# endpoints, 10,000 register/deregister cycles without fd or dma-buf leaks with the cache on
# and off, a registration over 4 GiB with --hbm 8G), `peerdirect register --provider tcp
# --json`; then under --rxe, `--fabric 'verbs;ofi_rxm'`: both registrations take host_bounce
# with the provider's reason and the same exchange runs through the staging buffers. After
# each exchange the receiver's HBM is checked on the host in the --hbm-backing file.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
hbm=/dev/shm/peerdirect-fabric-$$
hbm_rxe=/dev/shm/peerdirect-fabric-rxe-$$
trap 'rm -rf "$work" "$hbm" "$hbm_rxe"' EXIT
failed=0
fail() { failed=1; not_ok "$@"; }

# guest TAP, renumbered into ours
relay() {
	local line
	while IFS= read -r line; do
		case $line in
		"ok "*) ok "${line#ok [0-9]* - }" ;;
		"not ok "*) failed=1; tap_n=$((tap_n + 1)); echo "not ok $tap_n - ${line#not ok [0-9]* - }" ;;
		"#"*) echo "$line" ;;
		esac
	done
}

cat >"$work/tcp.sh" <<'EOS'
cd /mnt/host
peerdirect register --provider tcp --node 127.0.0.1 --json >register.json 2>register.err
echo $? >register.rc
peerdirect-guest-tests --fabric tcp >tap.out 2>&1
echo $? >tap.rc
EOS
out=$(guest --userland trixie --hbm 8G --hbm-backing "$hbm" --share "$work" -- sh /mnt/host/tcp.sh 2>&1)
rc=$?
if [ $rc != 0 ] || [ ! -s "$work/tap.out" ]; then
	fail "guest --userland trixie --hbm 8G runs peerdirect-guest-tests --fabric tcp" "qemu/run exited $rc" "$out"
fi
relay <"$work/tap.out"
if [ "$(cat "$work/tap.rc" 2>/dev/null)" != 0 ]; then failed=1; fi

if [ "$(cat "$work/register.rc" 2>/dev/null)" = 0 ] &&
	jq -e '.provider == "tcp" and .registration.path.path == "dma_buf" and .paths.dma_buf == 1 and .second_request_hit' "$work/register.json" >/dev/null 2>&1; then
	ok "peerdirect register --provider tcp --json: path $(jq -c .registration.path "$work/register.json"), key $(jq .registration.key "$work/register.json"), libfabric $(jq -r .libfabric "$work/register.json")"
else
	fail "peerdirect register --provider tcp --json reports path dma_buf" "$(cat "$work/register.json" "$work/register.err" 2>/dev/null)"
fi

# receiver_hbm PROVIDER BACKING: the receiver's HBM of the guest's exchange (its "# receiver-hbm"
# line in tap.out), read on the host: the sender's pattern (independent SplitMix64).
receiver_hbm() {
	local offset length seed
	read -r offset length seed < <(sed -n 's/^# receiver-hbm offset=\(0x[0-9a-f]*\) length=\(0x[0-9a-f]*\) seed=\(0x[0-9a-f]*\)$/\1 \2 \3/p' "$work/tap.out")
	if [ -n "$offset" ] && "$ROOT/tests/hbm-pattern" check "$2" "$offset" "$length" "$seed"; then
		ok "host: after the $1 exchange the receiver's HBM (backing file at $offset, $((length >> 20)) MiB) holds the sender's pattern"
	else
		fail "host: after the $1 exchange the receiver's HBM holds the sender's pattern" "offset '$offset' length '$length'"
	fi
}
receiver_hbm tcp "$hbm"
# And the HBM that tcp's fi_read filled (its "# rma-hbm" line).
read -r offset length seed < <(sed -n 's/^# rma-hbm offset=\(0x[0-9a-f]*\) length=\(0x[0-9a-f]*\) seed=\(0x[0-9a-f]*\)$/\1 \2 \3/p' "$work/tap.out")
if [ -n "$offset" ] && "$ROOT/tests/hbm-pattern" check "$hbm" "$offset" "$length" "$seed"; then
	ok "host: the HBM that tcp's fi_read filled (backing file at $offset, $((length >> 20)) MiB) holds the peer's bytes"
else
	fail "host: the HBM that tcp's fi_read filled holds the peer's bytes" "offset '$offset' length '$length'"
fi

rm -f "$work"/*.out "$work"/*.rc
cat >"$work/rxe.sh" <<'EOS'
cd /mnt/host
peerdirect-guest-tests --fabric 'verbs;ofi_rxm' >tap.out 2>&1
echo $? >tap.rc
peerdirect register --provider 'verbs;ofi_rxm' --json >register.json 2>register.err
echo $? >register.rc
EOS
out=$(guest --rxe --hbm-backing "$hbm_rxe" --share "$work" -- sh /mnt/host/rxe.sh 2>&1)
rc=$?
if [ $rc != 0 ] || [ ! -s "$work/tap.out" ]; then
	fail "guest --rxe runs peerdirect-guest-tests --fabric 'verbs;ofi_rxm'" "qemu/run exited $rc" "$out"
fi
relay <"$work/tap.out"
if [ "$(cat "$work/tap.rc" 2>/dev/null)" != 0 ]; then failed=1; fi
receiver_hbm "'verbs;ofi_rxm'" "$hbm_rxe"
if [ "$(cat "$work/register.rc" 2>/dev/null)" = 0 ] &&
	jq -e '.registration.path.path == "host_bounce" and (.registration.path.reason | test("FI_MR_DMABUF"))' "$work/register.json" >/dev/null 2>&1; then
	ok "peerdirect register --provider 'verbs;ofi_rxm' --json: $(jq -c .registration.path "$work/register.json")"
else
	fail "peerdirect register --provider 'verbs;ofi_rxm' --json reports host_bounce with a reason" "$(cat "$work/register.json" "$work/register.err" 2>/dev/null)"
fi
echo "1..$tap_n"
exit $failed
