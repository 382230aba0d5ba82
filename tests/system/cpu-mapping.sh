#!/usr/bin/env bash
# CPU mappings of dma-bufs use the largest page-table entries the alignment allows, filled at
# fault time (Documentation/exporter.md): 4 KiB entries at a 4 KiB-aligned address, one PMD
# per 2 MiB at a 2 MiB-aligned one, one PUD for 1 GiB at a 1 GiB-aligned one, told apart by
# the page faults that touching them costs.
# Plan: the checks are peerdirect-guest-tests', with its own plan; none of this script's own.
. "$(dirname "$0")/../lib.sh"
guest_tap "peerdirect-guest-tests --cpu-mapping" 1 --hbm 2G -- peerdirect-guest-tests --cpu-mapping
