#!/usr/bin/env bash
# Removal against importers, on one boot of the KASAN kernel (kmemleak scans afterwards):
# - the removal protocol for importers that cannot be revoked: an unbind waits for a pinned
#   (EFA-like) mapping held by hand, polls and logs, and returns once it is released; then one
#   held by a registration in a RegCache completes by itself, because the cache lets go when
#   the device file polls POLLPRI (--pinned-removal);
# - dma-bufs whose last reference goes while removal revokes the device's exports: a slow
#   revocable importer holds the revocation walk for seconds, other exports are closed
#   meanwhile, and revocation must skip those whose release has begun (their inode may be
#   freed already), which KASAN would report (--release-revoke).
# On the KASAN kernel unless PEERDIRECT_KERNEL says otherwise (tests/system/debian-kernel.sh runs
# this suite on Debian's kernel, where --kmemleak's scan is skipped).
# Plan: the checks are the two programs', each with its own plan; none of this script's own.
. "$(dirname "$0")/../lib.sh"
guest_tap "peerdirect-guest-tests --pinned-removal and --release-revoke" 2 \
	--kernel "${PEERDIRECT_KERNEL:-kasan}" --kmemleak -- "${guest_each[@]}" \
	"peerdirect-guest-tests --pinned-removal" "peerdirect-guest-tests --release-revoke"
