/* Divide-and-conquer float32 matrix multiplication with chained calls (ATC'20 section 6.4,
 * the seed's mat_mul): C = A B over a 2^splits x 2^splits grid of blocks. A task covering a
 * span of blocks chains 8 sub-tasks of half the span (C_ij = A_i0 B_0j + A_i1 B_1j, per
 * quadrant), awaits them and adds and places their results; a span-1 task multiplies two
 * stored blocks. With 2 splits: 1 + 8 + 64 = 73 calls.
 *
 * index 0: the whole product (output "Matrix multiplication finished"); index 1, input
 * "<lvl> <ar> <ac> <br> <bc> <span>": one sub-task (output: the state key of its result).
 * State (user python): matrix_state int32 {size, splits}, mat_a_<s>_<r>_<c>, mat_b_... blocks;
 * results intermediate_<lvl>_<ar>_<ac>_<br>_<bc>, and result_matrix for the whole product.
 */
#include "faasm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *read_block(const char *key, int32_t n) {
    int32_t bytes = n * n * (int32_t)sizeof(float);
    float *m = malloc(bytes);
    if (m && faasm_read_state(key, (uint8_t *)m, bytes) != bytes) { free(m); return NULL; }
    return m;
}

static int32_t task(int32_t lvl, int32_t ar, int32_t ac, int32_t br, int32_t bc, int32_t span) {
    int32_t dims[2];
    if (faasm_read_state("matrix_state", (uint8_t *)dims, sizeof dims) != (int32_t)sizeof dims)
        return faasm_fail("python_matrix_state missing");
    int32_t size = dims[0], splits = dims[1], blocks = 1 << splits;
    if (size % blocks) return faasm_fail("matrix size %d not divisible by %d", size, blocks);
    int32_t bs = size / blocks;
    char out_key[96];
    if (lvl == 0) snprintf(out_key, sizeof out_key, "result_matrix");
    else snprintf(out_key, sizeof out_key, "intermediate_%d_%d_%d_%d_%d", lvl, ar, ac, br, bc);
    if (span == 1) {
        char ka[64], kb[64];
        snprintf(ka, sizeof ka, "mat_a_%d_%d_%d", splits, ar, ac);
        snprintf(kb, sizeof kb, "mat_b_%d_%d_%d", splits, br, bc);
        float *a = read_block(ka, bs), *b = read_block(kb, bs), *c = calloc((size_t)bs * bs, sizeof(float));
        if (!a || !b || !c) return faasm_fail("cannot read %s / %s (%d x %d) or out of memory", ka, kb, bs, bs);
        for (int32_t i = 0; i < bs; i++)
            for (int32_t k = 0; k < bs; k++) {
                float aik = a[(size_t)i * bs + k];
                const float *brow = b + (size_t)k * bs;
                float *crow = c + (size_t)i * bs;
                for (int32_t j = 0; j < bs; j++) crow[j] += aik * brow[j];
            }
        faasm_write_state(out_key, (uint8_t *)c, bs * bs * (int32_t)sizeof(float));
        free(a); free(b); free(c);
        faasm_output_str(out_key);
        return 0;
    }
    int32_t half = span / 2, ids[8], n_sub = bs * half, n = 2 * n_sub;
    for (int32_t q = 0; q < 8; q++) { /* q = i*4 + j*2 + k: quadrant (i, j), term k */
        int32_t i = q >> 2, j = (q >> 1) & 1, k = q & 1;
        char arg[96];
        int len = snprintf(arg, sizeof arg, "%d %d %d %d %d %d", lvl + 1, ar + i * half, ac + k * half,
                           br + k * half, bc + j * half, half);
        ids[q] = faasm_chain(1, (uint8_t *)arg, len);
        if (ids[q] < 0) return faasm_fail("chaining sub-multiplication %d failed", q);
    }
    float *c = calloc((size_t)n * n, sizeof(float));
    if (!c) return faasm_fail("out of memory for a %d x %d result", n, n);
    for (int32_t q = 0; q < 8; q++) {
        char key[128]; int32_t len = 0;
        if (faasm_await(ids[q], (uint8_t *)key, sizeof key - 1, &len)) {
            key[len < (int32_t)sizeof key - 1 ? len : (int32_t)sizeof key - 1] = 0;
            return faasm_fail("sub-multiplication (call %d) failed: %s", ids[q], key);
        }
        key[len < (int32_t)sizeof key - 1 ? len : (int32_t)sizeof key - 1] = 0;
        float *part = read_block(key, n_sub);
        if (!part) return faasm_fail("result %s missing", key);
        int32_t i = q >> 2, j = (q >> 1) & 1;
        for (int32_t r = 0; r < n_sub; r++) {
            float *dst = c + (size_t)(i * n_sub + r) * n + j * n_sub;
            const float *src = part + (size_t)r * n_sub;
            for (int32_t s = 0; s < n_sub; s++) dst[s] += src[s];
        }
        free(part);
    }
    faasm_write_state(out_key, (uint8_t *)c, n * n * (int32_t)sizeof(float));
    free(c);
    faasm_output_str(out_key);
    return 0;
}

FAASM_EXPORT("faasm_main") int32_t faasm_main(int32_t index) {
    if (index == 0) {
        int32_t dims[2];
        if (faasm_read_state("matrix_state", (uint8_t *)dims, sizeof dims) != (int32_t)sizeof dims)
            return faasm_fail("python_matrix_state missing");
        int32_t rc = task(0, 0, 0, 0, 0, 1 << dims[1]);
        if (rc == 0) faasm_output_str("Matrix multiplication finished");
        return rc;
    }
    char in[128] = {0};
    faasm_input((uint8_t *)in, sizeof in - 1);
    int32_t v[6];
    if (sscanf(in, "%d %d %d %d %d %d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6 || v[5] < 1)
        return faasm_fail("sub-task input must be '<lvl> <ar> <ac> <br> <bc> <span>', got '%s'", in);
    return task(v[0], v[1], v[2], v[3], v[4], v[5]);
}
