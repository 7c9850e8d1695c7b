/* Whether the amx level (level_amx.c) may run in this process; see amx_probe.c. */
#ifndef EXACTDRAFT_CPU_AMX_PROBE_H
#define EXACTDRAFT_CPU_AMX_PROBE_H

/* NULL when the amx level may run, else one sentence saying why not; the first call probes. */
const char *amx_unavailable_reason(void);
/* Probe again and return the new answer. assume_cpu_support skips the CPUID and XCR0 checks
 * and refuse_permission answers the permission request with a refusal: tests use them to take
 * the refused-permission path on any CPU. No tile instruction runs unless CPUID reports AMX. */
const char *amx_probe(int assume_cpu_support, int refuse_permission);

#endif
