#!/usr/bin/env bash
# Races between the HBM device going away and userspace using it, on the KASAN kernel
# (userspace/guest-tests: race.rs, fuzz.rs): opens against unbind and rebind; CPU mappings
# against unbind and hot-unplug (every mapping must fault afterwards); last closes of dma-bufs
# against unbind; NIC imports (attach, pin, map) against unbind and rebind, behind the switch
# and through the host bridge (IOVA mappings); the NIC deleted and
# rescanned against those imports and unbind and rebind (the PCI notifier against the P2P
# verdict caches); module unloads against binds; NIC imports, exports and mmaps against resets
# of the device; a seeded random sequence of operations from several threads, alone and
# against unbind, rebind and rmmod; two devices unbound and bound at once.
# Any kernel report (KASAN, KFENCE, refcount, lockdep, kmemleak) fails the guest run.
#   PEERDIRECT_RACE_SECONDS  how long each suite runs (default 10; make stress: 120)
#   PEERDIRECT_FUZZ_SEED     the random sequence's seed (default: a new one, printed)
. "$(dirname "$0")/../lib.sh"

# Plan: the checks are the programs', each with its own plan (7 in all); none of this script's
# own (a guest run that does not end cleanly, or whose programs do not all report, adds a
# failure: guest_tap).
seconds=${PEERDIRECT_RACE_SECONDS:-10}
seed=${PEERDIRECT_FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "# fuzz seed $seed (PEERDIRECT_FUZZ_SEED=$seed replays its choices)"
rcs=()
# Each of the four runs whatever the others' outcome (guest_each). A race runs its seconds,
# and up to 4 times as long again until it met what it counts (race.rs, OVERTIME): the timeout
# allows that of every race. CPU mappings against hot-unplug come last: the device is gone
# after it.
guest_tap "races and fuzzing" 4 --kernel kasan --kmemleak --hotplug --timeout $((seconds * (6 * 5 + 2) + 300)) -- "${guest_each[@]}" \
	"peerdirect-guest-tests --race open-unbind,mmap-unbind,close-unbind,import-unbind,nic-rescan,rmmod-bind --seconds $seconds" \
	"peerdirect-guest-tests --fuzz $seed --seconds $seconds" \
	"peerdirect-guest-tests --fuzz $((seed + 1)) --fuzz-removal --seconds $seconds" \
	"peerdirect-guest-tests --race mmap-unplug"
rcs+=($?)
# Imports through the host bridge and the IOMMU (one IOVA range per map) against unbind, its
# checks named so.
tap_prefix="through the host bridge: " guest_tap "through the host bridge" 1 \
	--kernel kasan --kmemleak --topology host-bridge --timeout $((seconds * 5 + 240)) -- \
	peerdirect-guest-tests --race import-unbind --seconds "$seconds"
rcs+=($?)
# Imports, exports and mmaps against a loop of resets (a secondary bus reset each), in a guest
# whose vCPUs share one host thread (qemu/run --one-thread says why).
guest_tap "import-reset" 1 --kernel kasan --kmemleak --one-thread --timeout $((seconds * 5 + 240)) -- \
	peerdirect-guest-tests --race import-reset --seconds "$seconds"
rcs+=($?)
guest_tap "bind-two" 1 --kernel kasan --kmemleak --second-hbm --timeout $((seconds * 2 + 240)) -- \
	peerdirect-guest-tests --race bind-two --seconds "$seconds"
rcs+=($?)
exit "$(worst "${rcs[@]}")"
