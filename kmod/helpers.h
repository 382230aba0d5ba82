/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C helpers for what kernel::bindings cannot reach (static inlines and macros).
 * The Rust side declares these in ffi.rs; keep the two in step.
 */
#ifndef PEERDIRECT_HELPERS_H
#define PEERDIRECT_HELPERS_H

#include <linux/pci.h>

u64 peerdirect_pci_bus_address(struct pci_dev *pdev, int bar);
int peerdirect_pci_domain(struct pci_dev *pdev);
int peerdirect_pci_numa_node(struct pci_dev *pdev);
bool peerdirect_pci_bar_is_mem(struct pci_dev *pdev, int bar);

#endif /* PEERDIRECT_HELPERS_H */
