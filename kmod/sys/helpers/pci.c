// SPDX-License-Identifier: GPL-2.0
/*
 * The C helpers of sys/pci.rs: PCI devices, their BARs, bridges and host bridges, the device
 * lock and the bound driver.
 */
#include <linux/device.h>
#include <linux/io.h>
#include <linux/iommu.h>
#include <linux/pci.h>
#include <linux/string.h>

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

/*
 * Reserves write-combining as the memory type of @bar for the CPU (x86 PAT; an MTRR where PAT
 * is off), for as long as the driver is bound (device-managed), as DRM drivers do for their
 * VRAM BARs: on x86 vmf_insert_pfn*() give a PFN mapping the type reserved for its range
 * whatever the VMA asks for, UC- when nothing is reserved. Probe only.
 */
int peerdirect_pci_reserve_wc(struct pci_dev *pdev, int bar)
{
	resource_size_t start = pci_resource_start(pdev, bar);
	resource_size_t len = pci_resource_len(pdev, bar);
	int ret;

	ret = devm_arch_io_reserve_memtype_wc(&pdev->dev, start, len);
	if (ret)
		return ret;
	ret = devm_arch_phys_wc_add(&pdev->dev, start, len);
	return ret < 0 ? ret : 0;
}

bool peerdirect_pci_bar_is_mem(struct pci_dev *pdev, int bar)
{
	return pci_resource_flags(pdev, bar) & IORESOURCE_MEM;
}

/*
 * Whether @pdev decodes memory accesses (PCI_COMMAND_MEMORY) and is there. A reset turns
 * decoding off until the config space is restored, and an owner may leave it off (vfio-pci
 * when its user closes the device); a BAR that does not decode drops writes and answers
 * reads with all ones, or an error. Any context: a config read takes a raw spinlock.
 */
bool peerdirect_pci_decodes_memory(struct pci_dev *pdev)
{
	u16 cmd;

	if (pci_read_config_word(pdev, PCI_COMMAND, &cmd) || PCI_POSSIBLE_ERROR(cmd))
		return false;
	return cmd & PCI_COMMAND_MEMORY;
}

/*
 * Whether @pdev's BAR can be reached where @place says peerdirect found it: the device decodes
 * memory (above), the kernel's resource for the BAR still starts at place->phys and is
 * place->len long (not resized or reassigned since: pci_resize_resource(), sysfs
 * resourceN_resize), and the BAR register still holds place->bus (nobody moved the BAR
 * behind the kernel's back, as a write to the config space through sysfs or setpci can).
 * The register is not read where it says nothing: a VF's BARs live in its PF's SR-IOV
 * capability, and Enhanced Allocation BARs (IORESOURCE_PCI_FIXED) have none. Any context.
 */
bool peerdirect_pci_bar_in_place(struct pci_dev *pdev, const struct peerdirect_bar_place *place)
{
	const struct resource *res = &pdev->resource[place->bar];
	int where = PCI_BASE_ADDRESS_0 + 4 * place->bar;
	u32 lo, hi = 0;
	u64 bus;

	if (!peerdirect_pci_decodes_memory(pdev))
		return false;
	if (READ_ONCE(res->start) != place->phys || resource_size(res) != place->len)
		return false;
	if (pdev->is_virtfn || (res->flags & IORESOURCE_PCI_FIXED))
		return true;
	if (pci_read_config_dword(pdev, where, &lo) || PCI_POSSIBLE_ERROR(lo))
		return false;
	if ((lo & PCI_BASE_ADDRESS_MEM_TYPE_MASK) == PCI_BASE_ADDRESS_MEM_TYPE_64 &&
	    (place->bar >= PCI_STD_NUM_BARS - 1 || pci_read_config_dword(pdev, where + 4, &hi)))
		return false;
	bus = ((u64)hi << 32) | (lo & PCI_BASE_ADDRESS_MEM_MASK);
	return bus == place->bus;
}

/*
 * Whether the driver named @driver is bound to @pdev. The caller holds the device lock
 * (peerdirect_pci_device_lock), so the binding cannot change meanwhile.
 */
bool peerdirect_pci_bound_to(struct pci_dev *pdev, const char *driver)
{
	return pdev->dev.driver && !strcmp(pdev->dev.driver->name, driver);
}

/*
 * The name of the driver bound to @pdev, NUL-padded into @len bytes at @name (all NULs if
 * none). The caller holds the device lock, or is a bus notification (which the driver core
 * sends with it held): the driver cannot unbind, nor its module go, meanwhile.
 */
void peerdirect_pci_driver_name(struct pci_dev *pdev, u8 *name, size_t len)
{
	strscpy_pad((char *)name, pdev->dev.driver ? pdev->dev.driver->name : "", len);
}

/* The device lock, which the driver core holds across probe, remove and bus notifications. */
void peerdirect_pci_device_lock(struct pci_dev *pdev)
{
	device_lock(&pdev->dev);
}

void peerdirect_pci_device_unlock(struct pci_dev *pdev)
{
	device_unlock(&pdev->dev);
}

/* bus << 8 | devfn, as lspci prints a device without its domain. */
u16 peerdirect_pci_dev_id(struct pci_dev *pdev)
{
	return pci_dev_id(pdev);
}

/* The bridge above @pdev; NULL on a root bus. The caller's reference on @pdev keeps it. */
struct pci_dev *peerdirect_pci_upstream_bridge(struct pci_dev *pdev)
{
	return pci_upstream_bridge(pdev);
}

/*
 * Whether @bridge redirects peer-to-peer requests upstream: ACS request or completion
 * redirect, or egress control, enabled. The p2pdma core reads the same bits.
 */
bool peerdirect_pci_acs_redirects(struct pci_dev *bridge)
{
	u16 ctrl;

	if (!bridge->acs_cap)
		return false;
	if (pci_read_config_word(bridge, bridge->acs_cap + PCI_ACS_CTRL, &ctrl))
		return false;
	return ctrl & (PCI_ACS_RR | PCI_ACS_CR | PCI_ACS_EC);
}

bool peerdirect_pci_same_host_bridge(struct pci_dev *a, struct pci_dev *b)
{
	return pci_find_host_bridge(a->bus) == pci_find_host_bridge(b->bus);
}

/*
 * vendor << 16 | device of function 00.0 on @pdev's root bus (the "host bridge" the
 * kernel's P2P allowlist names), 0 if there is none.
 */
u32 peerdirect_pci_host_bridge_ids(struct pci_dev *pdev)
{
	struct pci_host_bridge *host = pci_find_host_bridge(pdev->bus);
	struct pci_dev *root = pci_get_slot(host->bus, PCI_DEVFN(0, 0));
	u32 ids;

	if (!root)
		return 0;
	ids = (u32)root->vendor << 16 | root->device;
	pci_dev_put(root);
	return ids;
}

bool peerdirect_pci_iommu_mapped(struct pci_dev *pdev)
{
	return device_iommu_mapped(&pdev->dev);
}

/* The PCI device of @dev, which the caller checked is one (sys/pci.rs's dev_is_pci). */
struct pci_dev *peerdirect_to_pci_dev(struct device *dev)
{
	return to_pci_dev(dev);
}

void peerdirect_log_refused_attach(struct pci_dev *hbm, struct device *importer,
				   const char *reason)
{
	dev_warn_ratelimited(&hbm->dev, "refusing dma-buf attach from %s %s: %s\n",
			     dev_driver_string(importer), dev_name(importer), reason);
}
