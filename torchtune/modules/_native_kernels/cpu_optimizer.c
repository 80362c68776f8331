/* The CPU optimizer step of torchtune/training/_cpu_optim.py (CPUAdamW, CPUSGD): one pass over the weight, the
 * gradient and the state of a parameter, the update in fp32 registers, written back in each tensor's own format.
 * torchtune/modules/_native_kernels/__init__.py builds this file with the other C kernels and calls it with ctypes; the
 * Python file holds the definition and the same arithmetic in PyTorch (the fallback, and what tests pin this to).
 *
 * Formats: the weight and the gradient fp32 or bf16; the state (Adam's moments, SGD's momentum) fp32, bf16, or
 * 8 bits with one fp32 scale per block of 256 elements of a row ("q8", below). The maths is fp32 with every
 * product and sum rounded (the build keeps IEEE semantics: no FMA contraction), so a PyTorch reference of the
 * same operations gives the same bits.
 *
 * Rounding: every value written in fewer bits than fp32 is rounded stochastically, from one 32-bit hash per
 * element (hash-prospector's low-bias [16 21f0aaad 15 735a2d97 15] of (index + base) xor salt, where (base,
 * salt) is the step's key and index the element's position in the tensor): the bf16 weight takes its top 16
 * bits (exactly the noise of stochastic_rounding.c), the first state tensor bits 8-15, the second bits 0-7.
 * Adding noise below the kept bits and truncating rounds away from zero with odds (dropped bits) / 2^k: for a
 * bf16 state the 8 bits are placed at the top of the 16 dropped ones with a half in the bit below (odds exact
 * to 1/512 of a step), for q8 at the top of the 20 dropped ones likewise.
 *
 * q8 (8-bit blockwise dynamic quantisation): a block is up to 256 consecutive elements of one row (rows are the
 * tensor's leading dimensions, so a row-sharded tensor keeps its blocks); its scale is the largest magnitude in
 * the block after the update (0 for an all-zero block). An element is stored as its magnitude over the scale,
 * x in [0, 1], in a small float: signed state (Adam's exp_avg, SGD's momentum) one sign bit and 4 exponent + 3
 * mantissa bits (x = 2^(e-15) (1 + m/8), e = 0 subnormal: m 2^-17), Adam's exp_avg_sq 5 exponent + 3 mantissa
 * bits (x = 2^(e-31) (1 + m/8), down to 2^-33), i.e. fp32's bits 20-27 of x scaled by 2^-112 (2^-96): a code map
 * of 256 values spaced evenly in log scale, with a relative step of 1/8 over 2^17 (2^33) of range. Decoded
 * value: float(code << 20) * 2^112 (2^96), times the scale. Encoded: x = (|v| * (1 / scale)) * 2^-112 (2^-96),
 * its fp32 bits plus the noise, shifted right by 20, at most 1.0's code. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TUNE_BLOCK 256
enum { F32 = 0, BF16 = 1, Q8 = 2 };

static inline float as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t as_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline uint32_t hash32(uint32_t index, uint32_t base, uint32_t salt) {
    uint32_t x = (index + base) ^ salt;
    x ^= x >> 16;
    x *= 0x21F0AAADu;
    x ^= x >> 15;
    x *= 0x735A2D97u;
    x ^= x >> 15;
    return x;
}

static inline float load(const void *p, int64_t i, const int fmt) {
    if (fmt == F32)
        return ((const float *)p)[i];
    return as_float((uint32_t)((const uint16_t *)p)[i] << 16);
}

/* fp32 or bf16 (rounded with 16 bits of noise); bf16 returns the old and new values for the change count */
static inline void store_weight(void *p, int64_t i, float x, uint32_t noise16, const int fmt) {
    if (fmt == F32)
        ((float *)p)[i] = x;
    else
        ((uint16_t *)p)[i] = (uint16_t)((as_bits(x) + noise16) >> 16);
}

static inline float q8_signed(uint8_t c, float scale) {
    float x = as_float((uint32_t)(c & 0x7F) << 20) * 0x1p112f * scale;
    return as_float(as_bits(x) | ((uint32_t)(c & 0x80) << 24));
}

static inline float q8_unsigned(uint8_t c, float scale) { return as_float((uint32_t)c << 20) * 0x1p96f * scale; }

static inline uint8_t q8_signed_code(float x, float inv, uint32_t noise8) {
    uint32_t q = (as_bits(fabsf(x) * inv * 0x1p-112f) + (noise8 << 12 | 0x800u)) >> 20;
    return (uint8_t)((q < 0x78u ? q : 0x78u) | ((as_bits(x) >> 24) & 0x80u));
}

static inline uint8_t q8_unsigned_code(float x, float inv, uint32_t noise8) {
    uint32_t q = (as_bits(x * inv * 0x1p-96f) + (noise8 << 12 | 0x800u)) >> 20;
    return (uint8_t)(q < 0xF8u ? q : 0xF8u);
}

static inline float load_state(const void *p, int64_t i, float scale, int is_signed, const int fmt) {
    if (fmt == Q8)
        return is_signed ? q8_signed(((const uint8_t *)p)[i], scale) : q8_unsigned(((const uint8_t *)p)[i], scale);
    return load(p, i, fmt);
}

/* fp32, or bf16 rounded with 8 bits of noise (q8 is written per block, below) */
static inline void store_state(void *p, int64_t i, float x, uint32_t noise8, const int fmt) {
    if (fmt == F32)
        ((float *)p)[i] = x;
    else if (fmt == BF16)
        ((uint16_t *)p)[i] = (uint16_t)((as_bits(x) + (noise8 << 8 | 0x80u)) >> 16);
}

static inline float inverse(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
/* The same operations on 16 lanes at a time (GCC's own vectorisation of the loops below runs about a fifth
 * slower: it widens the element index to 64 bits and keeps few vectors in flight). Every lane computes what
 * the scalar loop computes, to the bit; the scalar loop takes the tail. */
#include <immintrin.h>
#define TUNE_AVX512 1

static inline __attribute__((always_inline)) __m512 v_load(const void *p, int64_t i, const int fmt) {
    if (fmt == F32)
        return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) __m512i v_hash(__m512i index, __m512i base, __m512i salt) {
    __m512i x = _mm512_xor_si512(_mm512_add_epi32(index, base), salt);
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x21F0AAAD));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x735A2D97));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
}

/* (bits + noise) >> 16, stored as 16 bf16 values */
static inline __attribute__((always_inline)) void v_store_bf16(void *p, int64_t i, __m512 x, __m512i noise) {
    __m512i u = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(x), noise), 16);
    _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), _mm512_cvtepi32_epi16(u));
}

static inline __attribute__((always_inline)) void v_store(void *p, int64_t i, __m512 x, __m512i noise,
                                                          const int fmt) {
    if (fmt == F32)
        _mm512_storeu_ps((float *)p + i, x);
    else
        v_store_bf16(p, i, x, noise);
}

static inline __attribute__((always_inline)) __m512 v_q8_signed(const void *p, int64_t i, __m512 scale) {
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((const uint8_t *)p + i)));
    __m512i mag = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x7F)), 20);
    __m512 x = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(0x1p112f)), scale);
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), sign));
}

static inline __attribute__((always_inline)) __m512 v_q8_unsigned(const void *p, int64_t i, __m512 scale) {
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((const uint8_t *)p + i)));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(c, 20)), _mm512_set1_ps(0x1p96f)),
                         scale);
}

static inline __attribute__((always_inline)) __m512 v_load_state(const void *p, int64_t i, __m512 scale,
                                                                 int is_signed, const int fmt) {
    if (fmt == Q8)
        return is_signed ? v_q8_signed(p, i, scale) : v_q8_unsigned(p, i, scale);
    return v_load(p, i, fmt);
}

/* hash bits [from, from + 8) moved to bits [to, to + 8), with a half (bit to - 1) below: one shift and one
 * three-input logic op (x & mask | half) */
static inline __attribute__((always_inline)) __m512i v_noise(__m512i h, int from, int to) {
    const __m512i moved = to > from ? _mm512_slli_epi32(h, to - from) : _mm512_srli_epi32(h, from - to);
    return _mm512_ternarylogic_epi32(moved, _mm512_set1_epi32((int)(0xFFu << to)), _mm512_set1_epi32(1 << (to - 1)),
                                     0xEA);
}

/* noise: the 8 bits placed at bits 12-19 with a half below (v_noise(h, 8 or 0, 12)) */
static inline __attribute__((always_inline)) __m128i v_q8_signed_code(__m512 x, __m512 inv, __m512i noise) {
    __m512i bits = _mm512_castps_si512(x);
    __m512 q = _mm512_mul_ps(_mm512_mul_ps(_mm512_abs_ps(x), inv), _mm512_set1_ps(0x1p-112f));
    __m512i c = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(q), noise), 20);
    c = _mm512_min_epu32(c, _mm512_set1_epi32(0x78));
    c = _mm512_or_si512(c, _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80)));
    return _mm512_cvtepi32_epi8(c);
}

static inline __attribute__((always_inline)) __m128i v_q8_unsigned_code(__m512 x, __m512 inv, __m512i noise) {
    __m512 q = _mm512_mul_ps(_mm512_mul_ps(x, inv), _mm512_set1_ps(0x1p-96f));
    __m512i c = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(q), noise), 20);
    return _mm512_cvtepi32_epi8(_mm512_min_epu32(c, _mm512_set1_epi32(0xF8)));
}
#endif

#ifdef TUNE_AVX512
/* the update of one vector (adam_block's constants in scope): W, M, V updated in place from G */
#define ADAM_MATH(W, G, M, V)                                                                                  \
    do {                                                                                                       \
        W = _mm512_mul_ps(W, vdecay);                                                                          \
        G = _mm512_add_ps(G, _mm512_mul_ps(vwd, W));                                                           \
        M = _mm512_add_ps(_mm512_mul_ps(vb1, M), _mm512_mul_ps(vc1, G));                                       \
        V = _mm512_add_ps(_mm512_mul_ps(vb2, V), _mm512_mul_ps(vc2, _mm512_mul_ps(G, G)));                     \
        const __m512 denom_ = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(V), vbc2), veps);                     \
        W = _mm512_add_ps(W, _mm512_mul_ps(_mm512_div_ps(M, denom_), vstep));                                  \
    } while (0)

/* (bits + noise) >> 16 of two vectors, packed back into the order _mm512_unpack{lo,hi}_epi16 took them in */
static inline __attribute__((always_inline)) void v_store_bf16_pair(void *p, int64_t i, __m512 lo, __m512 hi,
                                                                    __m512i noise_lo, __m512i noise_hi) {
    __m512i a = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(lo), noise_lo), 16);
    __m512i b = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(hi), noise_hi), 16);
    _mm512_storeu_si512((void *)((uint16_t *)p + i), _mm512_packus_epi32(a, b));
}

/* 32 bf16 values as two fp32 vectors: values 0-3 of each 128-bit quarter in the first, 4-7 in the second */
#define LOAD_BF16_PAIR(P, I, LO, HI)                                                                           \
    do {                                                                                                       \
        const __m512i raw_ = _mm512_loadu_si512((const void *)((const uint16_t *)(P) + (I)));                  \
        LO = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), raw_));                         \
        HI = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), raw_));                         \
    } while (0)

/* one vector of adam_block's loop (its locals), lanes j0 .. j0 + 15 */
#define ADAM_VEC16 \
                const int64_t i = off + j0; \
                const __m512 w0 = v_load(w, i, WF); \
                __m512 w32 = w0, g32 = _mm512_mul_ps(v_load(g, i, GF), vsign); \
                __m512 m32 = v_load_state(m, i, vms, 1, SF), v32 = v_load_state(v, i, vvs, 0, SF); \
                ADAM_MATH(w32, g32, m32, v32); \
                const __m512i h = v_hash(index, vbase, vsalt); \
                index = _mm512_add_epi32(index, _mm512_set1_epi32(16)); \
                v_store(w, i, w32, _mm512_srli_epi32(h, 16), WF); \
                if (WF == BF16 && count) \
                    changed += __builtin_popcount(_mm512_cmp_ps_mask(w0, v_load(w, i, WF), _CMP_NEQ_UQ)); \
                if (SF == Q8) { \
                    _mm512_storeu_ps(mb + j0, m32); \
                    _mm512_storeu_ps(vb + j0, v32); \
                    _mm512_storeu_si512((void *)(hb + j0), h); \
                    vm_max = _mm512_max_ps(_mm512_abs_ps(m32), vm_max); \
                    vv_max = _mm512_max_ps(v32, vv_max); \
                } else if (SF == BF16) { \
                    v_store_bf16(m, i, m32, v_noise(h, 8, 8)); \
                    v_store_bf16(v, i, v32, v_noise(h, 0, 8)); \
                } else { \
                    _mm512_storeu_ps((float *)m + i, m32); \
                    _mm512_storeu_ps((float *)v + i, v32); \
                } \

#endif

/* One block of AdamW/Adam: w, g at element offset off (len elements), m and v likewise, their q8 scales at
 * *ms, *vs. s: decay (1 - lr wd, decoupled; else 1), wd (coupled, Adam's L2; else 0), beta1, 1 - beta1, beta2,
 * 1 - beta2, -lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t), eps. */
static inline __attribute__((always_inline)) int64_t adam_block(void *restrict w, const void *restrict g,
                                                               void *restrict m, void *restrict v,
                                                               float *restrict ms, float *restrict vs, int64_t off,
                                                               int64_t len, const float *s, uint32_t base,
                                                               uint32_t salt, int maximize, int count, const int WF,
                                                               const int GF, const int SF) {
    const float decay = s[0], wd = s[1], b1 = s[2], c1 = s[3], b2 = s[4], c2 = s[5], step = s[6], bc2 = s[7];
    const float eps = s[8], sign = maximize ? -1.0f : 1.0f;
    const float m_scale = SF == Q8 ? *ms : 0.0f, v_scale = SF == Q8 ? *vs : 0.0f;
    float mb[TUNE_BLOCK], vb[TUNE_BLOCK];
    uint32_t hb[TUNE_BLOCK];
    float m_max = 0.0f, v_max = 0.0f;
    int64_t changed = 0, j0 = 0;
#ifdef TUNE_AVX512
    {
        const __m512 vdecay = _mm512_set1_ps(decay), vwd = _mm512_set1_ps(wd), vb1 = _mm512_set1_ps(b1);
        const __m512 vc1 = _mm512_set1_ps(c1), vb2 = _mm512_set1_ps(b2), vc2 = _mm512_set1_ps(c2);
        const __m512 vstep = _mm512_set1_ps(step), vbc2 = _mm512_set1_ps(bc2), veps = _mm512_set1_ps(eps);
        const __m512 vsign = _mm512_set1_ps(sign), vms = _mm512_set1_ps(m_scale), vvs = _mm512_set1_ps(v_scale);
        const __m512i vbase = _mm512_set1_epi32((int)base), vsalt = _mm512_set1_epi32((int)salt);
        __m512i index = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)off),
                                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
        __m512 vm_max = _mm512_setzero_ps(), vv_max = _mm512_setzero_ps();
        /* all bf16: 32 values an iteration, unpacked and packed back in 128-bit quarters (no widening moves) */
        if (WF == BF16 && GF == BF16 && SF == BF16) {
            const __m512i quarter = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
            __m512i index_lo = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)off), quarter);
            for (; j0 + 32 <= len; j0 += 32) {
                const int64_t i = off + j0;
                __m512 wl, wh, gl, gh, ml, mh, vl, vh;
                LOAD_BF16_PAIR(w, i, wl, wh);
                LOAD_BF16_PAIR(g, i, gl, gh);
                LOAD_BF16_PAIR(m, i, ml, mh);
                LOAD_BF16_PAIR(v, i, vl, vh);
                const __m512 wl0 = wl, wh0 = wh;
                gl = _mm512_mul_ps(gl, vsign);
                gh = _mm512_mul_ps(gh, vsign);
                ADAM_MATH(wl, gl, ml, vl);
                ADAM_MATH(wh, gh, mh, vh);
                const __m512i hl = v_hash(index_lo, vbase, vsalt);
                const __m512i hh = v_hash(_mm512_add_epi32(index_lo, _mm512_set1_epi32(4)), vbase, vsalt);
                index_lo = _mm512_add_epi32(index_lo, _mm512_set1_epi32(32));
                v_store_bf16_pair(w, i, wl, wh, _mm512_srli_epi32(hl, 16), _mm512_srli_epi32(hh, 16));
                if (count) {
                    __m512 nl, nh;
                    LOAD_BF16_PAIR(w, i, nl, nh);
                    changed += __builtin_popcount(_mm512_cmp_ps_mask(wl0, nl, _CMP_NEQ_UQ));
                    changed += __builtin_popcount(_mm512_cmp_ps_mask(wh0, nh, _CMP_NEQ_UQ));
                }
                v_store_bf16_pair(m, i, ml, mh, v_noise(hl, 8, 8), v_noise(hh, 8, 8));
                v_store_bf16_pair(v, i, vl, vh, v_noise(hl, 0, 8), v_noise(hh, 0, 8));
            }
            index = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)(off + j0)),
                                     _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
        }
        /* two vectors an iteration for q8 (more loads in flight), one otherwise (measured) */
        if (SF == Q8) {
#pragma GCC unroll 2
            for (; j0 + 16 <= len; j0 += 16) {
                ADAM_VEC16
            }
        } else {
            for (; j0 + 16 <= len; j0 += 16) {
                ADAM_VEC16
            }
        }
        if (SF == Q8) {
            m_max = _mm512_reduce_max_ps(vm_max);
            v_max = _mm512_reduce_max_ps(vv_max);
        }
    }
#endif
#pragma omp simd reduction(+ : changed) reduction(max : m_max, v_max)
    for (int64_t j = j0; j < len; j++) {
        const int64_t i = off + j;
        float w32 = load(w, i, WF), g32 = load(g, i, GF) * sign;
        float m32 = load_state(m, i, m_scale, 1, SF), v32 = load_state(v, i, v_scale, 0, SF);
        w32 = w32 * decay;
        g32 = g32 + wd * w32;
        m32 = b1 * m32 + c1 * g32;
        v32 = b2 * v32 + c2 * (g32 * g32);
        const float denom = sqrtf(v32) * bc2 + eps;
        w32 = w32 + (m32 / denom) * step;
        const uint32_t h = WF == BF16 || SF != F32 ? hash32((uint32_t)i, base, salt) : 0u;
        if (WF == BF16 && count) {
            const float old = load(w, i, WF);
            store_weight(w, i, w32, h >> 16, WF);
            changed += load(w, i, WF) != old;
        } else {
            store_weight(w, i, w32, h >> 16, WF);
        }
        if (SF == Q8) {
            mb[j] = m32;
            vb[j] = v32;
            hb[j] = h;
            m_max = fabsf(m32) > m_max ? fabsf(m32) : m_max;
            v_max = v32 > v_max ? v32 : v_max;
        } else {
            store_state(m, i, m32, (h >> 8) & 0xFFu, SF);
            store_state(v, i, v32, h & 0xFFu, SF);
        }
    }
    if (SF == Q8) {
        const float m_inv = inverse(m_max), v_inv = inverse(v_max);
        uint8_t *mq = (uint8_t *)m + off, *vq = (uint8_t *)v + off;
        int64_t j = 0;
#ifdef TUNE_AVX512
        const __m512 vm_inv = _mm512_set1_ps(m_inv), vv_inv = _mm512_set1_ps(v_inv);
        for (; j + 16 <= len; j += 16) {
            const __m512i h = _mm512_loadu_si512((const void *)(hb + j));
            _mm_storeu_si128((__m128i *)(mq + j), v_q8_signed_code(_mm512_loadu_ps(mb + j), vm_inv, v_noise(h, 8, 12)));
            _mm_storeu_si128((__m128i *)(vq + j), v_q8_unsigned_code(_mm512_loadu_ps(vb + j), vv_inv, v_noise(h, 0, 12)));
        }
#endif
#pragma omp simd
        for (int64_t t = j; t < len; t++) {
            mq[t] = q8_signed_code(mb[t], m_inv, (hb[t] >> 8) & 0xFFu);
            vq[t] = q8_unsigned_code(vb[t], v_inv, hb[t] & 0xFFu);
        }
        *ms = m_max;
        *vs = v_max;
    }
    return changed;
}

/* One block of SGD: s: wd (coupled), momentum, 1 - dampening, -lr. first: the momentum buffer starts as the
 * gradient (torch's SGD); without momentum (s[1] == 0 and no buffer) the update is the gradient. */
static inline __attribute__((always_inline)) int64_t sgd_block(void *restrict w, const void *restrict g,
                                                              void *restrict b, float *restrict bs, int64_t off,
                                                              int64_t len, const float *s, uint32_t base,
                                                              uint32_t salt, int maximize, int nesterov, int first,
                                                              int count, const int WF, const int GF, const int SF,
                                                              const int momentum) {
    const float wd = s[0], mu = s[1], damp = s[2], neg_lr = s[3], sign = maximize ? -1.0f : 1.0f;
    const float b_scale = momentum && SF == Q8 ? *bs : 0.0f;
    float bb[TUNE_BLOCK];
    uint32_t hb[TUNE_BLOCK];
    float b_max = 0.0f;
    int64_t changed = 0;
#pragma omp simd reduction(+ : changed) reduction(max : b_max)
    for (int64_t j = 0; j < len; j++) {
        const int64_t i = off + j;
        float w32 = load(w, i, WF), g32 = load(g, i, GF) * sign;
        g32 = g32 + wd * w32;
        float d = g32;
        uint32_t h = WF == BF16 || (momentum && SF != F32) ? hash32((uint32_t)i, base, salt) : 0u;
        if (momentum) {
            float buf = first ? g32 : mu * load_state(b, i, b_scale, 1, SF) + damp * g32;
            d = nesterov ? g32 + mu * buf : buf;
            if (SF == Q8) {
                bb[j] = buf;
                hb[j] = h;
                b_max = fabsf(buf) > b_max ? fabsf(buf) : b_max;
            } else {
                store_state(b, i, buf, (h >> 8) & 0xFFu, SF);
            }
        }
        w32 = w32 + neg_lr * d;
        if (WF == BF16 && count) {
            const float old = load(w, i, WF);
            store_weight(w, i, w32, h >> 16, WF);
            changed += load(w, i, WF) != old;
        } else {
            store_weight(w, i, w32, h >> 16, WF);
        }
    }
    if (momentum && SF == Q8) {
        const float inv = inverse(b_max);
        uint8_t *bq = (uint8_t *)b + off;
#pragma omp simd
        for (int64_t j = 0; j < len; j++)
            bq[j] = q8_signed_code(bb[j], inv, (hb[j] >> 8) & 0xFFu);
        *bs = b_max;
    }
    return changed;
}

/* Blocks [k0, k1) of a tensor of rows x cols: block k is row k / nb, columns (k % nb) * 256 on (nb blocks a row). */
#define FOR_BLOCKS(CALL)                                                                                       \
    const int64_t nb = (cols + TUNE_BLOCK - 1) / TUNE_BLOCK;                                                   \
    int64_t changed = 0;                                                                                       \
    for (int64_t k = k0; k < k1; k++) {                                                                        \
        const int64_t row = k / nb, c0 = (k - row * nb) * TUNE_BLOCK;                                          \
        const int64_t off = row * cols + c0, len = cols - c0 < TUNE_BLOCK ? cols - c0 : TUNE_BLOCK;            \
        changed += CALL;                                                                                       \
    }                                                                                                          \
    return changed;

#define ADAM_ARGS                                                                                              \
    void *restrict w, const void *restrict g, void *restrict m, void *restrict v, float *restrict ms,          \
        float *restrict vs, int64_t cols, int64_t k0, int64_t k1, const float *s, uint32_t base, uint32_t salt, \
        int maximize, int count

static inline __attribute__((always_inline)) int64_t adam_blocks(ADAM_ARGS, const int WF, const int GF,
                                                                const int SF) {
    if (SF != Q8) { /* no per-block scale: the blocks' elements are one contiguous range */
        const int64_t nb = (cols + TUNE_BLOCK - 1) / TUNE_BLOCK, last = k1 - 1, row = last / nb;
        const int64_t start = k0 / nb * cols + (k0 % nb) * TUNE_BLOCK;
        const int64_t c_last = (last - row * nb) * TUNE_BLOCK;
        const int64_t end = row * cols + (cols - c_last < TUNE_BLOCK ? cols : c_last + TUNE_BLOCK);
        if (k1 <= k0)
            return 0;
        return adam_block(w, g, m, v, ms, vs, start, end - start, s, base, salt, maximize, count, WF, GF, SF);
    }
    FOR_BLOCKS(adam_block(w, g, m, v, ms + k, vs + k, off, len, s, base, salt, maximize, count, WF, GF, SF))
}

/* one function per format, each with the change count compiled in and out */
#define ADAM_VARIANT(WF, GF, SF)                                                                               \
    static int64_t adam_##WF##_##GF##_##SF(ADAM_ARGS) {                                                        \
        if (count)                                                                                             \
            return adam_blocks(w, g, m, v, ms, vs, cols, k0, k1, s, base, salt, maximize, 1, WF, GF, SF);      \
        return adam_blocks(w, g, m, v, ms, vs, cols, k0, k1, s, base, salt, maximize, 0, WF, GF, SF);          \
    }
#define ADAM_STATES(WF, GF) ADAM_VARIANT(WF, GF, F32) ADAM_VARIANT(WF, GF, BF16) ADAM_VARIANT(WF, GF, Q8)
ADAM_STATES(F32, F32)
ADAM_STATES(F32, BF16)
ADAM_STATES(BF16, F32)
ADAM_STATES(BF16, BF16)

typedef int64_t (*adam_fn)(ADAM_ARGS);
static const adam_fn ADAM[2][2][3] = {
    {{adam_F32_F32_F32, adam_F32_F32_BF16, adam_F32_F32_Q8}, {adam_F32_BF16_F32, adam_F32_BF16_BF16, adam_F32_BF16_Q8}},
    {{adam_BF16_F32_F32, adam_BF16_F32_BF16, adam_BF16_F32_Q8},
     {adam_BF16_BF16_F32, adam_BF16_BF16_BF16, adam_BF16_BF16_Q8}},
};

#define SGD_ARGS                                                                                               \
    void *restrict w, const void *restrict g, void *restrict b, float *restrict bs, int64_t cols, int64_t k0,  \
        int64_t k1, const float *s, uint32_t base, uint32_t salt, int maximize, int nesterov, int first, int count

static inline __attribute__((always_inline)) int64_t sgd_blocks(SGD_ARGS, const int WF, const int GF, const int SF,
                                                               const int MOM) {
    FOR_BLOCKS(sgd_block(w, g, b, bs + k, off, len, s, base, salt, maximize, nesterov, first, count, WF, GF, SF, MOM))
}

#define SGD_VARIANT(WF, GF, SF, MOM, NAME)                                                                     \
    static int64_t sgd_##NAME(SGD_ARGS) {                                                                      \
        if (count)                                                                                             \
            return sgd_blocks(w, g, b, bs, cols, k0, k1, s, base, salt, maximize, nesterov, first, 1, WF, GF, SF, \
                              MOM);                                                                            \
        return sgd_blocks(w, g, b, bs, cols, k0, k1, s, base, salt, maximize, nesterov, first, 0, WF, GF, SF, MOM); \
    }
#define SGD_STATES(WF, GF)                                                                                     \
    SGD_VARIANT(WF, GF, F32, 0, WF##_##GF##_none)                                                              \
    SGD_VARIANT(WF, GF, F32, 1, WF##_##GF##_F32)                                                               \
    SGD_VARIANT(WF, GF, BF16, 1, WF##_##GF##_BF16) SGD_VARIANT(WF, GF, Q8, 1, WF##_##GF##_Q8)
SGD_STATES(F32, F32)
SGD_STATES(F32, BF16)
SGD_STATES(BF16, F32)
SGD_STATES(BF16, BF16)

typedef int64_t (*sgd_fn)(SGD_ARGS);
static const sgd_fn SGD[2][2][4] = {
    {{sgd_F32_F32_none, sgd_F32_F32_F32, sgd_F32_F32_BF16, sgd_F32_F32_Q8},
     {sgd_F32_BF16_none, sgd_F32_BF16_F32, sgd_F32_BF16_BF16, sgd_F32_BF16_Q8}},
    {{sgd_BF16_F32_none, sgd_BF16_F32_F32, sgd_BF16_F32_BF16, sgd_BF16_F32_Q8},
     {sgd_BF16_BF16_none, sgd_BF16_BF16_F32, sgd_BF16_BF16_BF16, sgd_BF16_BF16_Q8}},
};

/* fmt: weight and gradient 0 fp32 / 1 bf16; state 0 fp32 / 1 bf16 / 2 q8 (SGD: -1, no momentum buffer).
 * Blocks [k0, k1) of a rows x cols tensor; key: (base, salt). Returns how many bf16 weights changed value
 * (when count). */
int64_t tune_cpu_adam(void *w, const void *g, void *m, void *v, float *ms, float *vs, int64_t cols, int64_t k0,
                      int64_t k1, const float *s, const uint32_t *key, int wf, int gf, int sf, int maximize,
                      int count) {
    return ADAM[wf][gf][sf](w, g, m, v, ms, vs, cols, k0, k1, s, key[0], key[1], maximize, count);
}

int64_t tune_cpu_sgd(void *w, const void *g, void *b, float *bs, int64_t cols, int64_t k0, int64_t k1,
                     const float *s, const uint32_t *key, int wf, int gf, int sf, int maximize, int nesterov,
                     int first, int count) {
    return SGD[wf][gf][sf + 1](w, g, b, bs, cols, k0, k1, s, key[0], key[1], maximize, nesterov, first, count);
}

#ifdef _OPENMP
#include <omp.h>

/* Block range t of T over nk blocks, split evenly. */
static inline int64_t block_start(int64_t nk, int64_t t, int64_t T) { return t == T ? nk : nk * t / T; }

int64_t tune_cpu_adam_threads(void *w, const void *g, void *m, void *v, float *ms, float *vs, int64_t cols,
                              int64_t nk, const float *s, const uint32_t *key, int wf, int gf, int sf, int maximize,
                              int count, int threads) {
    int64_t changed = 0;
#pragma omp parallel num_threads(threads) reduction(+ : changed)
    {
        int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
        changed += tune_cpu_adam(w, g, m, v, ms, vs, cols, block_start(nk, t, T), block_start(nk, t + 1, T), s, key,
                                 wf, gf, sf, maximize, count);
    }
    return changed;
}

int64_t tune_cpu_sgd_threads(void *w, const void *g, void *b, float *bs, int64_t cols, int64_t nk, const float *s,
                             const uint32_t *key, int wf, int gf, int sf, int maximize, int nesterov, int first,
                             int count, int threads) {
    int64_t changed = 0;
#pragma omp parallel num_threads(threads) reduction(+ : changed)
    {
        int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
        changed += tune_cpu_sgd(w, g, b, bs, cols, block_start(nk, t, T), block_start(nk, t + 1, T), s, key, wf, gf,
                                sf, maximize, nesterov, first, count);
    }
    return changed;
}
#endif
