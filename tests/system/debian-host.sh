#!/usr/bin/env bash
# A Debian host with the stock kernel, set up from `make deb`'s packages as an administrator
# would, tried as a new user would: Debian's own kernel booted under QEMU (qemu/run --kernel
# debian) with no peerdirect.ko loaded, the trixie-kbuild userland (that kernel's headers and
# source, rustc 1.85.1, dkms, udev; made writable with a tmpfs overlay) as its root file system.
# In the guest: `dpkg -i` of peerdirect-dkms and peerdirect; DKMS builds peerdirect.ko for the
# running kernel (the Rust metadata prepared for it comes from the host's kbuild cache, shared
# read-only with qemu/run --share-ro, so the guest does not spend minutes on it); `modprobe peerdirect` loads that build;
# systemd-udevd applies the package's rule, so /dev/peerdirect0 is root:peerdirect 0660; a user
# in the group uses the device, one outside it is refused with a message that says what to do;
# `peerdirect doctor` passes; the packages purge cleanly.
. "$(dirname "$0")/../lib.sh"
# PEERDIRECT_CACHE as the scripts have it, also when this suite runs outside make.
. "$ROOT/scripts/env.sh"
failed=0
fail() { failed=1; not_ok "$@"; }
# Plan: the guest script's 11 checks (below), relayed: dpkg -i, dkms status, modinfo, DKMS's
# signature, modprobe, the build ID, udev, a user in the group, one outside, doctor, dpkg -P.
guest_checks=11
plan $guest_checks

share=$(mktemp -d)
trap 'rm -rf "$share"' EXIT
mkdir -p "$share/debs"
t=$SECONDS
if ! "$ROOT/scripts/build-deb" "$share/debs" >"$share/build-deb.log" 2>&1; then
	fail "scripts/build-deb makes the packages" "$(tail -20 "$share/build-deb.log")"
	exit 1
fi

echo "# scripts/build-deb took $((SECONDS - t)) s"

cat >"$share/guest.sh" <<'EOF'
# Runs in the guest, in the trixie-kbuild userland; prints TAP lines, whose plan
# (guest_checks) the host declares.
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $1"; shift; printf '%s\n' "$@" | sed 's/^/# /'; }
check() { local d=$1; shift; if out=$("$@" 2>&1); then ok "$d"; else not_ok "$d" "$out"; fi; }
release=$(uname -r)
# DKMS's cache of prepared kernel trees (Documentation/packaging.md): the host's, shared.
mkdir -p /var/cache/peerdirect
ln -s /run/host-ro /var/cache/peerdirect/kbuild

t=$SECONDS
out=$(dpkg -i /mnt/host/debs/peerdirect-dkms_*.deb /mnt/host/debs/peerdirect_*.deb 2>&1)
rc=$?
echo "# dpkg -i, DKMS's build included, took $((SECONDS - t)) s"
if [ $rc = 0 ] && [ "$(dpkg-query -W -f '${Status}' peerdirect-dkms)" = "install ok installed" ] &&
   [ "$(dpkg-query -W -f '${Status}' peerdirect)" = "install ok installed" ]; then
	ok "dpkg -i peerdirect-dkms and peerdirect installs both on Debian $release"
else
	not_ok "dpkg -i peerdirect-dkms and peerdirect installs both on Debian $release" "exit $rc" "$(echo "$out" | tail -30)"
fi
status=$(dkms status peerdirect 2>&1)
if grep -q "peerdirect/[^,]*, $release, x86_64: installed" <<<"$status"; then
	ok "DKMS built and installed peerdirect.ko for the running kernel: $status"
else
	not_ok "DKMS built and installed peerdirect.ko for the running kernel" "$status" \
		"$(cat /var/lib/dkms/peerdirect/*/build/make.log 2>/dev/null | tail -20)"
fi
file=$(modinfo -F filename peerdirect 2>&1)
vermagic=$(modinfo -F vermagic peerdirect 2>&1)
if [[ $file == /lib/modules/$release/updates/dkms/peerdirect.ko* ]] && [ "${vermagic% }" = "$release SMP preempt mod_unload" ]; then
	ok "modprobe finds DKMS's build ($file), vermagic '$release SMP preempt mod_unload'"
else
	not_ok "modprobe finds DKMS's build, vermagic '$release SMP preempt mod_unload'" "$file" "$vermagic"
fi

# DKMS signs what it builds with its own key (made at the first build, with openssl), the key
# a Secure Boot host enrolls with mokutil (Documentation/packaging.md).
signer=$(modinfo -F signer peerdirect 2>&1)
if [ -n "$signer" ] && [ -f /var/lib/dkms/mok.pub ] &&
   [ "$(modinfo -F sig_key peerdirect | tr -d ':' | tr A-F a-f)" = "$(openssl x509 -inform DER -in /var/lib/dkms/mok.pub -noout -serial | sed 's/^serial=//' | tr A-F a-f)" ]; then
	ok "DKMS signed peerdirect.ko with its own key /var/lib/dkms/mok.pub (signer: $signer)"
else
	not_ok "DKMS signed peerdirect.ko with its own key /var/lib/dkms/mok.pub" "signer: $signer" "$(ls -la /var/lib/dkms/ 2>&1)"
fi

# Bind the HBM stand-in through driver_override (Gaudi's IDs need nothing), then load.
for d in /sys/bus/pci/devices/*; do
	[ "$(cat "$d/vendor")" = 0x1af4 ] && [ "$(cat "$d/device")" = 0x1110 ] && echo peerdirect >"$d/driver_override"
done
check "modprobe peerdirect loads it and /dev/peerdirect0 appears" sh -c 'modprobe peerdirect && test -c /dev/peerdirect0'
# The loaded module is DKMS's file: its GNU build ID in sysfs equals the installed file's.
case $file in
*.xz) xz -dc "$file" >/tmp/peerdirect.ko ;;
*.zst) zstd -qdc "$file" >/tmp/peerdirect.ko ;;
*) cp "$file" /tmp/peerdirect.ko ;;
esac
want=$(readelf -n /tmp/peerdirect.ko | sed -n 's/^ *Build ID: //p')
have=$(od -An -tx1 -v /sys/module/peerdirect/notes/.note.gnu.build-id | tr -d ' \n' | tail -c 40)
if [ -n "$want" ] && [ "$want" = "$have" ]; then
	ok "the loaded peerdirect is DKMS's build (build ID $have)"
else
	not_ok "the loaded peerdirect is DKMS's build" "file: $want" "loaded: $have"
fi

# udev, as on a host: the daemon applies the package's rule to the device. (The command runs
# chrooted into the userland, where systemd's tools do nothing unless told it is fine.)
export SYSTEMD_IGNORE_CHROOT=1
/usr/lib/systemd/systemd-udevd --daemon >/tmp/udevd.log 2>&1
udevadm trigger --action=add --subsystem-match=misc >/dev/null 2>&1
udevadm settle --timeout=20
perm=$(stat -c '%U:%G %a' /dev/peerdirect0)
if [ "$perm" = "root:peerdirect 660" ]; then
	ok "udev gives /dev/peerdirect0 to the group peerdirect, mode 0660 (60-peerdirect.rules)"
else
	not_ok "udev gives /dev/peerdirect0 to the group peerdirect, mode 0660" "$perm" "$(cat /tmp/udevd.log)"
fi
udevadm control --exit 2>/dev/null

# A runtime need not be root: a user in the group exports HBM; one outside is refused and told why.
useradd -m -G peerdirect runtime && useradd -m outsider
as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --init-groups env HOME="/home/$u" "$@"; }
check "a user in the group peerdirect (not root) allocates and exports 4 MiB of HBM with the packaged CLI" \
	as runtime /usr/bin/peerdirect export --size 4M --pattern 0x5eed --json
out=$(as outsider /usr/bin/peerdirect export --size 4M 2>&1)
rc=$?
if [ $rc != 0 ] && grep -q 'Permission denied' <<<"$out" && grep -qF 'join it (adduser $USER peerdirect' <<<"$out"; then
	ok "a user outside the group is refused, and told: $(echo "$out" | head -1)"
else
	not_ok "a user outside the group is refused with a message that says what to do" "exit $rc" "$out"
fi

# doctor, as the runtime user: nothing failing, and the module's build matches the kernel.
out=$(as runtime /usr/bin/peerdirect doctor 2>&1)
rc=$?
if [ $rc = 0 ] && ! grep -q '^FAIL' <<<"$out" && grep -q '^OK  *module_build' <<<"$out"; then
	ok "peerdirect doctor passes (exit 0, no FAIL; module_build OK): $(grep '^OK  *module_build' <<<"$out" | sed 's/  */ /g')"
else
	not_ok "peerdirect doctor passes with module_build OK" "exit $rc" "$out"
fi

rmmod peerdirect
out=$(dpkg -P peerdirect peerdirect-dkms 2>&1)
rc=$?
left=$(ls /lib/modules/$release/updates/dkms/ 2>/dev/null; dkms status peerdirect 2>&1)
if [ $rc = 0 ] && [ -z "$left" ] && ! modinfo peerdirect >/dev/null 2>&1 && [ ! -e /usr/bin/peerdirect ]; then
	ok "dpkg -P removes both packages, DKMS's build and the CLI"
else
	not_ok "dpkg -P removes both packages, DKMS's build and the CLI" "exit $rc" "$out" "left: $left"
fi
EOF

# The host's kbuild cache, read-only and cached by the guest (--share-ro: a build reads
# thousands of its headers; uncached over 9p, DKMS's build took 4 to 8 minutes).
t=$SECONDS
out=$(env PEERDIRECT_PREBUILT="${PEERDIRECT_PREBUILT:-0}" "$ROOT/qemu/run" --kernel debian --userland trixie-kbuild --writable \
	--no-bind --mem 2G --share "$share" --share-ro "$PEERDIRECT_CACHE/kbuild" --timeout 600 -- bash /mnt/host/guest.sh 2>"$share/err")
rc=$?
echo "# the guest's run took $((SECONDS - t)) s"
tap_n=0
while IFS= read -r l; do
	case $l in
	"ok "*) ok "${l#ok [0-9]* - }" ;;
	"not ok "*) fail "${l#not ok [0-9]* - }" ;;
	"#"*) echo "$l" ;;
	*) echo "# $l" ;;
	esac
done <<<"$out"
relayed=$tap_n
[ $rc = 0 ] || fail "the guest run ends cleanly" "qemu/run exited $rc (99: kernel splat, 98: guest died, 124: timeout)" "$(cat "$share/err")"
[ $relayed = $guest_checks ] || fail "the guest ran every check ($relayed of $guest_checks reported)" "$out"
exit $failed
