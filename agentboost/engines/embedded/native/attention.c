/*
 * Attention of a one-token decode step over a KV cache, fp32, grouped query heads.
 *
 * Built and loaded by agentboost/engines/embedded/native_attention.py (cc -O3 -march=native -fopenmp). One call
 * attends every row and every key/value head of one layer: for each (row, kv head) pair it reads the
 * pair's keys once (scores of its G query heads), takes a softmax per query head, and reads the pair's
 * values once (the weighted sum). The cache is read exactly once per step, in order, so the step runs
 * near the machine's memory bandwidth; the general-purpose path (PyTorch's flash kernel calling BLAS for
 * 3 x 64 by 64 x W products) ran at a third of it on SmolLM2's shapes (docs/engines.md).
 *
 * Layouts (element strides; the last dimension of every tensor is contiguous):
 *   query  (b, head, d) at b * q_row + head * q_head + d, head = h * G + g
 *   keys   (b, h, w, d) at b * kv_row + h * kv_head + w * kv_pos + d; values with the same strides
 *   mask   (b, w) at b * m_row + w, nonzero = attend; NULL = attend to all W positions
 *   out    (b, head, d) at (b * H * G + head) * D + d
 * A pair whose positions are all masked gets zeros (a one-token step always reads its own token).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 16-float vectors (GCC's and Clang's vector extensions: one AVX-512 register, two AVX2 ones, four of
 * NEON's), loaded and stored unaligned. */
typedef float vec16 __attribute__((vector_size(64)));
typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));

static inline vec16 load16(const float *p) {
    vec16 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline float sum16(vec16 x) {
    vec8 lo, hi;
    memcpy(&lo, &x, sizeof lo);
    memcpy(&hi, (const char *)&x + sizeof lo, sizeof hi);
    const vec8 eight = lo + hi;
    vec4 a, b;
    memcpy(&a, &eight, sizeof a);
    memcpy(&b, (const char *)&eight + sizeof a, sizeof b);
    const vec4 four = a + b;
    return (four[0] + four[2]) + (four[1] + four[3]);
}

typedef int32_t ivec16 __attribute__((vector_size(64)));

#if defined(__clang__)
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (ivec16){__VA_ARGS__})
#endif

/* The sums of 16 vectors, lane j the sum of x[j]'s lanes: four rounds of halving, each adding the two
 * halves of every group of lanes of two vectors (15 adds where 16 sum16 calls take 64); the rounds leave
 * the sums in bit-reversed lane order, which the last shuffle undoes. */
static inline vec16 sums16(const vec16 *x) {
    vec16 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)
        a[i] = SHUFFLE(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUFFLE(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        b[i] = SHUFFLE(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
               SHUFFLE(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        c[i] = SHUFFLE(b[2 * i], b[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
               SHUFFLE(b[2 * i], b[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    const vec16 d = SHUFFLE(c[0], c[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
                    SHUFFLE(c[0], c[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    return SHUFFLE(d, d, 0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15);
}

static inline vec16 select16(ivec16 take_a, vec16 a, vec16 b) {
    return (vec16)((take_a & (ivec16)a) | (~take_a & (ivec16)b));
}

/* exp(x) for x <= 0 (or -inf), lane by lane, to about one unit in the last place; exactly 0 below -87
 * (where expf's results leave the normal floats: a weight of at most 1.7e-38 against the row's largest,
 * which is 1). */
static inline vec16 exp16(vec16 x) {
    const vec16 zero = {0};
    const ivec16 under = x < zero - 87.0f;
    const vec16 clamped = select16(under, zero - 87.0f, x);
    const vec16 n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    vec16 r = clamped - n * 0.693145751953125f; /* ln 2 in two parts: r = x - n ln 2, |r| <= 0.35 */
    r = r - n * 1.428606765330187045e-06f;
    vec16 p = zero + 1.0f / 5040.0f; /* Taylor to r^7: error below 6e-9 relative on |r| <= 0.35 */
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const ivec16 bits = (__builtin_convertvector(n, ivec16) + 127) << 23; /* 2^n, n in [-126, 0] */
    return select16(under, zero, p * (vec16)bits);
}

/* Any head dimension: plain loops. */
static void score_any(const float *restrict q, int64_t q_head, const float *restrict k, int64_t kv_pos,
                      int first, int G, int W, int D, float scale, float *restrict scores) {
    for (int w = first; w < W; w++) {
        const float *row = k + (int64_t)w * kv_pos;
        for (int g = 0; g < G; g++) {
            const float *qg = q + g * q_head;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < D; d++) dot += qg[d] * row[d];
            scores[g * W + w] = dot * scale;
        }
    }
}

static void weigh_any(const float *restrict v, int64_t kv_pos, int first, float *restrict out, int G,
                      int W, int D, const float *restrict scores, float *restrict acc) {
    memset(acc, 0, sizeof(float) * (size_t)G * (size_t)D);
    for (int w = first; w < W; w++) {
        const float *row = v + (int64_t)w * kv_pos;
        for (int g = 0; g < G; g++) {
            const float p = scores[g * W + w];
            float *a = acc + g * D;
#pragma omp simd
            for (int d = 0; d < D; d++) a[d] += p * row[d];
        }
    }
    for (int g = 0; g < G; g++) memcpy(out + g * D, acc + g * D, sizeof(float) * (size_t)D);
}

/* Heads of D = 64 or 128: the products in 16-float vectors held in registers, the positions in blocks of
 * BLOCK rows (16 KiB of keys or values at D = 64), so that the query heads after the first read a block
 * from the L1 cache rather than from memory. */
#define BLOCK 64

#define DEFINE_PAIR(D)                                                                                     \
    static void score_##D(const float *restrict q, int64_t q_head, const float *restrict k,                \
                          int64_t kv_pos, int first, int G, int W, float scale, float *restrict scores) {  \
        for (int start = first; start < W; start += BLOCK) {                                               \
            const int stop = start + BLOCK < W ? start + BLOCK : W;                                        \
            for (int g = 0; g < G; g++) {                                                                  \
                vec16 qg[D / 16];                                                                          \
                for (int c = 0; c < D / 16; c++) qg[c] = load16(q + g * q_head + 16 * c);                  \
                int w = start;                                                                             \
                for (; w + 16 <= stop; w += 16) { /* 16 keys' products, summed lane-wise together */      \
                    vec16 dots[16];                                                                        \
                    for (int j = 0; j < 16; j++) {                                                         \
                        const float *row = k + (int64_t)(w + j) * kv_pos;                                  \
                        dots[j] = qg[0] * load16(row);                                                     \
                        for (int c = 1; c < D / 16; c++) dots[j] += qg[c] * load16(row + 16 * c);          \
                    }                                                                                      \
                    const vec16 sums = sums16(dots) * scale;                                               \
                    memcpy(scores + g * W + w, &sums, sizeof sums);                                        \
                }                                                                                          \
                for (; w < stop; w++) {                                                                    \
                    const float *row = k + (int64_t)w * kv_pos;                                            \
                    vec16 dot = qg[0] * load16(row);                                                       \
                    for (int c = 1; c < D / 16; c++) dot += qg[c] * load16(row + 16 * c);                  \
                    scores[g * W + w] = sum16(dot) * scale;                                                \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }                                                                                                      \
    static void weigh_##D(const float *restrict v, int64_t kv_pos, int first, float *restrict out, int G,  \
                          int W, const float *restrict scores, float *restrict acc) {                      \
        memset(acc, 0, sizeof(float) * (size_t)G * D);                                                     \
        for (int start = first; start < W; start += BLOCK) {                                               \
            const int stop = start + BLOCK < W ? start + BLOCK : W;                                        \
            for (int g = 0; g < G; g++) {                                                                  \
                vec16 sum[D / 16];                                                                         \
                for (int c = 0; c < D / 16; c++) sum[c] = load16(acc + g * D + 16 * c);                    \
                const float *p = scores + g * W;                                                           \
                for (int w = start; w < stop; w++) {                                                       \
                    const float *row = v + (int64_t)w * kv_pos;                                            \
                    for (int c = 0; c < D / 16; c++) sum[c] += p[w] * load16(row + 16 * c);                \
                }                                                                                          \
                memcpy(acc + g * D, sum, sizeof sum);                                                      \
            }                                                                                              \
        }                                                                                                  \
        memcpy(out, acc, sizeof(float) * (size_t)G * D);                                                   \
    }

DEFINE_PAIR(64)
DEFINE_PAIR(128)

static void attend_pair(const float *restrict q, int64_t q_head, const float *restrict k,
                        const float *restrict v, int64_t kv_pos, const uint8_t *restrict mask,
                        float *restrict out, int G, int W, int D, float scale, float *restrict scores,
                        float *restrict acc) {
    int first = 0;
    while (mask && first < W && !mask[first]) first++; /* left padding: never read */
    if (first == W) {
        memset(out, 0, sizeof(float) * (size_t)G * (size_t)D);
        return;
    }
    /* scores[g * W + w] = q_g . k_w * scale */
    if (D == 64)
        score_64(q, q_head, k, kv_pos, first, G, W, scale, scores);
    else if (D == 128)
        score_128(q, q_head, k, kv_pos, first, G, W, scale, scores);
    else
        score_any(q, q_head, k, kv_pos, first, G, W, D, scale, scores);
    /* softmax weights, unnormalized: masked positions weigh exactly 0 */
    float total[G];
    for (int g = 0; g < G; g++) {
        float *s = scores + g * W;
        if (mask)
            for (int w = first; w < W; w++)
                if (!mask[w]) s[w] = -INFINITY;
        float top = -INFINITY;
        for (int w = first; w < W; w++) top = s[w] > top ? s[w] : top;
        vec16 sum = {0};
        int w = first;
        for (; w + 16 <= W; w += 16) {
            const vec16 e = exp16(load16(s + w) - top);
            memcpy(s + w, &e, sizeof e);
            sum += e;
        }
        if (w < W) { /* the last few, padded with weights of 0 */
            float tail[16];
            for (int i = 0; i < 16; i++) tail[i] = w + i < W ? s[w + i] : -INFINITY;
            const vec16 e = exp16(load16(tail) - top);
            memcpy(tail, &e, sizeof e);
            memcpy(s + w, tail, sizeof(float) * (size_t)(W - w));
            sum += e;
        }
        total[g] = sum16(sum);
    }
    if (D == 64)
        weigh_64(v, kv_pos, first, out, G, W, scores, acc);
    else if (D == 128)
        weigh_128(v, kv_pos, first, out, G, W, scores, acc);
    else
        weigh_any(v, kv_pos, first, out, G, W, D, scores, acc);
    for (int g = 0; g < G; g++) {
        const float inverse = 1.0f / total[g];
        for (int d = 0; d < D; d++) out[g * D + d] *= inverse;
    }
}

/* Returns 0, or 1 when scratch memory could not be had (out untouched). */
int agentboost_decode_attention_f32(const float *q, int64_t q_row, int64_t q_head, const float *k,
                                    const float *v, int64_t kv_row, int64_t kv_head, int64_t kv_pos,
                                    const uint8_t *mask, int64_t m_row, float *out, int B, int H, int G,
                                    int W, int D, float scale, int threads) {
    /* every thread's scratch from this (the calling) thread: a malloc inside OpenMP's worker threads
     * gives each of them a heap of its own, which keeps memory for as long as the thread lives */
    const size_t share = (size_t)G * (size_t)W + (size_t)G * (size_t)D;
    float *scratch = malloc(sizeof(float) * share * (size_t)threads);
    if (!scratch) return 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t pair = 0; pair < (int64_t)B * H; pair++) {
        float *mine = scratch + share * (size_t)omp_get_thread_num();
        const int64_t b = pair / H, h = pair % H;
        attend_pair(q + b * q_row + h * G * q_head, q_head, k + b * kv_row + h * kv_head,
                    v + b * kv_row + h * kv_head, kv_pos, mask ? mask + b * m_row : NULL,
                    out + (b * H + h) * (int64_t)G * D, G, W, D, scale, mine, mine + (size_t)G * (size_t)W);
    }
    free(scratch);
    return 0;
}

/*
 * Attention of a prefill: L query positions per row against W keys (the row's cached prefix, if any,
 * then its new positions), under a boolean mask [B, 1, L, W] or, without one, causal with L == W.
 *
 * Each mask row must be one run of attended positions with at most one hole in it, [first, last] less
 * [hole_lo, hole_hi): causal rows, left padding, the engine's [pad | cached | pad | new] rows and sliding
 * windows all are. Any other row returns 2 before anything is computed, and the caller keeps PyTorch's
 * attention. Rows with nothing attended (a padding position's) get zeros.
 *
 * Work: for each (row, kv head) pair, the G * L query vectors in position order, in tiles of LANES.
 * A tile's scores are computed with the queries across the vector lanes (its query block transposed
 * once, each key's element broadcast), kept whole for the tile (LANES floats per key), softmaxed per
 * lane, then weighed against the values with the head dimension across the lanes. Tiles are independent:
 * the threads share them out.
 *
 * Layouts: query (b, head, p, d) at b * q_row + head * q_head + p * q_pos + d; keys and values as for the
 * decode step; mask (b, p, w) at b * m_row + p * m_pos + w; out (b, p, head, d) contiguous.
 */
#define LANES 16
#define KEYS 8

typedef struct {
    int first, last, hole_lo, hole_hi; /* attended: first..last, less hole_lo..hole_hi - 1 */
} span;

/* 0, or 1 when the row is not one run with at most one hole. */
static int describe_row(const uint8_t *row, int W, span *out) {
    int first = 0;
    while (first < W && !row[first]) first++;
    if (first == W) {
        out->first = 0, out->last = -1, out->hole_lo = out->hole_hi = 0;
        return 0;
    }
    int last = W - 1;
    while (!row[last]) last--;
    int w = first;
    while (w <= last && row[w]) w++;
    const int hole_lo = w;
    while (w <= last && !row[w]) w++;
    const int hole_hi = w;
    for (; w <= last; w++)
        if (!row[w]) return 1;
    out->first = first, out->last = last, out->hole_lo = hole_lo, out->hole_hi = hole_hi;
    return 0;
}

#define DEFINE_PREFILL_TILE(D)                                                                             \
    static void prefill_tile_##D(const float *restrict q, int64_t q_head, int64_t q_pos,                   \
                                 const float *restrict k, const float *restrict v, int64_t kv_pos,          \
                                 const span *restrict spans, float *restrict out, int H, int G, int h,       \
                                 int i0, int n, float scale, vec16 *restrict scores) {                      \
        int pos[LANES], head[LANES];                                                                       \
        ivec16 first, last, hole_lo, hole_hi;                                                              \
        vec16 qt[D];                                                                                       \
        int lo = 1 << 30, hi = 0;                                                                          \
        for (int l = 0; l < LANES; l++) {                                                                  \
            const int i = i0 + (l < n ? l : 0);                                                            \
            pos[l] = i / G, head[l] = h * G + i % G;                                                       \
            const span s = spans[pos[l]];                                                                  \
            first[l] = l < n ? s.first : 0, last[l] = l < n ? s.last : -1;                                 \
            hole_lo[l] = s.hole_lo, hole_hi[l] = s.hole_hi;                                                \
            if (first[l] <= last[l]) {                                                                     \
                lo = first[l] < lo ? first[l] : lo;                                                        \
                hi = last[l] + 1 > hi ? last[l] + 1 : hi;                                                  \
            }                                                                                              \
            const float *query = q + (int64_t)(i % G) * q_head + (int64_t)pos[l] * q_pos;                  \
            for (int d = 0; d < D; d++) qt[d][l] = l < n ? query[d] : 0.0f;                                \
        }                                                                                                  \
        if (lo >= hi) {                                                                                    \
            for (int l = 0; l < n; l++)                                                                    \
                memset(out + ((int64_t)pos[l] * H * G + head[l]) * D, 0, sizeof(float) * D);              \
            return;                                                                                        \
        }                                                                                                  \
        const vec16 zero = {0};                                                                            \
        vec16 top = zero - INFINITY;                                                                       \
        for (int w = lo; w < hi; w += KEYS) {                                                              \
            const int count = hi - w < KEYS ? hi - w : KEYS;                                               \
            vec16 acc[KEYS];                                                                               \
            for (int j = 0; j < KEYS; j++) acc[j] = zero;                                                  \
            const float *row = k + (int64_t)w * kv_pos;                                                    \
            if (count == KEYS) {                                                                           \
                for (int d = 0; d < D; d++)                                                                \
                    for (int j = 0; j < KEYS; j++) acc[j] += row[j * kv_pos + d] * qt[d];                  \
            } else {                                                                                       \
                for (int d = 0; d < D; d++)                                                                \
                    for (int j = 0; j < count; j++) acc[j] += row[j * kv_pos + d] * qt[d];                 \
            }                                                                                              \
            for (int j = 0; j < count; j++) {                                                              \
                const int key = w + j;                                                                     \
                const ivec16 live = (key >= first) & (key <= last) & ~((key >= hole_lo) & (key < hole_hi)); \
                const vec16 score = select16(live, acc[j] * scale, zero - INFINITY);                       \
                top = select16(score > top, score, top);                                                   \
                scores[key - lo] = score;                                                                  \
            }                                                                                              \
        }                                                                                                  \
        top = select16(top == zero - INFINITY, zero, top); /* empty lanes: exp(-inf) = 0 */                \
        vec16 total = zero;                                                                                \
        for (int w = 0; w < hi - lo; w++) {                                                                \
            const vec16 e = exp16(scores[w] - top);                                                        \
            scores[w] = e;                                                                                 \
            total += e;                                                                                    \
        }                                                                                                  \
        for (int l0 = 0; l0 < n; l0 += 4) {                                                                \
            vec16 acc[4][D / 16];                                                                          \
            for (int j = 0; j < 4; j++)                                                                    \
                for (int c = 0; c < D / 16; c++) acc[j][c] = zero;                                         \
            for (int w = lo; w < hi; w++) {                                                                \
                const float *row = v + (int64_t)w * kv_pos;                                                \
                const vec16 weights = scores[w - lo];                                                      \
                for (int c = 0; c < D / 16; c++) {                                                         \
                    const vec16 r = load16(row + 16 * c);                                                  \
                    for (int j = 0; j < 4; j++) acc[j][c] += weights[l0 + j] * r;                          \
                }                                                                                          \
            }                                                                                              \
            for (int j = 0; j < 4 && l0 + j < n; j++) {                                                    \
                const int l = l0 + j;                                                                      \
                const float inverse = total[l] > 0.0f ? 1.0f / total[l] : 0.0f;                            \
                float *target = out + ((int64_t)pos[l] * H * G + head[l]) * D;                             \
                for (int c = 0; c < D / 16; c++) {                                                         \
                    const vec16 result = acc[j][c] * inverse;                                              \
                    memcpy(target + 16 * c, &result, sizeof result);                                       \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }

DEFINE_PREFILL_TILE(64)
DEFINE_PREFILL_TILE(128)

/* Returns 0; 1 when scratch memory could not be had; 2 for a mask this kernel does not take, or a head
 * dimension other than 64 or 128 (out untouched). */
int agentboost_prefill_attention_f32(const float *q, int64_t q_row, int64_t q_head, int64_t q_pos,
                                     const float *k, const float *v, int64_t kv_row, int64_t kv_head,
                                     int64_t kv_pos, const uint8_t *mask, int64_t m_row, int64_t m_pos,
                                     float *out, int B, int H, int G, int L, int W, int D, float scale,
                                     int threads) {
    if (D != 64 && D != 128) return 2;
    span *spans = malloc(sizeof(span) * (size_t)B * (size_t)L);
    if (!spans) return 1;
    int irregular = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : irregular)
    for (int64_t row = 0; row < (int64_t)B * L; row++) {
        const int64_t b = row / L, p = row % L;
        if (mask) {
            irregular |= describe_row(mask + b * m_row + p * m_pos, W, spans + row);
        } else { /* causal over L == W positions */
            spans[row].first = 0, spans[row].last = (int)p;
            spans[row].hole_lo = spans[row].hole_hi = (int)p + 1;
        }
    }
    if (irregular) {
        free(spans);
        return 2;
    }
    const int tiles = (L * G + LANES - 1) / LANES;
    vec16 *scratch = aligned_alloc(sizeof(vec16), sizeof(vec16) * (size_t)W * (size_t)threads);
    if (!scratch) {
        free(spans);
        return 1;
    }
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int64_t unit = 0; unit < (int64_t)B * H * tiles; unit++) {
        vec16 *mine = scratch + (size_t)W * (size_t)omp_get_thread_num();
        const int64_t pair = unit / tiles, b = pair / H, h = pair % H;
        const int i0 = (int)(unit % tiles) * LANES;
        const int n = L * G - i0 < LANES ? L * G - i0 : LANES;
        const float *qb = q + b * q_row + (int64_t)h * G * q_head;
        const float *kb = k + b * kv_row + h * kv_head, *vb = v + b * kv_row + h * kv_head;
        float *ob = out + b * (int64_t)L * H * G * D;
        if (D == 64)
            prefill_tile_64(qb, q_head, q_pos, kb, vb, kv_pos, spans + b * L, ob, H, G, (int)h, i0, n, scale,
                            mine);
        else
            prefill_tile_128(qb, q_head, q_pos, kb, vb, kv_pos, spans + b * L, ob, H, G, (int)h, i0, n, scale,
                             mine);
    }
    free(scratch);
    free(spans);
    return 0;
}
