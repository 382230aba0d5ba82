// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only: registers a notifier on the PCI bus at load and unregisters it at unload, doing
 * nothing else, as any driver that watches PCI devices does (vfio-pci binding an SR-IOV PF,
 * for one). Registering takes the bus's notifier lock for writing: if a notification were
 * waiting inside the chain (a removal waiting for a pinned importer), the load would wait
 * with it, and so would every device add, delete, bind and unbind queued behind it. The
 * companion suite loads it while a companion's removal waits (tests/companion/revoke.sh).
 * Never installed, never loaded outside the test guest.
 */

#include <linux/module.h>
#include <linux/notifier.h>
#include <linux/pci.h>

static int pdbn_notify(struct notifier_block *nb, unsigned long action, void *data)
{
	return NOTIFY_DONE;
}

static struct notifier_block pdbn_nb = {
	.notifier_call = pdbn_notify,
};

static int __init pdbn_init(void)
{
	return bus_register_notifier(&pci_bus_type, &pdbn_nb);
}

static void __exit pdbn_exit(void)
{
	bus_unregister_notifier(&pci_bus_type, &pdbn_nb);
}

module_init(pdbn_init);
module_exit(pdbn_exit);

MODULE_DESCRIPTION("Test-only: a PCI bus notifier, registered at load");
MODULE_LICENSE("GPL");
