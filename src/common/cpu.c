/* CPU features through the compiler's cpuid helpers (gcc/clang); cached after the first call. */
#include "cpu.h"

#include <stdlib.h>

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
