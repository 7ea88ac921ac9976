/* CPU features through the compiler's cpuid helpers (gcc/clang); cached after the first call. */
#include "cpu.h"

#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

int e8kv_cpu_has_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        int ok = 0;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
        const char *force = getenv("E8KV_FORCE_REF");
        if (force && force[0] && force[0] != '0') ok = 0;
        cached = ok;
    }
    return cached;
}

int e8kv_cpu_has_avxvnni(void) {
    static int cached = -1;
    if (cached < 0) {
        int ok = 0;
#if defined(E8KV_HAVE_AVXVNNI) && (defined(__x86_64__) || defined(__i386__))
        unsigned a = 0, b = 0, c = 0, d = 0;
        if (e8kv_cpu_has_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d)) ok = (a >> 4) & 1u;
#endif
        const char *off = getenv("E8KV_NO_VNNI");
        if (off && off[0] && off[0] != '0') ok = 0;
        cached = ok;
    }
    return cached;
}
