/*
 * callback_race: the invalidation callback racing its own removal, built with
 * -fsanitize=address. A thread registers and frees HBM allocations of /dev/peerdirect0 in a
 * loop (each free tells the callback, PD_INVALIDATED_MEMORY, on the cache's thread), while the
 * main thread, ROUNDS times, sets the callback with a context of fresh heap memory, lets it be
 * called, clears it (pd_regcache_set_invalidate_callback(NULL)) and frees the context at once;
 * the last round ends with pd_regcache_free and then frees the context. Each removal is made
 * while a call of the callback runs: the main thread waits for a call to start, and the call
 * waits (up to 50 ms) for the main thread to have begun the removal, then writes its context
 * again. Were the removal to return before that call ended, the context would be freed under
 * it and AddressSanitizer would report a heap-use-after-free and abort.
 * Prints "ok - ..." with the counts, or "FAIL - ..."; exit status 0 iff all went well.
 *
 *   cc -fsanitize=address -o callback_race callback_race.c \
 *      $(pkg-config --cflags --libs peerdirect libfabric) -lpthread
 */
#define _POSIX_C_SOURCE 200809L /* strdup, nanosleep */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "tcp_cache.h"

#define ROUNDS 20
#define ALL (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE)

struct context {
	int calls;
	int done;
};

/* Calls of the callback, in all rounds. */
static long total_calls;

static void pause_us(long us)
{
	struct timespec ts = { 0, us * 1000 };

	nanosleep(&ts, NULL);
}

/* Set by the main thread just before it removes the callback. */
static int removing;

static void on_invalidate(void *ctx, const struct pd_invalidation *invalidation)
{
	struct context *context = ctx;
	int waited;

	(void)invalidation;
	__atomic_add_fetch(&context->calls, 1, __ATOMIC_RELEASE);
	__atomic_add_fetch(&total_calls, 1, __ATOMIC_RELAXED);
	for (waited = 0; waited < 50 && !__atomic_load_n(&removing, __ATOMIC_ACQUIRE); waited++)
		pause_us(1000);
	pause_us(1000);
	context->done++;
}

/* Waits (up to 5 s) for a call of the callback with context to start; whether one did. */
static int call_started(struct context *context)
{
	int waited;

	for (waited = 0; waited < 5000 && !__atomic_load_n(&context->calls, __ATOMIC_ACQUIRE);
	     waited++)
		pause_us(1000);
	return __atomic_load_n(&context->calls, __ATOMIC_ACQUIRE) > 0;
}

static pd_device *dev;
static struct tcp_cache tcp;
static int stop, worker_failed;
static long frees;

/* Registers and frees allocations until stop. */
static void *worker(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
		pd_allocation *alloc = NULL;
		pd_mr *mr = NULL;
		int err = pd_alloc(dev, 1 << 16, 0, &alloc);

		if (!err)
			err = pd_register(tcp.dom, alloc, 0, 0, ALL, &mr);
		pd_mr_release(mr);
		if (!err)
			err = pd_allocation_free(alloc);
		if (err) {
			printf("FAIL - the registering thread : %s (%s)\n", pd_strerror(err),
			       pd_last_error());
			__atomic_store_n(&worker_failed, 1, __ATOMIC_RELEASE);
			return NULL;
		}
		frees++;
	}
	return NULL;
}

int main(void)
{
	pthread_t thread;
	long calls;
	int err, round;

	dev = pd_device_open(0, &err);
	if (!dev || tcp_cache_open(&tcp))
		return 1;
	if (pthread_create(&thread, NULL, worker, NULL))
		return 1;
	for (round = 0; round < ROUNDS && !__atomic_load_n(&worker_failed, __ATOMIC_ACQUIRE);
	     round++) {
		struct context *context = calloc(1, sizeof(*context));

		if (!context || pd_regcache_set_invalidate_callback(tcp.cache, on_invalidate, context))
			return 1;
		if (!call_started(context)) {
			printf("FAIL - round %d : no call of the callback within 5 s\n", round);
			return 1;
		}
		__atomic_store_n(&removing, 1, __ATOMIC_RELEASE);
		if (round == ROUNDS - 1)
			pd_regcache_free(tcp.cache); /* the last round: the cache goes instead */
		else
			pd_regcache_set_invalidate_callback(tcp.cache, NULL, NULL);
		/* At once: a call still running, or a later one, writes freed memory. */
		free(context);
		__atomic_store_n(&removing, 0, __ATOMIC_RELEASE);
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	pthread_join(thread, NULL);
	if (round < ROUNDS)
		return 1;
	/* Its handle stays valid after the cache is freed, until detached. */
	tcp_cache_close(&tcp);
	pd_device_close(dev);
	calls = __atomic_load_n(&total_calls, __ATOMIC_RELAXED);
	if (calls == 0) {
		printf("FAIL - the callback was never called (%ld frees)\n", frees);
		return 1;
	}
	printf("ok - %d rounds of setting, clearing and freeing the callback's context (the last "
	       "with pd_regcache_free), each removal made while a call ran, as a thread freed %ld "
	       "registered allocations: %ld calls, none after its removal returned "
	       "(AddressSanitizer found nothing)\n",
	       ROUNDS, frees, calls);
	return 0;
}
