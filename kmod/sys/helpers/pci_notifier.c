// SPDX-License-Identifier: GPL-2.0
/*
 * The C helpers of sys/pci_notifier.rs: peerdirect's notifier on the PCI bus.
 */
#include <linux/device.h>
#include <linux/notifier.h>
#include <linux/pci.h>

#include "helpers.h"

/*
 * Tells the P2P verdict caches of PCI devices added and deleted: a verdict cached for an
 * importer's device is stale once it is deleted (its memory may go to another device) or a
 * device is added at its address.
 */
static const struct peerdirect_pci_events *peerdirect_pci_generation_events;

static int peerdirect_pci_generation_notify(struct notifier_block *nb, unsigned long action,
					    void *data)
{
	if (action == BUS_NOTIFY_ADD_DEVICE || action == BUS_NOTIFY_DEL_DEVICE)
		peerdirect_pci_generation_events->device_changed(data);
	return NOTIFY_DONE;
}

static struct notifier_block peerdirect_pci_generation_nb = {
	.notifier_call = peerdirect_pci_generation_notify,
};

/*
 * The events are stored before the block joins the bus's chain: a notification runs under the
 * chain's lock, which registration takes, so every notification sees them.
 */
int peerdirect_pci_generation_register(const struct peerdirect_pci_events *events)
{
	peerdirect_pci_generation_events = events;
	return bus_register_notifier(&pci_bus_type, &peerdirect_pci_generation_nb);
}

void peerdirect_pci_generation_unregister(void)
{
	bus_unregister_notifier(&pci_bus_type, &peerdirect_pci_generation_nb);
}
