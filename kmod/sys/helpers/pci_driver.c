// SPDX-License-Identifier: GPL-2.0
/*
 * The C helpers of sys/pci_driver.rs: the error handlers peerdirect's PCI driver registers
 * with.
 */
#include <linux/pci.h>

#include "helpers.h"

/*
 * The error handlers of peerdirect's PCI driver (sys/pci_driver.rs's ResetAware): what a reset
 * of a bound device (FLR, secondary bus reset, PM reset; sysfs "reset", vfio, AER recovery)
 * does around it. The PCI core calls each with the device lock held and the driver bound.
 */
static const struct peerdirect_pci_reset_events *peerdirect_reset_events;

static void peerdirect_pci_reset_prepare(struct pci_dev *pdev)
{
	peerdirect_reset_events->prepare(pdev);
}

static void peerdirect_pci_reset_done(struct pci_dev *pdev)
{
	peerdirect_reset_events->done(pdev);
}

/*
 * AER or DPC found an error: whatever the state, nothing may reach the BAR until recovery
 * ends (resume), so everything exported is revoked now, as before a reset. A device that is
 * gone for good is removed next; one that recovers is reset (slot_reset) and resumed.
 */
static pci_ers_result_t peerdirect_pci_error_detected(struct pci_dev *pdev,
						       pci_channel_state_t state)
{
	peerdirect_reset_events->prepare(pdev);
	return state == pci_channel_io_perm_failure ? PCI_ERS_RESULT_DISCONNECT :
						      PCI_ERS_RESULT_NEED_RESET;
}

static pci_ers_result_t peerdirect_pci_slot_reset(struct pci_dev *pdev)
{
	return PCI_ERS_RESULT_RECOVERED;
}

static void peerdirect_pci_resume(struct pci_dev *pdev)
{
	peerdirect_reset_events->done(pdev);
}

static const struct pci_error_handlers peerdirect_pci_err_handlers = {
	.error_detected = peerdirect_pci_error_detected,
	.slot_reset = peerdirect_pci_slot_reset,
	.resume = peerdirect_pci_resume,
	.reset_prepare = peerdirect_pci_reset_prepare,
	.reset_done = peerdirect_pci_reset_done,
};

/*
 * Gives @drv, before it registers, the error handlers above, which tell @events. One driver
 * per module: @events is stored before the driver can bind any device, and stays valid while
 * it is registered.
 */
void peerdirect_pci_driver_set_reset_events(struct pci_driver *drv,
					    const struct peerdirect_pci_reset_events *events)
{
	peerdirect_reset_events = events;
	drv->err_handler = &peerdirect_pci_err_handlers;
}
