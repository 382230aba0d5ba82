#!/usr/bin/env bash
# The Debian packages (scripts/build-deb, `make deb`) on a Debian trixie host with the stock
# trixie-backports kernel's headers: the trixie-kbuild chroot of tests/system/distro-kbuild.sh
# (scripts/build-userland trixie-kbuild, which has dkms), never changed: an overlay is mounted
# on it for this run, and another on $PEERDIRECT_CACHE/kbuild, where DKMS's builds find the
# Rust metadata scripts/prepare-kbuild prepared for that kernel (a cache hit once
# distro-kbuild.sh or an earlier run prepared it; else about 3 minutes more, kept only for this
# run). No guest. The debs are built into a temporary folder from $CARGO_TARGET_DIR/release.
# Checked: dpkg -i of both packages; DKMS built and installed peerdirect.ko for the headers'
# kernel with its vermagic; modprobe and `peerdirect doctor --kernel` find that module; the
# kernel hook DKMS installs (/etc/kernel/postinst.d/dkms) builds it again for a kernel; the
# group, the udev rule and the examples; libpeerdirect through pkg-config from a C program;
# the kernel postrm hook dropping that kernel's cache; dpkg -P leaves nothing behind. Last,
# `make install` (no DESTDIR) on this host, in a mount namespace of its own whose /etc,
# /usr/local and /usr/lib are overlays dropped after: what the packages' scripts do besides
# their files (the group, the udev rule, ldconfig) make install does too.
# Not here: udev applying the rule to a real /dev/peerdirectN (no udev in the chroot), Secure
# Boot signing (no openssl in the chroot: DKMS says it cannot make its MOK key), booting
# Debian's kernel with the module.
. "$(dirname "$0")/../lib.sh"
# Plan: the 12 check_that calls below, one per numbered step.
plan 12
export LC_ALL=C
failed=0
fail() { failed=1; not_ok "$@"; }
# check_that DESCRIPTION CONDITION DIAGNOSTIC...: ok when CONDITION (a command string) holds
check_that() {
	local desc=$1 cond=$2
	shift 2
	if eval "$cond"; then ok "$desc"; else fail "$desc" "$@"; fi
}

PEERDIRECT_CACHE=${PEERDIRECT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/peerdirect}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PEERDIRECT_CACHE/cargo-target}
start=$SECONDS

# Everything of this run, on disk: the debs, the overlays' upper and work folders, logs.
work=$(mktemp -d)
mnt=()
# mounts_under DIR: mount points at or below DIR, deepest first
mounts_under() { awk -v d="$1" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r; }
cleanup() {
	local m
	for m in "${mnt[@]}"; do
		! mountpoint -q "$m" || umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
	done
	# Never delete through a mount (the chroot's overlay, a bound /proc).
	if [ -n "$(mounts_under "$work")" ]; then
		echo "# mounts remain under $work; not deleting it" >&2
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. The packages.
"$ROOT/scripts/build-deb" "$work/deb" >"$work/build-deb.log" 2>&1
rc=$?
version=$(dpkg-deb -f "$work"/deb/peerdirect-dkms_*_all.deb Version 2>/dev/null)
arch=$(dpkg --print-architecture)
dkms_deb=$work/deb/peerdirect-dkms_${version}_all.deb
lib_deb=$work/deb/peerdirect_${version}_$arch.deb
mkdir -p "$work/lib"
dpkg-deb -x "$lib_deb" "$work/lib" 2>/dev/null
so=$(readelf -d "$work/lib/usr/lib/x86_64-linux-gnu/libpeerdirect.so.0" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
# What each must hold (make install's files, in Debian's places; what the DKMS build needs).
missing=$(comm -13 <({ dpkg-deb -c "$dkms_deb"; dpkg-deb -c "$lib_deb"; } 2>/dev/null | awk '{print $6}' | sed 's|^\.||' | sort) \
	<(printf '%s\n' "/usr/src/peerdirect-$version/"{dkms.conf,Makefile,Kbuild,kmod/peerdirect_main.rs,kmod/sys.rs,kmod/sys/raw.rs,kmod/sys/helpers/helpers.h,kmod/sys/helpers/pci.c,include/uapi/peerdirect_uapi.rs,scripts/prepare-kbuild,scripts/build-module,scripts/env.sh} \
		/usr/lib/udev/rules.d/60-peerdirect.rules /etc/kernel/postrm.d/peerdirect-dkms /usr/bin/peerdirect \
		/usr/lib/x86_64-linux-gnu/{libpeerdirect.so.0,libpeerdirect.so,libpeerdirect.a,pkgconfig/peerdirect.pc} \
		/usr/include/peerdirect.h /usr/include/peerdirect/peerdirect_uapi.h | sort) | tr '\n' ' ')
depends=$(dpkg-deb -f "$lib_deb" Depends 2>/dev/null)
desc="scripts/build-deb (make deb) from the release build: peerdirect-dkms_${version}_all.deb (the module's sources for DKMS, udev rule, kernel hook) and peerdirect_${version}_$arch.deb (CLI, libpeerdirect with soname $so, headers, peerdirect.pc; Depends: $depends)"
check_that "$desc" '[ $rc = 0 ] && [ -n "$version" ] && [ -z "$missing" ] && [ "$so" = libpeerdirect.so.0 ] && [[ $depends == "libc6 (>= 2."*", libgcc-s1" ]] && dpkg-deb -f "$dkms_deb" Depends | grep -q "^dkms (>= 3.0), "' \
	"exit $rc; missing: $missing" "$(cat "$work/build-deb.log")"
[ $rc = 0 ] || exit 1

# The chroot, under an overlay; the kbuild cache under another, at the path dkms.conf gives.
lower=$("$ROOT/scripts/build-userland" trixie-kbuild) || {
	fail "the trixie-kbuild chroot (Debian's stock kernel headers, its toolchain and dkms)" "scripts/build-userland trixie-kbuild failed"
	exit 1
}
headers=$(cd "$lower" && ls -d usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1)
release=${headers#usr/src/linux-headers-}
root=$work/root
mkdir -p "$root" "$work/upper" "$work/ovl" "$work/kbuild-upper" "$work/kbuild-ovl" "$PEERDIRECT_CACHE/kbuild"
host_cache=$(ls "$PEERDIRECT_CACHE/kbuild")
overlay() { # overlay LOWER UPPER WORK TARGET
	mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" && mnt=("$4" "${mnt[@]}")
}
overlay "$lower" "$work/upper" "$work/ovl" "$root" || { fail "an overlay on $lower" "mount failed"; exit 1; }
mkdir -p "$root/var/cache/peerdirect/kbuild"
overlay "$PEERDIRECT_CACHE/kbuild" "$work/kbuild-upper" "$work/kbuild-ovl" "$root/var/cache/peerdirect/kbuild" ||
	{ fail "an overlay on $PEERDIRECT_CACHE/kbuild" "mount failed"; exit 1; }
mount --bind /proc "$root/proc" && mnt=("$root/proc" "${mnt[@]}")
in_root() {
	chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
		DEBIAN_FRONTEND=noninteractive "$@"
}
mkdir -p "$root/tmp/deb"
cp "$dkms_deb" "$lib_deb" "$root/tmp/deb/"
# The chroot has the kernel's headers, not its image, whose postinst runs depmod: without a
# modules.dep, DKMS installs the module but skips depmod ("the image is not installed").
in_root depmod "$release"

# 2. Both packages install; postinst builds the module through DKMS.
t=$SECONDS
in_root dpkg -i "/tmp/deb/$(basename "$dkms_deb")" "/tmp/deb/$(basename "$lib_deb")" >"$work/dpkg-i.log" 2>&1
rc=$?
status=$(in_root dpkg-query -W -f '${Package}: ${Status}\n' peerdirect-dkms peerdirect 2>&1)
desc="dpkg -i of both on trixie with linux-headers-$release (every Depends present, none forced): installed, and the postinst had DKMS build peerdirect.ko ($((SECONDS - t)) s; the chroot's running kernel is the host's, so Debian's common.postinst builds for every kernel with headers)"
check_that "$desc" '[ $rc = 0 ] && [ "$(grep -c "^peerdirect\(-dkms\)\?: install ok installed$" <<<"$status")" = 2 ]' "exit $rc; $status" "$(tail -40 "$work/dpkg-i.log")"
sed -n 's/^\(Building for\|Installing\|openssl\).*/# dpkg -i: &/p' "$work/dpkg-i.log"
machine=$(uname -m)
makelog=$root/var/lib/dkms/peerdirect/$version/$release/$machine/log/make.log
if grep -q 'preparing it once' "$makelog" 2>/dev/null; then
	echo "# the kbuild cache had no tree for $release: prepare-kbuild made one for this run only"
else
	echo "# prepare-kbuild found $(cd "$root/var/cache/peerdirect/kbuild" && ls -d "$release"-* 2>/dev/null) in the kbuild cache (same headers, source, rustc, bindgen and gcc)"
fi

# 3. dkms status.
dkms_status=$(in_root dkms status -m peerdirect -v "$version" -k "$release" 2>&1)
ko=/lib/modules/$release/updates/dkms/peerdirect.ko
check_that "dkms status: $dkms_status; $ko present" \
	'[ "$dkms_status" = "peerdirect/$version, $release, $machine: installed" ] && [ -f "$root$ko" ]' \
	"$(in_root dkms status 2>&1)" "$(cat "$makelog" 2>/dev/null | tail -20)"

# 4. The module is the stock kernel's, and modinfo finds it by name.
vermagic=$(in_root modinfo -F vermagic "$ko" 2>&1)
by_name=$(in_root modinfo -k "$release" -F filename peerdirect 2>&1)
rustc=$(readelf -p .comment "$root$ko" 2>/dev/null | grep -o 'rustc version [0-9.]*')
check_that "modinfo -F vermagic: '${vermagic% }' (the stock kernel's), built by $rustc; modinfo -k $release peerdirect names it" \
	'[ "${vermagic% }" = "$release SMP preempt mod_unload" ] && [ "$by_name" = "$ko" ]' \
	"vermagic '$vermagic'; by name: $by_name"

# 5. modprobe resolves it for that kernel; the modprobe.d and modules-load.d examples parse.
examples=$root/usr/share/doc/peerdirect-dkms/examples
plain=$(in_root modprobe -n -v -S "$release" peerdirect 2>&1)
plain=${plain% }
sed 's/^#install /install /' "$examples/modprobe.d/peerdirect.conf" >"$root/etc/modprobe.d/peerdirect.conf"
with_example=$(in_root modprobe -n -v -S "$release" peerdirect 2>&1)
rm "$root/etc/modprobe.d/peerdirect.conf"
loads=$(grep -v '^#' "$examples/modules-load.d/peerdirect.conf" | grep .)
loads_ok=$(in_root modprobe -n -S "$release" $loads 2>&1 && echo yes)
check_that "modprobe -n -S $release peerdirect: '$plain'; with examples/modprobe.d's install line enabled it runs the driver_override loop first; modules-load.d's example names $loads, which modprobe finds" \
	'[ "$plain" = "insmod $ko" ] && grep -q "^install for d in 0000:03:00.0; do echo peerdirect >/sys/bus/pci/devices/\$d/driver_override; done; /sbin/modprobe --ignore-install peerdirect" <<<"$with_example" && [ "$loads_ok" = yes ]' \
	"plain: $plain" "with the example: $with_example" "modules-load.d: $loads: $loads_ok"

# 6. peerdirect doctor reads the module DKMS installed (and the same module xz-compressed, as
# DKMS installs it on hosts whose kernel modules are: Debian's images have .ko.xz).
doctor() { in_root peerdirect doctor --json --kernel "$release" 2>/dev/null | jq -c 'map(select(.name == "module_build"))[0]'; }
plain=$(doctor)
in_root xz "$ko" && in_root depmod "$release"
compressed=$(doctor)
in_root unxz "$ko.xz" && in_root depmod "$release"
want() { # want JSON FILE: the check is ok and names FILE, the release's vermagic and rustc 1.85
	jq -e --arg f "$2" --arg r "$release" '.status == "ok" and (.detail | startswith($f + ": vermagic \"" + $r + " SMP preempt mod_unload\", built by rustc version 1.85.")) and (.detail | test("the kernel.s too"))' <<<"$1" >/dev/null 2>&1
}
check_that "peerdirect doctor --kernel $release: module_build names $ko, vermagic and rustc (the kernel's), and reads $ko.xz alike: $(jq -r .detail <<<"$plain" 2>/dev/null)" \
	'want "$plain" "$ko" && want "$compressed" "$ko.xz"' "plain: $plain" "compressed: $compressed"

# 7. A kernel upgrade: the kernel packages run /etc/kernel/postinst.d/dkms RELEASE (and
# header_postinst.d), and DKMS builds every AUTOINSTALL module for that kernel.
in_root dkms unbuild -m peerdirect -v "$version" -k "$release" >"$work/unbuild.log" 2>&1
gone=$([ ! -e "$root$ko" ] && in_root dkms status -m peerdirect -v "$version" 2>&1)
t=$SECONDS
in_root /etc/kernel/postinst.d/dkms "$release" >"$work/autoinstall.log" 2>&1
rc=$?
again=$(in_root dkms status -m peerdirect -v "$version" -k "$release" 2>&1)
vermagic=$(in_root modinfo -F vermagic "$ko" 2>&1)
check_that "after dkms unbuild ($gone), /etc/kernel/postinst.d/dkms $release builds and installs it again ($((SECONDS - t)) s): $again (AUTOINSTALL=yes)" \
	'[ "$gone" = "peerdirect/$version: added" ] && [ $rc = 0 ] && [ "$again" = "peerdirect/$version, $release, $machine: installed" ] && [ "${vermagic% }" = "$release SMP preempt mod_unload" ]' \
	"unbuild: $(cat "$work/unbuild.log")" "hook (exit $rc): $(cat "$work/autoinstall.log")"

# 8. The group and the udev rule, against the names the module gives its misc devices.
group=$(in_root getent group peerdirect)
gid=$(cut -d: -f3 <<<"$group")
rule=$(grep -v '^#' "$root/usr/lib/udev/rules.d/60-peerdirect.rules" 2>/dev/null | grep .)
glob=$(sed -n 's/.*KERNEL=="\([^"]*\)".*/\1/p' <<<"$rule")
names=$(grep -o 'c"peerdirect[0-9]*"' "$ROOT/kmod/index.rs" | sed 's/^c"\(.*\)"$/\1/' | sort -uV | tr '\n' ' ')
unmatched=$(for n in $names; do [[ $n == $glob ]] || echo "$n"; done)
# (/dev/peerdirectN is a misc device: chardev.rs registers HbmFile with sys/misc.rs's
# MiscRegistration, a misc device registration.)
misc=$(( $(grep -c 'MiscRegistration<HbmFile>' "$ROOT/kmod/chardev.rs") * $(grep -c 'MiscDeviceRegistration::register' "$ROOT/kmod/sys/misc.rs") ))
# udevadm verify resolves the group's name too. Applying the rule to a device needs sysfs.
verify=$(in_root udevadm verify /usr/lib/udev/rules.d/60-peerdirect.rules 2>&1)
vrc=$?
check_that "system group peerdirect (gid $gid); 60-peerdirect.rules gives the misc devices $(awk '{print $1 ".." $NF}' <<<"$names") (kmod/index.rs) group peerdirect, mode 0660; udevadm verify $(in_root udevadm --version 2>/dev/null) passes it" \
	'[ -n "$gid" ] && [ "$gid" -lt 1000 ] && [ "$rule" = "SUBSYSTEM==\"misc\", KERNEL==\"peerdirect[0-9]*\", GROUP=\"peerdirect\", MODE=\"0660\"" ] && [ "$(wc -w <<<"$names")" -ge 2 ] && [ -z "$unmatched" ] && [ "$misc" -ge 1 ] && [ $vrc = 0 ]' \
	"group: $group" "rule: $rule" "names: $names; unmatched: $unmatched; chardev.rs's misc registration found: $misc" "udevadm verify (exit $vrc): $verify"

# 9. libpeerdirect through pkg-config, from a C program built with trixie's gcc. trixie-kbuild
# has no pkg-config: then the host's reads the chroot's peerdirect.pc (same file, same rules).
pc=$root/usr/lib/x86_64-linux-gnu/pkgconfig
if in_root sh -c 'command -v pkg-config' >/dev/null; then
	pkgconf=(in_root pkg-config) via="the chroot's pkg-config"
else
	pkgconf=(env PKG_CONFIG_LIBDIR="$pc" pkg-config) via="the host's pkg-config on the chroot's peerdirect.pc (no pkg-config in trixie-kbuild)"
fi
flags=$("${pkgconf[@]}" --cflags --libs peerdirect 2>&1)
flags=${flags% }
modversion=$("${pkgconf[@]}" --modversion peerdirect 2>&1)
libdir=$("${pkgconf[@]}" --variable=libdir peerdirect 2>&1)
cat >"$root/tmp/pd-version.c" <<'EOF'
#include <errno.h>
#include <stdio.h>
#include <peerdirect.h>

int main(void)
{
	int err = 0;
	pd_device *dev = pd_device_open(0, &err);

	printf("libpeerdirect %s; open: %s\n", pd_version(), dev ? "a device" : pd_strerror(err));
	return dev != NULL;
}
EOF
# shellcheck disable=SC2086 # the flags are words
in_root gcc -Wall -Werror -o /tmp/pd-version /tmp/pd-version.c $flags >"$work/cc.log" 2>&1
rc=$?
ldd=$(in_root ldd /tmp/pd-version 2>&1 | grep libpeerdirect)
# /lib is /usr/lib (merged /usr): the file the loader found, by its real path.
found=$(in_root realpath "$(awk '{print $3}' <<<"$ldd")" 2>&1)
run=$(in_root /tmp/pd-version 2>&1)
check_that "pkg-config --cflags --libs peerdirect: '$flags' ($via; version $modversion, libdir $libdir); a C program including peerdirect.h builds with gcc, ldd: $(awk '{print $1, $2, $3}' <<<"$ldd") ($found); it runs: $run" \
	'[ $rc = 0 ] && grep -qw -- -lpeerdirect <<<"$flags" && [ "$modversion" = "$version" ] && [ "$libdir" = /usr/lib/x86_64-linux-gnu ] && [ "$found" = /usr/lib/x86_64-linux-gnu/libpeerdirect.so.0 ] && [[ $run == "libpeerdirect $version; open: "* ]]' \
	"gcc: exit $rc $(cat "$work/cc.log")" "ldd: $ldd" "run: $run"

# 10. Removing the kernel's image runs /etc/kernel/postrm.d: our hook drops that kernel's
# prepared tree from DKMS's cache (here from the overlay; the host's cache stays).
cached=$(cd "$root/var/cache/peerdirect/kbuild" && ls -d "$release"-* 2>/dev/null)
in_root run-parts --arg="$release" /etc/kernel/postrm.d >"$work/postrm.d.log" 2>&1
rc=$?
left=$(cd "$root/var/cache/peerdirect/kbuild" && ls -d "$release"-* 2>/dev/null)
check_that "run-parts --arg=$release /etc/kernel/postrm.d (a kernel image's postrm) drops /var/cache/peerdirect/kbuild/${cached:-?}" \
	'[ $rc = 0 ] && [ -n "$cached" ] && [ -z "$left" ] && [ "$(ls "$PEERDIRECT_CACHE/kbuild")" = "$host_cache" ]' \
	"exit $rc: $(cat "$work/postrm.d.log")" "before: $cached; after: $left"

# 11. dpkg -P of both: DKMS forgets the module, nothing of the packages stays.
# The cache's overlay first: purge removes /var/cache/peerdirect, which must not be a mount.
umount "$root/var/cache/peerdirect/kbuild"
in_root dpkg -P peerdirect peerdirect-dkms >"$work/dpkg-P.log" 2>&1
rc=$?
after=$(in_root dkms status 2>&1)
left=$(for f in "/usr/src/peerdirect-$version" /var/lib/dkms/peerdirect "$ko" /usr/bin/peerdirect \
	/usr/lib/x86_64-linux-gnu/libpeerdirect.so.0 /usr/include/peerdirect.h /usr/lib/udev/rules.d/60-peerdirect.rules \
	/etc/kernel/postrm.d/peerdirect-dkms /var/cache/peerdirect; do [ ! -e "$root$f" ] || echo "$f"; done)
dep=$(grep -s peerdirect "$root/lib/modules/$release/modules.dep")
states=$(in_root dpkg-query -W -f '${Status}\n' peerdirect-dkms peerdirect 2>&1 | sort -u)
check_that "dpkg -P peerdirect peerdirect-dkms: dkms status empty, no file left (sources, module, modules.dep entry, binaries, rule, hook, cache); the group stays, as Debian keeps system groups" \
	'[ $rc = 0 ] && [ -z "$after" ] && [ -z "$left" ] && [ -z "$dep" ] && { [ "$states" = "unknown ok not-installed" ] || [[ $states == *"no packages found"* ]]; } && in_root getent group peerdirect >/dev/null' \
	"exit $rc: $(tail -20 "$work/dpkg-P.log")" "dkms status: $after" "left: $left" "modules.dep: $dep" "states: $states"

# 12. make install on a host, as its administrator runs it (KDIR: the test kernel's tree, the
# one kernel whose build needs nothing more here), in a mount namespace of its own whose /etc,
# /usr/local and /usr/lib (/lib/modules) are overlays on this host's, dropped with it: the
# host's own stay as they were. It runs twice: a second install finds the group there.
# /run/udev does not exist here, so it reloads no udev.
mkdir -p "$work/install"
host_files() { sha256sum /etc/group /etc/gshadow /etc/ld.so.cache 2>&1; ls /etc/udev/rules.d /usr/local/bin /usr/local/lib 2>&1; }
before=$(host_files)
unshare -m --propagation private bash -c '
	w=$1 root=$2
	for d in /etc /usr/local /usr/lib; do
		n=${d//\//_}
		mkdir -p "$w/upper$n" "$w/work$n"
		mount -t overlay overlay -o "lowerdir=$d,upperdir=$w/upper$n,workdir=$w/work$n" "$d" || exit 3
	done
	make -C "$root" install KDIR="$("$root/scripts/build-kernel")" PREFIX=/usr/local >"$w/make-install.log" 2>&1 &&
		make -s -C "$root" install KDIR="$("$root/scripts/build-kernel")" PREFIX=/usr/local >>"$w/make-install.log" 2>&1
	echo $? >"$w/rc"
	getent group peerdirect >"$w/group"
	ldconfig -p | grep -F libpeerdirect.so.0 >"$w/ldconfig"
	cmp -s /etc/udev/rules.d/60-peerdirect.rules "$root/packaging/udev/60-peerdirect.rules" && echo same >"$w/rule"
	[ -x /usr/local/bin/peerdirect ] && /usr/local/bin/peerdirect --version >"$w/version"
' bash "$work/install" "$ROOT"
rc=$(cat "$work/install/rc" 2>/dev/null)
group=$(cat "$work/install/group" 2>/dev/null)
gid=$(cut -d: -f3 <<<"$group")
cache=$(sed 's/^[[:space:]]*//' "$work/install/ldconfig" 2>/dev/null)
check_that "make install KDIR=(the test kernel) PREFIX=/usr/local, twice, on a host (overlays on its /etc, /usr/local, /usr/lib): the system group peerdirect (gid $gid), /etc/udev/rules.d/60-peerdirect.rules as the package's, ldconfig's cache has $cache, $(cat "$work/install/version" 2>/dev/null) installed; the host's own files unchanged" \
	'[ "$rc" = 0 ] && [ -n "$gid" ] && [ "$gid" -lt 1000 ] && [ "$(cat "$work/install/rule" 2>/dev/null)" = same ] && [ "$cache" = "libpeerdirect.so.0 (libc6,x86-64) => /usr/local/lib/libpeerdirect.so.0" ] && [ -s "$work/install/version" ] && [ "$(host_files)" = "$before" ]' \
	"make install: exit $rc" "$(tail -30 "$work/install/make-install.log" 2>/dev/null)" "group: $group" "ldconfig -p: $cache"
echo "# took $((SECONDS - start)) s"
exit $failed
