/* RoPE's rotation on a CPU in one pass (torchtune/modules/position_embeddings.py defines it;
 * torchtune/modules/_native_kernels/__init__.py builds this file with stochastic_rounding.c and calls it with ctypes).
 *
 * x is [batch, seq, heads, dim] (contiguous), channel pairs (2i, 2i+1) of each head rotated by the table's
 * (cos, sin) pair i of the row's position: table rows [*, dim / 2, 2] in fp32, row b * table_stride + s for
 * (b, s), table_stride 0 where every sequence uses positions 0..seq-1. The arithmetic is the PyTorch ops':
 * each product rounded to fp32, then the sum (no FMA contraction: the build keeps IEEE semantics), then
 * the bf16 result rounded to nearest even: the same bits. inverse: the rotation by -angle, which is the
 * gradient (x0 * cos + x1 * sin, x1 * cos - x0 * sin: autograd's sums, in either order, the same bits). */
#include <stdint.h>
#include <string.h>

static inline float rope_bf16_in(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t rope_bf16_out(float f) { /* torch's round to nearest even; NaN stays a quiet NaN */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (f != f)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* Each head's even channels, then its odd ones: written as one loop, GCC 12 recognises a complex multiply
 * and emits vfmaddsub (one rounding where PyTorch has two) even under -ffp-contract=off. */
#define ROPE_ROW(T, LOAD, STORE)                                                                               \
    for (int64_t h = 0; h < heads; h++) {                                                                      \
        const T *xh = xr + h * dim;                                                                            \
        T *oh = outr + h * dim;                                                                                \
        _Pragma("omp simd") for (int64_t i = 0; i < half; i++) {                                               \
            float a = LOAD(xh[2 * i]) * tr[2 * i], b = LOAD(xh[2 * i + 1]) * (sign * tr[2 * i + 1]);           \
            oh[2 * i] = STORE(a - b);                                                                          \
        }                                                                                                      \
        _Pragma("omp simd") for (int64_t i = 0; i < half; i++) {                                               \
            float d = LOAD(xh[2 * i + 1]) * tr[2 * i], e = LOAD(xh[2 * i]) * (sign * tr[2 * i + 1]);           \
            oh[2 * i + 1] = STORE(d + e);                                                                      \
        }                                                                                                      \
    }

#define ROPE_BODY(T, LOAD, STORE)                                                                              \
    const int64_t half = dim / 2, rows = batch * seq;                                                          \
    const float sign = inverse ? -1.0f : 1.0f;                                                                 \
    _Pragma("omp parallel for num_threads(threads) if (threads > 1)") for (int64_t r = 0; r < rows; r++) {     \
        const float *tr = table + ((r / seq) * table_stride + r % seq) * 2 * half;                             \
        const T *xr = x + r * heads * dim;                                                                     \
        T *outr = out + r * heads * dim;                                                                       \
        ROPE_ROW(T, LOAD, STORE)                                                                               \
    }

#define F32_SAME(v) (v)

void tune_rope_bf16(const uint16_t *x, uint16_t *out, const float *table, int64_t batch, int64_t seq, int64_t heads,
                    int64_t dim, int64_t table_stride, int inverse, int threads) {
    ROPE_BODY(uint16_t, rope_bf16_in, rope_bf16_out)
}

void tune_rope_f32(const float *x, float *out, const float *table, int64_t batch, int64_t seq, int64_t heads,
                   int64_t dim, int64_t table_stride, int inverse, int threads) {
    ROPE_BODY(float, F32_SAME, F32_SAME)
}
