// SPDX-License-Identifier: GPL-2.0
/*
 * The C helpers of sys/owner_link.rs: a device link from a consumer device of peerdirect's to
 * a PCI device another driver owns, so that the driver core unbinds peerdirect's side first
 * whenever the owner's driver unbinds (its unbind, its module's unload, the device's removal).
 *
 * The consumer is a faux device bound to the faux bus's driver; its remove() is where the
 * owner's unbind waits for peerdirect. The driver core calls it with the owner's device lock
 * dropped and outside every notifier chain (__device_release_driver() unbinds consumers
 * before it notifies BUS_NOTIFY_UNBIND_DRIVER), so a long wait there holds up that unbind
 * only, not the PCI bus's notifier lock that every other add, delete, bind and unbind takes.
 */
#include <linux/device.h>
#include <linux/device/faux.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#include "helpers.h"

struct peerdirect_owner_link {
	struct faux_device *faux;
	unsigned long key;
	void (*unlinked)(unsigned long key);
	struct work_struct destroy;
};

/* Where links are destroyed (peerdirect_owner_link_destroy); drained at module exit. */
static struct workqueue_struct *peerdirect_link_wq;

static void peerdirect_owner_link_remove(struct faux_device *faux)
{
	struct peerdirect_owner_link *link = faux_device_get_drvdata(faux);

	/* Set before the link was made: nothing unbinds the consumer before that. */
	if (link)
		link->unlinked(link->key);
}

static const struct faux_device_ops peerdirect_owner_link_ops = {
	.remove = peerdirect_owner_link_remove,
};

static void peerdirect_owner_link_destroy_work(struct work_struct *work)
{
	struct peerdirect_owner_link *link =
		container_of(work, struct peerdirect_owner_link, destroy);

	/* Unbinds the consumer if the owner's unbind did not (unlinked() is called then). */
	faux_device_destroy(link->faux);
	kfree(link);
}

int peerdirect_owner_links_init(void)
{
	/* Unbound: a destroy blocks while an owner's unbind waits in the same consumer's remove(). */
	peerdirect_link_wq = alloc_workqueue("peerdirect_links", WQ_UNBOUND, 0);
	return peerdirect_link_wq ? 0 : -ENOMEM;
}

void peerdirect_owner_links_exit(void)
{
	destroy_workqueue(peerdirect_link_wq);
	peerdirect_link_wq = NULL;
}

/*
 * Links a new consumer device to @owner, whose driver must be bound (the caller holds
 * @owner's device lock, so it stays bound until the link is made): from then on, until
 * peerdirect_owner_link_destroy(), @owner's driver unbinding first calls @unlinked(@key), and
 * waits for it to return. @unlinked is called in process context with no lock of peerdirect's
 * held, and may sleep as long as it needs; it is called each time the consumer unbinds, which
 * is once unless root rebinds the consumer through the faux bus's drivers_probe.
 */
struct peerdirect_owner_link *peerdirect_owner_link_create(struct pci_dev *owner,
							   unsigned long key,
							   void (*unlinked)(unsigned long key))
{
	static atomic_t seq = ATOMIC_INIT(0);
	struct peerdirect_owner_link *link;
	struct device_link *dl;
	char name[32];

	if (!peerdirect_link_wq)
		return ERR_PTR(-ENODEV);
	link = kzalloc(sizeof(*link), GFP_KERNEL);
	if (!link)
		return ERR_PTR(-ENOMEM);
	link->key = key;
	link->unlinked = unlinked;
	INIT_WORK(&link->destroy, peerdirect_owner_link_destroy_work);
	/* Unique even while an earlier link of the same device waits to be destroyed. */
	snprintf(name, sizeof(name), "peerdirect-companion.%d", atomic_inc_return(&seq));
	link->faux = faux_device_create(name, NULL, &peerdirect_owner_link_ops);
	if (!link->faux) {
		kfree(link);
		return ERR_PTR(-ENOMEM);
	}
	faux_device_set_drvdata(link->faux, link);
	/*
	 * Managed (the driver core unbinds the consumer before the supplier's driver), removed
	 * when the consumer unbinds. Both are bound, so the link starts active.
	 */
	dl = device_link_add(&link->faux->dev, &owner->dev, DL_FLAG_AUTOREMOVE_CONSUMER);
	if (!dl || dl->status != DL_STATE_ACTIVE) {
		/* Unbinds the consumer first: @unlinked must not be called for a link never made. */
		faux_device_set_drvdata(link->faux, NULL);
		faux_device_destroy(link->faux);
		kfree(link);
		return ERR_PTR(dl ? -ENODEV : -ENOMEM);
	}
	return link;
}

/*
 * Ends @link: its consumer device goes (unbinding it first if the owner's unbind did not,
 * which calls @unlinked), in a work item, so that this may be called from @unlinked itself.
 */
void peerdirect_owner_link_destroy(struct peerdirect_owner_link *link)
{
	queue_work(peerdirect_link_wq, &link->destroy);
}
