// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers for what kernel::bindings cannot reach (static inlines and macros).
 */
#include "helpers.h"

u64 peerdirect_pci_bus_address(struct pci_dev *pdev, int bar)
{
	return pci_bus_address(pdev, bar);
}

int peerdirect_pci_domain(struct pci_dev *pdev)
{
	return pci_domain_nr(pdev->bus);
}

int peerdirect_pci_numa_node(struct pci_dev *pdev)
{
	return dev_to_node(&pdev->dev);
}

bool peerdirect_pci_bar_is_mem(struct pci_dev *pdev, int bar)
{
	return pci_resource_flags(pdev, bar) & IORESOURCE_MEM;
}
