/* The CPU kernels of bf16 stochastic rounding (torchtune/training/optim/_stochastic_rounding.py defines them;
 * torchtune/modules/_native_kernels/__init__.py compiles this file once per machine and calls it with ctypes).
 *
 * Each element i of a call gets 16 random bits: a 32-bit avalanche hash (hash-prospector's low-bias
 * [16 21f0aaad 15 735a2d97 15]) of (i + base) xor salt, top 16 bits; the fp32 value is rounded to bf16 by
 * adding them to its bit pattern and keeping the top 16 bits. The Python side holds the definition and the
 * same arithmetic in PyTorch (compiled by Inductor on a GPU, plain on chunks elsewhere); these loops give
 * the same bits on a CPU without a per-process compile, and vectorise where Inductor's CPU code
 * reinterprets float bits one element at a time. Build flags keep IEEE semantics (no FMA contraction).
 * A large tensor is split into ranges (``start``: the first element's index in the whole tensor), one per
 * thread. Built with -fopenmp only where torch's own GNU OpenMP runtime is loaded (the same libgomp.so.1, so
 * the *_threads functions run on torch's thread pool, whose workers spin for work right after each torch op);
 * otherwise the caller runs the ranges on threads of its own. Never a second OpenMP runtime: it would fight
 * torch's threads for the cores. */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t hash16(uint32_t index, uint32_t base, uint32_t salt) {
    uint32_t x = (index + base) ^ salt;
    x ^= x >> 16;
    x *= 0x21F0AAADu;
    x ^= x >> 15;
    x *= 0x735A2D97u;
    x ^= x >> 15;
    return x >> 16;
}

static inline uint16_t rounded(float x, uint32_t noise) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)((u + noise) >> 16);
}

/* dst[i] = src[i] rounded; returns how many elements changed value (when count). */
int64_t tune_round(const float *src, uint16_t *dst, int64_t start, int64_t n, const uint32_t *key, int count) {
    int64_t changed = 0;
    const uint32_t base = key[0], salt = key[1];
#pragma omp simd reduction(+ : changed)
    for (int64_t i = 0; i < n; i++) {
        uint16_t out = rounded(src[i], hash16((uint32_t)(start + i), base, salt));
        if (count)
            changed += bf16_to_float(out) != bf16_to_float(dst[i]);
        dst[i] = out;
    }
    return changed;
}

/* torch's single-tensor Adam/AdamW update of bf16 w, m (exp_avg), v (exp_avg_sq) in fp32, each written back
 * rounded with its own key pair (key[0..1] w, key[2..3] m, key[4..5] v). s: the fp32 scalars of
 * _adam_scalars: 1 - lr*wd, wd, 1 - beta1, beta2, 1 - beta2, -lr/bias1, sqrt(bias2), eps. torch.lerp as
 * torch's CPU kernel computes it (one fused multiply-add of its two formulas); returns how many weights
 * changed value (when count). */
int64_t tune_adam(uint16_t *w, const uint16_t *g, uint16_t *m, uint16_t *v, int64_t start, int64_t n, const float *s,
                  const uint32_t *key, int decoupled, int maximize, int count) {
    int64_t changed = 0;
    /* scalars and keys in locals: the loop's stores (uint16_t) could otherwise alias them for the compiler */
    const float decay = s[0], wd = s[1], beta2 = s[3], one_minus_beta2 = s[4], step = s[5], bias2 = s[6];
    const float eps = s[7];
    const uint32_t wb = key[0], ws = key[1], mb = key[2], ms = key[3], vb = key[4], vs = key[5];
    const int small = fabsf(s[2]) < 0.5f;
    const float coeff = small ? s[2] : -(1.0f - s[2]);
#pragma omp simd reduction(+ : changed)
    for (int64_t i = 0; i < n; i++) {
        float w32 = bf16_to_float(w[i]), g32 = bf16_to_float(g[i]);
        float m0 = bf16_to_float(m[i]), v0 = bf16_to_float(v[i]);
        if (maximize)
            g32 = -g32;
        if (decoupled)
            w32 = w32 * decay;
        else
            g32 = g32 + w32 * wd;
        float m32 = fmaf(coeff, g32 - m0, small ? m0 : g32);
        float v32 = v0 * beta2 + (one_minus_beta2 * g32) * g32;
        float denom = sqrtf(v32) / bias2 + eps;
        w32 = w32 + step * (m32 / denom);
        uint32_t index = (uint32_t)(start + i);
        uint16_t out = rounded(w32, hash16(index, wb, ws));
        if (count)
            changed += bf16_to_float(out) != bf16_to_float(w[i]);
        w[i] = out;
        m[i] = rounded(m32, hash16(index, mb, ms));
        v[i] = rounded(v32, hash16(index, vb, vs));
    }
    return changed;
}

#ifdef _OPENMP
#include <omp.h>

/* Range t of T over n elements: split evenly, every range but the last starting on a multiple of 64. */
static inline int64_t range_start(int64_t n, int64_t t, int64_t T) { return t == T ? n : n * t / T / 64 * 64; }

int64_t tune_round_threads(const float *src, uint16_t *dst, int64_t n, const uint32_t *key, int count, int threads) {
    int64_t changed = 0;
#pragma omp parallel num_threads(threads) reduction(+ : changed)
    {
        int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t a = range_start(n, t, T), b = range_start(n, t + 1, T);
        changed += tune_round(src + a, dst + a, a, b - a, key, count);
    }
    return changed;
}

int64_t tune_adam_threads(uint16_t *w, const uint16_t *g, uint16_t *m, uint16_t *v, int64_t n, const float *s,
                          const uint32_t *key, int decoupled, int maximize, int count, int threads) {
    int64_t changed = 0;
#pragma omp parallel num_threads(threads) reduction(+ : changed)
    {
        int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t a = range_start(n, t, T), b = range_start(n, t + 1, T);
        changed += tune_adam(w + a, g + a, m + a, v + a, a, b - a, s, key, decoupled, maximize, count);
    }
    return changed;
}
#endif
