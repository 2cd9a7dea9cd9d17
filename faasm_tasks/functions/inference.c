/* Image inference with a small CNN (the TF Lite experiments' shape, ATC'20 section 6.3):
 * the model is read from state once per instance (a warm instance keeps it; a cold start
 * reads it again), then each call runs one inference on the shared image.
 *
 * Network: conv 3->8 (3x3, stride 2, pad 1) ReLU, conv 8->16 (3x3, stride 2, pad 1) ReLU,
 * global average pool, linear 16->10, softmax. Weights (state tf_mobilenet_v1): float32 in
 * the order conv1.w [8][3][3][3], conv1.b, conv2.w [16][8][3][3], conv2.b, fc.w [10][16], fc.b.
 * Image: the last 3*64*64 bytes of tfdata/grace_hopper.bmp, planar RGB, scaled to [0, 1].
 * Output: "<label> <probability>".
 */
#include "faasm.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define C0 3
#define H0 64
#define C1 8
#define H1 32
#define C2 16
#define H2 16
#define NCLASS 10
#define N_PARAMS (C1 * C0 * 9 + C1 + C2 * C1 * 9 + C2 + NCLASS * C2 + NCLASS)

static float *model;  /* read once per instance */
static float image[C0 * H0 * H0];
static char labels[NCLASS][64];
static int have_image;

static void conv_relu(const float *in, int cin, int hin, const float *w, const float *b, int cout,
                      float *out, int hout) {
    for (int o = 0; o < cout; o++)
        for (int y = 0; y < hout; y++)
            for (int x = 0; x < hout; x++) {
                float s = b[o];
                for (int c = 0; c < cin; c++)
                    for (int ky = 0; ky < 3; ky++) {
                        int iy = 2 * y + ky - 1;
                        if (iy < 0 || iy >= hin) continue;
                        for (int kx = 0; kx < 3; kx++) {
                            int ix = 2 * x + kx - 1;
                            if (ix < 0 || ix >= hin) continue;
                            s += w[((o * cin + c) * 3 + ky) * 3 + kx] * in[(c * hin + iy) * hin + ix];
                        }
                    }
                out[(o * hout + y) * hout + x] = s > 0 ? s : 0;
            }
}

static int load_inputs(void) {
    if (!have_image) {
        int32_t size = faasm_read_file("tfdata/grace_hopper.bmp", NULL, 0);
        if (size < (int32_t)sizeof image / 4) return faasm_fail("shared file tfdata/grace_hopper.bmp missing or short");
        uint8_t *raw = malloc(size);
        if (!raw) return faasm_fail("out of memory");
        faasm_read_file("tfdata/grace_hopper.bmp", raw, size);
        const uint8_t *px = raw + size - C0 * H0 * H0;
        for (int i = 0; i < C0 * H0 * H0; i++) image[i] = px[i] / 255.0f;
        free(raw);
        char text[NCLASS * 64] = {0};
        int32_t n = faasm_read_file("tfdata/labels.txt", (uint8_t *)text, sizeof text - 1);
        if (n < 0) return faasm_fail("shared file tfdata/labels.txt missing");
        text[n < (int32_t)sizeof text - 1 ? n : (int32_t)sizeof text - 1] = 0;
        char *line = text;
        for (int k = 0; k < NCLASS; k++) {
            char *nl = line ? strchr(line, '\n') : NULL;
            if (nl) *nl = 0;
            snprintf(labels[k], sizeof labels[k], "%s", line && *line ? line : "?");
            line = nl ? nl + 1 : NULL;
        }
        have_image = 1;
    }
    if (!model) {
        int32_t size = faasm_read_state("mobilenet_v1", NULL, 0);
        if (size != N_PARAMS * (int32_t)sizeof(float))
            return faasm_fail("model state tf_mobilenet_v1 holds %d bytes, the CNN needs %d", size,
                              N_PARAMS * (int)sizeof(float));
        model = malloc(size);
        if (!model) return faasm_fail("out of memory for the model");
        faasm_read_state("mobilenet_v1", (uint8_t *)model, size);
    }
    return 0;
}

FAASM_EXPORT("faasm_main") int32_t faasm_main(int32_t index) {
    (void)index;
    if (load_inputs()) return 1;
    static float a1[C1 * H1 * H1], a2[C2 * H2 * H2];
    const float *w1 = model, *b1 = w1 + C1 * C0 * 9, *w2 = b1 + C1, *b2 = w2 + C2 * C1 * 9,
                *fw = b2 + C2, *fb = fw + NCLASS * C2;
    conv_relu(image, C0, H0, w1, b1, C1, a1, H1);
    conv_relu(a1, C1, H1, w2, b2, C2, a2, H2);
    float pooled[C2], logits[NCLASS], max = -INFINITY, sum = 0;
    for (int c = 0; c < C2; c++) {
        float s = 0;
        for (int i = 0; i < H2 * H2; i++) s += a2[c * H2 * H2 + i];
        pooled[c] = s / (H2 * H2);
    }
    int top = 0;
    for (int k = 0; k < NCLASS; k++) {
        float s = fb[k];
        for (int c = 0; c < C2; c++) s += fw[k * C2 + c] * pooled[c];
        logits[k] = s;
        if (s > max) { max = s; top = k; }
    }
    for (int k = 0; k < NCLASS; k++) sum += expf(logits[k] - max);
    char out[96];
    snprintf(out, sizeof out, "%s %.4f", labels[top], 1.0f / sum);
    faasm_output_str(out);
    return 0;
}
