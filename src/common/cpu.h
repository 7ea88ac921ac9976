/* Run-time CPU feature detection. E8KV_FORCE_REF=1 in the environment disables every fast path (used by
 * tests and to compare twins from the command line). */
#ifndef E8KV_CPU_H
#define E8KV_CPU_H

/* 1 when the CPU and OS support AVX2 and FMA and E8KV_FORCE_REF is not set. */
int e8kv_cpu_has_avx2(void);
/* 1 when e8kv_cpu_has_avx2() and the CPU has AVX-VNNI (vpdpbusd on ymm, VEX: CPUID.(7,1):EAX[4]) and this
 * build has the kernels for it (E8KV_HAVE_AVXVNNI); E8KV_NO_VNNI=1 turns it off (to compare twins). */
int e8kv_cpu_has_avxvnni(void);

#endif
