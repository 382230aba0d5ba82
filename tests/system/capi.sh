#!/usr/bin/env bash
# The C ABI as a C user gets it: `make install` into a staging DESTDIR (PREFIX=/usr/local),
# then userspace/capi/examples/hbm_export.c built with the guest's Debian trixie userland's gcc
# (chrooted on the host) and `pkg-config --cflags --libs peerdirect` against the installed
# header and library (PKG_CONFIG_SYSROOT_DIR points pkg-config at the staging tree) and run in
# the guest against /dev/peerdirect0; the pattern it writes is then checked on the host in the HBM backing file.
# Then userspace/capi/examples/fabric_register.c, built the same way against peerdirect and
# libfabric (`pkg-config --cflags --libs peerdirect libfabric`): it opens libfabric's tcp
# domain itself, registers HBM through the cache twice (a miss, then a hit), checks the RMA
# address and key a peer would use (pd_mr_remote), registers it again through a second cache
# in the same domain (tcp takes the requested keys: they must differ), and frees the
# allocation, which must invalidate the cached registration before the domain is closed; then
# it registers a udmabuf (a dma-buf exported elsewhere) through pd_register_dmabuf: a miss, a
# hit inside it, and pd_regcache_invalidate_dmabuf drops it. The domain is named by pd_domain
# handles: a second handle on the same domain pointer registers anew and refuses to detach
# (-EBUSY, dropping nothing: no invalidation heard, the entry still cached) while its
# registration is held, and detaches once it is released; pd_mr_local's address reads what an export of the
# same HBM wrote; the invalidation callback hears of each registration whose domain or memory
# goes, with its key, cause, held flag, domain handle, local address and length. Last, the same program on
# soft-RoCE's verbs;ofi_rxm, which refuses dma-bufs: pd_register fails with -EOPNOTSUPP until
# the program turns host bounce on, and the registration then says host_bounce, with its
# reason, a staging buffer and no RMA address. Then userspace/capi/examples/verbs_register.c,
# built against libibverbs: the ibverbs registrar in C on rxe0 with Debian's provider, whose
# refusal of dma-buf memory regions it must report. And userspace/capi/examples/hcl_style.cpp, built with
# g++: it registers two peerdirect exports as Habana's HCL registers device memory
# (fi_mr_dmabuf: fd, offset 0, base_addr = the buffer, iov_count 1) and moves 4 MiB over tcp.
# And userspace/capi/examples/nommap_register.c: a dma-buf whose exporter has no mmap
# (tests/kmod/peerdirect_nommap.ko, which maps its buffer through its own device, as habanalabs
# does) registered by its fd alone at the runtime's address (pd_register_dmabuf_at), and a
# read-only export of /dev/peerdirect0 registered for reading, each moving 1 MiB over tcp.
# And userspace/capi/examples/hcl_pool.c: HCL's pattern, a 4 GiB pool registered once
# (the first boot has 8 GiB of HBM), 1,000 buffers found in it by address (pd_register_addr),
# a transfer between two of them, the one-word flush buffer found for remote reads.
# userspace/capi/tests/callback_race.c and lookup_race.c, built with AddressSanitizer: the
# invalidation callback set, cleared and freed while it is called; lookups by address
# (pd_register_addr) while other threads register and drop dma-bufs at their addresses, and
# another asks for bytes past their ends there (refused, binding nothing); then lookups of a
# dma-buf while it is registered, which find it only once its registration returned.
# userspace/capi/tests/fork_handles.c, also with AddressSanitizer: a forked child's
# registrations in its parent's domain fail with -ECHILD, and its releases of the parent's
# handles (allocated and in the caller's storage) leave them alone.
# userspace/capi/tests/reset_register.c, last in that boot: an allocation registered, the
# device reset (sysfs), and pd_register of the same allocation registers a new export of it
# (the one made before is revoked: its mapping faults), while pd_register_export refuses the
# program's own export made before the reset (ENODEV); and two exports registered with
# pd_register_export_at at device addresses, which the reset drops at once (the callback
# hears of them), whose bytes are then refused by address (ENODEV), and whose place a new
# export takes; again in the --rxe-dmabuf boot, on rxe0, where ib_core refuses the revoked
# export.
# Then a boot with qemu/run --rxe-dmabuf (the test kernel's patched rxe and the patched rxe
# provider: rxe0 registers dma-bufs, as EFA, mlx5 and irdma do): verbs_register.c takes its
# other branch, a registration at IOVA = its offset in the allocation; and
# userspace/capi/examples/verbs_rdma.c, HCL's ibverbs path: the program's own protection domain
# and RC queue pairs (two, looped back inside rxe0), 8 MiB of HBM registered once with
# pd_register_dmabuf_at at a device VA of the runtime's, buffers found by device VA, whose
# pd_mr_remote and pd_mr_local must be those device VAs; an RDMA WRITE of host memory into HBM
# at a device VA, an RDMA READ out of it and an RDMA WRITE from HBM (the local side named by
# device VA) into HBM, with the bytes checked through a second export's mapping in the guest
# and in the HBM backing file on the host.
# Last, userspace/capi/examples/companion_export.c on a companion device (the HBM device bound
# to vfio-pci): pd_export_range refused without CAP_SYS_ADMIN (-EPERM), then a BAR range
# exported, the pattern written through its mapping (checked on the host), and registered
# with libfabric tcp through the cache (pd_register_export: a miss, then a hit); then, held
# registered and mapped, a reset announced with pd_companion_reset_prepare (the callback hears
# of it from the library's watching thread, the mapping faults, exports wait for
# pd_companion_reset_done, then work again); then held registered and mapped while the
# companion is removed: the invalidation callback hears of it (PD_INVALIDATED_DEVICE) and the
# mapping faults.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Plan: make install and pkg-config (2); the first boot: hbm_export (4), fabric_register (3),
# verbs_register (2), hcl_style (2), nommap_register (3), hcl_pool (2), key_pool (2),
# callback_race (2), lookup_race (2), fork_handles (2), reset_register (3); the --rxe-dmabuf boot:
# verbs_register (1), reset_register (2), verbs_rdma (6); the companion
# boot (7).
plan 45
failed=0
# fail DESCRIPTION [DIAGNOSTIC...]: not_ok, remembered for the exit status
fail() { failed=1; not_ok "$@"; }

show() { echo "exit status $(cat "$1.rc" 2>/dev/null || echo none):"; cat "$1.out" 2>/dev/null; }

# asan_checks PROGRAM BUILD RUN DESC OK: the two checks of tests/PROGRAM.c, built with
# AddressSanitizer (BUILD.rc, .out) and run (RUN.rc, .out): that it built, and DESC, met if it
# exited 0, printed a line starting "ok - OK" (a grep pattern) and no "FAIL", and
# AddressSanitizer reported nothing.
asan_checks() {
	local desc="trixie's gcc builds tests/$1.c with AddressSanitizer (-fsanitize=address, -Wall -Wextra -Werror)"
	if [ "$(cat "$2.rc" 2>/dev/null)" = 0 ]; then
		ok "$desc"
	else
		fail "$desc" "$(show "$2")"
	fi
	if [ "$(cat "$3.rc" 2>/dev/null)" = 0 ] && ! grep -q '^FAIL\|AddressSanitizer: ' "$3.out" &&
		grep -q "^ok - $5" "$3.out"; then
		ok "$4"
		sed "s/^/# /" "$3.out"
	else
		fail "$4" "$(show "$3")"
	fi
}

stage=$work/share/stage
lib=$stage/usr/local/lib
mkdir -p "$work/share"
desc="make install DESTDIR=... PREFIX=/usr/local installs libpeerdirect.so.0 (its soname), libpeerdirect.so, peerdirect.h and peerdirect.pc"
if out=$(capi_install "$work/share") &&
	[ -f "$lib/libpeerdirect.so.0" ] && [ "$(readlink "$lib/libpeerdirect.so")" = libpeerdirect.so.0 ] &&
	readelf -d "$lib/libpeerdirect.so.0" | grep -q 'SONAME.*\[libpeerdirect\.so\.0\]' &&
	cmp -s "$stage/usr/local/include/peerdirect.h" "$ROOT/userspace/capi/include/peerdirect.h" &&
	[ -f "$lib/pkgconfig/peerdirect.pc" ]; then
	ok "$desc"
else
	fail "$desc" "$out" "$(find "$stage" 2>/dev/null)"
fi

flags=$(PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage pkg-config --cflags --libs peerdirect 2>&1)
expected="-I$stage/usr/local/include -L$stage/usr/local/lib -lpeerdirect"
if [ "$(echo $flags)" = "$expected" ] && grep -qx 'prefix=/usr/local' "$lib/pkgconfig/peerdirect.pc"; then
	ok "peerdirect.pc has prefix=/usr/local and gives: ${expected//$stage/\$DESTDIR}"
else
	fail "peerdirect.pc has prefix=/usr/local and gives -I, -L and -lpeerdirect" "got: $flags" \
		"$(cat "$lib/pkgconfig/peerdirect.pc" 2>/dev/null)"
fi

cp "$ROOT/userspace/capi/examples/hbm_export.c" "$ROOT/userspace/capi/examples/fabric_register.c" \
	"$ROOT/userspace/capi/examples/hcl_style.cpp" "$ROOT/userspace/capi/examples/verbs_register.c" \
	"$ROOT/userspace/capi/examples/nommap_register.c" "$ROOT/userspace/capi/examples/hcl_pool.c" \
	"$ROOT/userspace/capi/examples/key_pool.c" "$ROOT/userspace/capi/tests/callback_race.c" \
	"$ROOT/userspace/capi/tests/lookup_race.c" "$ROOT/userspace/capi/tests/tcp_cache.h" \
	"$ROOT/userspace/capi/tests/fork_handles.c" "$ROOT/userspace/capi/tests/reset_register.c" \
	"$ROOT/userspace/capi/examples/verbs_rdma.c" "$work/share/"
# The programs are built on the host, chrooted in the guest's trixie userland (in_trixie: its
# gcc, g++, pkg-config, headers and libraries, the files the guest runs them with): a second
# each, where TCG takes half a minute for the C++ one. They run in the guest.
# trixie_build NAME CMD: CMD's output and status in NAME.out and NAME.rc of the share, as the
# guest scripts' run() leaves them.
trixie_build() {
	in_capi "$work/share" "$2" >"$work/share/$1.out" 2>&1
	echo $? >"$work/share/$1.rc"
}
trixie_build build 'gcc -std=c99 -pedantic -Wall -Wextra -Werror -o /tmp/hbm_export hbm_export.c $(pkg-config --cflags --libs peerdirect) && cp /tmp/hbm_export .'
trixie_build hbuild 'g++ -std=c++17 -Wall -Wextra -Werror -o /tmp/hcl_style hcl_style.cpp $(pkg-config --cflags --libs peerdirect libfabric) && cp /tmp/hcl_style .'
trixie_build fbuild 'gcc -std=c99 -pedantic -Wall -Wextra -Werror -o /tmp/fabric_register fabric_register.c $(pkg-config --cflags --libs peerdirect libfabric) && cp /tmp/fabric_register .'
trixie_build nbuild 'gcc -std=c99 -pedantic -Wall -Wextra -Werror -o /tmp/nommap_register nommap_register.c $(pkg-config --cflags --libs peerdirect libfabric) && cp /tmp/nommap_register .'
trixie_build pbuild 'gcc -std=c99 -pedantic -Wall -Wextra -Werror -o /tmp/hcl_pool hcl_pool.c $(pkg-config --cflags --libs peerdirect libfabric) && cp /tmp/hcl_pool .'
for p in abuild:callback_race lbuild:lookup_race xbuild:fork_handles; do
	trixie_build "${p%%:*}" "gcc -std=c99 -Wall -Wextra -Werror -fsanitize=address -g -o /tmp/${p#*:} ${p#*:}.c \$(pkg-config --cflags --libs peerdirect libfabric) -pthread && cp /tmp/${p#*:} ."
done
trixie_build tbuild 'gcc -std=c99 -pedantic -Wall -Wextra -Werror -o /tmp/reset_register reset_register.c $(pkg-config --cflags --libs peerdirect libfabric libibverbs) && cp /tmp/reset_register .'
trixie_build kbuild 'gcc -std=c99 -pedantic -Wall -Wextra -Werror -o /tmp/key_pool key_pool.c $(pkg-config --cflags --libs peerdirect libfabric) && cp /tmp/key_pool .'
trixie_build vbuild 'gcc -std=c99 -pedantic -Wall -Wextra -Werror -o /tmp/verbs_register verbs_register.c $(pkg-config --cflags --libs peerdirect libibverbs) && cp /tmp/verbs_register .'
trixie_build rbuild 'gcc -std=c99 -pedantic -Wall -Wextra -Werror -o /tmp/verbs_rdma verbs_rdma.c $(pkg-config --cflags --libs peerdirect libibverbs) && cp /tmp/verbs_rdma .'
cat >"$work/share/probe.sh" <<'EOF'
cd /mnt/host
run() { name=$1; shift; "$@" >"$name.out" 2>&1; echo $? >"$name.rc"; }
export LD_LIBRARY_PATH=/mnt/host/stage/usr/local/lib
run ldd ldd ./hbm_export
# hcl_style before hbm_export: each leaves its bytes in HBM for the host to find, and
# hbm_export's allocation (offset 0) must be the last to be written there.
run hcl ./hcl_style
run nommap sh -c 'insmod /usr/lib/peerdirect/tests/peerdirect_nommap.ko && ./nommap_register'
run pool ./hcl_pool
run keys ./key_pool
# AddressSanitizer for use after free only: the Rust library's process-long allocations are
# no leaks to report.
run race env ASAN_OPTIONS=detect_leaks=0 ./callback_race
run lookup env ASAN_OPTIONS=detect_leaks=0 ./lookup_race
run forked env ASAN_OPTIONS=detect_leaks=0 ./fork_handles
run example ./hbm_export
run fabric ./fabric_register
run fabric_rxe env FI_UNIVERSE_SIZE=64 ./fabric_register 'verbs;ofi_rxm'
run verbs ./verbs_register rxe0 refused
# Last: it resets the device.
run reset ./reset_register
EOF
hbm=$work/hbm
out=$(guest --rxe --hbm 8G --hbm-backing "$hbm" --share "$work/share" -- sh /mnt/host/probe.sh 2>&1)
rc=$?
cd "$work/share"
if [ "$(cat build.rc 2>/dev/null)" = 0 ]; then
	ok "trixie's gcc builds hbm_export.c (C99, -Wall -Wextra -Werror) with pkg-config --cflags --libs peerdirect"
else
	fail "trixie's gcc builds hbm_export.c (C99, -Wall -Wextra -Werror) with pkg-config --cflags --libs peerdirect" \
		"$(show build)"
fi

if grep -q "libpeerdirect.so.0 => /mnt/host/stage/usr/local/lib/libpeerdirect.so.0" ldd.out 2>/dev/null; then
	ok "hbm_export loads the installed libpeerdirect.so.0"
else
	fail "hbm_export loads the installed libpeerdirect.so.0" "$(show ldd)"
fi

if [ $rc = 0 ] && [ "$(cat example.rc 2>/dev/null)" = 0 ] &&
	grep -q '^/dev/peerdirect0: .* 8589934592 bytes of HBM' example.out &&
	grep -q '^wrote and read back 4194304 bytes through the mapping: 0 words differ$' example.out &&
	grep -q '^stats: allocations 0, allocated_bytes 0, exports 0, hbm_bytes 8589934592$' example.out; then
	ok "hbm_export runs in the guest: device info, 4 MiB allocated, exported, mapped, pattern read back, stats back to zero"
	sed "s/^/# /" example.out
else
	fail "hbm_export runs in the guest: device info, 4 MiB allocated, exported, mapped, pattern read back, stats back to zero" \
		"qemu/run exited $rc (99: kernel splat, 98: guest died, 124: timeout)" "$out" "$(show example)"
fi

# The pattern (word i = (i + 1) * 0x9e3779b97f4a7c15 mod 2^64) must be in HBM itself.
offset=$(sed -n 's/^allocated 4194304 bytes at HBM offset \(0x[0-9a-f]*\|0\) .*/\1/p' example.out 2>/dev/null)
if [ -n "$offset" ] && python3 - "$hbm" "$offset" <<'PY'; then
import struct, sys
path, offset = sys.argv[1], int(sys.argv[2], 0)
with open(path, "rb") as f:
    f.seek(offset)
    data = f.read(4 << 20)
words = struct.unpack("<%dQ" % (len(data) // 8), data)
bad = [i for i, w in enumerate(words) if w != ((i + 1) * 0x9E3779B97F4A7C15) % (1 << 64)]
if len(words) != (4 << 20) // 8 or bad:
    print("# %d words, first bad word: %s" % (len(words), bad[:1]))
    sys.exit(1)
PY
	ok "the host finds the pattern in the HBM backing file at the allocation's offset ($offset)"
else
	fail "the host finds the pattern in the HBM backing file at the allocation's offset" "offset: ${offset:-none}" "$(show example)"
fi

desc="trixie's gcc builds fabric_register.c (C99, -Werror) with pkg-config --cflags --libs peerdirect libfabric"
if [ "$(cat fbuild.rc 2>/dev/null)" = 0 ]; then
	ok "$desc"
else
	fail "$desc" "$(show fbuild)"
fi

desc="fabric_register in the guest: tcp domain opened by the program and attached (pd_domain_attach), HBM registered through pd_register (path dmabuf), second request a cache hit, pd_mr_local's address reads the HBM an export wrote, a second handle on the same domain registers anew and detach refuses with -EBUSY while held, dropping nothing, and so does pd_domain_set_endpoint, then detach drops it once released, a second cache in the same domain gets another key (freed with it held, its domain handle detaches once the handle is released: EBUSY before, saying it is held), pd_mr_remote gives the RMA address and key, pd_allocation_free invalidates the entry and the callback hears of it with key, address and length; a udmabuf through pd_register_dmabuf: a miss, a hit inside it, pd_regcache_invalidate_dmabuf drops it, heard too; domain detached and closed"
if [ "$(cat fabric.rc 2>/dev/null)" = 0 ] &&
	grep -q '^registered 4194304 bytes: path dmabuf, key ' fabric.out &&
	grep -q '^registered 4096 bytes at 1 MiB: path dmabuf, key .*offset in mr 1048576$' fabric.out &&
	grep -q '^local: 4194304 bytes at the whole.s address, 4096 at +1048576 of it, which reads what an export of the same HBM wrote$' fabric.out &&
	grep -q '^second handle, same domain pointer: key ' fabric.out &&
	grep -q '^detach while held: pd_domain_detach: 1 registration(s) in the domain are still held' fabric.out &&
	grep -q '^refused detach dropped nothing: no invalidation heard, [0-9]* entries cached as before$' fabric.out &&
	grep -q '^refused endpoint dropped nothing: pd_domain_set_endpoint: 1 registration(s) in the domain made with the endpoint named before are still held' fabric.out &&
	grep -q '^invalidated: cause domain, key 0x[0-9a-f]*, held 0, its domain, 4194304 bytes at its local address$' fabric.out &&
	grep -q '^second cache, same domain: key ' fabric.out &&
	grep -q '^second cache freed with its registration held: detach EBUSY until the handle is released, then 0$' fabric.out &&
	grep -Eq '^rma: FI_MR_VIRT_ADDR [01], whole at (0|0x[0-9a-f]+), the part at 0x[0-9a-f]+ \(\+1048576\), key ' fabric.out &&
	grep -q '^cache after registering: hits 1, misses 2, registrations 2, deregistrations 1, invalidations 1, entries 1$' fabric.out &&
	grep -q '^cache after freeing: hits 1, misses 2, registrations 2, deregistrations 2, invalidations 2, entries 0$' fabric.out &&
	grep -q '^invalidated: cause memory, key 0x[0-9a-f]*, held 0, its domain, 4194304 bytes at its local address$' fabric.out &&
	grep -q '^foreign dma-buf, 4194304 bytes: path dmabuf, key ' fabric.out &&
	grep -q '^cache after the foreign dma-buf: hits 2, misses 3, registrations 3, deregistrations 2, invalidations 2, entries 1$' fabric.out &&
	grep -q '^cache after invalidating it: hits 2, misses 3, registrations 3, deregistrations 3, invalidations 3, entries 0$' fabric.out &&
	[ "$(grep -c '^invalidated: ' fabric.out)" = 3 ] &&
	grep -q '^detached: 3 invalidations heard in all$' fabric.out &&
	grep -q '^closed: the domain after every registration in it$' fabric.out; then
	ok "$desc"
	sed "s/^/# /" fabric.out
else
	fail "$desc" "$(show fabric)"
fi

desc="fabric_register on verbs;ofi_rxm (soft-RoCE refuses dma-bufs): pd_register fails with -EOPNOTSUPP and the provider's reason until pd_regcache_set_host_bounce(cache, 1), as does pd_register_dmabuf_at, binding nothing (a lookup there: ENOENT; again: EOPNOTSUPP), and with host bounce on too, saying host bounce cannot copy through a dma-buf at an address; then path host_bounce with a reason and a staging buffer, pd_mr_remote and pd_mr_local refused, invalidations heard without a local address"
if [ "$(cat fabric_rxe.rc 2>/dev/null)" = 0 ] &&
	grep -q '^refused without host bounce: .*fi_mr_regattr(FI_MR_DMABUF).*the host-bounce fallback is off.*pd_regcache_set_host_bounce' fabric_rxe.out &&
	grep -q '^refused by fd alone too, binding nothing: a lookup there ENOENT, asked again EOPNOTSUPP$' fabric_rxe.out &&
	grep -q '^refused by fd alone with host bounce on: .*host bounce is on, but it copies through a CPU mapping of the dma-buf' fabric_rxe.out &&
	grep -q '^registered 4194304 bytes: path host_bounce, key .*, reason: ' fabric_rxe.out &&
	grep -q '^second cache, same domain: key ' fabric_rxe.out &&
	grep -q '^foreign dma-buf, 4194304 bytes: path host_bounce, ' fabric_rxe.out &&
	grep -q '^cache after invalidating it: .*entries 0$' fabric_rxe.out &&
	grep -Eq '^staging: [1-9][0-9]* bytes, written by the program$' fabric_rxe.out &&
	grep -q '^rma: refused for host bounce ' fabric_rxe.out &&
	grep -q '^local: refused for host bounce (pd_mr_local: the registration is a host bounce' fabric_rxe.out &&
	grep -q '^invalidated: cause memory, key 0x[0-9a-f]*, held 0, its domain, 0 bytes$' fabric_rxe.out &&
	grep -q '^detached: 3 invalidations heard in all$' fabric_rxe.out &&
	grep -q '^closed: the domain after every registration in it$' fabric_rxe.out; then
	ok "$desc"
	sed "s/^/# /" fabric_rxe.out
else
	fail "$desc" "$(show fabric_rxe)"
fi
desc="trixie's gcc builds verbs_register.c (C99, -Werror) with pkg-config --cflags --libs peerdirect libibverbs"
if [ "$(cat vbuild.rc 2>/dev/null)" = 0 ]; then
	ok "$desc"
else
	fail "$desc" "$(show vbuild)"
fi

desc="verbs_register on rxe0 (the ibverbs registrar in C): the program's own protection domain attached with pd_domain_attach_verbs; pd_register (ibv_reg_dmabuf_mr) refused with -EOPNOTSUPP naming rxe0, its driver and the alternatives, counted as a failed registration; detached, and ibv_dealloc_pd of the program's domain succeeds (no region left in it, never freed by the library)"
if [ "$(cat verbs.rc 2>/dev/null)" = 0 ] &&
	grep -q '^attached protection domain of rxe0$' verbs.out &&
	grep -q '^refused: pd_register: ibv_reg_dmabuf_mr on rxe0 (provider rxe): EOPNOTSUPP.*cannot register dma-bufs.*EFA, mlx5, irdma); ibverbs registrations are always direct, so with this device register through libfabric instead' verbs.out &&
	grep -q '^cache: misses 1, registrations 0, failed 1, entries 0$' verbs.out &&
	grep -q '^detached: 0 cached registration(s) dropped$' verbs.out &&
	grep -q '^released: the protection domain is the program.s to deallocate, and was$' verbs.out; then
	ok "$desc"
	sed "s/^/# /" verbs.out
else
	fail "$desc" "$(show verbs)"
fi

desc="trixie's gcc builds tests/reset_register.c (C99, -Wall -Wextra -Werror) with pkg-config --cflags --libs peerdirect libfabric libibverbs"
if [ "$(cat tbuild.rc 2>/dev/null)" = 0 ]; then
	ok "$desc"
else
	fail "$desc" "$(show tbuild)"
fi
# reset_at NAME WHERE: the check of reset_register's pd_register_export_at part in NAME.out.
reset_at() {
	local desc="reset_register on $2: two exports registered with pd_register_export_at at device addresses of the program's, through a device handle closed right after, and found by address (hits); the reset drops both at once and the invalidation callback hears of each (PD_INVALIDATED_DEVICE); their bytes (pd_register_addr) and the first one's fd are then refused with ENODEV saying to export again (its bytes still after that), and a new export registers at the second one's address without pd_regcache_invalidate_dmabuf and is found there (a hit), and another over part of the first one's addresses takes them over (a hit in it, ENOENT before it)"
	if [ "$(cat "$1.rc" 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' "$1.out" &&
		grep -q '^ok - two exports registered with pd_register_export_at at 0x100040000000 and 0x100050000000 through a device handle closed right after, each found by address (a hit, at its offset)$' "$1.out" &&
		grep -q '^ok - the reset dropped both registrations at device addresses at once: the callback heard of each (PD_INVALIDATED_DEVICE)$' "$1.out" &&
		grep -q '^ok - pd_register_addr of a revoked export.s bytes: ENODEV (pd_register_addr: the dma-buf registered at 0x100040000000 (+0x400000) is an export of /dev/peerdirect0 that a reset or the removal of the device revoked: export the memory again' "$1.out" &&
		grep -q '^ok - pd_register_export_at of an export made before the reset: ENODEV$' "$1.out" &&
		grep -q '^ok - and its bytes still: ENODEV$' "$1.out" &&
		grep -q '^ok - a new export registers at the revoked one.s address 0x100050000000 (no pd_regcache_invalidate_dmabuf) and is found there, a hit$' "$1.out" &&
		grep -q '^ok - a new export over part of the revoked one.s addresses takes them over: a hit in it, -ENOENT before it$' "$1.out"; then
		ok "$desc"
	else
		fail "$desc" "$(show "$1")"
	fi
}
desc="reset_register on tcp: an allocation registered with pd_register (its registration held), the device reset through sysfs (its mapping then faults: SIGBUS), and pd_register of the same allocation registers a new export of it, whose memory takes a pattern; a third pd_register is a cache hit on it; the program's own export registered with pd_register_export before the reset is refused after it (ENODEV, saying to export again), and a new export registers"
if [ "$(cat reset.rc 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' reset.out &&
	grep -q '^ok - the device reset through /sys/bus/pci/devices/.*/reset$' reset.out &&
	grep -q '^ok - the first registration.s memory faults after the reset (SIGBUS)$' reset.out &&
	grep -q '^ok - registered again after the reset: a new export, whose memory at 0x[0-9a-f]* takes a pattern$' reset.out &&
	grep -q '^ok - pd_register_export of the program.s export made before the reset: ENODEV (pd_register_export: fd [0-9]* is an export of /dev/peerdirect0 made before a reset or the removal of the device, which revoked it: export the memory again' reset.out &&
	grep -q '^ok - a new export registers with pd_register_export after the reset$' reset.out &&
	grep -q '^ok - the third pd_register is a hit on it: hits 5 (4 by address), misses 8, registrations 8 (2 of them pd_register.s), failed 0$' reset.out; then
	ok "$desc"
	sed "s/^/# /" reset.out
else
	fail "$desc" "$(show reset)"
fi
reset_at reset tcp

desc="trixie's gcc builds nommap_register.c (C99, -Wall -Wextra -Werror) with pkg-config --cflags --libs peerdirect libfabric"
if [ "$(cat nbuild.rc 2>/dev/null)" = 0 ]; then
	ok "$desc"
else
	fail "$desc" "$(show nbuild)"
fi
desc="nommap_register: a dma-buf whose exporter refuses mmap (tests/kmod/peerdirect_nommap.ko, reached through its own device) registers by its fd alone with pd_register_dmabuf_at at the runtime's address (pd_register_dmabuf, which maps it, fails; a NULL or second base address: EINVAL; bytes past its end refused at the pool's address leave nothing there to look up); a sub-range is a cache hit; tcp moves 1 MiB through the registration, every byte checked; no dma-buf is mapped in the process"
if [ "$(cat nommap.rc 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' nommap.out &&
	grep -q '^ok - pd_register_dmabuf, which maps the dma-buf, fails: EINVAL (.*mmap' nommap.out &&
	grep -q '^ok - pd_register_dmabuf_at with base address NULL: EINVAL (pd_register_dmabuf_at: base address 0x0 ' nommap.out &&
	grep -q '^ok - the same dma-buf at another base address: EINVAL' nommap.out &&
	grep -q '^ok - pd_register_dmabuf_at of bytes past the dma-buf.s end: EINVAL' nommap.out &&
	grep -q '^ok - then a lookup at that address: ENOENT' nommap.out &&
	grep -q '^ok - pd_register_dmabuf_at registered the pool by its fd at .*: path dma_buf' nommap.out &&
	grep -q '^ok - a sub-range of the pool is a cache hit on the same registration$' nommap.out &&
	grep -q '^ok - tcp moved 1048576 bytes from the pool' nommap.out &&
	grep -q '^ok - /proc/self/maps maps no dma-buf' nommap.out; then
	ok "$desc"
else
	fail "$desc" "$(show nommap)"
fi
desc="nommap_register: a read-only export of /dev/peerdirect0 is refused by pd_register_dmabuf (EACCES: it maps writable), registers for reading with pd_register_dmabuf_at at its read-only mapping, and tcp sends 1 MiB of HBM from it, every byte checked"
if [ "$(cat nommap.rc 2>/dev/null)" = 0 ] &&
	grep -q '^ok - pd_register_dmabuf of a read-only export (it maps writable): EACCES' nommap.out &&
	grep -q '^ok - a read-only export registered for reading at its read-only mapping; tcp sent 1048576 bytes' nommap.out; then
	ok "$desc"
	sed "s/^/# /" nommap.out
else
	fail "$desc" "$(show nommap)"
fi

desc="trixie's gcc builds hcl_pool.c (C99, -Wall -Wextra -Werror) with pkg-config --cflags --libs peerdirect libfabric"
if [ "$(cat pbuild.rc 2>/dev/null)" = 0 ]; then
	ok "$desc"
else
	fail "$desc" "$(show pbuild)"
fi
desc="hcl_pool (HCL's pattern): a 4 GiB pool of HBM registered once with pd_register_dmabuf_at at the runtime's address; 1,000 buffers found by address (pd_register_addr_in, each handle in the caller's pd_mr_storage) are cache hits on that one registration at their addresses and offsets; addresses outside it: ENOENT; in a cache of one entry with the pool's registration evicted, a buffer found by address registers the whole pool again and a second buffer hits it; tcp sends 1 MiB between two buffers 2 GiB apart, found by address, every byte checked; the one-word flush buffer found for remote reads with the pool's key"
if [ "$(cat pool.rc 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' pool.out &&
	grep -q '^ok - the 4 GiB pool registered once at .*: path dma_buf' pool.out &&
	grep -q '^ok - 1000 buffers looked up by address .*: 1000 cache hits on the one registration, each at its address and offset, its handle in the caller.s pd_mr_storage$' pool.out &&
	grep -q '^ok - bytes past the pool.s end, and an address outside it: ENOENT (pd_register_addr: .* runs past the end of the dma-buf registered at ' pool.out &&
	grep -q '^ok - the pool.s registration evicted (a cache of one entry, its handle released): a buffer found by address registers the whole pool again (offset 0x40001000 in it), and a buffer 2 GiB away is a hit on that registration$' pool.out &&
	grep -q '^ok - tcp sent 1048576 bytes from pool + 3 GiB + 12345 to pool + 1 GiB + 777' pool.out &&
	grep -q '^ok - the one-word flush buffer ' pool.out; then
	ok "$desc"
	sed "s/^/# /" pool.out
else
	fail "$desc" "$(show pool)"
fi

desc="trixie's gcc builds key_pool.c (C99, -Wall -Wextra -Werror) with pkg-config --cflags --libs peerdirect libfabric"
if [ "$(cat kbuild.rc 2>/dev/null)" = 0 ]; then
	ok "$desc"
else
	fail "$desc" "$(show kbuild)"
fi
desc="key_pool: tcp without FI_MR_PROV_KEY takes the keys of the program's pool (pd_domain_set_keys with the domain's mr_key_size), which get them back as registrations close (a freed allocation, pd_domain_detach); a key the key size cannot hold: ERANGE, none left: ENOSPC; PD_IFACE_SYNAPSEAI refused by tcp, an unknown iface EINVAL; the allocator calls into the library (it runs under no lock of the library's), and its pd_domain_detach of the domain it registers in is refused (EBUSY)"
if [ "$(cat keys.rc 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' keys.out &&
	grep -q '^ok - two registrations took keys 0x7000 and 0x7001 from the program.s pool' keys.out &&
	grep -q '^ok - freeing the first allocation closed its registration and gave key 0x7000 back' keys.out &&
	grep -q '^ok - a key the key size cannot hold: -ERANGE; an allocator with none left: -ENOSPC' keys.out &&
	grep -q '^ok - PD_IFACE_SYNAPSEAI (device 0) on tcp' keys.out &&
	grep -q '^ok - pd_domain_detach closed every registration: every key is back in the pool' keys.out &&
	grep -q '^ok - the allocator called into the library [0-9]* times' keys.out &&
	grep -q '^ok - pd_domain_detach of the domain from inside its key allocator: -EBUSY' keys.out; then
	ok "$desc"
	sed "s/^/# /" keys.out
else
	fail "$desc" "$(show keys)"
fi

asan_checks callback_race abuild race "callback_race under AddressSanitizer: 20 rounds of setting the invalidation callback with a fresh heap context, clearing it (the last: pd_regcache_free) and freeing the context at once, while a thread registers and frees allocations (each telling the callback): no call after its removal returned, no use after free" \
	'20 rounds of setting, clearing and freeing the callback.s context'
asan_checks lookup_race lbuild lookup "lookup_race under AddressSanitizer: two threads registering (pd_register_dmabuf_at) and dropping (pd_regcache_invalidate_dmabuf) four exports at their addresses while two threads look them up by address (pd_register_addr, and pd_register_addr_in with the handle in the caller's storage) and one asks for bytes past their ends at their addresses (refused, binding nothing) and for the pool through a domain handle tcp refuses (the pool stays found): lookups in a pool registered all along always hit, every handle names the bytes looked up, no lookup misses an export registered before and after it, the final set is found exactly; a dma-buf registered 200 times while two threads look it up is found by none until its registration returns, then by each, registered once a round (no lookup registers a piece of its own); and with all dropped nothing stays cached or registered" \
	'2 threads registering and dropping 4 exports'
asan_checks fork_handles xbuild forked "fork_handles under AddressSanitizer: a forked child's pd_register_addr, pd_register_addr_in and pd_register_in in its parent's domain (each a hit in the parent) fail with -ECHILD saying why, and its pd_mr_release of the parent's handles, allocated and in the caller's storage, leaves each alone saying why; the parent's released, nothing stays cached or registered" \
	'a forked child.s registrations in its parent.s domain'

desc="trixie's g++ builds hcl_style.cpp (C++17, -Wall -Wextra -Werror) with pkg-config --cflags --libs peerdirect libfabric"
if [ "$(cat hbuild.rc 2>/dev/null)" = 0 ]; then
	ok "$desc"
else
	fail "$desc" "$(show hbuild)"
fi

desc="hcl_style (C++, registering as HCL does: fi_mr_dmabuf with the dma-buf fd, offset 0, base_addr = the buffer's address, iov_count 1) registers two peerdirect exports and moves 4 MiB HBM to HBM over tcp"
offset=$(sed -n "s/^moved 4194304 bytes HBM to HBM over tcp in 4 tagged messages; the receiver's HBM (offset \(0x[0-9a-f]*\|0\)) holds the sender's bytes$/\1/p" hcl.out 2>/dev/null)
if [ "$(cat hcl.rc 2>/dev/null)" = 0 ] &&
	grep -q '^registered 2 peerdirect exports like HCL (fi_mr_dmabuf: fd, offset 0, base_addr = buffer, iov_count 1): keys ' hcl.out &&
	[ -n "$offset" ] && python3 - "$hbm" "$offset" <<'PY'; then
import sys
path, offset = sys.argv[1], int(sys.argv[2], 0)
with open(path, "rb") as f:
    f.seek(offset)
    data = f.read(4 << 20)
bad = [i for i, b in enumerate(data) if b != ((i * 0x9E3779B97F4A7C15) % (1 << 64)) >> 56]
if len(data) != 4 << 20 or bad:
    print("# host: %d bytes at %#x, first bad byte: %s" % (len(data), offset, bad[:1]))
    sys.exit(1)
PY
	ok "$desc; the host finds the sender's bytes in the HBM backing file at $offset"
	sed "s/^/# /" hcl.out
else
	fail "$desc" "$(show hcl)"
fi

# The patched rxe (qemu/run --rxe-dmabuf): the ibverbs registrar's registrations succeed, and
# HCL's path moves bytes with the program's own queue pairs, HBM named by device VA.
cd /
cat >"$work/share/rxe.sh" <<'EOS'
cd /mnt/host
run() { name=$1; shift; "$@" >"$name.out" 2>&1; echo $? >"$name.rc"; }
export LD_LIBRARY_PATH=/mnt/host/stage/usr/local/lib
run verbs_direct ./verbs_register rxe0 direct
run rdma ./verbs_rdma rxe0
# Last: it resets the device.
run vreset ./reset_register verbs rxe0
EOS
hbm_rxe=$work/hbm-rxe
out=$(guest --rxe-dmabuf --hbm-backing "$hbm_rxe" --share "$work/share" -- sh /mnt/host/rxe.sh 2>&1)
rc=$?
cd "$work/share"
desc="trixie's gcc builds verbs_rdma.c (C99, -Wall -Wextra -Werror) with pkg-config --cflags --libs peerdirect libibverbs"
if [ "$(cat rbuild.rc 2>/dev/null)" = 0 ]; then
	ok "$desc"
else
	fail "$desc" "$(show rbuild)"
fi
desc="verbs_register on rxe0 with the patched rxe and provider (qemu/run --rxe-dmabuf): pd_register (ibv_reg_dmabuf_mr) of 4096 bytes at 1 MiB of an allocation succeeds, path dmabuf, at IOVA = its offset (0x100000), which pd_mr_local and pd_mr_remote give; the registration is cached and dropped at detach; ibv_dealloc_pd of the program's domain succeeds"
if [ $rc = 0 ] && [ "$(cat verbs_direct.rc 2>/dev/null)" = 0 ] &&
	grep -q '^attached protection domain of rxe0$' verbs_direct.out &&
	grep -q '^registered 4096 bytes at 1 MiB: lkey 0x[0-9a-f]*, rkey 0x[0-9a-f]*, iova 0x100000$' verbs_direct.out &&
	grep -q '^cache: misses 1, registrations 1, failed 0, entries 1$' verbs_direct.out &&
	grep -q '^detached: 1 cached registration(s) dropped$' verbs_direct.out &&
	grep -q '^released: the protection domain is the program.s to deallocate, and was$' verbs_direct.out; then
	ok "$desc"
	sed "s/^/# /" verbs_direct.out
else
	fail "$desc" "qemu/run exited $rc (99: kernel splat, 98: guest died, 124: timeout)" "$out" "$(show verbs_direct)"
fi
desc="reset_register on rxe0 with the patched rxe (ibv_reg_dmabuf_mr): an allocation registered with pd_register (held), the device reset through sysfs, and pd_register of the same allocation registers a new export of it (the revoked one ib_core refuses: ENODEV), path dmabuf; a third pd_register is a cache hit on it; the program's own export made before the reset is refused by pd_register_export (ENODEV), a new one registers"
if [ "$(cat vreset.rc 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' vreset.out &&
	grep -q '^ok - the device reset through /sys/bus/pci/devices/.*/reset$' vreset.out &&
	grep -q '^ok - registered again after the reset on rxe0: path dmabuf, lkey 0x[0-9a-f]*$' vreset.out &&
	grep -q '^ok - pd_register_export of the program.s export made before the reset: ENODEV' vreset.out &&
	grep -q '^ok - a new export registers with pd_register_export after the reset$' vreset.out &&
	grep -q '^ok - the third pd_register is a hit on it: hits 5 (4 by address), misses 8, registrations 8 (2 of them pd_register.s), failed 0$' vreset.out; then
	ok "$desc"
	sed "s/^/# /" vreset.out
else
	fail "$desc" "$(show vreset)"
fi
reset_at vreset "rxe0 with the patched rxe"
desc="verbs_rdma (HCL's ibverbs path, the program's own PD and RC queue pairs on rxe0): 8 MiB of HBM registered once with pd_register_dmabuf_at at device VA 0x100040000000; two buffers in it found by device VA (pd_register_addr: cache hits); pd_mr_remote and pd_mr_local give their device VAs (pool + offset) and the pool's rkey"
if grep -q '^ok - rxe0: the program.s protection domain and two RC queue pairs connected to each other$' rdma.out &&
	grep -q '^ok - the pool registered once with pd_register_dmabuf_at at device VA 0x100040000000: rkey 0x[0-9a-f]*, path dma_buf$' rdma.out &&
	grep -q '^ok - buffers at pool + 0x105000 and + 0x503000 found by device VA (pd_register_addr): cache hits' rdma.out &&
	grep -q '^ok - pd_mr_remote and pd_mr_local give the buffers. device VAs 0x100040105000 and 0x100040503000 (the pool.s + 0x105000, + 0x503000) and the pool.s rkey$' rdma.out; then
	ok "$desc"
else
	fail "$desc" "$(show rdma)"
fi
desc="verbs_rdma: an RDMA WRITE of 1 MiB of host memory into HBM at device VA pool + 0x105000 completes and HBM holds the pattern there (read through a second export's mapping)"
if grep -q '^ok - RDMA WRITE of 1 MiB of host memory into HBM at device VA pool + OFF_A completes' rdma.out &&
	grep -q '^ok - HBM at pool + OFF_A holds the pattern' rdma.out; then
	ok "$desc"
else
	fail "$desc" "$(show rdma)"
fi
desc="verbs_rdma: an RDMA READ of 1 MiB of HBM at device VA pool + 0x105000 into host memory completes with the pattern"
if grep -q '^ok - RDMA READ of 1 MiB of HBM at device VA pool + OFF_A into host memory completes' rdma.out &&
	grep -q '^ok - the host memory read into holds the pattern$' rdma.out; then
	ok "$desc"
else
	fail "$desc" "$(show rdma)"
fi
desc="verbs_rdma: an RDMA WRITE of 1 MiB from HBM named by device VA (pd_mr_local, pd_mr_lkey) into HBM at device VA pool + 0x503000 completes and HBM holds the pattern there; the rest of the 8 MiB is still zero; every step ok, and ibv_dealloc_pd of the program's domain succeeds"
if [ "$(cat rdma.rc 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' rdma.out &&
	grep -q '^ok - RDMA WRITE of 1 MiB from HBM at device VA pool + OFF_A (pd_mr_lkey) into HBM at pool + OFF_B completes' rdma.out &&
	grep -q '^ok - HBM at pool + OFF_B holds the pattern$' rdma.out &&
	grep -q '^ok - the rest of the pool is still zero$' rdma.out &&
	grep -q '^ok - released: ibv_dealloc_pd of the program.s domain succeeds$' rdma.out; then
	ok "$desc"
	sed "s/^/# /" rdma.out
else
	fail "$desc" "$(show rdma)"
fi
desc="on the host, the HBM backing file holds verbs_rdma's pattern at both buffers' hbm_offsets (the RDMA WRITE's targets)"
read -r seed length at_a at_b < <(sed -n 's/^hbm: pattern \(0x[0-9a-f]*\) of \([0-9]*\) bytes at hbm_offset \(0x[0-9a-f]*\) and \(0x[0-9a-f]*\)$/\1 \2 \3 \4/p' rdma.out 2>/dev/null)
if [ -n "${at_b:-}" ] &&
	"$ROOT/tests/hbm-pattern" check "$hbm_rxe" $((at_a)) "$length" "$seed" >check.out 2>&1 &&
	"$ROOT/tests/hbm-pattern" check "$hbm_rxe" $((at_b)) "$length" "$seed" >>check.out 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(cat check.out 2>/dev/null)" "$(show rdma)"
fi

# The companion export (Documentation/companion.md): the HBM device bound to vfio-pci as its
# owner, peerdirect loaded with companion=1 and the device named; companion_export.c exports a
# BAR range with pd_export_range, writes the pattern through its mapping and registers it
# with libfabric's tcp through the cache; without CAP_SYS_ADMIN it is refused with -EPERM.
cd /
cp "$ROOT/userspace/capi/examples/companion_export.c" "$work/share/"
trixie_build cbuild 'gcc -std=gnu11 -Wall -Wextra -Werror -o /tmp/companion_export companion_export.c $(pkg-config --cflags --libs peerdirect libfabric) && cp /tmp/companion_export .'
cat >"$work/share/companion.sh" <<'EOS'
cd /mnt/host
run() { name=$1; shift; "$@" >"$name.out" 2>&1; echo $? >"$name.rc"; }
export LD_LIBRARY_PATH=/mnt/host/stage/usr/local/lib
hbm=0000:03:00.0
echo vfio-pci >/sys/bus/pci/devices/$hbm/driver_override
echo $hbm >/sys/bus/pci/drivers_probe
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
peerdirect companion add $hbm --bar 2 >/dev/null
run cnocap setpriv --inh-caps=-sys_admin --bounding-set=-sys_admin ./companion_export 0 0x1000000 0x400000 0x5eed0003 --expect-errno EPERM
run companion ./companion_export 0 0x1000000 0x400000 0x5eed0003
run creset ./companion_export 0 0x3000000 0x200000 0x5eed0005 --reset
run clock ./companion_export 0 0x3400000 0x200000 0x5eed0006 --lock
# Registered and mapped while the companion goes.
./companion_export 0 0x2000000 0x200000 0x5eed0004 --hold /tmp/go >hold.out 2>&1 &
pid=$!
n=0
while ! grep -q 'registered, waiting' hold.out && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
run cremove peerdirect companion remove $hbm
touch /tmp/go
wait $pid
echo $? >hold.rc
EOS
hbm_companion=$work/hbm-companion
out=$(guest --topology switch-iommu --no-bind --userland trixie --hbm-backing "$hbm_companion" \
	--share "$work/share" -- sh /mnt/host/companion.sh 2>&1)
rc=$?
cd "$work/share"
desc="trixie's gcc builds companion_export.c (-Wall -Wextra -Werror) with pkg-config --cflags --libs peerdirect libfabric"
if [ "$(cat cbuild.rc 2>/dev/null)" = 0 ]; then
	ok "$desc"
else
	fail "$desc" "$(show cbuild)"
fi
desc="companion_export without CAP_SYS_ADMIN: pd_export_range refused with -EPERM, and pd_last_error says why"
if [ "$(cat cnocap.rc 2>/dev/null)" = 0 ] && grep -q '^ok - refused with EPERM: .*needs CAP_SYS_ADMIN' cnocap.out; then
	ok "$desc"
	sed "s/^/# /" cnocap.out
else
	fail "$desc" "$(show cnocap)"
fi
desc="companion_export: pd_device_info says companion, pd_export_range exports 4 MiB at BAR offset 16 MiB, the pattern written through its mapping reads back, libfabric tcp registers it through the cache (a miss, then a hit on the same key, path dma_buf)"
if [ $rc = 0 ] && [ "$(cat companion.rc 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' companion.out &&
	grep -qi 'companion' companion.out && grep -q 'dma_buf' companion.out; then
	ok "$desc"
	sed "s/^/# /" companion.out
else
	fail "$desc" "qemu/run exited $rc" "$out" "$(show companion)"
fi
desc="companion_export --reset: pd_companion_reset_prepare with a registration held and mapped: the callback hears of it (PD_INVALIDATED_DEVICE, its key) on the library's own thread, the mapping faults with SIGBUS, exports are EBUSY until pd_companion_reset_done (a second: EINVAL), then a new export maps, takes a pattern and registers anew"
if [ "$(cat creset.rc 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' creset.out &&
	grep -q "^ok - invalidated by the reset: 1 callback(s), cause PD_INVALIDATED_DEVICE, held 1, key .*, on the library's thread$" creset.out &&
	grep -q '^ok - touching the mapping after the reset began: SIGBUS$' creset.out &&
	grep -q '^ok - pd_export_range during the reset: EBUSY$' creset.out &&
	grep -q '^ok - exported again after the reset and registered' creset.out; then
	ok "$desc"
	sed "s/^/# /" creset.out
else
	fail "$desc" "$(show creset)"
fi
desc="companion_export --lock: the invalidation callback takes an error-checking mutex the program holds around two resets and its pd_register_export calls (one finding its registration revoked): both calls come once the program lets go, none on the program's own thread (no EDEADLK)"
if [ "$(cat clock.rc 2>/dev/null)" = 0 ] && ! grep -q '^FAIL' clock.out &&
	grep -q '^ok - a second reset, then pd_register_export of the revoked export with the lock held' clock.out &&
	grep -q '^ok - the callback heard of both registrations once the lock was let go of: [0-9]* call(s), none with EDEADLK$' clock.out; then
	ok "$desc"
	sed "s/^/# /" clock.out
else
	fail "$desc" "$(show clock)"
fi
desc="companion remove while companion_export holds a registration (pd_register_export) and a mapping: the invalidation callback hears of it with PD_INVALIDATED_DEVICE and its key, and touching the mapping then gets SIGBUS; the revoked dma-buf registered again, mapped or at an address, is refused with ENODEV saying to export again"
if [ "$(cat cremove.rc 2>/dev/null)" = 0 ] && [ "$(cat hold.rc 2>/dev/null)" = 0 ] &&
	grep -q '^ok - invalidated: [0-9]* callback(s), cause PD_INVALIDATED_DEVICE' hold.out &&
	grep -q '^ok - touching the mapping after the companion went: SIGBUS$' hold.out &&
	grep -q '^ok - the revoked dma-buf registered again: ENODEV, mapped and at an address' hold.out; then
	ok "$desc"
	sed "s/^/# /" hold.out
else
	fail "$desc" "$(show cremove)" "$(show hold)"
fi
desc="the host finds companion_export's pattern in the HBM backing file at BAR offset 16 MiB"
if "$ROOT/tests/hbm-pattern" check "$hbm_companion" $((16 << 20)) $((4 << 20)) 0x5eed0003 >check.out 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(cat check.out)" "$(show companion)"
fi
cd /
exit $failed
