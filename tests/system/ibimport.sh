#!/usr/bin/env bash
# ib_core importing peerdirect's dma-bufs with its own functions (tests/kmod/peerdirect_ibimport.c):
# EFA's pinned path (ib_umem_dmabuf_get_pinned_with_dma_device, rxe's ib_device, the NIC's PCI
# device), irdma's revocable pinned path and mlx5's dynamic path, for 64 MiB (2 MiB- and 64 MiB-
# aligned), 1, 3 and 5 GiB exports of an 8 GiB HBM in the switch topology, with the page size
# ib_umem_find_best_pgsz picks and the DMA blocks; ibv_reg_dmabuf_mr on rxe through the crate
# (EOPNOTSUPP, documented error); imports held across an unbind of the HBM device.
. "$(dirname "$0")/../lib.sh"

# Plan: the checks are peerdirect-guest-tests', with its own plan; none of this script's own.
guest_tap "" 1 --topology switch --hbm 8G --mem 2G --rxe --kmemleak -- \
	peerdirect-guest-tests --ibimport
