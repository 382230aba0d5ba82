# peerdirect: accelerator HBM as DMA-BUF for peer-to-peer RDMA. See README.md.
#
#   make demo      set everything up, boot the test guest, show what peerdirect does
#   make test      set everything up, run every test; ends with "N passed, N failed"
#   make module [KDIR=/path/to/kernel/build]   build peerdirect.ko (default: the test kernel)
#   make peermem KDIR=... OFED=DIR              the PeerDirect peer-memory client, for MLNX_OFED
#   make userspace                              build the crate and the `peerdirect` CLI
#   make install KDIR=... [DESTDIR=] [PREFIX=/usr/local] [UDEVRULESDIR=/etc/udev/rules.d]
#   make deb       Debian packages in build/deb: peerdirect-dkms (the module, built by DKMS for
#                  each kernel) and peerdirect (CLI, libpeerdirect, headers); packaging.md
#   make bench     benchmarks (not tests): ratios against baselines measured in the same run
#   make stress    every suite that races (tests/run --stress: race, companion, pinned,
#                  KUnit's), each race for 120 s instead of 10
#   make check-quick   the edit loop: lints, host tests, KUnit and one guest suite on the test
#                  kernel (tests/run --quick); make test stays the whole proof
#   make guest     everything the test guests need, for the three guest kernels: the default
#                  test kernel (gcc), its KASAN flavour (clang 19; `qemu/run --kernel kasan`) and
#                  Debian's own stock kernel (`qemu/run --kernel debian`); guest-default,
#                  guest-kasan and guest-debian build one of them
#
# Expensive outputs (toolchain pieces, the test kernel, cargo's target dir) are cached in
# $(PEERDIRECT_CACHE), ~/.cache/peerdirect by default, keyed by versions and config.

SHELL := /bin/bash
ROOT := $(CURDIR)
BUILD := $(ROOT)/build
KDIR ?=
PREFIX ?= /usr/local
PEERDIRECT_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/peerdirect
export PEERDIRECT_CACHE
export CARGO_TARGET_DIR ?= $(PEERDIRECT_CACHE)/cargo-target
BIN := $(CARGO_TARGET_DIR)/release

.PHONY: all setup kernel module module-kunit test-modules peermem peermem-test userspace userland \
	rxe-provider guest guest-default guest-debian \
	kernel-kasan module-kasan module-kunit-kasan test-modules-kasan guest-kasan demo test check-quick stress bench install deb clean

all: module userspace

setup:
	@scripts/setup-toolchain

kernel: setup
	@scripts/build-kernel >/dev/null

# With KDIR, build against that tree (a host's kernel; distro headers without Rust metadata are
# prepared once by scripts/prepare-kbuild); without, against the test kernel.
module: $(if $(KDIR),,kernel)
	@kdir=$(if $(KDIR),$$(scripts/prepare-kbuild $(KDIR)),) && scripts/build-module $(ROOT) $(BUILD)/kmod "$$kdir"

module-kunit: kernel
	@scripts/build-module $(ROOT) $(BUILD)/kmod-kunit "" PEERDIRECT_KUNIT=1

test-modules: kernel
	@scripts/build-module $(ROOT)/tests/kmod $(BUILD)/tests-kmod ""

# The PeerDirect peer-memory client (kmod/peermem/), only for hosts whose ib_core exports
# ib_register_peer_memory_client (MLNX_OFED): linked against that core's Module.symvers and
# peerdirect.ko's. OFED is the directory of the core's Module.symvers.
peermem: module
	@[ -n "$(OFED)" ] || { echo "make peermem needs OFED=DIR, DIR holding the Module.symvers of an ib_core with the peer-memory API (MLNX_OFED: /usr/src/ofa_kernel/default)"; exit 2; }
	@[ -f "$(OFED)/Module.symvers" ] || { echo "no $(OFED)/Module.symvers: is MLNX_OFED's kernel part (mlnx-ofed-kernel-dkms or -modules) installed?"; exit 2; }
	@kdir=$(if $(KDIR),$$(scripts/prepare-kbuild $(KDIR)),) && scripts/build-module $(ROOT)/kmod/peermem $(BUILD)/peermem "$$kdir" \
		KBUILD_EXTRA_SYMBOLS="$(realpath $(OFED))/Module.symvers $(BUILD)/kmod/Module.symvers"

# The same client for the test guest, linked against the contract-test stand-in of that API
# (tests/kmod/peerdirect_peermem_core.c), which exports it as MLNX_OFED does.
peermem-test: module test-modules
	@scripts/build-module $(ROOT)/kmod/peermem $(BUILD)/peermem-test "" \
		KBUILD_EXTRA_SYMBOLS="$(BUILD)/tests-kmod/Module.symvers $(BUILD)/kmod/Module.symvers"

# The workspace includes capi: libpeerdirect.so and libpeerdirect.a land in $(BIN) too, and
# the crate's example programs in $(BIN)/examples (the guest's peerdirect-allreduce).
userspace:
	@cd userspace && cargo build -q --release --workspace --locked --lib --bins --examples
	@test -f $(BIN)/libpeerdirect.so || { echo "no $(BIN)/libpeerdirect.so after cargo build"; exit 1; }

# The guest's Debian userland (qemu/run --userland trixie): libfabric >= 1.20, rdma-core.
userland: setup
	@scripts/build-userland trixie >/dev/null

# rdma-core's rxe provider with reg_dmabuf_mr (qemu/rdma-core/), for tests/system/rxe-dmabuf.sh.
rxe-provider: userland
	@scripts/build-rxe-provider >/dev/null

guest: guest-default guest-kasan guest-debian rxe-provider

guest-default: kernel module module-kunit test-modules peermem-test userspace userland
	@scripts/mkinitramfs $(BUILD)/initramfs.cpio "$$(scripts/build-kernel)" $(BUILD) $(BIN)

# The KASAN flavour of the test kernel (qemu/kernel-kasan.config, built with clang) and the
# modules built against it (with its LLVM=, which scripts/build-module picks from its .config).
kernel-kasan: setup
	@scripts/build-kernel kasan >/dev/null

module-kasan: kernel-kasan
	@scripts/build-module $(ROOT) $(BUILD)/kmod-kasan "$$(scripts/build-kernel kasan)"

# The KUnit build for the KASAN kernel: the suites' own races (tests/system/kunit.sh) run
# under KASAN too.
module-kunit-kasan: kernel-kasan
	@scripts/build-module $(ROOT) $(BUILD)/kmod-kunit-kasan "$$(scripts/build-kernel kasan)" PEERDIRECT_KUNIT=1

test-modules-kasan: kernel-kasan
	@scripts/build-module $(ROOT)/tests/kmod $(BUILD)/tests-kmod-kasan "$$(scripts/build-kernel kasan)"

guest-kasan: kernel-kasan module-kasan module-kunit-kasan test-modules-kasan userspace userland
	@scripts/mkinitramfs $(BUILD)/initramfs-kasan.cpio "$$(scripts/build-kernel kasan)" $(BUILD) $(BIN) -kasan

# Debian's own stock kernel (`qemu/run --kernel debian`): its linux-binary and linux-modules
# packages, unchanged, and peerdirect.ko and the test modules built for it in the trixie-kbuild
# chroot, with its headers package and the rustc it was built with (1.85.1).
guest-debian: userspace userland
	@scripts/debian-modules $(BUILD)
	@scripts/mkinitramfs $(BUILD)/initramfs-debian.cpio "$$(scripts/debian-kernel)" $(BUILD) $(BIN) -debian

# The demo boots the default test kernel (the tour, the all-reduce's tcp and verbs direct paths,
# with the patched rxe provider) and Debian's (its host-bounce path), not the KASAN flavour.
demo: guest-default guest-debian rxe-provider
	@PEERDIRECT_PREBUILT=1 scripts/demo

test: guest
	@PEERDIRECT_PREBUILT=1 tests/run

# The edit loop's run: lints, host tests, KUnit and the exporter's guest suite on the test
# kernel (tests/run --quick). make test stays the whole proof, and what CI runs.
check-quick: guest-default
	@PEERDIRECT_PREBUILT=1 tests/run --quick

stress: guest
	@PEERDIRECT_PREBUILT=1 PEERDIRECT_RACE_SECONDS=$${PEERDIRECT_RACE_SECONDS:-120} tests/run --stress

bench:
	@scripts/bench

# Beside the files, what the packages' maintainer scripts and ldconfig trigger do
# (Documentation/packaging.md): udev's rule giving /dev/peerdirect* to the group peerdirect, in
# UDEVRULESDIR, where udev reads an administrator's rules ($(PREFIX) is not read); and, on the
# host itself (no DESTDIR: a staging tree's package does it in its own scripts), that system
# group, ldconfig's cache for libpeerdirect.so.0 (found when $(PREFIX)/lib is in ld.so.conf, as
# /usr/local/lib is on Debian), and a running udev's rules reloaded and applied to the nodes a
# loaded module made before.
UDEVRULESDIR ?= /etc/udev/rules.d

install:
	@[ -n "$(KDIR)" ] || { echo "make install needs KDIR=/lib/modules/\$$(uname -r)/build (or another kernel build tree)"; exit 2; }
	@$(MAKE) -s module userspace
	$(MAKE) -C $(KDIR) M=$(ROOT) MO=$(BUILD)/kmod INSTALL_MOD_PATH=$(DESTDIR) modules_install
	install -D -m 0755 $(BIN)/peerdirect $(DESTDIR)$(PREFIX)/bin/peerdirect
	install -D -m 0644 include/uapi/peerdirect.h $(DESTDIR)$(PREFIX)/include/peerdirect/peerdirect_uapi.h
	install -D -m 0755 $(BIN)/libpeerdirect.so $(DESTDIR)$(PREFIX)/lib/libpeerdirect.so.0
	ln -sf libpeerdirect.so.0 $(DESTDIR)$(PREFIX)/lib/libpeerdirect.so
	install -m 0644 $(BIN)/libpeerdirect.a $(DESTDIR)$(PREFIX)/lib/libpeerdirect.a
	install -D -m 0644 userspace/capi/include/peerdirect.h $(DESTDIR)$(PREFIX)/include/peerdirect.h
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig
	sed -e 's|@PREFIX@|$(PREFIX)|' -e "s|@VERSION@|$$(sed -n 's/^version = \"\(.*\)\"$$/\1/p' userspace/Cargo.toml)|" \
		userspace/capi/peerdirect.pc.in >$(DESTDIR)$(PREFIX)/lib/pkgconfig/peerdirect.pc
	install -D -m 0644 packaging/udev/60-peerdirect.rules $(DESTDIR)$(UDEVRULESDIR)/60-peerdirect.rules
	[ -n "$(DESTDIR)" ] || getent group peerdirect >/dev/null || groupadd --system peerdirect
	[ -n "$(DESTDIR)" ] || ldconfig
	[ -n "$(DESTDIR)" ] || [ ! -d /run/udev ] || { udevadm control --reload-rules && \
		udevadm trigger --action=change --subsystem-match=misc --sysname-match='peerdirect[0-9]*'; } || true

# peerdirect-dkms_VERSION_all.deb and peerdirect_VERSION_ARCH.deb (Documentation/packaging.md).
deb: userspace
	@scripts/build-deb $(BUILD)/deb

clean:
	rm -rf $(BUILD)
