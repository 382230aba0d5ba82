// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only: registers a PCI driver named "peerdirect" that matches no device, so that loading
 * peerdirect.ko afterwards fails half-way (its driver registration gets -EBUSY after the state
 * its devices share is made). The lifecycle test checks that such a failed load leaves nothing
 * behind. Never installed, never loaded outside the test guest.
 */

#include <linux/module.h>
#include <linux/pci.h>

static const struct pci_device_id pdn_ids[] = {
	{ }
};

static int pdn_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	return -ENODEV;
}

static struct pci_driver pdn_driver = {
	.name = "peerdirect",
	.id_table = pdn_ids,
	.probe = pdn_probe,
};

module_pci_driver(pdn_driver);

MODULE_DESCRIPTION("Test-only: takes the PCI driver name peerdirect");
MODULE_LICENSE("GPL");
