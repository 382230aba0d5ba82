#!/usr/bin/env bash
# dma-bufs whose last reference goes while removal revokes the device's exports: a slow
# revocable importer holds the revocation walk for seconds, other exports are closed meanwhile,
# and revocation must skip those whose release has begun (their inode may be freed already).
# On the KASAN kernel, where touching such a buffer's mapping is a reported use-after-free;
# kmemleak scans afterwards.
. "$(dirname "$0")/../lib.sh"
guest --kernel kasan --kmemleak -- peerdirect-guest-tests --release-revoke
