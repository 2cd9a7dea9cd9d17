/* The host interface of the project's Faasm functions: one source, two builds.
 *
 * wasm32-wasi: these are imports of module "faasm", served by the wasmtime runtime
 * (faasm_tasks/runtimes/wasm.py): state comes from the runtime process's shared local
 * tier, synchronised with Redis.
 * native: host_native.c implements them as requests over stdin/stdout to the worker that
 * started the container (faasm_tasks/runtimes/native.py), which copies state in and out of
 * Redis.
 *
 * A function module exports faasm_main(index): 0 = success, else failure (the output is the
 * reason). Keys are NUL-terminated; sizes are bytes.
 */
#ifndef FAASM_H
#define FAASM_H
#include <stdint.h>

#ifdef __wasm__
#define FAASM_IMPORT(name) __attribute__((import_module("faasm"), import_name(name)))
#define FAASM_EXPORT(name) __attribute__((export_name(name)))
#else
#define FAASM_IMPORT(name)
#define FAASM_EXPORT(name)
#endif

/* the call's input (copied into buf, at most len bytes); returns the input's size */
FAASM_IMPORT("input") int32_t faasm_input(uint8_t *buf, int32_t len);
/* the call's output (replaces any earlier one) */
FAASM_IMPORT("output") void faasm_output(const uint8_t *buf, int32_t len);
/* copy state key into buf (at most len bytes); returns its size, -1 when it does not exist */
FAASM_IMPORT("read_state") int32_t faasm_read_state(const char *key, uint8_t *buf, int32_t len);
/* set state key (local tier and global tier) */
FAASM_IMPORT("write_state") void faasm_write_state(const char *key, const uint8_t *buf, int32_t len);
/* Hogwild update: key[idx[i]] += vals[i] (float64 elements), atomically per element */
FAASM_IMPORT("add_state_f64") void faasm_add_state_f64(const char *key, const int32_t *idx,
                                                         const double *vals, int32_t n);
/* refresh the local copy of key from the global tier */
FAASM_IMPORT("pull_state") void faasm_pull_state(const char *key);
/* chain a call of this function's module (index, input); returns the call id (< 0: failed) */
FAASM_IMPORT("chain") int32_t faasm_chain(int32_t index, const uint8_t *input, int32_t len);
/* wait for a chained call; 0 = success; its output copied into buf; *out_len = output size */
FAASM_IMPORT("await") int32_t faasm_await(int32_t id, uint8_t *buf, int32_t len, int32_t *out_len);
/* a shared file (the upload server's /file store), like state */
FAASM_IMPORT("read_file") int32_t faasm_read_file(const char *path, uint8_t *buf, int32_t len);

/* helpers over the interface */
void faasm_output_str(const char *s);
int32_t faasm_fail(const char *fmt, ...);
#endif
