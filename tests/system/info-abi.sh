#!/usr/bin/env bash
# PEERDIRECT_IOC_INFO's ABI rules (sizes, flags, padding, unknown commands) from the guest.
# Plan: the checks are peerdirect-guest-tests', with its own plan; none of this script's own.
. "$(dirname "$0")/../lib.sh"
guest_tap "peerdirect-guest-tests" 1 -- peerdirect-guest-tests --expect-hbm-bytes 268435456
