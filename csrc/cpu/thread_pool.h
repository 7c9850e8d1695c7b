/* A persistent pool of worker threads that runs numbered work items.
 *
 * Invariant: the pool decides only which thread runs an item and when; an item's result never
 * depends on that, so kernels give the same bits for every thread count.
 */
#ifndef EXACTDRAFT_CPU_THREAD_POOL_H
#define EXACTDRAFT_CPU_THREAD_POOL_H

#include <stddef.h>

typedef void (*pool_task)(void *context, ptrdiff_t item);

/* CPUs this process may run on (at least 1). */
int pool_default_threads(void);
/* Threads that run items, the caller included; starts the default pool on first use. */
int pool_threads(void);
/* Replace the workers by n - 1 new ones (n >= 1); returns the count actually running. */
int pool_set_threads(int n);
/* Run task(context, i) for i in [0, items) on the pool and the calling thread; returns when
 * every item has finished. Calls from several threads are served one after another. */
void pool_run(pool_task task, void *context, ptrdiff_t items);

#endif
