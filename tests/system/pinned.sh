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
. "$(dirname "$0")/../lib.sh"
guest --kernel kasan --kmemleak -- sh -c \
	'peerdirect-guest-tests --pinned-removal; a=$?; peerdirect-guest-tests --release-revoke; b=$?; [ $a = 0 ] && [ $b = 0 ]'
