/* Helpers shared by both builds. */
#include "faasm.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void faasm_output_str(const char *s) { faasm_output((const uint8_t *)s, (int32_t)strlen(s)); }

int32_t faasm_fail(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    faasm_output_str(msg);
    return 1;
}
