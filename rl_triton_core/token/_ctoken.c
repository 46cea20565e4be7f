/* The token-level estimators' CPU kernel in C: masked GAE, masked returns (REINFORCE++)
 * and the masked whitening, as rl_triton_core/token/_token_cpu.py computes them with
 * numba -- the same float64 operations in the same order (built with -ffp-contract=off:
 * no fused multiply-add), so the results are bit for bit the numba path's; except for
 * float32 data with contiguous tokens (padded layout) on AVX-512, which a loop of its own
 * computes in float32: one response at a time, 16 tokens a register, where the CPU has
 * VPOPCNTDQ (walk_f32), else 16 responses a register (vec_group16); each within float32
 * rounding of the others.
 *
 * Plain C99 against Python.h: arrays come through the buffer protocol (numpy views of
 * torch tensors, [R, P], any strides; bfloat16 as the int16 view of its bits). The GIL
 * is released for the computation; responses are split over threads (_cpool.h: torch's
 * OpenMP team where loaded, else POSIX threads).
 *
 * One call, run(), does what _token_cpu's scan + finish + whiten do in three numba calls:
 *   1. the scan of every response (last token first), writing the outputs and, where the
 *      whitening needs them, each response's (count, mean, M2) of the stored advantages
 *      (shifted sums: k = the response's first valid output in scan order);
 *      or, for masked_whiten, Welford's per-row statistics of the source (row_stats);
 *   2. the combination of those statistics in response order (finish), on one thread;
 *   3. the whitening pass over the stored advantages, each thread on its own responses
 *      (the ones it just wrote, most recent first: read back from its caches).
 *
 * Padded data (each row one response of P tokens) runs 8 responses at once in vector
 * lanes, the widest the CPU has (checked at run time). With AVX-512, 16 tokens of 8 rows
 * (a float32 row's 64-byte line) are loaded, transposed in registers and converted to
 * float64, the recurrence runs over the 16 tokens with one response per lane of one
 * register (masks in mask registers), and the outputs are transposed back and stored a
 * line per row. With AVX2 the same in blocks of 8 tokens, two 4-lane chains. Packed data
 * (cu_seqlens) and other machines run the scalar loop, one response at a time. All three
 * give the same bits (use_simd() lets the tests reach each; use_f32(False) keeps float32
 * data on them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef _WIN32
#include <pthread.h>
#include <sys/mman.h>
#endif
#include "_cblocks.h"
#include "_cpool.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(_M_X64)) && !defined(_WIN32)
#define CT_AVX2 1
#include <immintrin.h>
#define CT_AVX2_FN __attribute__((target("avx2")))
#else
#define CT_AVX2 0
#endif

#if defined(__GNUC__)
#define CT_INLINE static inline __attribute__((always_inline))
#else
#define CT_INLINE static inline
#endif

enum { GAE_SKIP = 0, GAE_MUL = 1, RET_SKIP = 2, RET_MUL = 3, STATS = 4 };
/* element kinds: data (float32, float64, bfloat16 bits); masks (integers by size, floats) */
enum { K_F4 = 1, K_F8, K_BF16, K_I1, K_I2, K_I4, K_I8 };
#ifndef NT_MIN_BYTES
/* both outputs' bytes from which stores stream: from 4 MiB, where [256, 4096] (8 MB of
 * outputs) measured 2.8-3.0x the floor streamed against 3.4-3.6x cached (2-core EPYC VM,
 * 32 MiB L3; docs/notes.md) */
#define NT_MIN_BYTES (4.0 * 1048576.0)
#endif
enum { W_NONE = 0, W_STATS = 1, W_FILL = 2 }; /* no whitening; whiten; fill only */
/* CASE(MODE, STATS_ON) (which ends in a break) for c's mode and whitening: each loop is
   compiled for every variant, the arm taken once a call */
#define MODE_SWITCH(CASE)                                                                \
    switch (c->mode * 2 + (c->want_stats != 0)) {                                        \
    case 0: CASE(GAE_SKIP, 0)                                                            \
    case 1: CASE(GAE_SKIP, 1)                                                            \
    case 2: CASE(GAE_MUL, 0)                                                             \
    case 3: CASE(GAE_MUL, 1)                                                             \
    case 4: CASE(RET_SKIP, 0)                                                            \
    case 5: CASE(RET_SKIP, 1)                                                            \
    case 6: CASE(RET_MUL, 0)                                                             \
    default: CASE(RET_MUL, 1)                                                            \
    }
static int use_f32_path = 1; /* float32 data may take the float32 loop (AVX-512) */
static int use_walk_path = 1; /* ... one response at a time (walk_f32), where it runs */

typedef struct {
    char *p;
    Py_ssize_t rs, ts; /* bytes between rows, between tokens */
    int kind;
} Arr;

typedef struct {
    int mode, want_stats, out_f32;
    Arr r, v, m, o0, o1, src;
    int has_v, has_o1;
    const int64_t *rows, *starts, *lens; /* NULL: padded, response i = row i, P tokens */
    Py_ssize_t n, P;
    double g, gl;
    double *stats; /* [n][3] */
    int wmode, unbiased, shift, has_fill;
    double count_eps, eps, fill, mu, rstd;
    int vec; /* the padded scan's vector path: 4 the float32 row walk, 3 float32 in 16 lanes
                (both AVX-512), 2 AVX-512, 1 AVX2, 0 none */
    int nt;  /* ... and streams its float32 outputs to memory (large data, aligned rows) */
} Ctx;

/* ------------------------------------------------------------------ elements */

CT_INLINE double bf16(uint16_t u) {
    uint32_t x = (uint32_t)u << 16;
    float f;
    memcpy(&f, &x, 4);
    return (double)f;
}

CT_INLINE double ld(int kind, const char *p) {
    switch (kind) {
    case K_F4: return (double)*(const float *)p;
    case K_F8: return *(const double *)p;
    default: return bf16(*(const uint16_t *)p);
    }
}

CT_INLINE int okm(int kind, const char *p) {
    switch (kind) {
    case K_I1: return *(const uint8_t *)p != 0;
    case K_I2: return *(const uint16_t *)p != 0;
    case K_I4: return *(const uint32_t *)p != 0;
    case K_I8: return *(const uint64_t *)p != 0;
    case K_F4: return *(const float *)p != 0.0f;
    default: return *(const double *)p != 0.0;
    }
}

CT_INLINE void st(int kind, char *p, double y) {
    if (kind == K_F4)
        *(float *)p = (float)y;
    else
        *(double *)p = y;
}

/* where response i lies: its row, first token and length */
CT_INLINE void where(const Ctx *c, Py_ssize_t i, Py_ssize_t *row, Py_ssize_t *s,
                     Py_ssize_t *n) {
    if (c->rows) {
        *row = (Py_ssize_t)c->rows[i];
        *s = (Py_ssize_t)c->starts[i];
        *n = (Py_ssize_t)c->lens[i];
    } else {
        *row = i;
        *s = 0;
        *n = c->P;
    }
}

CT_INLINE void put_stats(double *st3, double cnt, double kk, double s1, double s2) {
    double mean = cnt > 0 ? kk + s1 / cnt : 0.0;
    double m2 = 0.0;
    if (cnt > 0) {
        double a = s2 - s1 * s1 / cnt;
        m2 = (0.0 > a) ? 0.0 : a; /* numba's max(a, 0.0) */
    }
    st3[0] = cnt;
    st3[1] = mean;
    st3[2] = m2;
}

/* ------------------------------------------------------------------ scalar scan */

CT_INLINE void scan_one(const Ctx *c, Py_ssize_t i, const int MODE, const int STATS_ON) {
    Py_ssize_t row, s, n;
    where(c, i, &row, &s, &n);
    const Arr *R = &c->r, *V = &c->v, *M = &c->m, *O0 = &c->o0, *O1 = &c->o1;
    const char *pr = R->p + row * R->rs + s * R->ts;
    const char *pv = c->has_v ? V->p + row * V->rs + s * V->ts : NULL;
    const char *pm = M->p + row * M->rs + s * M->ts;
    char *p0 = O0->p + row * O0->rs + s * O0->ts;
    char *p1 = c->has_o1 ? O1->p + row * O1->rs + s * O1->ts : NULL;
    const int rk = R->kind, vk = V->kind, mk = M->kind, k0 = O0->kind, k1 = O1->kind;
    const double g = c->g, gl = c->gl;
    double carry = 0.0, nv = 0.0, cnt = 0.0, s1 = 0.0, s2 = 0.0, kk = 0.0;
    for (Py_ssize_t j = n - 1; j >= 0; j--) {
        int ok = okm(mk, pm + j * M->ts);
        double rt = ld(rk, pr + j * R->ts);
        double y;
        if (MODE == GAE_SKIP) {
            double vt = ld(vk, pv + j * V->ts);
            double nw = rt + g * nv - vt + gl * carry;
            carry = ok ? nw : carry;
            nv = ok ? vt : nv;
            y = carry;
            st(k1, p1 + j * O1->ts, carry + vt);
        } else if (MODE == GAE_MUL) {
            double vt = ok ? ld(vk, pv + j * V->ts) : 0.0;
            rt = ok ? rt : 0.0;
            carry = rt + g * nv - vt + gl * carry;
            nv = vt;
            y = carry;
            st(k1, p1 + j * O1->ts, carry + vt);
        } else if (MODE == RET_SKIP) {
            double nw = rt + g * carry;
            carry = ok ? nw : carry;
            y = ok ? carry : 0.0;
        } else {
            rt = ok ? rt : 0.0;
            carry = rt + g * carry;
            y = carry;
        }
        st(k0, p0 + j * O0->ts, y);
        if (STATS_ON) {
            double x = k0 == K_F4 ? (double)(float)y : y;
            kk = (ok && cnt == 0.0) ? x : kk;
            double d = ok ? x - kk : 0.0;
            cnt += ok ? 1.0 : 0.0;
            s1 += d;
            s2 += d * d;
        }
    }
    if (STATS_ON)
        put_stats(c->stats + 3 * i, cnt, kk, s1, s2);
}

#define SCALAR_CASE(MODE, ST)                                                            \
    scan_one(c, i, MODE, ST);                                                            \
    break;

static void scan_scalar(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    for (Py_ssize_t i = hi - 1; i >= lo; i--) {
        MODE_SWITCH(SCALAR_CASE)
    }
}
#undef SCALAR_CASE

/* Welford's (count, mean, M2) of the valid entries (_token_cpu.row_stats) */
static void row_stats(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    const Arr *X = &c->src, *M = &c->m;
    for (Py_ssize_t i = lo; i < hi; i++) {
        Py_ssize_t row, s, n;
        where(c, i, &row, &s, &n);
        const char *px = X->p + row * X->rs + s * X->ts;
        const char *pm = M->p + row * M->rs + s * M->ts;
        double cnt = 0.0, mean = 0.0, m2 = 0.0;
        for (Py_ssize_t k = 0; k < n; k++) {
            if (okm(M->kind, pm + k * M->ts)) {
                double xt = ld(X->kind, px + k * X->ts);
                cnt += 1.0;
                double d = xt - mean;
                mean += d / cnt;
                m2 += d * (xt - mean);
            }
        }
        c->stats[3 * i] = cnt;
        c->stats[3 * i + 1] = mean;
        c->stats[3 * i + 2] = m2;
    }
}

/* _token_cpu.finish: the rows' statistics combined in order -> (mean, 1 / std) */
static void finish(Ctx *c) {
    double cnt = 0.0, mean = 0.0, m2 = 0.0;
    for (Py_ssize_t i = 0; i < c->n; i++) {
        double nb = c->stats[3 * i];
        if (nb == 0.0)
            continue;
        double n = cnt + nb;
        double d = c->stats[3 * i + 1] - mean;
        mean += d * nb / n;
        m2 += c->stats[3 * i + 2] + d * d * cnt * nb / n;
        cnt = n;
    }
    double mu = mean * cnt / (cnt + c->count_eps);
    double d = mean - mu;
    double var = (m2 + cnt * d * d) / (cnt + c->count_eps);
    if (c->unbiased)
        var = cnt == 1.0 ? NAN : var * (cnt / (cnt - 1.0)); /* one valid token: NaN */
    c->mu = mu;
    c->rstd = 1.0 / sqrt(var + c->eps);
}

/* ------------------------------------------------------------------ whitening pass */

#define WHITEN_LOOP(LOAD, STORE)                                                         \
    for (Py_ssize_t k = 0; k < n; k++) {                                                 \
        double y = ((LOAD) - mu) * rstd;                                                 \
        if (!shift)                                                                      \
            y += mu;                                                                     \
        if (has_fill)                                                                    \
            y = okm(M->kind, pm + k * M->ts) ? y : fill;                                 \
        STORE;                                                                           \
    }

CT_INLINE void whiten_range(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    const Arr *X = &c->src, *M = &c->m, *O = &c->o0;
    const double mu = c->mu, rstd = c->rstd, fill = c->fill;
    const int shift = c->shift, has_fill = c->has_fill;
    for (Py_ssize_t i = lo; i < hi; i++) {
        Py_ssize_t row, s, n;
        where(c, i, &row, &s, &n);
        const char *px = X->p + row * X->rs + s * X->ts;
        const char *pm = M->p + row * M->rs + s * M->ts;
        char *po = O->p + row * O->rs + s * O->ts;
        if (X->kind == K_F4 && O->kind == K_F4 && X->ts == 4 && O->ts == 4 && !has_fill) {
            const float *x = (const float *)px;
            float *o = (float *)po;
            if (shift) {
                for (Py_ssize_t k = 0; k < n; k++)
                    o[k] = (float)(((double)x[k] - mu) * rstd);
            } else {
                for (Py_ssize_t k = 0; k < n; k++)
                    o[k] = (float)(((double)x[k] - mu) * rstd + mu);
            }
        } else if (X->kind == K_F8 && O->kind == K_F8 && X->ts == 8 && O->ts == 8 &&
                   !has_fill) {
            const double *x = (const double *)px;
            double *o = (double *)po;
            if (shift) {
                for (Py_ssize_t k = 0; k < n; k++)
                    o[k] = (x[k] - mu) * rstd;
            } else {
                for (Py_ssize_t k = 0; k < n; k++)
                    o[k] = (x[k] - mu) * rstd + mu;
            }
        } else {
            WHITEN_LOOP(ld(X->kind, px + k * X->ts), st(O->kind, po + k * O->ts, y))
        }
    }
}

static void whiten_scalar(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    whiten_range(c, lo, hi);
}

#if CT_AVX2
CT_AVX2_FN static void whiten_avx2(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    whiten_range(c, lo, hi); /* the same loops, vectorised by the compiler for AVX2 */
}
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2"))) static void
whiten_avx512(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    whiten_range(c, lo, hi); /* ... and for AVX-512 */
}
#endif

/* ------------------------------------------------------------------ AVX2 scan */

#if CT_AVX2

/* 8x8 transpose: in r[i] = row i's tokens 0..7; out r[k] = token k of rows 0..7 */
CT_AVX2_FN CT_INLINE void tr8(__m256 *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* 4x4 transpose of doubles */
CT_AVX2_FN CT_INLINE void tr4d(__m256d *r) {
    __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]), t1 = _mm256_unpackhi_pd(r[0], r[1]);
    __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]), t3 = _mm256_unpackhi_pd(r[2], r[3]);
    r[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
    r[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
    r[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
    r[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
}

/* tile[k][l] (float64) = token b + k of lane l, k < kn */
CT_AVX2_FN CT_INLINE void load_tile(const Arr *a, const char *const *base, Py_ssize_t b,
                                    int kn, double *tile) {
    if (kn == 8 && a->kind == K_F4 && a->ts == 4) {
        __m256 x[8];
        for (int l = 0; l < 8; l++)
            x[l] = _mm256_loadu_ps((const float *)(base[l] + b * 4));
        tr8(x);
        for (int k = 0; k < 8; k++) {
            _mm256_store_pd(tile + 8 * k, _mm256_cvtps_pd(_mm256_castps256_ps128(x[k])));
            _mm256_store_pd(tile + 8 * k + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(x[k], 1)));
        }
    } else if (kn == 8 && a->kind == K_BF16 && a->ts == 2) {
        __m256 x[8];
        for (int l = 0; l < 8; l++) {
            __m128i h = _mm_loadu_si128((const __m128i *)(base[l] + b * 2));
            x[l] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
        tr8(x);
        for (int k = 0; k < 8; k++) {
            _mm256_store_pd(tile + 8 * k, _mm256_cvtps_pd(_mm256_castps256_ps128(x[k])));
            _mm256_store_pd(tile + 8 * k + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(x[k], 1)));
        }
    } else if (kn == 8 && a->kind == K_F8 && a->ts == 8) {
        for (int lq = 0; lq < 8; lq += 4)
            for (int kq = 0; kq < 8; kq += 4) {
                __m256d x[4];
                for (int l = 0; l < 4; l++)
                    x[l] = _mm256_loadu_pd((const double *)(base[lq + l] + (b + kq) * 8));
                tr4d(x);
                for (int k = 0; k < 4; k++)
                    _mm256_store_pd(tile + 8 * (kq + k) + lq, x[k]);
            }
    } else {
        for (int l = 0; l < 8; l++)
            for (int k = 0; k < kn; k++)
                tile[8 * k + l] = ld(a->kind, base[l] + (b + k) * a->ts);
    }
}

/* bit k of the result: token b + k of this lane is valid (k < kn) */
CT_AVX2_FN CT_INLINE unsigned mask_bits(const Arr *m, const char *base, Py_ssize_t b, int kn) {
    const char *p = base + b * m->ts;
    if (kn == 8) {
        const __m256i z = _mm256_setzero_si256();
        if (m->kind == K_I8 && m->ts == 8) {
            __m256i a0 = _mm256_loadu_si256((const __m256i *)p);
            __m256i a1 = _mm256_loadu_si256((const __m256i *)(p + 32));
            unsigned e0 = (unsigned)_mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(a0, z)));
            unsigned e1 = (unsigned)_mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(a1, z)));
            return ~(e0 | e1 << 4) & 0xffu;
        }
        if (m->kind == K_I1 && m->ts == 1) {
            __m128i a = _mm_loadl_epi64((const __m128i *)p);
            return ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(a, _mm_setzero_si128())) & 0xffu;
        }
        if (m->kind == K_I4 && m->ts == 4) {
            __m256i a = _mm256_loadu_si256((const __m256i *)p);
            return ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a, z))) &
                   0xffu;
        }
        if (m->kind == K_F4 && m->ts == 4) {
            __m256 a = _mm256_loadu_ps((const float *)p);
            return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_NEQ_UQ));
        }
    }
    unsigned bits = 0;
    for (int k = 0; k < kn; k++)
        bits |= (unsigned)okm(m->kind, p + k * m->ts) << k;
    return bits;
}


/* tile[k][l] (float64) -> x[l]: lane l's 8 tokens as float32 */
CT_AVX2_FN CT_INLINE void tile_rows_f32(const double *tile, __m256 *x) {
    for (int k = 0; k < 8; k++) {
        __m128 lo4 = _mm256_cvtpd_ps(_mm256_load_pd(tile + 8 * k));
        __m128 hi4 = _mm256_cvtpd_ps(_mm256_load_pd(tile + 8 * k + 4));
        x[k] = _mm256_insertf128_ps(_mm256_castps128_ps256(lo4), hi4, 1);
    }
    tr8(x);
}

/* The streamed stores of a float32 output: whole 64-byte lines, no read for ownership.
   A block at b = 8 (mod 16), the upper half of its lines, waits in `pend` for the block
   below it (b = 0 mod 16, the scan's next); then each row's line is written in two
   consecutive 32-byte streamed stores (the write-combining buffer sees the whole line). */
CT_AVX2_FN CT_INLINE void stream_tile(char *const *base, Py_ssize_t b, int nl,
                                      const double *tile, __m256 *pend, int *have) {
    __m256 x[8];
    tile_rows_f32(tile, x);
    if ((b & 15) == 8) {
        for (int l = 0; l < 8; l++)
            pend[l] = x[l];
        *have = 1;
        return;
    }
    for (int l = 0; l < nl; l++) {
        float *o = (float *)(base[l] + b * 4);
        _mm256_stream_ps(o, x[l]);
        if (*have)
            _mm256_stream_ps(o + 8, pend[l]);
    }
    *have = 0;
}

/* tile[k][l] -> lane l's tokens b + k (lanes < nl) */
CT_AVX2_FN CT_INLINE void store_tile(const Arr *a, char *const *base, Py_ssize_t b, int kn,
                                     int nl, const double *tile) {
    if (kn == 8 && a->kind == K_F4 && a->ts == 4) {
        __m256 x[8];
        for (int k = 0; k < 8; k++) {
            __m128 lo4 = _mm256_cvtpd_ps(_mm256_load_pd(tile + 8 * k));
            __m128 hi4 = _mm256_cvtpd_ps(_mm256_load_pd(tile + 8 * k + 4));
            x[k] = _mm256_insertf128_ps(_mm256_castps128_ps256(lo4), hi4, 1);
        }
        tr8(x);
        for (int l = 0; l < nl; l++)
            _mm256_storeu_ps((float *)(base[l] + b * 4), x[l]);
    } else if (kn == 8 && a->kind == K_F8 && a->ts == 8 && nl == 8) {
        for (int lq = 0; lq < 8; lq += 4)
            for (int kq = 0; kq < 8; kq += 4) {
                __m256d x[4];
                for (int k = 0; k < 4; k++)
                    x[k] = _mm256_load_pd(tile + 8 * (kq + k) + lq);
                tr4d(x);
                for (int l = 0; l < 4; l++)
                    _mm256_storeu_pd((double *)(base[lq + l] + (b + kq) * 8), x[l]);
            }
    } else {
        for (int l = 0; l < nl; l++)
            for (int k = 0; k < kn; k++)
                st(a->kind, base[l] + (b + k) * a->ts, tile[8 * k + l]);
    }
}

#define ALIGN32 __attribute__((aligned(32)))
#define PF_TOKENS 128 /* how far ahead (in tokens) the scan prefetches its inputs */

/* the rows of a group of n lanes from row `first`: where each array's row starts (lanes
   past nl repeat the group's first row; absent v and o1 point at r and o0) */
CT_INLINE void group_rows(const Ctx *c, Py_ssize_t first, int nl, int n, const char **br,
                          const char **bv, const char **bm, char **b0, char **b1) {
    for (int l = 0; l < n; l++) {
        Py_ssize_t row = first + (l < nl ? l : 0);
        br[l] = c->r.p + row * c->r.rs;
        bv[l] = c->has_v ? c->v.p + row * c->v.rs : br[l];
        bm[l] = c->m.p + row * c->m.rs;
        b0[l] = c->o0.p + row * c->o0.rs;
        b1[l] = c->has_o1 ? c->o1.p + row * c->o1.rs : b0[l];
    }
}

/* the first block of the walk down P tokens in blocks of w: its first token and length
   (the partial block at the end of the row, else a whole one) */
CT_INLINE void top_block(Py_ssize_t P, int w, Py_ssize_t *b, int *kn) {
    *b = P - P % w;
    *kn = (int)(P % w);
    if (*kn == 0) {
        *b -= w;
        *kn = w;
    }
}

/* One group of up to 8 padded responses (lanes past nl repeat lane 0 and are not stored) */
CT_AVX2_FN CT_INLINE void vec_group(const Ctx *c, Py_ssize_t first, int nl, const int MODE,
                                    const int STATS_ON, const int OUT_F32) {
    const char *br[8], *bv[8], *bm[8];
    char *b0[8], *b1[8];
    group_rows(c, first, nl, 8, br, bv, bm, b0, b1);
    double R[64] ALIGN32, V[64] ALIGN32, A[64] ALIGN32, Q[64] ALIGN32;
    const __m256d g = _mm256_set1_pd(c->g), gl = _mm256_set1_pd(c->gl);
    const __m256d zero = _mm256_setzero_pd(), one = _mm256_set1_pd(1.0);
    __m256d carry[2] = {zero, zero}, nv[2] = {zero, zero}, cnt[2] = {zero, zero};
    __m256d s1[2] = {zero, zero}, s2[2] = {zero, zero}, kk[2] = {zero, zero};
    const int two = MODE == GAE_SKIP || MODE == GAE_MUL;
    const Py_ssize_t P = c->P;
    const int NT = c->nt;
    __m256 pend0[8], pend1[8];
    int have0 = 0, have1 = 0;
    Py_ssize_t b;
    int kn;
    top_block(P, 8, &b, &kn);
    for (; b >= 0; b -= 8, kn = 8) {
        if (b >= PF_TOKENS) {
            /* 40 streams (8 rows x 5 arrays) run backwards: more than the hardware
               prefetchers follow, so the inputs' lines are asked for ahead */
            Py_ssize_t q = b - PF_TOKENS;
            for (int l = 0; l < 8; l++) {
                _mm_prefetch(br[l] + q * c->r.ts, _MM_HINT_T0);
                if (two)
                    _mm_prefetch(bv[l] + q * c->v.ts, _MM_HINT_T0);
                _mm_prefetch(bm[l] + q * c->m.ts, _MM_HINT_T0);
            }
        }
        load_tile(&c->r, br, b, kn, R);
        if (two)
            load_tile(&c->v, bv, b, kn, V);
        unsigned mb[8];
        for (int l = 0; l < 8; l++)
            mb[l] = mask_bits(&c->m, bm[l], b, kn);
        __m256i mv[2] = {_mm256_set_epi64x(mb[3], mb[2], mb[1], mb[0]),
                         _mm256_set_epi64x(mb[7], mb[6], mb[5], mb[4])};
        for (int k = kn - 1; k >= 0; k--) {
            const __m256i bit = _mm256_set1_epi64x((long long)1 << k);
            for (int h = 0; h < 2; h++) {
                __m256d ok = _mm256_castsi256_pd(
                    _mm256_cmpeq_epi64(_mm256_and_si256(mv[h], bit), bit));
                __m256d rt = _mm256_load_pd(R + 8 * k + 4 * h), y;
                if (MODE == GAE_SKIP) {
                    __m256d vt = _mm256_load_pd(V + 8 * k + 4 * h);
                    __m256d nw = _mm256_add_pd(
                        _mm256_sub_pd(_mm256_add_pd(rt, _mm256_mul_pd(g, nv[h])), vt),
                        _mm256_mul_pd(gl, carry[h]));
                    carry[h] = _mm256_blendv_pd(carry[h], nw, ok);
                    nv[h] = _mm256_blendv_pd(nv[h], vt, ok);
                    y = carry[h];
                    _mm256_store_pd(Q + 8 * k + 4 * h, _mm256_add_pd(carry[h], vt));
                } else if (MODE == GAE_MUL) {
                    __m256d vt = _mm256_and_pd(_mm256_load_pd(V + 8 * k + 4 * h), ok);
                    rt = _mm256_and_pd(rt, ok);
                    carry[h] = _mm256_add_pd(
                        _mm256_sub_pd(_mm256_add_pd(rt, _mm256_mul_pd(g, nv[h])), vt),
                        _mm256_mul_pd(gl, carry[h]));
                    nv[h] = vt;
                    y = carry[h];
                    _mm256_store_pd(Q + 8 * k + 4 * h, _mm256_add_pd(carry[h], vt));
                } else if (MODE == RET_SKIP) {
                    __m256d nw = _mm256_add_pd(rt, _mm256_mul_pd(g, carry[h]));
                    carry[h] = _mm256_blendv_pd(carry[h], nw, ok);
                    y = _mm256_and_pd(carry[h], ok);
                } else {
                    rt = _mm256_and_pd(rt, ok);
                    carry[h] = _mm256_add_pd(rt, _mm256_mul_pd(g, carry[h]));
                    y = carry[h];
                }
                _mm256_store_pd(A + 8 * k + 4 * h, y);
                if (STATS_ON) {
                    __m256d x = OUT_F32 ? _mm256_cvtps_pd(_mm256_cvtpd_ps(y)) : y;
                    __m256d fst = _mm256_and_pd(ok, _mm256_cmp_pd(cnt[h], zero, _CMP_EQ_OQ));
                    kk[h] = _mm256_blendv_pd(kk[h], x, fst);
                    __m256d d = _mm256_and_pd(_mm256_sub_pd(x, kk[h]), ok);
                    cnt[h] = _mm256_add_pd(cnt[h], _mm256_and_pd(one, ok));
                    s1[h] = _mm256_add_pd(s1[h], d);
                    s2[h] = _mm256_add_pd(s2[h], _mm256_mul_pd(d, d));
                }
            }
        }
        if (NT && kn == 8 && ((b & 15) == 8 || have0)) {
            stream_tile(b0, b, nl, A, pend0, &have0);
            if (two)
                stream_tile(b1, b, nl, Q, pend1, &have1);
        } else {
            store_tile(&c->o0, b0, b, kn, nl, A);
            if (two)
                store_tile(&c->o1, b1, b, kn, nl, Q);
        }
    }
    if (STATS_ON) {
        double vc[8] ALIGN32, vk[8] ALIGN32, v1[8] ALIGN32, v2[8] ALIGN32;
        for (int h = 0; h < 2; h++) {
            _mm256_store_pd(vc + 4 * h, cnt[h]);
            _mm256_store_pd(vk + 4 * h, kk[h]);
            _mm256_store_pd(v1 + 4 * h, s1[h]);
            _mm256_store_pd(v2 + 4 * h, s2[h]);
        }
        for (int l = 0; l < nl; l++)
            put_stats(c->stats + 3 * (first + l), vc[l], vk[l], v1[l], v2[l]);
    }
}

/* rows [lo, hi), last group first, through GROUP (vec_group or vec_group512), each mode
   and statistics case compiled on its own; then the streamed stores reach memory before
   this thread's work ends */
#define VEC_CASE(GROUP, MODE, ST)                                                        \
    for (Py_ssize_t g0 = hi; g0 > lo; g0 -= 8) {                                         \
        Py_ssize_t first = g0 - 8 < lo ? lo : g0 - 8;                                    \
        if (c->out_f32)                                                                  \
            GROUP(c, first, (int)(g0 - first), MODE, ST, 1);                             \
        else                                                                             \
            GROUP(c, first, (int)(g0 - first), MODE, ST, 0);                             \
    }                                                                                    \
    break;
#define vec_group_CASE(MODE, ST) VEC_CASE(vec_group, MODE, ST)
#define vec_group512_CASE(MODE, ST) VEC_CASE(vec_group512, MODE, ST)
#define VEC_SCAN(GROUP)                                                                  \
    MODE_SWITCH(GROUP##_CASE)                                                            \
    if (c->nt)                                                                           \
        _mm_sfence();

CT_AVX2_FN static void scan_avx2(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    VEC_SCAN(vec_group)
}

/* ------------------------------------------------------------------ AVX-512 scan */

/* The same recurrence with the 8 responses of a group in one 512-bit register: one chain
 * instead of two, masks in mask registers (a select is folded into its add), and blocks
 * of 16 tokens: a float32 row's 64-byte line is loaded, transposed and stored whole. The
 * operations on each element are the AVX2 path's, in the same order: the same bits. */
#define CT_AVX512_FN __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2")))

/* 8 x 8 bits: bit k of byte l -> bit l of byte k (Hacker's Delight, 7-3) */
CT_INLINE uint64_t tr8bits(uint64_t x) {
    uint64_t t;
    t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
    x = x ^ t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
    x = x ^ t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
    return x ^ t ^ (t << 28);
}

/* 4 x 4 transposes inside each 128-bit lane: r[0..3] -> r[0..3] (its own inverse) */
CT_AVX512_FN CT_INLINE void tr4x4_512(__m512 *r) {
    __m512 t0 = _mm512_unpacklo_ps(r[0], r[1]), t1 = _mm512_unpackhi_ps(r[0], r[1]);
    __m512 t2 = _mm512_unpacklo_ps(r[2], r[3]), t3 = _mm512_unpackhi_ps(r[2], r[3]);
    r[0] = _mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    r[1] = _mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    r[2] = _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    r[3] = _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
}

/* tile[8k + l] (float64) = token b + k of row l, k < 16: 8 float32 lines, transposed.
   After the in-lane transposes, u[i] (u[4 + i]) holds in its lane q rows 0-3 (4-7) of
   token 4q + i; one two-source permute puts a token's 8 rows together. */
CT_AVX512_FN CT_INLINE void load16_f32(const char *const *base, Py_ssize_t b, double *tile) {
    const __m512i i01 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i23 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29,
                                          30, 31);
    __m512 u[8];
    for (int l = 0; l < 8; l++)
        u[l] = _mm512_loadu_ps((const float *)(base[l] + b * 4));
    tr4x4_512(u);
    tr4x4_512(u + 4);
    for (int i = 0; i < 4; i++) {
        __m512 w0 = _mm512_permutex2var_ps(u[i], i01, u[i + 4]); /* tokens i, 4 + i */
        __m512 w1 = _mm512_permutex2var_ps(u[i], i23, u[i + 4]); /* tokens 8 + i, 12 + i */
        _mm512_store_pd(tile + 8 * i, _mm512_cvtps_pd(_mm512_castps512_ps256(w0)));
        _mm512_store_pd(tile + 8 * (4 + i), _mm512_cvtps_pd(_mm512_extractf32x8_ps(w0, 1)));
        _mm512_store_pd(tile + 8 * (8 + i), _mm512_cvtps_pd(_mm512_castps512_ps256(w1)));
        _mm512_store_pd(tile + 8 * (12 + i), _mm512_cvtps_pd(_mm512_extractf32x8_ps(w1, 1)));
    }
}

/* the inverse: rows l < nl get their 16 tokens from tile[8k + l], rounded to float32;
   streamed (whole 64-byte lines, no read for ownership) where nt */
CT_AVX512_FN CT_INLINE void store16_f32(char *const *base, Py_ssize_t b, int nl,
                                        const double *tile, int nt) {
    const __m512i ia = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i ib = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                         31);
    __m512 u[8];
    for (int i = 0; i < 4; i++) {
        __m512 w0 = _mm512_insertf32x8(
            _mm512_castps256_ps512(_mm512_cvtpd_ps(_mm512_load_pd(tile + 8 * i))),
            _mm512_cvtpd_ps(_mm512_load_pd(tile + 8 * (4 + i))), 1);
        __m512 w1 = _mm512_insertf32x8(
            _mm512_castps256_ps512(_mm512_cvtpd_ps(_mm512_load_pd(tile + 8 * (8 + i)))),
            _mm512_cvtpd_ps(_mm512_load_pd(tile + 8 * (12 + i))), 1);
        u[i] = _mm512_permutex2var_ps(w0, ia, w1);
        u[i + 4] = _mm512_permutex2var_ps(w0, ib, w1);
    }
    tr4x4_512(u);
    tr4x4_512(u + 4);
    for (int l = 0; l < nl; l++) {
        float *o = (float *)(base[l] + b * 4);
        if (nt)
            _mm512_stream_ps(o, u[l]);
        else
            _mm512_storeu_ps(o, u[l]);
    }
}

/* bit k: token b + k of this row is valid (k < kn <= 16) */
CT_AVX512_FN CT_INLINE unsigned mask16(const Arr *m, const char *base, Py_ssize_t b, int kn) {
    const char *p = base + b * m->ts;
    if (kn == 16) {
        if (m->kind == K_I8 && m->ts == 8) {
            __m512i a0 = _mm512_loadu_si512((const void *)p);
            __m512i a1 = _mm512_loadu_si512((const void *)(p + 64));
            return (unsigned)_mm512_test_epi64_mask(a0, a0) |
                   (unsigned)_mm512_test_epi64_mask(a1, a1) << 8;
        }
        if (m->kind == K_I1 && m->ts == 1) {
            __m128i a = _mm_loadu_si128((const __m128i *)p);
            return (unsigned)_mm_test_epi8_mask(a, a);
        }
        if (m->kind == K_I2 && m->ts == 2) {
            __m256i a = _mm256_loadu_si256((const __m256i *)p);
            return (unsigned)_mm256_test_epi16_mask(a, a);
        }
        if (m->kind == K_I4 && m->ts == 4) {
            __m512i a = _mm512_loadu_si512((const void *)p);
            return (unsigned)_mm512_test_epi32_mask(a, a);
        }
        if (m->kind == K_F4 && m->ts == 4)
            return (unsigned)_mm512_cmp_ps_mask(_mm512_loadu_ps((const float *)p),
                                                _mm512_setzero_ps(), _CMP_NEQ_UQ);
    }
    unsigned bits = 0;
    for (int k = 0; k < kn; k++)
        bits |= (unsigned)okm(m->kind, p + k * m->ts) << k;
    return bits;
}

/* tile[8k + l] = token b + k of lane l, k < kn <= 16 */
CT_AVX512_FN CT_INLINE void load16(const Arr *a, const char *const *base, Py_ssize_t b, int kn,
                                   double *tile) {
    if (kn == 16 && a->kind == K_F4 && a->ts == 4) {
        load16_f32(base, b, tile);
        return;
    }
    load_tile(a, base, b, kn < 8 ? kn : 8, tile);
    if (kn > 8)
        load_tile(a, base, b + 8, kn - 8, tile + 64);
}

CT_AVX512_FN CT_INLINE void store16(const Arr *a, char *const *base, Py_ssize_t b, int kn,
                                    int nl, const double *tile, int nt) {
    if (kn == 16 && a->kind == K_F4 && a->ts == 4) {
        store16_f32(base, b, nl, tile, nt);
        return;
    }
    store_tile(a, base, b, kn < 8 ? kn : 8, nl, tile);
    if (kn > 8)
        store_tile(a, base, b + 8, kn - 8, nl, tile + 64);
}

/* the state of a group's 8 lanes */
typedef struct {
    __m512d carry, nv, cnt, s1, s2, kk;
} Lanes512;

/* token k of the tile: the recurrence (and the statistics) of the 8 lanes; ok: the lanes
   where the token is valid */
CT_AVX512_FN CT_INLINE void step512(Lanes512 *S, const double *R, const double *V, double *A,
                                    double *Q, int k, __mmask8 ok, __m512d g, __m512d gl,
                                    const int MODE, const int STATS_ON, const int OUT_F32) {
    __m512d rt = _mm512_load_pd(R + 8 * k), y;
    if (MODE == GAE_SKIP) {
        __m512d vt = _mm512_load_pd(V + 8 * k);
        __m512d t = _mm512_sub_pd(_mm512_add_pd(rt, _mm512_mul_pd(g, S->nv)), vt);
        S->carry = _mm512_mask_add_pd(S->carry, ok, t, _mm512_mul_pd(gl, S->carry));
        S->nv = _mm512_mask_mov_pd(S->nv, ok, vt);
        y = S->carry;
        _mm512_store_pd(Q + 8 * k, _mm512_add_pd(S->carry, vt));
    } else if (MODE == GAE_MUL) {
        __m512d vt = _mm512_maskz_mov_pd(ok, _mm512_load_pd(V + 8 * k));
        rt = _mm512_maskz_mov_pd(ok, rt);
        S->carry = _mm512_add_pd(_mm512_sub_pd(_mm512_add_pd(rt, _mm512_mul_pd(g, S->nv)), vt),
                                 _mm512_mul_pd(gl, S->carry));
        S->nv = vt;
        y = S->carry;
        _mm512_store_pd(Q + 8 * k, _mm512_add_pd(S->carry, vt));
    } else if (MODE == RET_SKIP) {
        S->carry = _mm512_mask_add_pd(S->carry, ok, rt, _mm512_mul_pd(g, S->carry));
        y = _mm512_maskz_mov_pd(ok, S->carry);
    } else {
        rt = _mm512_maskz_mov_pd(ok, rt);
        S->carry = _mm512_add_pd(rt, _mm512_mul_pd(g, S->carry));
        y = S->carry;
    }
    _mm512_store_pd(A + 8 * k, y);
    if (STATS_ON) {
        const __m512d zero = _mm512_setzero_pd(), one = _mm512_set1_pd(1.0);
        __m512d x = OUT_F32 ? _mm512_cvtps_pd(_mm512_cvtpd_ps(y)) : y;
        __mmask8 fst = _mm512_mask_cmp_pd_mask(ok, S->cnt, zero, _CMP_EQ_OQ);
        S->kk = _mm512_mask_mov_pd(S->kk, fst, x);
        __m512d d = _mm512_maskz_sub_pd(ok, x, S->kk);
        S->cnt = _mm512_mask_add_pd(S->cnt, ok, S->cnt, one);
        S->s1 = _mm512_add_pd(S->s1, d);
        S->s2 = _mm512_add_pd(S->s2, _mm512_mul_pd(d, d));
    }
}

/* One group of up to 8 padded responses (lanes past nl repeat lane 0 and are not stored) */
CT_AVX512_FN CT_INLINE void vec_group512(const Ctx *c, Py_ssize_t first, int nl, const int MODE,
                                         const int STATS_ON, const int OUT_F32) {
    const char *br[8], *bv[8], *bm[8];
    char *b0[8], *b1[8];
    group_rows(c, first, nl, 8, br, bv, bm, b0, b1);
    double R[128] __attribute__((aligned(64))), V[128] __attribute__((aligned(64)));
    double A[128] __attribute__((aligned(64))), Q[128] __attribute__((aligned(64)));
    const __m512d g = _mm512_set1_pd(c->g), gl = _mm512_set1_pd(c->gl);
    const __m512d zero = _mm512_setzero_pd();
    Lanes512 S = {zero, zero, zero, zero, zero, zero};
    const int two = MODE == GAE_SKIP || MODE == GAE_MUL;
    const Py_ssize_t P = c->P;
    const int NT = c->nt;
    Py_ssize_t b;
    int kn;
    top_block(P, 16, &b, &kn);
    for (; b >= 0; b -= 16, kn = 16) {
        if (b >= PF_TOKENS) { /* as in vec_group: every line of the 16 tokens */
            Py_ssize_t q = b - PF_TOKENS;
            for (int l = 0; l < 8; l++) {
                for (Py_ssize_t o = 0; o < 16 * c->r.ts; o += 64)
                    _mm_prefetch(br[l] + q * c->r.ts + o, _MM_HINT_T0);
                if (two)
                    for (Py_ssize_t o = 0; o < 16 * c->v.ts; o += 64)
                        _mm_prefetch(bv[l] + q * c->v.ts + o, _MM_HINT_T0);
                for (Py_ssize_t o = 0; o < 16 * c->m.ts; o += 64)
                    _mm_prefetch(bm[l] + q * c->m.ts + o, _MM_HINT_T0);
            }
        }
        load16(&c->r, br, b, kn, R);
        if (two)
            load16(&c->v, bv, b, kn, V);
        uint64_t lo = 0, hi = 0; /* byte k: the lanes' validity at token b + k (b + 8 + k) */
        for (int l = 0; l < 8; l++) {
            unsigned bits = mask16(&c->m, bm[l], b, kn);
            lo |= (uint64_t)(bits & 0xffu) << (8 * l);
            hi |= (uint64_t)(bits >> 8) << (8 * l);
        }
        lo = tr8bits(lo);
        hi = tr8bits(hi);
        if (kn == 16) { /* constant bounds: unrolled, the masks' shifts constants */
#pragma GCC unroll 8
            for (int k = 15; k >= 8; k--)
                step512(&S, R, V, A, Q, k, (__mmask8)(hi >> (8 * (k - 8))), g, gl, MODE,
                        STATS_ON, OUT_F32);
#pragma GCC unroll 8
            for (int k = 7; k >= 0; k--)
                step512(&S, R, V, A, Q, k, (__mmask8)(lo >> (8 * k)), g, gl, MODE, STATS_ON,
                        OUT_F32);
        } else {
            for (int k = kn - 1; k >= 0; k--)
                step512(&S, R, V, A, Q, k,
                        (__mmask8)(k >= 8 ? hi >> (8 * (k - 8)) : lo >> (8 * k)), g, gl, MODE,
                        STATS_ON, OUT_F32);
        }
        store16(&c->o0, b0, b, kn, nl, A, NT);
        if (two)
            store16(&c->o1, b1, b, kn, nl, Q, NT);
    }
    if (STATS_ON) {
        double vc[8] __attribute__((aligned(64))), vk[8] __attribute__((aligned(64)));
        double v1[8] __attribute__((aligned(64))), v2[8] __attribute__((aligned(64)));
        _mm512_store_pd(vc, S.cnt);
        _mm512_store_pd(vk, S.kk);
        _mm512_store_pd(v1, S.s1);
        _mm512_store_pd(v2, S.s2);
        for (int l = 0; l < nl; l++)
            put_stats(c->stats + 3 * (first + l), vc[l], vk[l], v1[l], v2[l]);
    }
}

CT_AVX512_FN static void scan_avx512(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    VEC_SCAN(vec_group512)
}

/* ------------------------------------------------------------------ float32 in 16 lanes */

/* Float32 data and outputs (contiguous tokens, padded layout) on AVX-512: the recurrence
 * in float32, 16 responses a register, where the float64 loop above is bound by its
 * arithmetic (8 lanes a register, 0.64 ns a token a thread on the 2-core EPYC VM, about
 * what the memory takes to move the bytes). The whitening's statistics: each lane's
 * shifted sums in float32 over a block of 16 tokens, added into float64 sums once a block.
 * Not numba's bits (those are the float64 loop's): within float32 rounding of them, and
 * of the float64 reference (tests/core/test_token_ckernel.py). use_f32(False) turns it off. */
#ifndef PF16_TOKENS
#define PF16_TOKENS 128
#endif
#ifndef PF16_HINT
#define PF16_HINT _MM_HINT_T1 /* into L2: into L1 (T0) measured 11.9 against 9.8 ms at [1024, 8192] */
#endif

/* r[0..15] -> r[0..15] transposed: lane l of r[k] becomes lane k of r[l] */
CT_AVX512_FN CT_INLINE void tr16x16(__m512 *r) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* r[4j + q]: rows 4j..4j+3 of columns q, 4 + q, 8 + q, 12 + q (one per 128-bit lane) */
    for (int q = 0; q < 4; q++) {
        t[q] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88);      /* lanes 0, 2 of each */
        t[4 + q] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xdd);  /* lanes 1, 3 */
        t[8 + q] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88);
        t[12 + q] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xdd);
    }
    for (int q = 0; q < 4; q++) {
        r[q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0x88);
        r[8 + q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0xdd);
        r[4 + q] = _mm512_shuffle_f32x4(t[4 + q], t[12 + q], 0x88);
        r[12 + q] = _mm512_shuffle_f32x4(t[4 + q], t[12 + q], 0xdd);
    }
}

/* tile[16k + l] = token b + k of row l (k < kn; zeros past it) */
CT_AVX512_FN CT_INLINE void load16x16(const char *const *base, Py_ssize_t b, int kn, float *tile) {
    __m512 u[16];
    const __mmask16 km = (__mmask16)(kn == 16 ? 0xffffu : (1u << kn) - 1u);
    for (int l = 0; l < 16; l++)
        u[l] = _mm512_maskz_loadu_ps(km, (const float *)(base[l] + b * 4));
    tr16x16(u);
    for (int k = 0; k < 16; k++)
        _mm512_store_ps(tile + 16 * k, u[k]);
}

/* the inverse, rows l < nl; streamed where nt and the block is whole */
CT_AVX512_FN CT_INLINE void store16x16(char *const *base, Py_ssize_t b, int kn, int nl,
                                       const float *tile, int nt) {
    __m512 u[16];
    for (int k = 0; k < 16; k++)
        u[k] = _mm512_load_ps(tile + 16 * k);
    tr16x16(u);
    const __mmask16 km = (__mmask16)(kn == 16 ? 0xffffu : (1u << kn) - 1u);
    for (int l = 0; l < nl; l++) {
        float *o = (float *)(base[l] + b * 4);
        if (kn < 16)
            _mm512_mask_storeu_ps(o, km, u[l]);
        else if (nt)
            _mm512_stream_ps(o, u[l]);
        else
            _mm512_storeu_ps(o, u[l]);
    }
}

typedef struct {
    __m512 carry, nv, kk, s1, s2, cnt; /* cnt, s1, s2: this block's, in float32 */
    __mmask16 seen;
    __m512d c64[2], s164[2], s264[2]; /* ... and all blocks', in float64 */
} Lanes16;

CT_AVX512_FN CT_INLINE void step16(Lanes16 *S, const float *R, const float *V, float *A,
                                   float *Q, int k, __mmask16 ok, __m512 g, __m512 gl,
                                   const int MODE, const int STATS_ON) {
    __m512 rt = _mm512_load_ps(R + 16 * k), y;
    if (MODE == GAE_SKIP) {
        __m512 vt = _mm512_load_ps(V + 16 * k);
        __m512 t = _mm512_sub_ps(_mm512_fmadd_ps(g, S->nv, rt), vt);
        S->carry = _mm512_mask_mov_ps(S->carry, ok, _mm512_fmadd_ps(gl, S->carry, t));
        S->nv = _mm512_mask_mov_ps(S->nv, ok, vt);
        y = S->carry;
        _mm512_store_ps(Q + 16 * k, _mm512_add_ps(y, vt));
    } else if (MODE == GAE_MUL) {
        __m512 vt = _mm512_maskz_mov_ps(ok, _mm512_load_ps(V + 16 * k));
        rt = _mm512_maskz_mov_ps(ok, rt);
        __m512 t = _mm512_sub_ps(_mm512_fmadd_ps(g, S->nv, rt), vt);
        S->carry = _mm512_fmadd_ps(gl, S->carry, t);
        S->nv = vt;
        y = S->carry;
        _mm512_store_ps(Q + 16 * k, _mm512_add_ps(y, vt));
    } else if (MODE == RET_SKIP) {
        S->carry = _mm512_mask_mov_ps(S->carry, ok, _mm512_fmadd_ps(g, S->carry, rt));
        y = _mm512_maskz_mov_ps(ok, S->carry);
    } else {
        S->carry = _mm512_fmadd_ps(g, S->carry, _mm512_maskz_mov_ps(ok, rt));
        y = S->carry;
    }
    _mm512_store_ps(A + 16 * k, y);
    if (STATS_ON) {
        S->kk = _mm512_mask_mov_ps(S->kk, (__mmask16)(ok & ~S->seen), y);
        S->seen = (__mmask16)(S->seen | ok);
        __m512 d = _mm512_maskz_sub_ps(ok, y, S->kk);
        S->s1 = _mm512_add_ps(S->s1, d);
        S->s2 = _mm512_fmadd_ps(d, d, S->s2);
        S->cnt = _mm512_mask_add_ps(S->cnt, ok, S->cnt, _mm512_set1_ps(1.0f));
    }
}

CT_AVX512_FN CT_INLINE void flush16(Lanes16 *S) {
    __m512 *f[3] = {&S->cnt, &S->s1, &S->s2};
    __m512d *d[3] = {S->c64, S->s164, S->s264};
    for (int i = 0; i < 3; i++) {
        d[i][0] = _mm512_add_pd(d[i][0], _mm512_cvtps_pd(_mm512_castps512_ps256(*f[i])));
        d[i][1] = _mm512_add_pd(d[i][1], _mm512_cvtps_pd(_mm512_extractf32x8_ps(*f[i], 1)));
        *f[i] = _mm512_setzero_ps();
    }
}

/* One group of up to 16 padded responses (lanes past nl repeat lane 0, not stored) */
CT_AVX512_FN CT_INLINE void vec_group16(const Ctx *c, Py_ssize_t first, int nl, const int MODE,
                                        const int STATS_ON) {
    const char *br[16], *bv[16], *bm[16];
    char *b0[16], *b1[16];
    group_rows(c, first, nl, 16, br, bv, bm, b0, b1);
    float R[256] __attribute__((aligned(64))), V[256] __attribute__((aligned(64)));
    float A[256] __attribute__((aligned(64))), Q[256] __attribute__((aligned(64)));
    const __m512 g = _mm512_set1_ps((float)c->g), gl = _mm512_set1_ps((float)c->gl);
    const __m512 zero = _mm512_setzero_ps();
    const __m512d zd = _mm512_setzero_pd();
    Lanes16 S = {zero, zero, zero, zero, zero, zero, 0, {zd, zd}, {zd, zd}, {zd, zd}};
    const int two = MODE == GAE_SKIP || MODE == GAE_MUL;
    const Py_ssize_t P = c->P;
    const int NT = c->nt;
    Py_ssize_t b;
    int kn;
    top_block(P, 16, &b, &kn);
    for (; b >= 0; b -= 16, kn = 16) {
        if (b >= PF16_TOKENS) { /* every line of the 16 tokens, PF16_TOKENS ahead */
            Py_ssize_t q = b - PF16_TOKENS;
            for (int l = 0; l < 16; l++) {
                _mm_prefetch(br[l] + q * 4, PF16_HINT);
                if (two)
                    _mm_prefetch(bv[l] + q * 4, PF16_HINT);
                for (Py_ssize_t o = 0; o < 16 * c->m.ts; o += 64)
                    _mm_prefetch(bm[l] + q * c->m.ts + o, PF16_HINT);
            }
        }
        load16x16(br, b, kn, R);
        if (two)
            load16x16(bv, b, kn, V);
        /* byte k of lo[h] (hi[h]): rows 8h..8h+7's validity at token b + k (b + 8 + k) */
        uint64_t lo[2] = {0, 0}, hi[2] = {0, 0};
        for (int l = 0; l < 16; l++) {
            unsigned bits = mask16(&c->m, bm[l], b, kn);
            lo[l >> 3] |= (uint64_t)(bits & 0xffu) << (8 * (l & 7));
            hi[l >> 3] |= (uint64_t)(bits >> 8) << (8 * (l & 7));
        }
        for (int h = 0; h < 2; h++) {
            lo[h] = tr8bits(lo[h]);
            hi[h] = tr8bits(hi[h]);
        }
#define OK16(k) ((__mmask16)((k) >= 8                                                        \
                                 ? ((hi[0] >> (8 * ((k) - 8))) & 0xff) |                      \
                                       (((hi[1] >> (8 * ((k) - 8))) & 0xff) << 8)             \
                                 : ((lo[0] >> (8 * (k))) & 0xff) | (((lo[1] >> (8 * (k))) & 0xff) << 8)))
        if (kn == 16) {
#pragma GCC unroll 16
            for (int k = 15; k >= 0; k--)
                step16(&S, R, V, A, Q, k, OK16(k), g, gl, MODE, STATS_ON);
        } else {
            for (int k = kn - 1; k >= 0; k--)
                step16(&S, R, V, A, Q, k, OK16(k), g, gl, MODE, STATS_ON);
        }
#undef OK16
        if (STATS_ON)
            flush16(&S);
        store16x16(b0, b, kn, nl, A, NT);
        if (two)
            store16x16(b1, b, kn, nl, Q, NT);
    }
    if (STATS_ON) {
        double vc[16] __attribute__((aligned(64))), v1[16] __attribute__((aligned(64)));
        double v2[16] __attribute__((aligned(64)));
        float vk[16] __attribute__((aligned(64)));
        for (int h = 0; h < 2; h++) {
            _mm512_store_pd(vc + 8 * h, S.c64[h]);
            _mm512_store_pd(v1 + 8 * h, S.s164[h]);
            _mm512_store_pd(v2 + 8 * h, S.s264[h]);
        }
        _mm512_store_ps(vk, S.kk);
        for (int l = 0; l < nl; l++)
            put_stats(c->stats + 3 * (first + l), vc[l], (double)vk[l], v1[l], v2[l]);
    }
}

/* ------------------------------------------------------------------ float32 row walk */

/* The same float32 computation one response at a time, 16 tokens a register: where the
 * responses are rows of a padded batch, vec_group16 reads 16 rows at once (80 streams of
 * lines a thread, with the outputs), which this memory serves at 1.3-1.6x the time it
 * takes for the same bytes read in order (2-core EPYC VM, docs/notes.md); the walk reads
 * each array of one response in order, last token first.
 *
 * In a block of 16 tokens the tokens that take part in the recurrence (K: the valid ones
 * where masked tokens are skipped, all of them where they are zeroed) are compressed to
 * the low lanes (vcompressps), so the recurrence has one coefficient, cf (gamma lambda
 * for GAE, gamma for the returns):  x_j = delta_j + cf x_{j+1},  x_cnt = the carry from
 * the block above. Four rounds (x_j += cf^s x_{j+s}, s = 1, 2, 4, 8) and the carry times
 * cf^(cnt - j) give every x_j; token t's output is x at the number of scanning tokens
 * before t (the next one's value for a skipped token, the carry past the last). GAE's
 * next value is the compressed values shifted down one lane, the block above's first
 * value past the last. Float32 with fused multiply-adds, as vec_group16; the rounds add
 * in another order, so its bits are its own (within float32 rounding of the others;
 * tests/core/test_token_ckernel.py). Needs AVX-512 VPOPCNTDQ (the counts); use_walk(False)
 * takes vec_group16 instead. */
#define CT_WALK_FN __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512vpopcntdq,avx2")))
#ifndef WALK_FOLD
#define WALK_FOLD 16 /* blocks a lane's float32 statistics add before they go to float64 */
#endif
static int simd_have(void);

static int walk_have(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = simd_have() == 2 && __builtin_cpu_supports("avx512vpopcntdq");
    }
    return known;
}

CT_WALK_FN CT_INLINE __m512 lanes_up(__m512 x, const int s) { /* lane j <- lane j + s, 0 past 15 */
    __m512i z = _mm512_setzero_si512(), xi = _mm512_castps_si512(x);
    switch (s) {
    case 1: return _mm512_castsi512_ps(_mm512_alignr_epi32(z, xi, 1));
    case 2: return _mm512_castsi512_ps(_mm512_alignr_epi32(z, xi, 2));
    case 4: return _mm512_castsi512_ps(_mm512_alignr_epi32(z, xi, 4));
    default: return _mm512_castsi512_ps(_mm512_alignr_epi32(z, xi, 8));
    }
}

/* the float32 sums s[0..2] added into the float64 sums d[0..2] (both halves of each
   into one: a response's sums need no lanes), then zeroed */
CT_WALK_FN CT_INLINE void walk_fold(__m512d *d, __m512 *s) {
    for (int q = 0; q < 3; q++) {
        d[q] = _mm512_add_pd(d[q], _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(s[q])),
                                                 _mm512_cvtps_pd(_mm512_extractf32x8_ps(s[q], 1))));
        s[q] = _mm512_setzero_ps();
    }
}

typedef struct {
    __m512 pw[4]; /* cf, cf^2, cf^4, cf^8 */
    float rv[32] __attribute__((aligned(64))); /* rv[m] = cf^(16 - m), 0 past m = 16 */
} WalkK;

CT_WALK_FN CT_INLINE void walk_one(const Ctx *c, const WalkK *W, Py_ssize_t i, const int MODE,
                                   const int STATS_ON) {
    Py_ssize_t row, s, n;
    where(c, i, &row, &s, &n);
    const Arr *M = &c->m;
    const int gae = MODE == GAE_SKIP || MODE == GAE_MUL;
    const int skip = MODE == GAE_SKIP || MODE == RET_SKIP;
    const float *pr = (const float *)(c->r.p + row * c->r.rs + s * 4);
    const float *pv = (const float *)(c->v.p + row * c->v.rs + s * 4);
    const char *pm = M->p + row * M->rs + s * M->ts;
    float *p0 = (float *)(c->o0.p + row * c->o0.rs + s * 4);
    float *p1 = (float *)(c->o1.p + row * c->o1.rs + s * 4);
    const int NT = c->nt && c->rows == NULL;
    const __m512 g = _mm512_set1_ps((float)c->g), zero = _mm512_setzero_ps();
    const __m512i before = _mm512_setr_epi32(0x0, 0x1, 0x3, 0x7, 0xf, 0x1f, 0x3f, 0x7f, 0xff,
                                             0x1ff, 0x3ff, 0x7ff, 0xfff, 0x1fff, 0x3fff, 0x7fff);
    const __m512i lane0 = _mm512_setzero_si512();
    __m512 carry = zero, nv = zero, kkv = zero;
    __m512 sum[3] = {zero, zero, zero}; /* this response's count, sum and sum of squares */
    __m512d dsum[3] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
    int seen = 0, fold = 0;
    Py_ssize_t b = 0;
    int kn = 0;
    if (n > 0)
        top_block(n, 16, &b, &kn);
    for (; n > 0 && b >= 0; b -= 16, kn = 16) {
        const __mmask16 km = (__mmask16)(kn == 16 ? 0xffffu : (1u << kn) - 1u);
        __m512 rt = _mm512_maskz_loadu_ps(km, pr + b);
        __m512 vt = gae ? _mm512_maskz_loadu_ps(km, pv + b) : zero;
        const __mmask16 k = (__mmask16)(mask16(M, pm, b, kn) & km);
        const __mmask16 K = skip ? k : km;
        if (!skip) {
            rt = _mm512_maskz_mov_ps(k, rt);
            if (gae)
                vt = _mm512_maskz_mov_ps(k, vt);
        }
        const int cnt = __builtin_popcount((unsigned)K);
        __m512 x;
        if (gae) {
            const __mmask16 low = (__mmask16)((1u << cnt) - 1u);
            __m512 cv = _mm512_mask_mov_ps(nv, low, _mm512_maskz_compress_ps(K, vt));
            __m512 nxt = _mm512_castsi512_ps(
                _mm512_alignr_epi32(_mm512_castps_si512(nv), _mm512_castps_si512(cv), 1));
            x = _mm512_maskz_sub_ps(low, _mm512_fmadd_ps(g, nxt, _mm512_maskz_compress_ps(K, rt)),
                                    cv);
            nv = _mm512_permutexvar_ps(lane0, cv);
        } else {
            x = _mm512_maskz_compress_ps(K, rt);
        }
        x = _mm512_fmadd_ps(W->pw[0], lanes_up(x, 1), x);
        x = _mm512_fmadd_ps(W->pw[1], lanes_up(x, 2), x);
        x = _mm512_fmadd_ps(W->pw[2], lanes_up(x, 4), x);
        x = _mm512_fmadd_ps(W->pw[3], lanes_up(x, 8), x);
        x = _mm512_fmadd_ps(_mm512_loadu_ps(W->rv + 16 - cnt), carry, x);
        carry = _mm512_permutexvar_ps(lane0, x);
        __m512i at = _mm512_popcnt_epi32(_mm512_and_si512(_mm512_set1_epi32((int)K), before));
        __m512 y = _mm512_permutexvar_ps(at, x);
        if (MODE == RET_SKIP)
            y = _mm512_maskz_mov_ps(k, y);
        if (kn < 16) {
            _mm512_mask_storeu_ps(p0 + b, km, y);
            if (gae)
                _mm512_mask_storeu_ps(p1 + b, km, _mm512_add_ps(y, vt));
        } else if (NT) {
            _mm512_stream_ps(p0 + b, y);
            if (gae)
                _mm512_stream_ps(p1 + b, _mm512_add_ps(y, vt));
        } else {
            _mm512_storeu_ps(p0 + b, y);
            if (gae)
                _mm512_storeu_ps(p1 + b, _mm512_add_ps(y, vt));
        }
        if (STATS_ON) {
            if (!seen && k) { /* the first valid output in scan order: the shift */
                kkv = _mm512_permutexvar_ps(_mm512_set1_epi32(31 - __builtin_clz((unsigned)k)), y);
                seen = 1;
            }
            __m512 d = _mm512_maskz_sub_ps(k, y, kkv);
            sum[0] = _mm512_mask_add_ps(sum[0], k, sum[0], _mm512_set1_ps(1.0f));
            sum[1] = _mm512_add_ps(sum[1], d);
            sum[2] = _mm512_fmadd_ps(d, d, sum[2]);
            if (++fold == WALK_FOLD) {
                fold = 0;
                walk_fold(dsum, sum);
            }
        }
    }
    if (STATS_ON) {
        walk_fold(dsum, sum);
        put_stats(c->stats + 3 * i, _mm512_reduce_add_pd(dsum[0]),
                  (double)_mm512_cvtss_f32(kkv), _mm512_reduce_add_pd(dsum[1]),
                  _mm512_reduce_add_pd(dsum[2]));
    }
}

#define WALK_CASE(MODE, ST)                                                              \
    for (Py_ssize_t i = hi - 1; i >= lo; i--)                                            \
        walk_one(c, &W, i, MODE, ST);                                                    \
    break;

CT_WALK_FN static void walk_f32(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    WalkK W;
    const int gae = c->mode == GAE_SKIP || c->mode == GAE_MUL;
    const double cf = gae ? (double)(float)c->gl : (double)(float)c->g;
    double p = cf;
    for (int j = 0; j < 4; j++, p = p * p)
        W.pw[j] = _mm512_set1_ps((float)p);
    for (int m = 0; m < 32; m++)
        W.rv[m] = m > 16 ? 0.0f : (float)pow(cf, 16 - m);
    MODE_SWITCH(WALK_CASE)
    if (c->nt)
        _mm_sfence();
}
#undef WALK_CASE

#define F32_CASE(MODE, ST)                                                               \
    for (Py_ssize_t g0 = hi; g0 > lo; g0 -= 16) {                                        \
        Py_ssize_t first = g0 - 16 < lo ? lo : g0 - 16;                                  \
        vec_group16(c, first, (int)(g0 - first), MODE, ST);                              \
    }                                                                                    \
    break;

CT_AVX512_FN static void scan_f32(const Ctx *c, Py_ssize_t lo, Py_ssize_t hi) {
    MODE_SWITCH(F32_CASE)
    if (c->nt)
        _mm_sfence();
}
#undef F32_CASE
#endif /* CT_AVX2 */

/* ------------------------------------------------------------------ threads */

enum { PH_SCAN = 0, PH_ROWSTATS = 1, PH_WHITEN = 2 };

/* The widest vector path this CPU has: 2 AVX-512 (F, DQ, VL, BW), 1 AVX2, 0 none; at most
   simd_cap (use_simd: tests reach every path on one machine) */
static int simd_cap = 2;

static int simd_have(void) {
#if CT_AVX2
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = !__builtin_cpu_supports("avx2")       ? 0
                : __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")
                    ? 2
                    : 1;
    }
    return known;
#else
    return 0;
#endif
}

static int simd_level(void) {
    int h = simd_have();
    return h < simd_cap ? h : simd_cap;
}

static void run_phase(const Ctx *c, int phase, Py_ssize_t lo, Py_ssize_t hi) {
    if (phase == PH_SCAN) {
#if CT_AVX2
        if (c->vec == 4) {
            walk_f32(c, lo, hi);
            return;
        }
        if (c->vec == 3) {
            scan_f32(c, lo, hi);
            return;
        }
        if (c->vec == 2) {
            scan_avx512(c, lo, hi);
            return;
        }
        if (c->vec == 1) {
            scan_avx2(c, lo, hi);
            return;
        }
#endif
        scan_scalar(c, lo, hi);
    } else if (phase == PH_ROWSTATS) {
        row_stats(c, lo, hi);
    } else {
#if CT_AVX2
        int level = simd_level();
        if (level == 2) {
            whiten_avx512(c, lo, hi);
            return;
        }
        if (level == 1) {
            whiten_avx2(c, lo, hi);
            return;
        }
#endif
        whiten_scalar(c, lo, hi);
    }
}

#define MAX_THREADS 16

typedef struct {
    const Ctx *c;
    int phase;
    Py_ssize_t chunk;
    Py_ssize_t next; /* the first response not yet taken (atomic) */
} Work;

/* take chunks of responses until none is left: a thread slowed down (another process on
   its core) takes fewer, so the call does not wait on a fixed half */
static void worker(void *arg) {
    Work *w = (Work *)arg;
    for (;;) {
#if defined(__GNUC__)
        Py_ssize_t lo = __atomic_fetch_add(&w->next, w->chunk, __ATOMIC_RELAXED);
#else
        Py_ssize_t lo = w->next;
        w->next += w->chunk;
#endif
        if (lo >= w->c->n)
            break;
        Py_ssize_t hi = lo + w->chunk < w->c->n ? lo + w->chunk : w->c->n;
        run_phase(w->c, w->phase, lo, hi);
    }
}

/* responses [0, n) in chunks over `threads` threads (the caller's one of them; _cpool.h:
   torch's OpenMP team where loaded); chunks of whole 8-response groups for the AVX2 path,
   about 64K tokens each */
static void parallel(const Ctx *c, int phase, int threads) {
    Py_ssize_t n = c->n;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > 1 && n > 1) {
        Py_ssize_t per = c->rows ? 1 : (c->P > 0 ? c->P : 1);
        Py_ssize_t chunk = ((Py_ssize_t)1 << 16) / per;
        Py_ssize_t most = (n + 2 * threads - 1) / (2 * threads); /* >= 2 chunks a thread */
        if (chunk > most)
            chunk = most;
        if (chunk < 1)
            chunk = 1;
        if (c->vec && c->vec != 4) /* (the row walk takes any rows) */
            chunk = (chunk + 15) / 16 * 16; /* whole groups (8 rows, or 16 in float32) */
        Work w = {c, phase, chunk, 0};
        pool_run(worker, &w, threads);
        return;
    }
    run_phase(c, phase, 0, n);
}

/* ------------------------------------------------------------------ arguments */

static int data_kind(const Py_buffer *b, int out) {
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    else if (*f == '>' || *f == '!')
        return 0;
    if (f[0] == '\0' || f[1] != '\0')
        return 0;
    if (*f == 'f' && b->itemsize == 4)
        return K_F4;
    if (*f == 'd' && b->itemsize == 8)
        return K_F8;
    if (!out && *f == 'h' && b->itemsize == 2)
        return K_BF16;
    return 0;
}

static int mask_kind(const Py_buffer *b) {
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    else if (*f == '>' || *f == '!')
        return 0;
    if (f[0] == '\0' || f[1] != '\0')
        return 0;
    if (*f == 'f' && b->itemsize == 4)
        return K_F4;
    if (*f == 'd' && b->itemsize == 8)
        return K_F8;
    if (strchr("?bBhHiIlLqQnN", *f) == NULL)
        return 0;
    switch (b->itemsize) {
    case 1: return K_I1;
    case 2: return K_I2;
    case 4: return K_I4;
    case 8: return K_I8;
    default: return 0;
    }
}

typedef struct {
    Py_buffer views[8];
    int nviews;
} Views;

static void release(Views *vs) {
    for (int i = 0; i < vs->nviews; i++)
        PyBuffer_Release(&vs->views[i]);
    vs->nviews = 0;
}

/* a [R, P] array argument: kind (0: data, 1: output, 2: mask), shape checked */
static int get_arr(Views *vs, PyObject *o, const char *name, int role, Arr *a,
                   Py_ssize_t *R, Py_ssize_t *P) {
    Py_buffer *b = &vs->views[vs->nviews];
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (role == 1 ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, b, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a%s 2-D array (buffer protocol), got %.100s",
                     name, role == 1 ? " writable" : "", Py_TYPE(o)->tp_name);
        return -1;
    }
    vs->nviews++;
    if (b->ndim != 2) {
        PyErr_Format(PyExc_ValueError, "%s must be 2-D [rows, tokens], got %d dimensions",
                     name, b->ndim);
        return -1;
    }
    int kind = role == 2 ? mask_kind(b) : data_kind(b, role == 1);
    if (!kind) {
        PyErr_Format(PyExc_TypeError, "%s has an unsupported element format '%s' (itemsize %zd)",
                     name, b->format ? b->format : "B", b->itemsize);
        return -1;
    }
    if (*R < 0) {
        *R = b->shape[0];
        *P = b->shape[1];
    } else if (b->shape[0] != *R || b->shape[1] != *P) {
        PyErr_Format(PyExc_ValueError, "%s must have shape [%zd, %zd], got [%zd, %zd]", name,
                     *R, *P, b->shape[0], b->shape[1]);
        return -1;
    }
    a->p = (char *)b->buf;
    a->rs = b->strides ? b->strides[0] : b->itemsize * b->shape[1];
    a->ts = b->strides ? b->strides[1] : b->itemsize;
    a->kind = kind;
    return 0;
}

static int get_index(Views *vs, PyObject *o, const char *name, const int64_t **out,
                     Py_ssize_t *n) {
    Py_buffer *b = &vs->views[vs->nviews];
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "layout's %s must be a contiguous int64 array", name);
        return -1;
    }
    vs->nviews++;
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    if (b->ndim != 1 || b->itemsize != 8 || strchr("lLqQ", *f) == NULL) {
        PyErr_Format(PyExc_TypeError, "layout's %s must be a 1-D int64 array", name);
        return -1;
    }
    if (*n >= 0 && b->shape[0] != *n) {
        PyErr_Format(PyExc_ValueError, "layout's %s must have %zd entries, got %zd", name, *n,
                     b->shape[0]);
        return -1;
    }
    *n = b->shape[0];
    *out = (const int64_t *)b->buf;
    return 0;
}

/* ------------------------------------------------------------------ run() */

static const char run_doc[] =
    "run(mode, r, v, m, src, layout, g, gl, out0, out1, wmode, count_eps, eps, unbiased,\n"
    "    shift, fill, threads)\n\n"
    "mode 0-3: _token_cpu's scans (GAE_SKIP, GAE_MUL, RET_SKIP, RET_MUL) of r (and v) into\n"
    "out0 (and out1); mode 4: masked_whiten of src into out0. layout: None (padded, one\n"
    "response per row) or (rows, starts, lens) int64 arrays. wmode 0: no whitening, 1:\n"
    "whiten out0 (count_eps, eps, unbiased, shift, fill), 2: only fill masked tokens of\n"
    "out0. fill: None or a float. threads: how many threads may share the work.";

static PyObject *run(PyObject *self, PyObject *args) {
    int mode, wmode, unbiased, shift, threads;
    PyObject *r, *v, *m, *src, *layout, *out0, *out1, *fill;
    double g, gl, count_eps, eps;
    (void)self;
    if (!PyArg_ParseTuple(args, "iOOOOOddOOiddppOi:run", &mode, &r, &v, &m, &src, &layout, &g,
                          &gl, &out0, &out1, &wmode, &count_eps, &eps, &unbiased, &shift, &fill,
                          &threads))
        return NULL;
    if (mode < GAE_SKIP || mode > STATS) {
        PyErr_Format(PyExc_ValueError, "mode must be 0-4, got %d", mode);
        return NULL;
    }
    if (wmode < W_NONE || wmode > W_FILL) {
        PyErr_Format(PyExc_ValueError, "wmode must be 0-2, got %d", wmode);
        return NULL;
    }
    if (mode == STATS && wmode != W_STATS) {
        PyErr_SetString(PyExc_ValueError, "mode 4 (masked_whiten) takes wmode 1");
        return NULL;
    }
    Ctx c;
    memset(&c, 0, sizeof c);
    Views vs;
    vs.nviews = 0;
    Py_ssize_t R = -1, P = -1;
    double *stats = NULL;
    c.mode = mode;
    c.g = g;
    c.gl = gl;
    int two = mode == GAE_SKIP || mode == GAE_MUL;
    if (mode == STATS) {
        if (get_arr(&vs, src, "src", 0, &c.src, &R, &P) < 0)
            goto fail;
    } else {
        if (get_arr(&vs, r, "r", 0, &c.r, &R, &P) < 0)
            goto fail;
        if (two) {
            if (v == Py_None) {
                PyErr_SetString(PyExc_TypeError, "v must be an array for the GAE modes");
                goto fail;
            }
            if (get_arr(&vs, v, "v", 0, &c.v, &R, &P) < 0)
                goto fail;
            c.has_v = 1;
        }
    }
    if (get_arr(&vs, m, "m", 2, &c.m, &R, &P) < 0)
        goto fail;
    if (get_arr(&vs, out0, "out0", 1, &c.o0, &R, &P) < 0)
        goto fail;
    if (two) {
        if (out1 == Py_None) {
            PyErr_SetString(PyExc_TypeError, "out1 must be an array for the GAE modes");
            goto fail;
        }
        if (get_arr(&vs, out1, "out1", 1, &c.o1, &R, &P) < 0)
            goto fail;
        c.has_o1 = 1;
    } else {
        c.o1 = c.o0;
    }
    if (!c.has_v)
        c.v = c.r;
    c.P = P;
    if (layout == Py_None) {
        c.n = R;
    } else {
        PyObject *rows, *starts, *lens;
        if (!PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != 3) {
            PyErr_SetString(PyExc_TypeError, "layout must be None or (rows, starts, lens)");
            goto fail;
        }
        rows = PyTuple_GET_ITEM(layout, 0);
        starts = PyTuple_GET_ITEM(layout, 1);
        lens = PyTuple_GET_ITEM(layout, 2);
        Py_ssize_t n = -1;
        if (get_index(&vs, rows, "rows", &c.rows, &n) < 0 ||
            get_index(&vs, starts, "starts", &c.starts, &n) < 0 ||
            get_index(&vs, lens, "lens", &c.lens, &n) < 0)
            goto fail;
        c.n = n;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t rw = c.rows[i], s = c.starts[i], l = c.lens[i];
            if (rw < 0 || rw >= R || s < 0 || l < 0 || s > P || l > P - s) {
                PyErr_Format(PyExc_ValueError,
                             "cu_seqlens: response %zd (start %lld, length %lld) lies outside "
                             "the %zd tokens of the data",
                             i, (long long)s, (long long)l, P);
                goto fail;
            }
        }
    }
    c.out_f32 = c.o0.kind == K_F4;
    c.wmode = wmode;
    c.want_stats = wmode == W_STATS;
    c.unbiased = unbiased;
    c.shift = shift;
    c.count_eps = count_eps;
    c.eps = eps;
    if (fill != Py_None) {
        c.fill = PyFloat_AsDouble(fill);
        if (c.fill == -1.0 && PyErr_Occurred())
            goto fail;
        c.has_fill = 1;
    }
    if (c.n > 0) {
        stats = (double *)PyMem_RawCalloc((size_t)c.n * 3, sizeof(double));
        if (!stats) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    c.stats = stats;
    c.vec = mode != STATS && c.rows == NULL ? simd_level() : 0;
    /* float32 data and outputs, contiguous tokens: the float32 loop (16 lanes) */
    if (c.vec == 2 && use_f32_path && c.r.kind == K_F4 && c.r.ts == 4 &&
        (!c.has_v || (c.v.kind == K_F4 && c.v.ts == 4)) && c.o0.kind == K_F4 && c.o0.ts == 4 &&
        (!c.has_o1 || (c.o1.kind == K_F4 && c.o1.ts == 4)))
        c.vec = 3;
#if CT_AVX2
    if (c.vec == 3 && use_walk_path && walk_have())
        c.vec = 4; /* ... one response at a time (walk_f32) */
#endif
    /* streamed stores where the outputs are large (NT_MIN_BYTES): every row of both
       outputs float32, contiguous, on 64-byte lines */
    c.nt = c.vec && c.out_f32 && (double)R * (double)P * 8.0 >= NT_MIN_BYTES &&
           c.o0.ts == 4 && c.o0.rs % 64 == 0 && ((uintptr_t)c.o0.p & 63) == 0 &&
           (!c.has_o1 || (c.o1.kind == K_F4 && c.o1.ts == 4 && c.o1.rs % 64 == 0 &&
                          ((uintptr_t)c.o1.p & 63) == 0));
    if (mode != STATS)
        c.src = c.o0; /* the whitening reads the stored advantages back */
    pool_find(); /* with the GIL held */
    if (c.n > 0) {
        Py_BEGIN_ALLOW_THREADS
        parallel(&c, mode == STATS ? PH_ROWSTATS : PH_SCAN, threads);
        if (wmode == W_STATS) {
            finish(&c);
        } else if (wmode == W_FILL) {
            c.mu = 0.0;
            c.rstd = 1.0;
            c.shift = 1;
        }
        if (wmode != W_NONE)
            parallel(&c, PH_WHITEN, threads);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(stats);
    release(&vs);
    if (wmode == W_STATS)
        return Py_BuildValue("(dd)", c.n > 0 ? c.mu : 0.0, c.n > 0 ? c.rstd : 0.0);
    Py_RETURN_NONE;
fail:
    PyMem_RawFree(stats);
    release(&vs);
    return NULL;
}


/* ------------------------------------------------------------------ output blocks */

/* Output buffers that outlive their tensors: a fresh 32 MiB buffer costs its page faults
   (the kernel zeroes every page: about 7 ms per 32 MiB on the 2-core VM, more than the
   scan itself), so the memory of a freed output goes back to a small cache here and the
   next call of the same size takes it, already faulted in. Bounded by a byte limit
   (set_cache_limit; 0 frees every block at once). Blocks are handed to torch through the
   buffer protocol (torch.frombuffer keeps the block alive as long as the tensor). */

#define POOL_MAX 16
#define HUGE_ALIGN ((size_t)2 << 20)

typedef struct {
    void *mem;
    size_t cap;
} Slot;

static Slot pool[POOL_MAX];
static int pool_n = 0;
static size_t pool_bytes = 0, pool_limit = (size_t)512 << 20;
#ifndef _WIN32
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
#define POOL_LOCK() pthread_mutex_lock(&pool_lock)
#define POOL_UNLOCK() pthread_mutex_unlock(&pool_lock)
#else
#define POOL_LOCK()
#define POOL_UNLOCK()
#endif

static void *raw_alloc(size_t cap) {
#ifndef _WIN32
    void *p = NULL;
    if (posix_memalign(&p, cap >= HUGE_ALIGN ? HUGE_ALIGN : 64, cap) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (cap >= HUGE_ALIGN)
        madvise(p, cap / HUGE_ALIGN * HUGE_ALIGN, MADV_HUGEPAGE); /* advice only */
#endif
    return p;
#else
    return malloc(cap);
#endif
}

static void *pool_get(size_t size, size_t *cap) {
    void *p = NULL;
    POOL_LOCK();
    int best = -1;
    for (int i = 0; i < pool_n; i++) /* the smallest block that holds it, up to 1.25x */
        if (pool[i].cap >= size && pool[i].cap - size <= size / 4 &&
            (best < 0 || pool[i].cap < pool[best].cap))
            best = i;
    if (best >= 0) {
        p = pool[best].mem;
        *cap = pool[best].cap;
        pool_bytes -= pool[best].cap;
        pool[best] = pool[--pool_n];
    }
    POOL_UNLOCK();
    if (!p) {
        *cap = size > 0 ? size : 1;
        p = raw_alloc(*cap);
    }
    return p;
}

static void pool_put(void *mem, size_t cap) {
    void *drop = mem;
    POOL_LOCK();
    if (pool_limit > 0 && cap <= pool_limit) {
        while (pool_n > 0 && (pool_n == POOL_MAX || pool_bytes + cap > pool_limit)) {
            /* make room: the oldest block goes */
            free(pool[0].mem);
            pool_bytes -= pool[0].cap;
            memmove(pool, pool + 1, sizeof(Slot) * (size_t)(--pool_n));
        }
        pool[pool_n].mem = mem;
        pool[pool_n].cap = cap;
        pool_n++;
        pool_bytes += cap;
        drop = NULL;
    }
    POOL_UNLOCK();
    free(drop);
}

typedef struct {
    PyObject_HEAD void *mem;
    size_t cap;
    Py_ssize_t size;
    size_t off; /* the tensor's data: mem + off */
} Block;

/* Where in its block an output starts: _cblocks.h, in turn (a call's two outputs at
   different offsets) */
static unsigned block_turn;

/* size bytes from the cache (or fresh) and where in the block they start (call it with
   the GIL held: the color's turn); NULL where out of memory */
static void *blocks_get(size_t size, size_t *cap, size_t *off) {
    void *mem = pool_get(size + BLOCK_COLOR_SPAN, cap);
    if (mem) /* the first byte at the color's place in a 4 KiB page */
        *off = block_offset(mem, block_turn++);
    return mem;
}

/* The cache to other C code (the scan's replay makes its outputs from it, through
   DLPack, without Python): the capsule "blocks_api" of this module. put() needs no GIL. */
typedef struct {
    void *(*get)(size_t size, size_t *cap, size_t *off);
    void (*put)(void *mem, size_t cap);
} blocks_api_t;
static const blocks_api_t blocks_api = {blocks_get, pool_put};

static int block_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Block *b = (Block *)self;
    return PyBuffer_FillInfo(view, self, (char *)b->mem + b->off, b->size, 0, flags);
}

static void block_dealloc(PyObject *self) {
    Block *b = (Block *)self;
    if (b->mem)
        pool_put(b->mem, b->cap);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs block_as_buffer = {block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0) "rl_triton_core.token._ctoken.Block", /* tp_name */
    sizeof(Block),                                                  /* tp_basicsize */
};

static PyObject *empty(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t size = PyLong_AsSsize_t(arg);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0) {
        PyErr_Format(PyExc_ValueError, "nbytes must be >= 0, got %zd", size);
        return NULL;
    }
    Block *b = PyObject_New(Block, &BlockType);
    if (!b)
        return NULL;
    b->size = size;
    b->off = 0;
    b->mem = blocks_get((size_t)size, &b->cap, &b->off);
    if (!b->mem) {
        b->cap = 0;
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    return (PyObject *)b;
}

static PyObject *set_cache_limit(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t lim = PyLong_AsSsize_t(arg);
    if (lim == -1 && PyErr_Occurred())
        return NULL;
    if (lim < 0) {
        PyErr_Format(PyExc_ValueError, "limit must be >= 0 bytes, got %zd", lim);
        return NULL;
    }
    POOL_LOCK();
    pool_limit = (size_t)lim;
    while (pool_n > 0 && pool_bytes > pool_limit) {
        free(pool[0].mem);
        pool_bytes -= pool[0].cap;
        memmove(pool, pool + 1, sizeof(Slot) * (size_t)(--pool_n));
    }
    POOL_UNLOCK();
    Py_RETURN_NONE;
}

static PyObject *cache_info(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    POOL_LOCK();
    int n = pool_n;
    size_t bytes = pool_bytes, lim = pool_limit;
    POOL_UNLOCK();
    return Py_BuildValue("{s:i,s:n,s:n}", "blocks", n, "bytes", (Py_ssize_t)bytes, "limit",
                         (Py_ssize_t)lim);
}

static PyObject *simd(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    static const char *names[] = {"scalar", "avx2", "avx512"};
    return PyUnicode_FromString(names[simd_level()]);
}

/* use_simd(level): the widest vector path allowed (2 AVX-512, 1 AVX2, 0 scalar); returns
   the previous limit. For tests: every path gives the same bits. */
static PyObject *use_simd(PyObject *self, PyObject *arg) {
    (void)self;
    long want = PyLong_AsLong(arg);
    if (want == -1 && PyErr_Occurred())
        return NULL;
    if (want < 0 || want > 2) {
        PyErr_SetString(PyExc_ValueError, "use_simd: 0 (scalar), 1 (AVX2) or 2 (AVX-512)");
        return NULL;
    }
    int was = simd_cap;
    simd_cap = (int)want;
    return PyLong_FromLong(was);
}

/* use_f32(flag): whether float32 data may take the float32 loop (AVX-512); returns the
   previous setting. For tests: the float64 loops give numba's bits. */
static PyObject *use_f32(PyObject *self, PyObject *arg) {
    (void)self;
    int want = PyObject_IsTrue(arg);
    if (want < 0)
        return NULL;
    int was = use_f32_path;
    use_f32_path = want;
    return PyBool_FromLong(was);
}

static PyObject *use_walk(PyObject *self, PyObject *arg) {
    (void)self;
    int want = PyObject_IsTrue(arg);
    if (want < 0)
        return NULL;
    int was = use_walk_path;
    use_walk_path = want;
    return PyBool_FromLong(was);
}

static PyObject *has_walk(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
#if CT_AVX2
    return PyBool_FromLong(walk_have());
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, run_doc},
    {"use_f32", use_f32, METH_O, "Allow the float32 loop (True) or not; returns the previous setting."},
    {"has_walk", has_walk, METH_NOARGS, "Whether this CPU runs the float32 row walk."},
    {"use_walk", use_walk, METH_O,
     "Let the float32 loop walk one response at a time (True; where the CPU has AVX-512 "
     "VPOPCNTDQ) or take 16 responses a register (False); returns the previous setting."},
    {"simd", simd, METH_NOARGS, "The scan's instruction set here: 'avx512', 'avx2' or 'scalar'."},
    {"use_simd", use_simd, METH_O,
     "use_simd(level): the widest vector path allowed (2 AVX-512, 1 AVX2, 0 scalar); returns "
     "the previous limit (for tests)."},
    {"empty", empty, METH_O, "empty(nbytes): a writable block of memory (from the cache)."},
    {"set_cache_limit", set_cache_limit, METH_O,
     "set_cache_limit(nbytes): how many bytes of freed blocks the cache keeps."},
    {"cache_info", cache_info, METH_NOARGS, "The cache: blocks, bytes, limit."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ctoken",
                                    "The token-level estimators' CPU kernel (C).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ctoken(void) {
    BlockType.tp_dealloc = block_dealloc;
    BlockType.tp_as_buffer = &block_as_buffer;
    BlockType.tp_flags = Py_TPFLAGS_DEFAULT;
    BlockType.tp_doc = "A block of output memory; back to the cache when freed.";
    if (PyType_Ready(&BlockType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    PyObject *cap = PyCapsule_New((void *)&blocks_api, "rl_triton_core._ctoken.blocks_api", NULL);
    if (!cap || PyModule_AddObject(m, "blocks_api", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
