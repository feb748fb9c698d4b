/*
 * The elementwise parts of a decoder layer that PyTorch runs as several passes each: RMSNorm and the
 * rotary position embedding, fp32, for agentboost/engines/embedded/direct_forward.py.
 *
 * Built with attention.c into one library by agentboost/engines/embedded/native_attention.py. Each replaces a
 * chain of PyTorch operators, every one of which reads and writes a whole tensor (RMSNorm: pow, mean,
 * add, rsqrt, two multiplications; the rotary embedding: two multiplications, a negation, a
 * concatenation and an addition, for the queries and again for the keys), with one pass.
 *
 * Layouts (element strides; the last dimension of every tensor is contiguous):
 *   rms_norm:  x and out (r, d) at r * x_row + d and r * out_row + d; weight (d)
 *   rotary:    x (r, h, d) at r * x_row + h * x_head + d, rotated in place; cos and sin (r, d) at
 *              r * cs_row + d, the same for every head h
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#define NO_CONTRACTION
#define NO_CONTRACTION_BODY _Pragma("clang fp contract(off)")
#else
#define NO_CONTRACTION __attribute__((optimize("fp-contract=off")))
#define NO_CONTRACTION_BODY
#endif

/* Work under this many elements runs on the calling thread: a parallel region costs more than it saves. */
#define SERIAL_BELOW 65536

typedef float vec16 __attribute__((vector_size(64)));

/* out = weight * (x * (1 / sqrt(mean(x^2) + eps))), in this order, as transformers' Llama, Mistral and
 * Qwen RMSNorm compute it. The sum of squares runs in 16 lanes from the row's first element, then the
 * lanes in a fixed order, then the tail: the same order for every row wherever it lies in memory (a
 * vectorizer that peels elements to align the row would make a row's result depend on its address, and
 * so on what else is in the batch). It is another order than PyTorch's: results agree to float rounding,
 * not to the bit. */
void agentboost_rms_norm_f32(const float *x, int64_t rows, int64_t dim, int64_t x_row, const float *weight,
                             float eps, float *out, int64_t out_row, int threads) {
    if (rows * dim < SERIAL_BELOW) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict in = x + r * x_row;
        float *restrict o = out + r * out_row;
        vec16 lanes = {0};
        int64_t d = 0;
        for (; d + 16 <= dim; d += 16) {
            vec16 v;
            memcpy(&v, in + d, sizeof v);
            lanes += v * v;
        }
        float sum = 0.0f;
        for (int lane = 0; lane < 16; lane++) sum += lanes[lane];
        for (; d < dim; d++) sum += in[d] * in[d];
        const float inverse = 1.0f / sqrtf(sum / (float)dim + eps);
#pragma omp simd
        for (int64_t e = 0; e < dim; e++) o[e] = weight[e] * (in[e] * inverse);
    }
}

/* transformers' apply_rotary_pos_emb, in place: with h = d / 2, x[i] <- x[i] cos[i] + (-x[i + h]) sin[i]
 * and x[i + h] <- x[i + h] cos[i + h] + x[i] sin[i + h]. Each product is rounded before the sum, as
 * PyTorch's separate operators round them (no fused multiply-add), so the results are PyTorch's to the
 * bit. */
NO_CONTRACTION void agentboost_rotary_f32(float *x, int64_t rows, int64_t heads, int64_t dim, int64_t x_row,
                                         int64_t x_head, const float *cos, const float *sin, int64_t cs_row,
                                         int threads) {
    NO_CONTRACTION_BODY
    const int64_t half = dim / 2;
    if (rows * heads * dim < SERIAL_BELOW) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict c = cos + r * cs_row;
        const float *restrict s = sin + r * cs_row;
        for (int64_t h = 0; h < heads; h++) {
            float *restrict v = x + r * x_row + h * x_head;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half];
                const float first = a * c[i], second = -b * s[i];
                const float third = b * c[i + half], fourth = a * s[i + half];
                v[i] = first + second;
                v[i + half] = third + fourth;
            }
        }
    }
}
