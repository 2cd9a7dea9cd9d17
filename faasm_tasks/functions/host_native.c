/* The native build's host interface: the function runs as a long-lived process in its
 * container and serves calls from the worker that started it, over stdin (from the worker)
 * and stdout (to it). Frame: u8 op, u32 length (little-endian), payload.
 *   worker -> function  'C' {i32 index, input}   a call
 *                       'R' {i32 status, i32 size, data}   the answer to a host request
 *   function -> worker  'r'/'f' {i32 max, key}   read state / a shared file (status = size, -1 missing)
 *                       'w' {i32 keylen, key, data}  write state
 *                       'a' {i32 keylen, key, i32 n, i32 idx[n], f64 vals[n]}  element-wise add
 *                       'c' {i32 index, input}  chain (status = call id)
 *                       'W' {i32 id, i32 max}   await (status = 0 success, size = output size)
 *                       'D' {i32 rc, output}    the call finished
 * There is no local tier: every read copies the value out of Redis (through the worker), as
 * the seed's native containers do; pull_state is therefore a no-op.
 */
#include "faasm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int32_t faasm_main(int32_t index);

static uint8_t *call_input, *call_output;
static int32_t input_len, output_len;

static void put_all(const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t k = write(1, b, n);
        if (k <= 0) _exit(3);
        b += k; n -= (size_t)k;
    }
}

static int get_all(void *p, size_t n) {
    uint8_t *b = p;
    while (n) {
        ssize_t k = read(0, b, n);
        if (k <= 0) return -1;
        b += k; n -= (size_t)k;
    }
    return 0;
}

/* one frame out, from up to three parts */
static void send_frame(uint8_t op, const void *a, uint32_t na, const void *b, uint32_t nb, const void *c, uint32_t nc) {
    uint32_t len = na + nb + nc;
    uint8_t hdr[5] = {op, len & 0xff, (len >> 8) & 0xff, (len >> 16) & 0xff, len >> 24};
    put_all(hdr, 5);
    if (na) put_all(a, na);
    if (nb) put_all(b, nb);
    if (nc) put_all(c, nc);
}

/* the answer to a request: status, size, and data copied into buf (at most max bytes) */
static int32_t reply(uint8_t *buf, int32_t max, int32_t *size_out) {
    uint8_t hdr[5];
    int32_t head[2];
    if (get_all(hdr, 5) || hdr[0] != 'R') _exit(4);
    uint32_t len = hdr[1] | hdr[2] << 8 | hdr[3] << 16 | (uint32_t)hdr[4] << 24;
    if (len < 8 || get_all(head, 8)) _exit(4);
    uint32_t data = len - 8, keep = buf && max > 0 ? ((int32_t)data < max ? data : (uint32_t)max) : 0;
    if (keep && get_all(buf, keep)) _exit(4);
    for (uint32_t left = data - keep; left;) { /* drain what does not fit */
        uint8_t sink[4096];
        uint32_t k = left < sizeof sink ? left : sizeof sink;
        if (get_all(sink, k)) _exit(4);
        left -= k;
    }
    if (size_out) *size_out = head[1];
    return head[0];
}

int32_t faasm_input(uint8_t *buf, int32_t len) {
    if (buf && len > 0) memcpy(buf, call_input, input_len < len ? input_len : len);
    return input_len;
}

void faasm_output(const uint8_t *buf, int32_t len) {
    free(call_output);
    call_output = malloc(len > 0 ? len : 1);
    memcpy(call_output, buf, len);
    output_len = len;
}

static int32_t read_req(uint8_t op, const char *key, uint8_t *buf, int32_t len) {
    int32_t max = buf ? len : 0;
    send_frame(op, &max, 4, key, (uint32_t)strlen(key), NULL, 0);
    return reply(buf, max, NULL);
}

int32_t faasm_read_state(const char *key, uint8_t *buf, int32_t len) { return read_req('r', key, buf, len); }
int32_t faasm_read_file(const char *path, uint8_t *buf, int32_t len) { return read_req('f', path, buf, len); }

void faasm_write_state(const char *key, const uint8_t *buf, int32_t len) {
    int32_t kl = (int32_t)strlen(key);
    send_frame('w', &kl, 4, key, kl, buf, len);
    reply(NULL, 0, NULL);
}

void faasm_add_state_f64(const char *key, const int32_t *idx, const double *vals, int32_t n) {
    int32_t kl = (int32_t)strlen(key);
    size_t len = 4 + kl + 4 + (size_t)n * 12;
    uint8_t *msg = malloc(len), *p = msg;
    memcpy(p, &kl, 4); p += 4;
    memcpy(p, key, kl); p += kl;
    memcpy(p, &n, 4); p += 4;
    memcpy(p, idx, (size_t)n * 4); p += (size_t)n * 4;
    memcpy(p, vals, (size_t)n * 8);
    send_frame('a', msg, (uint32_t)len, NULL, 0, NULL, 0);
    free(msg);
    reply(NULL, 0, NULL);
}

void faasm_pull_state(const char *key) { (void)key; }

int32_t faasm_chain(int32_t index, const uint8_t *input, int32_t len) {
    send_frame('c', &index, 4, input, len, NULL, 0);
    return reply(NULL, 0, NULL);
}

int32_t faasm_await(int32_t id, uint8_t *buf, int32_t len, int32_t *out_len) {
    int32_t arg[2] = {id, buf ? len : 0};
    send_frame('W', arg, 8, NULL, 0, NULL, 0);
    return reply(buf, arg[1], out_len);
}

int main(void) {
    for (;;) {
        uint8_t hdr[5];
        if (get_all(hdr, 5)) return 0; /* the worker closed the pipe: the container ends */
        uint32_t len = hdr[1] | hdr[2] << 8 | hdr[3] << 16 | (uint32_t)hdr[4] << 24;
        if (hdr[0] != 'C' || len < 4) return 5;
        uint8_t *msg = malloc(len);
        if (!msg || get_all(msg, len)) return 6;
        int32_t index;
        memcpy(&index, msg, 4);
        call_input = msg + 4;
        input_len = (int32_t)len - 4;
        output_len = 0;
        int32_t rc = faasm_main(index);
        send_frame('D', &rc, 4, call_output, output_len, NULL, 0);
        free(msg);
        free(call_output);
        call_output = NULL;
    }
}
