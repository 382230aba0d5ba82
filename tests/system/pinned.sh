#!/usr/bin/env bash
# The removal protocol for importers that cannot be revoked (Documentation/exporter.md): an
# unbind waits for a pinned (EFA-like) mapping held by hand, polls and logs, and returns once
# it is released; then one held by a registration in a RegCache completes by itself, because
# the cache lets go when the device file polls POLLPRI. On the KASAN kernel; kmemleak scans
# afterwards.
. "$(dirname "$0")/../lib.sh"
guest --kernel kasan --kmemleak -- peerdirect-guest-tests --pinned-removal
