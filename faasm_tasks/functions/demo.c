/* Small functions for tests (user demo): the index selects one.
 * 0 echo: output = input; 1 sleep: busy for <input> ms; 2 fail: a failed call;
 * 3 noop; 4 trap: an unreachable instruction (a crash natively); 5 loop: never returns;
 * 6 alloc: allocate and touch <input> MiB.
 */
#include "faasm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

FAASM_EXPORT("faasm_main") int32_t faasm_main(int32_t index) {
    static uint8_t in[65536];
    int32_t n = faasm_input(in, sizeof in - 1);
    if (n > (int32_t)sizeof in - 1) n = sizeof in - 1;
    in[n] = 0;
    volatile uint64_t spin = 0;
    switch (index) {
    case 0: faasm_output(in, n); return 0;
    case 1: {
        double end = now_ms() + atof((char *)in);
        while (now_ms() < end) spin++;
        faasm_output_str("slept");
        return 0;
    }
    case 2: return faasm_fail("demo failure: %s", (char *)in);
    case 3: return 0;
    case 4: __builtin_trap();
    case 5: for (;;) spin++;
    case 6: {
        size_t mib = (size_t)atol((char *)in);
        uint8_t *p = malloc(mib << 20);
        if (!p) return faasm_fail("allocation of %zu MiB refused", mib);
        memset(p, 1, mib << 20);
        faasm_output(p + (mib << 20) - 1, 1); /* the block escapes: the compiler keeps it */
        char msg[64];
        snprintf(msg, sizeof msg, "allocated %zu MiB", mib);
        faasm_output_str(msg);
        free(p);
        return 0;
    }
    }
    return faasm_fail("demo: no function index %d", index);
}
