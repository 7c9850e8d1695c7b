/* A persistent pool of worker threads that runs numbered work items.
 *
 * Invariant: the pool decides only which thread runs an item and when; an item's result never
 * depends on that, so kernels give the same bits for every thread count.
 *
 * Items are claimed from one atomic word holding (job generation << 32 | next item), so a worker
 * that wakes late can never claim an item of a job that has finished or been replaced: a new job
 * first moves the word to a closed generation, then sets its task and count, then opens its own
 * generation, so a claim always checks a count against the word of the same job, and a job
 * counts exactly its own items done (were a stale claim to count, the caller could return while
 * an item still runs). The caller works on its own job and waits only for the items, never for
 * sleeping workers to wake.
 * Idle workers spin briefly (kernel calls come in quick succession during generation), then
 * sleep on a condition variable.
 */
#define _GNU_SOURCE
#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SPIN_NANOSECONDS 100000L
/* The item index of a closed job: no job has this many items. */
#define CLOSED 0xffffffffu

struct pool {
    pthread_mutex_t submit;     /* one job at a time */
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    _Atomic uint64_t next;      /* generation << 32 | next unclaimed item */
    _Atomic ptrdiff_t items;
    _Atomic ptrdiff_t done;
    _Atomic int sleepers;
    _Atomic int stop;
    pool_task task;             /* read only by a thread that has claimed an item */
    void *context;
    pthread_t *threads;
    int workers;                /* threads besides the caller */
    int started;
};

static struct pool pool = {
    .submit = PTHREAD_MUTEX_INITIALIZER,
    .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long now_nanoseconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

static inline uint32_t generation_of(uint64_t word) { return (uint32_t)(word >> 32); }

/* Claim and run items of job `generation` until none is left. */
static void work_on(uint32_t generation)
{
    for (;;) {
        uint64_t word = atomic_load_explicit(&pool.next, memory_order_acquire);
        if (generation_of(word) != generation) return;
        ptrdiff_t item = (ptrdiff_t)(word & 0xffffffffu);
        if (item >= atomic_load_explicit(&pool.items, memory_order_relaxed)) return;
        if (!atomic_compare_exchange_weak_explicit(&pool.next, &word, word + 1,
                                                   memory_order_acq_rel, memory_order_relaxed))
            continue;
        pool.task(pool.context, item);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
    }
}

static void *worker_main(void *argument)
{
    uint32_t seen = (uint32_t)(uintptr_t)argument;
    for (;;) {
        long spin_until = now_nanoseconds() + SPIN_NANOSECONDS;
        uint32_t generation = seen;
        for (int spins = 0; generation == seen; spins++) {
            if (atomic_load_explicit(&pool.stop, memory_order_relaxed)) return NULL;
            generation = generation_of(atomic_load_explicit(&pool.next, memory_order_acquire));
            if (generation != seen) break;
            cpu_relax();
            if ((spins & 63) == 63 && now_nanoseconds() > spin_until) {
                pthread_mutex_lock(&pool.sleep_lock);
                atomic_fetch_add(&pool.sleepers, 1);
                while (generation_of(atomic_load(&pool.next)) == seen && !atomic_load(&pool.stop))
                    pthread_cond_wait(&pool.wake, &pool.sleep_lock);
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.sleep_lock);
                spin_until = now_nanoseconds() + SPIN_NANOSECONDS;
            }
        }
        seen = generation;
        work_on(seen);
    }
}

int pool_default_threads(void)
{
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long count = sysconf(_SC_NPROCESSORS_ONLN);
    return count > 0 ? (int)count : 1;
}

static void stop_workers(void)
{
    atomic_store(&pool.stop, 1);
    pthread_mutex_lock(&pool.sleep_lock);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.sleep_lock);
    for (int i = 0; i < pool.workers; i++) pthread_join(pool.threads[i], NULL);
    free(pool.threads);
    pool.threads = NULL;
    pool.workers = 0;
    atomic_store(&pool.stop, 0);
}

static void start_workers(int n)
{
    pool.started = 1;
    if (n <= 1) return;
    pool.threads = calloc((size_t)(n - 1), sizeof(pthread_t));
    if (!pool.threads) return;
    uint32_t generation = generation_of(atomic_load(&pool.next));
    for (int i = 0; i < n - 1; i++) {
        if (pthread_create(&pool.threads[i], NULL, worker_main,
                           (void *)(uintptr_t)generation) != 0)
            break;
        pool.workers++;
    }
}

/* A forked child has no workers; it starts a fresh default pool when it next needs one. */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&pool.submit, NULL);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.stop, 0);
    pool.threads = NULL;
    pool.workers = 0;
    pool.started = 0;
}

/* Called with pool.submit held. */
static void ensure_started(void)
{
    static int fork_handler_registered = 0;
    if (!fork_handler_registered) {
        pthread_atfork(NULL, NULL, after_fork_in_child);
        fork_handler_registered = 1;
    }
    if (!pool.started) start_workers(pool_default_threads());
}

int pool_threads(void)
{
    pthread_mutex_lock(&pool.submit);
    ensure_started();
    int n = pool.workers + 1;
    pthread_mutex_unlock(&pool.submit);
    return n;
}

int pool_set_threads(int n)
{
    pthread_mutex_lock(&pool.submit);
    ensure_started();
    stop_workers();
    start_workers(n);
    int running = pool.workers + 1;
    pthread_mutex_unlock(&pool.submit);
    return running;
}

void pool_run(pool_task task, void *context, ptrdiff_t items)
{
    pthread_mutex_lock(&pool.submit);
    ensure_started();
    if (pool.workers == 0 || items <= 1) {
        for (ptrdiff_t i = 0; i < items; i++) task(context, i);
        pthread_mutex_unlock(&pool.submit);
        return;
    }
    /* Close the previous job before touching what describes a job: a worker that read its
     * last word before this store then fails its claim, so it can never run or count an item
     * of the job set up below (a claim checks the new count against a word of the old job
     * only if `next` still holds that word). CLOSED is past any count, so a worker that sees
     * the closing generation claims nothing. */
    uint32_t generation = generation_of(atomic_load(&pool.next)) + 1;
    atomic_store(&pool.next, (uint64_t)generation << 32 | CLOSED);
    pool.task = task;
    pool.context = context;
    atomic_store_explicit(&pool.items, items, memory_order_relaxed);
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    generation += 1;
    atomic_store(&pool.next, (uint64_t)generation << 32);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    work_on(generation);
    for (int spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < items; spins++) {
        cpu_relax();
        if ((spins & 1023) == 1023) sched_yield();
    }
    pthread_mutex_unlock(&pool.submit);
}
