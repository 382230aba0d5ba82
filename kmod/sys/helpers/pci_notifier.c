// SPDX-License-Identifier: GPL-2.0
/*
 * The C helpers of sys/pci_notifier.rs: peerdirect's two notifiers on the PCI bus.
 */
#include <linux/device.h>
#include <linux/notifier.h>
#include <linux/pci.h>

#include "helpers.h"

/*
 * A companion device's owner driver unbinds (BUS_NOTIFY_UNBIND_DRIVER: before its remove(),
 * with the device lock held, so the BAR is still there), or the device is deleted: its
 * companion must go first (companion.rs revokes everything exported from it).
 */
static const struct peerdirect_pci_events *peerdirect_pci_events;

static int peerdirect_pci_notify(struct notifier_block *nb, unsigned long action, void *data)
{
	struct device *dev = data;

	if (action == BUS_NOTIFY_UNBIND_DRIVER || action == BUS_NOTIFY_DEL_DEVICE)
		peerdirect_pci_events->driver_unbinding_or_gone(to_pci_dev(dev));
	else if (action == BUS_NOTIFY_BOUND_DRIVER)
		peerdirect_pci_events->driver_bound(to_pci_dev(dev));
	return NOTIFY_DONE;
}

static struct notifier_block peerdirect_pci_nb = {
	.notifier_call = peerdirect_pci_notify,
};

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

/* As peerdirect_pci_generation_register(). */
int peerdirect_pci_notifier_register(const struct peerdirect_pci_events *events)
{
	peerdirect_pci_events = events;
	return bus_register_notifier(&pci_bus_type, &peerdirect_pci_nb);
}

void peerdirect_pci_notifier_unregister(void)
{
	bus_unregister_notifier(&pci_bus_type, &peerdirect_pci_nb);
}
