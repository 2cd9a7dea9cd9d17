/* Hogwild SVM SGD over the Reuters-like sparse state (ATC'20 section 6.2, reuters_svm).
 *
 * index 0, the driver, input "<n_workers> <sync_interval> [epochs]": zero weights in state,
 *   then per epoch chain n_workers step calls over contiguous batches (in a shuffled order),
 *   await them and report the RMS hinge error: one line "<seconds since epoch 1 ended> <loss>".
 * index 1, a step, input "<w> <start> <end> <epoch>": one pass over examples [start, end),
 *   pushing its weight updates every sync_interval examples (and at the end) with element-wise
 *   adds, no lock over the vector (Hogwild), then re-reading the shared weights.
 * State (user sgd): inputs_size int32 {features, examples, nnz}, inputs_outr int32 column
 * pointers, inputs_innr int32 feature ids, inputs_vals float64, outputs float64 labels (+-1);
 * the run's sgd_params int32 {n_workers, interval, epochs}, sgd_weights float64, sgd_errors.
 */
#include "faasm.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LEARNING_RATE 0.1

static int32_t n_features, n_examples, nnz;
static int32_t *outr, *innr;
static double *vals, *labels;

static void *read_whole(const char *key, int32_t elem, int32_t want) {
    int32_t size = faasm_read_state(key, NULL, 0);
    if (size < 0 || size != elem * want) return NULL;
    void *buf = malloc(size > 0 ? size : 1);
    if (buf && faasm_read_state(key, buf, size) != size) { free(buf); return NULL; }
    return buf;
}

/* the data set, read from state once per instance (a warm instance keeps it) */
static int load_data(void) {
    if (outr) return 0;
    int32_t dims[3];
    if (faasm_read_state("inputs_size", (uint8_t *)dims, sizeof dims) != (int32_t)sizeof dims) return -1;
    n_features = dims[0]; n_examples = dims[1]; nnz = dims[2];
    outr = read_whole("inputs_outr", 4, n_examples + 1);
    innr = read_whole("inputs_innr", 4, nnz);
    vals = read_whole("inputs_vals", 8, nnz);
    labels = read_whole("outputs", 8, n_examples);
    if (!outr || !innr || !vals || !labels) { free(outr); outr = NULL; return -1; }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int32_t driver(void) {
    char in[128] = {0};
    faasm_input((uint8_t *)in, sizeof in - 1);
    int32_t params[3] = {0, 0, 20};
    if (sscanf(in, "%d %d %d", &params[0], &params[1], &params[2]) < 2)
        return faasm_fail("input must be '<n_workers> <sync_interval> [epochs]', got '%s'", in);
    if (params[0] < 1 || params[2] < 1) return faasm_fail("n_workers and epochs must be >= 1");
    if (load_data()) return faasm_fail("SGD state (sgd_inputs_*, sgd_outputs) missing or inconsistent");
    int32_t workers = params[0], epochs = params[2];
    faasm_write_state("params", (uint8_t *)params, sizeof params);
    double *zero = calloc(n_features, sizeof(double));
    if (!zero) return faasm_fail("out of memory for %d weights", n_features);
    faasm_write_state("weights", (uint8_t *)zero, n_features * (int32_t)sizeof(double));
    free(zero);
    int32_t batch = (n_examples + workers - 1) / workers;
    int32_t *order = malloc(workers * sizeof(int32_t)), *ids = malloc(workers * sizeof(int32_t));
    char *out = malloc(epochs * 32 + 1);
    if (!order || !ids || !out) return faasm_fail("out of memory");
    out[0] = 0;
    uint32_t rng = 1234;
    double t_first = -1;
    for (int32_t e = 0; e < epochs; e++) {
        double err = 0;
        faasm_write_state("errors", (uint8_t *)&err, sizeof err);
        for (int32_t w = 0; w < workers; w++) order[w] = w;
        for (int32_t w = workers - 1; w > 0; w--) { /* Fisher-Yates with a fixed LCG */
            rng = rng * 1664525u + 1013904223u;
            int32_t j = (int32_t)(rng % (uint32_t)(w + 1)), t = order[w];
            order[w] = order[j]; order[j] = t;
        }
        for (int32_t k = 0; k < workers; k++) {
            int32_t w = order[k], start = w * batch, end = start + batch;
            if (end > n_examples) end = n_examples;
            if (start > end) start = end;
            char arg[64];
            int n = snprintf(arg, sizeof arg, "%d %d %d %d", w, start, end, e);
            ids[k] = faasm_chain(1, (uint8_t *)arg, n);
            if (ids[k] < 0) return faasm_fail("chaining step %d failed", w);
        }
        for (int32_t k = 0; k < workers; k++) {
            char msg[256]; int32_t len = 0;
            if (faasm_await(ids[k], (uint8_t *)msg, sizeof msg - 1, &len)) {
                msg[len < (int32_t)sizeof msg - 1 ? len : (int32_t)sizeof msg - 1] = 0;
                return faasm_fail("step call %d failed: %s", ids[k], msg);
            }
        }
        faasm_pull_state("errors");
        faasm_read_state("errors", (uint8_t *)&err, sizeof err);
        double t = now_s();
        if (t_first < 0) t_first = t;
        size_t used = strlen(out);
        snprintf(out + used, 32, "%s%.4f %.4f", e ? "\n" : "", t - t_first, sqrt(err / n_examples));
    }
    faasm_output_str(out);
    free(order); free(ids); free(out);
    return 0;
}

static int32_t step(void) {
    char in[128] = {0};
    faasm_input((uint8_t *)in, sizeof in - 1);
    int32_t w, start, end, epoch, params[3];
    if (sscanf(in, "%d %d %d %d", &w, &start, &end, &epoch) != 4)
        return faasm_fail("step input must be '<w> <start> <end> <epoch>', got '%s'", in);
    if (load_data()) return faasm_fail("SGD state missing or inconsistent");
    if (start < 0 || end > n_examples || start > end) return faasm_fail("batch [%d, %d) out of range", start, end);
    faasm_pull_state("params");
    if (faasm_read_state("params", (uint8_t *)params, sizeof params) != (int32_t)sizeof params)
        return faasm_fail("sgd_params missing");
    int32_t interval = params[1];
    double *weights = malloc(n_features * sizeof(double)), *delta = calloc(n_features, sizeof(double));
    int32_t *touched = malloc(n_features * sizeof(int32_t));
    char *mark = calloc(n_features, 1);
    if (!weights || !delta || !touched || !mark) return faasm_fail("out of memory");
    int32_t wbytes = n_features * (int32_t)sizeof(double), n_touched = 0;
    faasm_pull_state("weights");
    if (faasm_read_state("weights", (uint8_t *)weights, wbytes) != wbytes) return faasm_fail("sgd_weights missing");
    double sq_err = 0;
    for (int32_t i = start, updates = 1; i < end; i++, updates++) {
        double pred = 0, y = labels[i];
        for (int32_t p = outr[i]; p < outr[i + 1]; p++) pred += weights[innr[p]] * vals[p];
        double hinge = 1.0 - y * pred;
        if (hinge > 0) {
            sq_err += hinge * hinge;
            for (int32_t p = outr[i]; p < outr[i + 1]; p++) {
                int32_t f = innr[p];
                double d = LEARNING_RATE * y * vals[p];
                weights[f] += d;
                delta[f] += d;
                if (!mark[f]) { mark[f] = 1; touched[n_touched++] = f; }
            }
        }
        if ((interval > 0 && updates % interval == 0) || i == end - 1) {
            double *dv = malloc((n_touched ? n_touched : 1) * sizeof(double));
            if (!dv) return faasm_fail("out of memory");
            for (int32_t k = 0; k < n_touched; k++) { dv[k] = delta[touched[k]]; delta[touched[k]] = 0; mark[touched[k]] = 0; }
            if (n_touched) faasm_add_state_f64("weights", touched, dv, n_touched);
            free(dv);
            n_touched = 0;
            if (i != end - 1) {
                faasm_pull_state("weights");
                faasm_read_state("weights", (uint8_t *)weights, wbytes);
            }
        }
    }
    int32_t zero = 0;
    faasm_add_state_f64("errors", &zero, &sq_err, 1);
    free(weights); free(delta); free(touched); free(mark);
    char msg[64];
    snprintf(msg, sizeof msg, "worker %d done %d examples", w, end - start);
    faasm_output_str(msg);
    return 0;
}

FAASM_EXPORT("faasm_main") int32_t faasm_main(int32_t index) {
    return index == 1 ? step() : driver();
}
