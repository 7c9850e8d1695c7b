/* Deciding once per process whether the amx level may run.
 *
 * Invariant: the level is offered only if CPUID reports AMX-TILE and AMX-INT8, the OS enables
 * tile state in XCR0, Linux grants this process tile data (arch_prctl ARCH_REQ_XCOMP_PERM,
 * asked before any thread runs a tile instruction), and the level reproduces the avx512vnni
 * level's bits on a random problem of every dot format, with one-row and multi-tile passes. A
 * level that fails any step is not offered, and the reason is kept for the Python side to log.
 */
#if defined(__linux__)
#define _GNU_SOURCE
#endif
#include "amx_probe.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "kernels.h"
#include "random_problems.h"

#if defined(HAVE_AMX_LEVEL)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#endif
#endif

static char reason[256];
static int probed;

#if defined(HAVE_AMX_LEVEL)
static int cpu_reports_amx(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (d >> 24 & 1) && (d >> 25 & 1); /* AMX-TILE, AMX-INT8 */
}

static int os_enables_tiles(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return 0; /* OSXSAVE */
    unsigned low, high;
    __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    (void)high;
    return (low >> 17 & 3) == 3; /* XTILECFG and XTILEDATA */
}

/* 1 when this process may use tile data, else 0 with the reason written. */
static int tile_permission(int refuse)
{
#if defined(__linux__)
    if (refuse) {
        snprintf(reason, sizeof reason, "the OS refused AMX tile data (arch_prctl "
                 "ARCH_REQ_XCOMP_PERM: refused by the caller's request)");
        return 0;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(reason, sizeof reason, "the OS refused AMX tile data (arch_prctl "
                 "ARCH_REQ_XCOMP_PERM: %s)", strerror(errno));
        return 0;
    }
    unsigned long features = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &features) != 0 ||
        !(features >> XFEATURE_XTILEDATA & 1)) {
        snprintf(reason, sizeof reason, "the OS did not grant AMX tile data (arch_prctl "
                 "ARCH_GET_XCOMP_PERM lacks XTILEDATA)");
        return 0;
    }
    return 1;
#else
    (void)refuse;
    snprintf(reason, sizeof reason, "AMX tile data is requested through Linux's arch_prctl; "
             "this OS is not Linux");
    return 0;
#endif
}

/* 1 when `level` gives the avx512vnni level's bits on random problems of every dot format
 * (rows 1 and 19: a one-row pass, a full and a partial tile; a partial column group; bias). */
static int same_bits_as_vnni(const struct kernel_table *level)
{
    enum { COLUMNS = 40, DEPTH = 256 };
    const ptrdiff_t row_counts[2] = {1, 19};
    struct random_stream stream = {0x5EEDu};
    int same = 1;
    for (int format = FORMAT_Q8_0; format < FORMAT_COUNT && same; format++) {
        if (!FORMAT_ROWS[format].dot_record_bytes) continue; /* a code no format takes */
        for (int r = 0; r < 2 && same; r++) {
            const ptrdiff_t rows = row_counts[r];
            uint8_t *weight = random_stream_dot_weights(&stream, format, COLUMNS, DEPTH);
            float *x = random_stream_floats(&stream, (size_t)(rows * DEPTH), 1);
            float *bias = random_stream_floats(&stream, COLUMNS, 0);
            float *out = malloc(2 * sizeof(float) * (size_t)(rows * COLUMNS));
            same = weight && x && bias && out;
            for (int l = 0; l < 2 && same; l++) {
                struct matmul_problem p = {
                    .x = x, .weight = weight, .bias = bias, .out = out + l * rows * COLUMNS,
                    .rows = rows, .depth = DEPTH, .columns = COLUMNS, .format = format,
                    .layout = LAYOUT_DOT};
                same = dot_matmul_on(l ? level : &kernels_avx512vnni, &p, 0) == 0;
            }
            same = same && !memcmp(out, out + rows * COLUMNS,
                                   sizeof(float) * (size_t)(rows * COLUMNS));
            if (!same)
                snprintf(reason, sizeof reason, "the amx level's self-check gave other bits "
                         "than the avx512vnni level (%s, %td rows)", FORMAT_ROWS[format].name,
                         rows);
            free(weight), free(x), free(bias), free(out);
        }
    }
    return same;
}
#endif

static const char *probe(int assume_cpu_support, int refuse_permission)
{
    probed = 1;
    reason[0] = '\0';
#if defined(HAVE_AMX_LEVEL)
    __builtin_cpu_init();
    const int vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    if (!assume_cpu_support && !cpu_reports_amx()) {
        snprintf(reason, sizeof reason, "this CPU reports no amx_tile/amx_int8 in CPUID");
    } else if (!assume_cpu_support && !os_enables_tiles()) {
        snprintf(reason, sizeof reason, "the OS does not enable AMX tile state (XCR0)");
    } else if (!assume_cpu_support && !vnni) {
        snprintf(reason, sizeof reason, "this CPU reports AMX but not the AVX-512 VNNI the amx "
                 "level's other kernels need");
    } else if (!tile_permission(refuse_permission)) {
        /* reason written */
    } else if (!cpu_reports_amx() || !vnni) {
        /* assume_cpu_support never runs a tile instruction on a CPU without AMX */
        snprintf(reason, sizeof reason, "this CPU reports no amx_tile/amx_int8 in CPUID");
    } else {
        same_bits_as_vnni(kernels_amx());
    }
#else
    (void)assume_cpu_support;
    (void)refuse_permission;
    snprintf(reason, sizeof reason, "this build has no amx level (an x86-64 GCC 11 or Clang 12 "
             "or newer builds it)");
#endif
    return reason[0] ? reason : NULL;
}

static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;

const char *amx_probe(int assume_cpu_support, int refuse_permission)
{
    pthread_mutex_lock(&probe_lock);
    const char *answer = probe(assume_cpu_support, refuse_permission);
    pthread_mutex_unlock(&probe_lock);
    return answer;
}

const char *amx_unavailable_reason(void)
{
    pthread_mutex_lock(&probe_lock);
    if (!probed) probe(0, 0);
    pthread_mutex_unlock(&probe_lock);
    return reason[0] ? reason : NULL;
}
