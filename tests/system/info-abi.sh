#!/usr/bin/env bash
# PEERDIRECT_IOC_INFO's ABI rules (sizes, flags, padding, unknown commands) from the guest.
. "$(dirname "$0")/../lib.sh"
guest -- peerdirect-guest-tests --expect-hbm-bytes 268435456
