/* The CPU path's scan kernel for GAE and TD(lambda), in C: no JIT, so a fresh process
 * computes its first call at full speed.
 *
 * The recurrence runs backwards in time, h_t = alpha_t + beta_t h_{t+1} (h_T = 0):
 *
 *   GAE:        alpha = (r + [not te] gamma V') - V       beta = [not done] gamma lambda
 *               out0 = h (the advantage), out1 = h + V (the value target)
 *   TD(lambda): l' = [t + 1 < T and not done] lambda
 *               alpha = r + [not te] gamma (1 - l') V'      beta = [not te] gamma l'
 *               out0 = h (the return)
 *
 * Float32 data is computed in float32 where the CPU has AVX-512 (with AVX2 only, the
 * row walk's contiguous calls too, fast_units256; the rest as float64 data: see
 * use_vec8), as the GPU kernel computes it, by the fast walks
 * (fast_stream: a stream 16 steps a vector, with an in-register scan whose compositions
 * are fused multiply-adds, on AVX-512 as masked rounds in fast_units512, where a few
 * long streams are cut into segments for the threads and fixed up; fastcol_block: 16
 * time-major streams a vector). Float64 data is computed with the coefficients of
 * rl_triton_core/_cpu.py (_coefficients), in float64, in the same order of operations
 * and without fused multiply-adds (compiled with -ffp-contract=off): every output is bit
 * for bit the numba loop's.
 *
 * V' is next_values where given, else V_{t+1} (at t = T - 1 the bootstrap, or 0). A set
 * flag (nonzero, in the flag's own dtype) cuts by a select, never by a product: 0 * NaN
 * is NaN. h = alpha exactly where beta is 0.
 *
 * Arrays arrive as [N1, N2, T] strided views (numpy, through the buffer protocol), any
 * strides, any float32 / float64 data and any bool / integer / float flags. Two ways
 * through memory, chosen by which axis of the rewards is contiguous (float32 data takes
 * the fast walk of the same kind, further below; float64 data these):
 *
 *  - columns (time-major data, streams contiguous): a block of streams advances one
 *    step at a time; every load, the recurrence and every store are vectorised across
 *    the block's streams.
 *  - rows (batch-major data, each stream contiguous in time): a group of W lanes, each a
 *    stream or a segment of one, is walked in chunks of K steps. Per lane, the
 *    coefficients of the chunk are computed vectorised along time; then the W
 *    recurrences advance together (W independent dependency chains: the latency of one
 *    multiply-add chain is hidden); then the outputs are stored vectorised along time.
 *    A long stream that would leave threads or lanes idle is cut into segments, each
 *    started from h = 0. That start is wrong only until the segment's first step with
 *    beta = 0 (from there h = alpha exactly); a fix-up then walks the segments in scan
 *    order and recomputes each one's steps up to that point from the true carry, so the
 *    results are those of one sequential pass, bit for bit. (A segment without such a
 *    step is recomputed whole.)
 *
 * Work is split over threads (_cpool.h: torch's OpenMP team where loaded) with the GIL
 * released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef _WIN32
#include <sched.h>
#endif
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#include "_cblocks.h"
#include "_cpool.h"

#define MODE_GAE 1
#define MODE_TDLAMBDA 2

#define W 8         /* lanes of the row walk */
#define K 128       /* steps per chunk of the row walk */
#define WC 256      /* streams per block of the column walk */
#define WF 128      /* streams per block of the fast column walk */

typedef Py_ssize_t ssz;

/* The walks are compiled for three instruction sets and the widest this CPU has is
 * chosen when the module loads (gcc's function multiversioning; AVX-512 ran the
 * time-major walk 2x faster than SSE2). Everything they call is inlined into them. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MULTIVERSION \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif
#if defined(_MSC_VER)
#define INLINE static __forceinline
#define restrict __restrict
#else
#define INLINE static inline __attribute__((always_inline))
#endif
/* the buffers a loop reads and writes never overlap: no runtime alias checks (whose
 * failure would run the loop's scalar version) */
#if defined(__GNUC__) && !defined(__clang__)
#define NOALIAS _Pragma("GCC ivdep")
#else
#define NOALIAS
#endif

/* dtype kinds */
enum { K_F32, K_F64, K_I8, K_I16, K_I32, K_I64 };

typedef struct {
    char *p;       /* NULL: absent */
    ssz s0, s1, st; /* byte strides of [N1, N2, T] (boot: s0, s1) */
    int kind;
} arr_t;

typedef struct {
    int mode, two_out, has_v, has_nv, has_trunc, has_boot, g_t, l_t;
    ssz N1, N2, T;
    double gs, lms;
    arr_t o0, o1, x, v, nv, te, tr, boot, g, lm;
    /* the row walk's lanes: stream n, steps [lo, hi) */
    ssz nlanes, seg, S;
    double *h_end; /* per lane: h at its lowest step (segmented streams) */
    int columns;
    int fast; /* the fast row walk (fast_stream): a stream a unit */
    int fastcol; /* the fast column walk (fastcol_block): WF streams a unit */
    ssz nblocks;
} ctx_t;

INLINE ssz off3(const arr_t *a, ssz n, ssz N2) {
    if (N2 == 1) return n * a->s0; /* no division (a stream a row, the common case) */
    return (n / N2) * a->s0 + (n % N2) * a->s1;
}

/* ---------------------------------------------------------------- loads and stores */

/* dst[k] = a[base + k * stride] as float64, k < n */
INLINE void load_d(double *restrict dst, const arr_t *a, ssz base, ssz stride, ssz n) {
    const char *p = a->p + base;
    ssz k;
    if (a->kind == K_F32) {
        if (stride == 4) {
            const float *restrict q = (const float *)p;
            for (k = 0; k < n; k++) dst[k] = (double)q[k];
        } else {
            for (k = 0; k < n; k++) dst[k] = (double)*(const float *)(p + k * stride);
        }
    } else {
        if (stride == 8) {
            const double *restrict q = (const double *)p;
            for (k = 0; k < n; k++) dst[k] = q[k];
        } else {
            for (k = 0; k < n; k++) dst[k] = *(const double *)(p + k * stride);
        }
    }
}

/* dst[k] = 1.0 where a[base + k * stride] != 0 (a flag: set where nonzero, NaN
 * included), else 0.0: as wide as the data, so the coefficient loops select without
 * widening bytes */
INLINE void load_m(double *restrict dst, const arr_t *a, ssz base, ssz stride, ssz n) {
    const char *p = a->p + base;
    ssz k;
#define LOADM(T_, SZ)                                                                 \
    if (stride == SZ) {                                                               \
        const T_ *restrict q = (const T_ *)p;                                         \
        for (k = 0; k < n; k++) dst[k] = q[k] != 0 ? 1.0 : 0.0;                       \
    } else {                                                                          \
        for (k = 0; k < n; k++) dst[k] = *(const T_ *)(p + k * stride) != 0 ? 1.0 : 0.0; \
    }
    switch (a->kind) {
    case K_F32: LOADM(float, 4) break;
    case K_F64: LOADM(double, 8) break;
    case K_I8: LOADM(uint8_t, 1) break;
    case K_I16: LOADM(int16_t, 2) break;
    case K_I32: LOADM(int32_t, 4) break;
    default: LOADM(int64_t, 8) break;
    }
#undef LOADM
}

/* a[base + k * stride] = src[k] (+ add[k]), rounded once into a's dtype */
INLINE void store_d(const arr_t *a, ssz base, ssz stride, ssz n, const double *restrict src,
                    const double *restrict add) {
    char *p = a->p + base;
    ssz k;
    if (a->kind == K_F32) {
        if (stride == 4) {
            float *restrict q = (float *)p;
            if (add) for (k = 0; k < n; k++) q[k] = (float)(src[k] + add[k]);
            else for (k = 0; k < n; k++) q[k] = (float)src[k];
        } else {
            if (add) for (k = 0; k < n; k++) *(float *)(p + k * stride) = (float)(src[k] + add[k]);
            else for (k = 0; k < n; k++) *(float *)(p + k * stride) = (float)src[k];
        }
    } else {
        if (stride == 8) {
            double *restrict q = (double *)p;
            if (add) for (k = 0; k < n; k++) q[k] = src[k] + add[k];
            else for (k = 0; k < n; k++) q[k] = src[k];
        } else {
            if (add) for (k = 0; k < n; k++) *(double *)(p + k * stride) = src[k] + add[k];
            else for (k = 0; k < n; k++) *(double *)(p + k * stride) = src[k];
        }
    }
}

INLINE double get1(const arr_t *a, ssz byte_off) {
    const char *p = a->p + byte_off;
    return a->kind == K_F32 ? (double)*(const float *)p : *(const double *)p;
}


/* ------------------------------------------------------------------ coefficients */

/* alpha, beta of n steps from their inputs (vectorised: no branch, selects only). G, L:
 * gamma, lambda per step (filled with the number where it is one); TR: zeros without
 * truncation flags. Elements k >= no_next have no successor in their stream (TD(lambda)'s
 * l' = 0 there): n - 1 for a chunk that ends a stream, 0 for a row of steps T - 1. */
INLINE void coefs(const ctx_t *c, ssz n, const double *restrict X, const double *restrict V,
                  const double *restrict NV, const double *restrict TE,
                  const double *restrict TR, const double *restrict G,
                  const double *restrict L, ssz no_next, double *restrict A,
                  double *restrict B) {
    ssz k;
    if (c->mode == MODE_GAE) {
        NOALIAS for (k = 0; k < n; k++) {
            const double gamma = G[k], lmbda = L[k];
            const int te = TE[k] != 0.0;
            const int done = (TE[k] + TR[k]) != 0.0;
            const double bnv = te ? 0.0 : gamma * NV[k];
            A[k] = X[k] + bnv - V[k];
            B[k] = done ? 0.0 : gamma * lmbda;
        }
    } else {
        NOALIAS for (k = 0; k < n; k++) {
            const double gamma = G[k], lmbda = L[k];
            const int te = TE[k] != 0.0;
            const int done = (TE[k] + TR[k]) != 0.0;
            const int nonext = k >= no_next;
            const double lc = (nonext | done) ? 0.0 : lmbda;
            A[k] = X[k] + (te ? 0.0 : gamma * (1.0 - lc) * NV[k]);
            B[k] = te ? 0.0 : gamma * lc;
        }
    }
}

/* 8 doubles as one vector (gcc's vector extensions: AVX-512 registers where the CPU has
 * them, pairs or quadruples of narrower ones elsewhere; the same IEEE operations). Other
 * compilers take the scalar loop. */
#if defined(__GNUC__) && !defined(__clang__)
#define VEC8 1
typedef double v8d __attribute__((vector_size(64)));
typedef long long v8i __attribute__((vector_size(64)));

/* r[i][j] -> r[j][i] for an 8 x 8 block, in three rounds of pairwise shuffles */
INLINE void transpose8(v8d *r) {
    const v8i lo1 = {0, 8, 2, 10, 4, 12, 6, 14}, hi1 = {1, 9, 3, 11, 5, 13, 7, 15};
    const v8i lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8i lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    v8d t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shuffle(r[i], r[i + 1], lo1);
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], hi1);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = __builtin_shuffle(t[i], t[i + 2], lo2);
        u[i + 1] = __builtin_shuffle(t[i + 1], t[i + 3], lo2);
        u[i + 2] = __builtin_shuffle(t[i], t[i + 2], hi2);
        u[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], hi2);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = __builtin_shuffle(u[i], u[i + 4], lo4);
        r[i + 4] = __builtin_shuffle(u[i], u[i + 4], hi4);
    }
}
#else
#define VEC8 0
#endif

/* The vector recurrence pays only with 512-bit registers: in AVX2, the transposes of
 * 8-wide vectors cost more than the scalar loop saves (4096 x 128 on one thread: 2.06 ms
 * against 1.42 for the scalar loop). So do the fast walks (their 16-lane vectors, split
 * in two for AVX2, shuffle across the halves): built for AVX2 they took 4.3 ms at
 * 4096 x 128 on one thread against 1.0 for the float64 row walk, 3.2 against 0.46 at
 * 128 x 4096 time-major, 0.55 against 0.22 on a 100,000-step stream. Set when the
 * module loads. */
static int use_vec8 = 0;
/* the fast walks (see fast_stream), where use_vec8; off only in tests, to reach the
 * other walks */
static int use_fast = 1;
/* the fast row walk's AVX-512 path (fast_units512); off only in tests, to reach the
 * generic fast walk */
static int use_512 = 1;
/* the fast row walk on AVX2 (fast_units256) where the CPU has no AVX-512; for contiguous
 * calls with gamma and lambda numbers (the others take the float64 walks there); tests
 * switch it off, or on where use_512 is off */
static int use_256 = 1;
static int has_avx2 = 0; /* set when the module loads */

/* ---------------------------------------------------------------------- row walk */

/* rows padded off multiples of 4 KiB apart: a load that aliases an earlier store there
 * (4K aliasing) stalls until the store is done */
#define KP (K + 24)
typedef struct {
    double A[W][KP], B[W][KP + 40], V[W][KP];
    double X[K], NV[K], G[K], L[K], TE[K], TR[K];
} rowbuf_t;

INLINE void lane_of(const ctx_t *c, ssz lane, ssz *n, ssz *lo, ssz *hi) {
    const ssz s = lane % c->S;
    *n = lane / c->S;
    *lo = s * c->seg;
    *hi = *lo + c->seg < c->T ? *lo + c->seg : c->T;
}

/* a fresh row buffer: the per-step coefficients that are numbers, and no truncation,
 * filled in once (never overwritten where they are not loaded) */
static rowbuf_t *rowbuf_new(const ctx_t *c) {
    rowbuf_t *bf = (rowbuf_t *)malloc(sizeof(rowbuf_t));
    if (!bf) return NULL;
    for (int k = 0; k < K; k++) {
        bf->G[k] = c->gs;
        bf->L[k] = c->lms;
        bf->TR[k] = 0.0;
    }
    return bf;
}

/* the cache lines of steps [t_lo, t_hi) of array a, stream n, asked for ahead of use:
 * a group's lanes walk up to 8 x 7 streams of memory at once, more than the hardware
 * prefetchers follow (a 100,000-step stream in 8 segments from cold caches: 2.8x slower
 * than from warm ones without this) */
INLINE void prefetch(const arr_t *a, ssz n, ssz N2, ssz t_lo, ssz t_hi, int write) {
    if (!a->p || t_hi <= t_lo) return;
    const char *p0 = a->p + off3(a, n, N2) + t_lo * a->st;
    const ssz bytes = (t_hi - t_lo) * a->st;
    if (bytes <= 0) return; /* a broadcast (stride 0) or reversed axis: nothing to stream */
    for (ssz o = 0; o < bytes; o += 64) {
        if (write) __builtin_prefetch(p0 + o, 1, 3);
        else __builtin_prefetch(p0 + o, 0, 3);
    }
}

/* chunk [t_lo, t_hi) of stream n into lane l's A, B, V (V[l][q] = V_t; q = t - t_lo);
 * the chunk after it (in scan order: [t_lo - K, t_lo)) is prefetched */
INLINE void row_load(const ctx_t *c, rowbuf_t *bf, int l, ssz n, ssz t_lo, ssz t_hi) {
    const ssz N2 = c->N2, T = c->T, m = t_hi - t_lo;
    {
        const ssz p_lo = t_lo - K > 0 ? t_lo - K : 0, p_hi = t_lo;
        prefetch(&c->x, n, N2, p_lo, p_hi, 0);
        if (c->has_v) prefetch(&c->v, n, N2, p_lo, p_hi, 0);
        if (c->has_nv) prefetch(&c->nv, n, N2, p_lo, p_hi, 0);
        prefetch(&c->te, n, N2, p_lo, p_hi, 0);
        if (c->has_trunc) prefetch(&c->tr, n, N2, p_lo, p_hi, 0);
        prefetch(&c->o0, n, N2, p_lo, p_hi, 1);
        if (c->two_out) prefetch(&c->o1, n, N2, p_lo, p_hi, 1);
    }
    double *V = bf->V[l];
    load_d(bf->X, &c->x, off3(&c->x, n, N2) + t_lo * c->x.st, c->x.st, m);
    if (c->has_v) {
        const ssz mv = t_hi < T ? m + 1 : m; /* and V_{t_hi} where it exists */
        load_d(V, &c->v, off3(&c->v, n, N2) + t_lo * c->v.st, c->v.st, mv);
    } else {
        memset(V, 0, sizeof(double) * (m + 1));
    }
    const double *NV;
    if (c->has_nv) {
        load_d(bf->NV, &c->nv, off3(&c->nv, n, N2) + t_lo * c->nv.st, c->nv.st, m);
        NV = bf->NV;
    } else {
        if (t_hi >= T) /* the step after the stream's last: the bootstrap */
            V[m] = c->has_boot ? get1(&c->boot, off3(&c->boot, n, N2)) : 0.0;
        NV = V + 1;
    }
    load_m(bf->TE, &c->te, off3(&c->te, n, N2) + t_lo * c->te.st, c->te.st, m);
    if (c->has_trunc) load_m(bf->TR, &c->tr, off3(&c->tr, n, N2) + t_lo * c->tr.st, c->tr.st, m);
    if (c->g_t) load_d(bf->G, &c->g, off3(&c->g, n, N2) + t_lo * c->g.st, c->g.st, m);
    if (c->l_t) load_d(bf->L, &c->lm, off3(&c->lm, n, N2) + t_lo * c->lm.st, c->lm.st, m);
    coefs(c, m, bf->X, V, NV, bf->TE, bf->TR, bf->G, bf->L, t_hi >= T ? m - 1 : m, bf->A[l],
          bf->B[l]);
}

INLINE void row_store(const ctx_t *c, rowbuf_t *bf, int l, ssz n, ssz t_lo, ssz t_hi) {
    const ssz N2 = c->N2, m = t_hi - t_lo;
    store_d(&c->o0, off3(&c->o0, n, N2) + t_lo * c->o0.st, c->o0.st, m, bf->A[l], NULL);
    if (c->two_out)
        store_d(&c->o1, off3(&c->o1, n, N2) + t_lo * c->o1.st, c->o1.st, m, bf->A[l],
                bf->V[l]);
}

/* lanes [g0, g1) (g1 - g0 <= W), walked together chunk by chunk */
INLINE void row_group(const ctx_t *c, rowbuf_t *bf, ssz g0, ssz g1) {
    const int nl = (int)(g1 - g0);
    ssz n[W], lo[W], hi[W], len[W], maxlen = 0;
    double h[W];
    int l;
    for (l = 0; l < nl; l++) {
        lane_of(c, g0 + l, &n[l], &lo[l], &hi[l]);
        len[l] = hi[l] - lo[l];
        if (len[l] > maxlen) maxlen = len[l];
        h[l] = 0.0;
    }
    for (ssz r0 = 0; r0 < maxlen; r0 += K) {
        /* this chunk: scan steps [r0, r0 + K) from each lane's top, t = hi - 1 - r */
        ssz tlo[W], thi[W];
        int same = 1;
        for (l = 0; l < nl; l++) {
            thi[l] = hi[l] - r0;
            tlo[l] = thi[l] - K > lo[l] ? thi[l] - K : lo[l];
            if (thi[l] < tlo[l]) thi[l] = tlo[l];
            if (thi[l] - tlo[l] != thi[0] - tlo[0]) same = 0;
            if (thi[l] > tlo[l]) row_load(c, bf, l, n[l], tlo[l], thi[l]);
        }
#if VEC8
        if (use_vec8 && same && nl == W) {
            const ssz m = thi[0] - tlo[0], m8 = m & ~(ssz)7;
            /* the top steps that do not fill a block of 8, one lane at a time */
            for (l = 0; l < W; l++) {
                double hl = h[l];
                for (ssz q = m - 1; q >= m8; q--) {
                    const double a = bf->A[l][q], b = bf->B[l][q];
                    hl = b == 0.0 ? a : a + b * hl;
                    bf->A[l][q] = hl;
                }
                h[l] = hl;
            }
            /* then blocks of 8 steps: the lanes' rows transposed into 8 vectors of one
             * step each, the 8 recurrences advanced as one vector, transposed back */
            v8d hv;
            memcpy(&hv, h, sizeof(hv));
            for (ssz q0 = m8 - 8; q0 >= 0; q0 -= 8) {
                v8d ra[W], rb[W];
                for (l = 0; l < W; l++) {
                    memcpy(&ra[l], &bf->A[l][q0], sizeof(v8d));
                    memcpy(&rb[l], &bf->B[l][q0], sizeof(v8d));
                }
                transpose8(ra);
                transpose8(rb);
                for (int j = W - 1; j >= 0; j--) {
                    const v8i zero = rb[j] == 0.0; /* beta = 0: h = alpha exactly */
                    const v8d carried = ra[j] + rb[j] * hv;
                    hv = (v8d)(((v8i)ra[j] & zero) | ((v8i)carried & ~zero));
                    ra[j] = hv;
                }
                transpose8(ra);
                for (l = 0; l < W; l++) memcpy(&bf->A[l][q0], &ra[l], sizeof(v8d));
            }
            memcpy(h, &hv, sizeof(hv));
        } else
#endif
        {
            for (l = 0; l < nl; l++) {
                double hl = h[l];
                double *restrict A = bf->A[l];
                const double *restrict B = bf->B[l];
                for (ssz q = thi[l] - tlo[l] - 1; q >= 0; q--) {
                    const double a = A[q], b = B[q];
                    hl = b == 0.0 ? a : a + b * hl;
                    A[q] = hl;
                }
                h[l] = hl;
            }
        }
        for (l = 0; l < nl; l++)
            if (thi[l] > tlo[l]) row_store(c, bf, l, n[l], tlo[l], thi[l]);
    }
    if (c->h_end)
        for (l = 0; l < nl; l++) c->h_end[g0 + l] = h[l];
}

/* The segments of stream n after the walk: each one's steps before its first beta = 0
 * recomputed from the true carry (the walk started them from 0), in scan order, chunk by
 * chunk with the walk's own coefficients (the same bits). */
MULTIVERSION static void row_fixup(const ctx_t *c, rowbuf_t *bf, ssz n) {
    const ssz S = c->S;
    double carry = c->h_end[n * S + S - 1]; /* the last segment started from h_T = 0 */
    for (ssz s = S - 2; s >= 0; s--) {
        const ssz lo = s * c->seg, hi = lo + c->seg;
        double h = carry;
        int reset = 0;
        for (ssz t_hi = hi; t_hi > lo && !reset; t_hi -= K) {
            const ssz t_lo = t_hi - K > lo ? t_hi - K : lo;
            row_load(c, bf, 0, n, t_lo, t_hi);
            double *restrict A = bf->A[0];
            const double *restrict B = bf->B[0];
            ssz q = t_hi - t_lo - 1;
            for (; q >= 0; q--) {
                if (B[q] == 0.0) { /* from here the walk's values are exact */
                    reset = 1;
                    break;
                }
                h = A[q] + B[q] * h;
                A[q] = h;
            }
            /* steps (q, m) were recomputed */
            const ssz from = q + 1, m = t_hi - t_lo;
            if (from < m) {
                const ssz N2 = c->N2;
                store_d(&c->o0, off3(&c->o0, n, N2) + (t_lo + from) * c->o0.st, c->o0.st,
                        m - from, A + from, NULL);
                if (c->two_out)
                    store_d(&c->o1, off3(&c->o1, n, N2) + (t_lo + from) * c->o1.st, c->o1.st,
                            m - from, A + from, bf->V[0] + from);
            }
        }
        carry = reset ? c->h_end[n * S + s] : h;
    }
}

/* ------------------------------------------------------------ the fast row walk */

/* Float32 data in rows (batch-major data and flat streams: each stream's steps at one
 * stride, any stride), computed in float32 as the GPU kernel computes float32 data. Each
 * stream is walked on its own, backwards from its last step, 16 steps at a time:
 *   1. the 16 steps' alpha and beta, as one vector;
 *   2. their suffix maps (A_i, B_i) = (alpha_i, beta_i) o ... o (alpha_15, beta_15), by
 *      four rounds of lane shifts (an in-register scan: the same tree on every call);
 *   3. h_i = A_i + B_i c, with c the h of the step above the 16 (broadcast from lane 0
 *      of the previous vector).
 * Only step 3 is sequential, one multiply-add per 16 steps: a stream runs at the speed of
 * its loads and needs no segments. The bits depend on the values only: not on the
 * number of threads (a stream is one thread's), the strides, or the flags' dtype
 * (contiguous float32 data and byte or float32 flags load as vectors, the rest one by
 * one into the same vectors). Every composition selects where beta is 0: a done step
 * cuts everything, NaN and inf included. */
#if VEC8
typedef float v16f __attribute__((vector_size(64)));
typedef int v16i __attribute__((vector_size(64)));
typedef signed char v16c __attribute__((vector_size(16)));

INLINE v16f sel16(v16i m, v16f a, v16f b) { /* m ? a : b, lane by lane */
    return (v16f)(((v16i)a & m) | ((v16i)b & ~m));
}

/* elements [t, t + m) of a stream's float32 or float64 array (base p, byte stride st) as
 * float32 lanes 0..m-1, the others 0 */
INLINE v16f ldf(const char *p, ssz st, int kind, ssz t, ssz m, const int cont) {
    v16f f = {0};
    if (cont && m == 16) {
        memcpy(&f, p + 4 * t, sizeof(f));
    } else if (m == 16 && kind == K_F32 && st == 4) {
        memcpy(&f, p + 4 * t, sizeof(f));
    } else if (kind == K_F32) {
        for (ssz k = 0; k < m; k++) f[k] = *(const float *)(p + (t + k) * st);
    } else {
        for (ssz k = 0; k < m; k++) f[k] = (float)*(const double *)(p + (t + k) * st);
    }
    return f;
}

INLINE int flag_at(const char *q, int kind) { /* set where nonzero, NaN included */
    switch (kind) {
    case K_F32: return *(const float *)q != 0.0f;
    case K_F64: return *(const double *)q != 0.0;
    case K_I8: return *(const uint8_t *)q != 0;
    case K_I16: return *(const int16_t *)q != 0;
    case K_I32: return *(const int32_t *)q != 0;
    default: return *(const int64_t *)q != 0;
    }
}

/* flags [t, t + m) as a lane mask (-1 set), lanes past m clear */
INLINE v16i ldm(const char *p, ssz st, int kind, ssz t, ssz m, const int cont) {
    if (cont && m == 16 && kind == K_I8) {
        v16c b;
        memcpy(&b, p + t, sizeof(b));
        return __builtin_convertvector(b != 0, v16i);
    }
    if (cont && m == 16) {
        v16f f;
        memcpy(&f, p + 4 * t, sizeof(f));
        return f != 0.0f;
    }
    if (m == 16 && kind == K_I8 && st == 1) {
        v16c b;
        memcpy(&b, p + t, sizeof(b));
        return __builtin_convertvector(b != 0, v16i);
    }
    if (m == 16 && kind == K_F32 && st == 4) {
        v16f f;
        memcpy(&f, p + 4 * t, sizeof(f));
        return f != 0.0f;
    }
    v16i r = {0};
    for (ssz k = 0; k < m; k++) r[k] = -flag_at(p + (t + k) * st, kind);
    return r;
}

INLINE void stf(char *p, ssz st, ssz t, ssz m, v16f x, const int cont) {
    if (m == 16 && (cont || st == 4)) {
        memcpy(p + 4 * t, &x, sizeof(x));
    } else {
        for (ssz k = 0; k < m; k++) *(float *)(p + (t + k) * st) = x[k];
    }
}

/* lane i takes lane i + s (16: past the end, the shuffle's second operand) */
#define SHIFT1 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
#define SHIFT2 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 16
#define SHIFT4 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 16, 16, 16
#define SHIFT8 8, 9, 10, 11, 12, 13, 14, 15, 16, 16, 16, 16, 16, 16, 16, 16

/* b * x + a lane by lane, fused (one rounding): the fast row walk's compositions, on
 * every path the same operation (the AVX-512 path's masked fused multiply-adds; gcc
 * turns this loop into the vector instruction where the target has one) */
INLINE v16f fma16(v16f b, v16f x, v16f a) {
    v16f r;
    for (int i = 0; i < 16; i++) r[i] = __builtin_fmaf(b[i], x[i], a[i]);
    return r;
}

/* h of 16 steps from their alpha, beta and the carry cv (c in every lane) */
INLINE v16f scan16(v16f a, v16f b, v16f cv) {
    const v16f zero = {0}, one = zero + 1.0f;
#define ROUND(...)                                                                    \
    do {                                                                              \
        const v16i idx = {__VA_ARGS__};                                               \
        const v16f sa = __builtin_shuffle(a, zero, idx), sb = __builtin_shuffle(b, one, idx); \
        a = sel16(b == 0.0f, a, fma16(b, sa, a));                                     \
        b = b * sb;                                                                   \
    } while (0)
    ROUND(SHIFT1);
    ROUND(SHIFT2);
    ROUND(SHIFT4);
    ROUND(SHIFT8);
#undef ROUND
    return sel16(b == 0.0f, a, fma16(b, cv, a));
}

/* whether any lane of m is set */
INLINE int any16(v16i m) {
    typedef unsigned long long v8u __attribute__((vector_size(64)));
    const v8u w = (v8u)m;
    return ((w[0] | w[1]) | (w[2] | w[3]) | (w[4] | w[5]) | (w[6] | w[7])) != 0;
}

/* The suffix maps' B of scan16 where every beta of the 16 steps is the same number c
 * (no flag set, gamma and lambda numbers): B[k] is b before round k (B[0] = c), B[4]
 * after the last. They depend on c only, so a stream computes them once. */
typedef struct {
    v16f B[5];
    v16i Z[5]; /* B[k] == 0: lanes whose product underflowed (the select keeps a there) */
    int uf;    /* some lane did */
} bconst_t;

INLINE bconst_t bconst_of(float c) {
    const v16f zero = {0}, one = zero + 1.0f;
    bconst_t k;
    v16f b = zero + c;
    k.B[0] = b;
#define BROUND(j, ...)                                                                \
    do {                                                                              \
        const v16i idx = {__VA_ARGS__};                                               \
        b = b * __builtin_shuffle(b, one, idx);                                       \
        k.B[j] = b;                                                                   \
    } while (0)
    BROUND(1, SHIFT1);
    BROUND(2, SHIFT2);
    BROUND(3, SHIFT4);
    BROUND(4, SHIFT8);
#undef BROUND
    k.uf = 0;
    for (int j = 0; j < 5; j++) {
        k.Z[j] = k.B[j] == 0.0f;
        k.uf |= any16(k.Z[j]);
    }
    return k;
}

/* scan16 where every beta is c (see bconst_t): the same operations on the same values,
 * so the same bits, without computing B; the selects only where a product underflowed
 * to 0 (a uniform branch: c is the stream's). */
INLINE v16f scan16c(v16f a, const bconst_t *k, v16f cv) {
    const v16f zero = {0};
#define CROUND(j, ...)                                                                \
    do {                                                                              \
        const v16i idx = {__VA_ARGS__};                                               \
        const v16f ab = fma16(k->B[j], __builtin_shuffle(a, zero, idx), a);           \
        a = k->uf ? sel16(k->Z[j], a, ab) : ab;                                       \
    } while (0)
    CROUND(0, SHIFT1);
    CROUND(1, SHIFT2);
    CROUND(2, SHIFT4);
    CROUND(3, SHIFT8);
#undef CROUND
    const v16f h = fma16(k->B[4], cv, a);
    return k->uf ? sel16(k->Z[4], a, h) : h;
}

/* an array as one walk sees it: its base for a stream (or a block's first stream), the
 * stride between the 16 elements of a vector (along time for the row walk, across
 * streams for the column walk) and its kind; p NULL: absent */
typedef struct {
    const char *p;
    ssz s;
    int k;
} sv_t;

typedef struct {
    sv_t x, v, nv, te, tr, g, l, o0, o1;
} views_t;

INLINE sv_t sv_of(const arr_t *a, int present, ssz n, ssz N2, int along_time) {
    sv_t r = {NULL, 0, K_F32};
    if (present) {
        r.p = a->p + off3(a, n, N2);
        r.s = along_time ? a->st : (N2 > 1 ? a->s1 : a->s0);
        r.k = a->kind;
    }
    return r;
}

/* the arrays of the call from stream n on, for the row walk (along_time) or the column
 * walk */
INLINE views_t views_of(const ctx_t *c, ssz n, int along_time) {
    const ssz N2 = c->N2;
    views_t f;
    f.x = sv_of(&c->x, 1, n, N2, along_time);
    f.v = sv_of(&c->v, c->has_v, n, N2, along_time);
    f.nv = sv_of(&c->nv, c->has_nv, n, N2, along_time);
    f.te = sv_of(&c->te, 1, n, N2, along_time);
    f.tr = sv_of(&c->tr, c->has_trunc, n, N2, along_time);
    f.g = sv_of(&c->g, c->g_t, n, N2, along_time);
    f.l = sv_of(&c->lm, c->l_t, n, N2, along_time);
    f.o0 = sv_of(&c->o0, 1, n, N2, along_time);
    f.o1 = sv_of(&c->o1, c->two_out, n, N2, along_time);
    return f;
}

/* alpha, beta of 16 steps (the formulas of coefs(), in float32) from their loaded
 * inputs; nonext: lanes with no successor (TD(lambda)'s l' = 0 there) */
INLINE void coefs16(const int gae, v16f x, v16f v, v16f nv, v16i te, v16i tr, v16f gv,
                    v16f lv, v16i nonext, v16f *a, v16f *b) {
    const v16f zero = {0};
    const v16i done = te | tr;
    if (gae) {
        *a = x + sel16(te, zero, gv * nv) - v;
        *b = sel16(done, zero, gv * lv);
    } else {
        const v16f lc = sel16(nonext | done, zero, lv);
        *a = x + sel16(te, zero, gv * (1.0f - lc) * nv);
        *b = sel16(te, zero, gv * lc);
    }
}

/* whether a flag is set in the 16 steps [t, t + 16): contiguous flags tested on their
 * bits (bytes as two words, float32 without the sign: -0 is not set), the others as
 * ldm reads them */
INLINE int any_flag16(const views_t *f, ssz t, const int cont) {
    if (cont && f->te.k == K_I8) {
        uint64_t w[2], u[2] = {0, 0};
        memcpy(w, f->te.p + t, 16);
        if (f->tr.p) memcpy(u, f->tr.p + t, 16);
        return ((w[0] | w[1]) | (u[0] | u[1])) != 0;
    }
    if (cont) {
        v16i bits, other = {0};
        memcpy(&bits, f->te.p + 4 * t, 64);
        if (f->tr.p) memcpy(&other, f->tr.p + 4 * t, 64);
        return any16((bits | other) & 0x7fffffff);
    }
    const v16i none = {0};
    const v16i te = ldm(f->te.p, f->te.s, f->te.k, t, 16, 0);
    const v16i tr = f->tr.p ? ldm(f->tr.p, f->tr.s, f->tr.k, t, 16, 0) : none;
    return any16(te | tr);
}

/* 16 steps [t, t + m) of a stream from the carry cv: their h, stored; v_next: V_{t+m}
 * (shifted values) where t + m < T, else the bootstrap (or 0) */
/* how often the flag-free path found no flag (per walk: both paths give the same bits,
 * so the choice is speed only; where most vectors have a flag, the test's unpredictable
 * branch costs more than the path saves, and the walk stops trying) */
typedef struct {
    int tried, flagged;
} tries_t;

INLINE int try_const(const tries_t *tr) {
    return tr->tried < 64 || 4 * tr->flagged < tr->tried;
}

INLINE v16f fast16(const ctx_t *c, const views_t *f, ssz t, ssz m, v16f cv, float v_next,
                   const int gae, const int cont, const bconst_t *kc, tries_t *tries) {
    const v16f zero = {0};
    const v16i none = {0};
    const v16f x = ldf(f->x.p, f->x.s, K_F32, t, m, cont);
    const v16f v = f->v.p ? ldf(f->v.p, f->v.s, K_F32, t, m, cont) : zero;
    v16f nv;
    if (f->nv.p) {
        nv = ldf(f->nv.p, f->nv.s, K_F32, t, m, cont);
    } else if (m == 16 && f->v.p && t + 16 < c->T) {
        nv = ldf(f->v.p, f->v.s, K_F32, t + 1, 16, cont);
    } else { /* V' = V_{t+1}, and at the last of the m steps V_{t+m} */
        const v16i up = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
        nv = __builtin_shuffle(v, zero, up);
        nv[m - 1] = v_next;
    }
    const v16f gv = !cont && f->g.p ? ldf(f->g.p, f->g.s, f->g.k, t, m, 0) : zero + (float)c->gs;
    const v16f lv = !cont && f->l.p ? ldf(f->l.p, f->l.s, f->l.k, t, m, 0) : zero + (float)c->lms;
    v16f a, b;
    if (kc && m == 16 && t + 16 < c->T && try_const(tries)) {
        tries->tried++;
        if (!any_flag16(f, t, cont)) {
            /* no flag set: every beta is gamma lambda, whose scan16 maps kc holds */
            coefs16(gae, x, v, nv, none, none, gv, lv, none, &a, &b);
            const v16f h = scan16c(a, kc, cv);
            stf((char *)f->o0.p, f->o0.s, t, 16, h, cont);
            if (f->o1.p) stf((char *)f->o1.p, f->o1.s, t, 16, h + v, cont);
            return h;
        }
        tries->flagged++;
    }
    const v16i te = ldm(f->te.p, f->te.s, f->te.k, t, m, cont);
    const v16i tr = f->tr.p ? ldm(f->tr.p, f->tr.s, f->tr.k, t, m, cont) : none;
    v16i nonext = none; /* past the stream's last step */
    if (t + m >= c->T) nonext[m - 1] = -1;
    coefs16(gae, x, v, nv, te, tr, gv, lv, nonext, &a, &b);
    if (m < 16) { /* lanes past the stream's end: alpha 0 (h_T = 0), beta 1 */
        for (ssz k = m; k < 16; k++) {
            a[k] = 0.0f;
            b[k] = 1.0f;
        }
    }
    const v16f h = scan16(a, b, cv);
    stf((char *)f->o0.p, f->o0.s, t, m, h, cont);
    if (f->o1.p) stf((char *)f->o1.p, f->o1.s, t, m, h + v, cont);
    return h;
}

/* stream n */
INLINE void fast_stream(const ctx_t *c, ssz n, const int gae, const int cont,
                        const bconst_t *kp, tries_t *tries) {
    const ssz T = c->T;
    const views_t f = views_of(c, n, 1);
    const v16f zero = {0};
    const v16i bcast = {0};
    /* the top 16 steps, or fewer: [t0, T), m of them, from h_T = 0 */
    const ssz q = (T - 1) / 16, t0 = 16 * q, m = T - t0;
    const float boot = !c->has_nv && c->has_boot
                           ? (float)get1(&c->boot, off3(&c->boot, n, c->N2))
                           : 0.0f;
    v16f h = fast16(c, &f, t0, m, zero, boot, gae, cont, kp, tries);
    /* then 16 steps at a time, down to step 0 */
    for (ssz t = t0 - 16; t >= 0; t -= 16)
        h = fast16(c, &f, t, 16, __builtin_shuffle(h, bcast), 0.0f, gae, cont, kp, tries);
}

/* The fast column walk: float32 time-major data (the streams contiguous at each step),
 * in float32. A block of WF streams advances one step at a time, 16 streams a vector:
 * h = alpha + beta h, a select where beta is 0. Loads and stores are vectors where the
 * streams are contiguous (byte or float32 flags), one by one otherwise. */

/* the block's first stream and width (as col_block) */
INLINE void fastcol_range(const ctx_t *c, ssz blk, ssz *n0, ssz *w) {
    const ssz N2 = c->N2;
    if (N2 > 1) {
        const ssz per = (N2 + WF - 1) / WF;
        const ssz i = blk / per, j0 = (blk % per) * WF;
        *n0 = i * N2 + j0;
        *w = N2 - j0 < WF ? N2 - j0 : WF;
    } else {
        *n0 = blk * WF;
        *w = c->N1 - *n0 < WF ? c->N1 - *n0 : WF;
    }
}

INLINE void fastcol_block(const ctx_t *c, ssz blk, const int gae) {
    const ssz T = c->T;
    ssz n0, w;
    fastcol_range(c, blk, &n0, &w);
    const views_t f = views_of(c, n0, 0);
    /* element (step t, lane o + k) of a view: step strides are the arrays' own */
#define AT(V, A) ((V).p + t * (A).st + o * (V).s)
    const v16f zero = {0};
    const v16i none = {0};
    const int nvec = (int)((w + 15) / 16);
    for (int j = 0; j < nvec; j++) { /* 16 streams, every step */
        const ssz mj = w - 16 * j < 16 ? w - 16 * j : 16, o = 16 * j;
        v16f h = zero, vnext = zero; /* V' at the last step: the bootstrap, or 0 */
        if (!c->has_nv && c->has_boot) {
            const ssz ls = c->N2 > 1 ? c->boot.s1 : c->boot.s0;
            const ssz pb = off3(&c->boot, n0, c->N2) + o * ls;
            for (ssz k = 0; k < mj; k++) vnext[k] = (float)get1(&c->boot, pb + k * ls);
        }
        for (ssz t = T - 1; t >= 0; t--) {
            const v16f x = ldf(AT(f.x, c->x), f.x.s, K_F32, 0, mj, 0);
            const v16f v = f.v.p ? ldf(AT(f.v, c->v), f.v.s, K_F32, 0, mj, 0) : zero;
            const v16f nv = f.nv.p ? ldf(AT(f.nv, c->nv), f.nv.s, K_F32, 0, mj, 0) : vnext;
            const v16i te = ldm(AT(f.te, c->te), f.te.s, f.te.k, 0, mj, 0);
            const v16i tr = f.tr.p ? ldm(AT(f.tr, c->tr), f.tr.s, f.tr.k, 0, mj, 0) : none;
            const v16f gv =
                f.g.p ? ldf(AT(f.g, c->g), f.g.s, f.g.k, 0, mj, 0) : zero + (float)c->gs;
            const v16f lv =
                f.l.p ? ldf(AT(f.l, c->lm), f.l.s, f.l.k, 0, mj, 0) : zero + (float)c->lms;
            v16f a, b;
            coefs16(gae, x, v, nv, te, tr, gv, lv, t + 1 >= T ? ~none : none, &a, &b);
            h = sel16(b == 0.0f, a, a + b * h);
            stf((char *)AT(f.o0, c->o0), f.o0.s, 0, mj, h, 0);
            if (f.o1.p) stf((char *)AT(f.o1, c->o1), f.o1.s, 0, mj, h + v, 0);
            vnext = v;
        }
    }
#undef AT
}

INLINE void fastcol_blocks(const ctx_t *c, ssz lo, ssz hi) {
    if (c->mode == MODE_GAE)
        for (ssz b = lo; b < hi; b++) fastcol_block(c, b, 1);
    else
        for (ssz b = lo; b < hi; b++) fastcol_block(c, b, 0);
}

/* every array contiguous in time, byte or float32 flags, gamma and lambda numbers: the
 * loop with vector loads only */
static int fast_contiguous(const ctx_t *c) {
    if (c->x.st != 4 || c->o0.st != 4 || (c->two_out && c->o1.st != 4)) return 0;
    if ((c->has_v && c->v.st != 4) || (c->has_nv && c->nv.st != 4)) return 0;
    if (c->g_t || c->l_t) return 0;
#define FLAGROW(a) (((a).kind == K_I8 && (a).st == 1) || ((a).kind == K_F32 && (a).st == 4))
    if (!FLAGROW(c->te) || (c->has_trunc && !FLAGROW(c->tr))) return 0;
    if (c->has_trunc && c->te.kind != c->tr.kind) return 0;
#undef FLAGROW
    return 1;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX512_TARGET target("avx512f,avx512dq,avx512vl,avx512bw")
#define AVX512 __attribute__((AVX512_TARGET, noinline))
#define AVX512_INLINE __attribute__((AVX512_TARGET, always_inline)) static inline

/* The fast row walk's inner vectors on AVX-512, for contiguous arrays and gamma and
 * lambda numbers: one path for every vector below a stream's top one, flags or none.
 * Every beta is gamma lambda or 0 (a done step), so scan16's products B are those of
 * the flag-free stream (bconst_t) except in the lanes whose window holds a done step,
 * where they are 0. Those lanes come from the flags' bits as 16-bit masks (a done step
 * in [i, i + 2^k): shifts and ors of the mask), and each round is a masked fused
 * multiply-add: the same operations on the same values as scan16, so the same bits, without computing B or
 * testing for flags (at 2% flags, 28% of the vectors hold one). */
typedef struct {
    __m512 B[5];
    __mmask16 uz[5]; /* lanes whose flag-free product underflowed to 0 */
    __m512 gv, lv;
    int gae, bytes;
} k512_t;

typedef struct {
    const float *x, *v, *nv;
    const char *te, *tr;
    float *o0, *o1;
} chain512_t;

INLINE chain512_t chain512_of(const views_t *f) {
    chain512_t ch = {(const float *)f->x.p, (const float *)f->v.p, (const float *)f->nv.p,
                     f->te.p, f->tr.p, (float *)f->o0.p, (float *)f->o1.p};
    return ch;
}

/* the 16 steps [t, t + 16) from the h of the vector above (its lane 0 the carry): their
 * h, stored. top: the stream's last 16 steps (t + 16 = T; above 0): V' of the last is
 * the bootstrap `boot` (or 0), and TD(lambda)'s l' is 0 there */
AVX512_INLINE __m512 vec512(const k512_t *k, const chain512_t *ch, ssz t, __m512 above,
                            unsigned *cut, const int top, const float boot) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512 x = _mm512_loadu_ps(ch->x + t);
    const __m512 v = ch->v ? _mm512_loadu_ps(ch->v + t) : zero;
    __m512 nv; /* V' = V_{t+1} */
    if (ch->nv) {
        nv = _mm512_loadu_ps(ch->nv + t);
    } else {
        nv = !ch->v ? zero : top ? _mm512_maskz_loadu_ps(0x7fff, ch->v + t + 1)
                                 : _mm512_loadu_ps(ch->v + t + 1);
        if (top) nv = _mm512_mask_mov_ps(nv, 0x8000, _mm512_set1_ps(boot));
    }
    __mmask16 te, tr = 0; /* set where nonzero: bytes, or float32 bits without the sign */
    if (k->bytes) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(ch->te + t));
        te = _mm_test_epi8_mask(b, b);
        if (ch->tr) {
            const __m128i u = _mm_loadu_si128((const __m128i *)(ch->tr + t));
            tr = _mm_test_epi8_mask(u, u);
        }
    } else {
        const __m512i nosign = _mm512_set1_epi32(0x7fffffff);
        te = _mm512_test_epi32_mask(_mm512_loadu_si512(ch->te + 4 * t), nosign);
        if (ch->tr) tr = _mm512_test_epi32_mask(_mm512_loadu_si512(ch->tr + 4 * t), nosign);
    }
    unsigned done = (unsigned)te | tr;
    __m512 a; /* alpha: coefs16's operations */
    if (k->gae) {
        a = _mm512_sub_ps(_mm512_add_ps(x, _mm512_maskz_mul_ps((__mmask16)~te, k->gv, nv)), v);
    } else {
        if (top) done |= 0x8000; /* no successor: l' = 0, so beta = 0 */
        const __m512 lc = _mm512_maskz_mov_ps((__mmask16)~done, k->lv);
        const __m512 g1 = _mm512_mul_ps(k->gv, _mm512_sub_ps(_mm512_set1_ps(1.0f), lc));
        a = _mm512_add_ps(x, _mm512_maskz_mul_ps((__mmask16)~te, g1, nv));
    }
    /* lane i takes lane i + s, past 15 zero; a lane whose window holds a done step keeps a */
    const unsigned w1 = done | (done >> 1), w2 = w1 | (w1 >> 2), w3 = w2 | (w2 >> 4);
    const unsigned w4 = w3 | (w3 >> 8);
    /* lane i + s into lane i, zeros past 15: valignd of (zero : a), one shuffle */
#define ROUND512(J, WIN, S)                                                            \
    a = _mm512_mask3_fmadd_ps(                                                        \
        k->B[J],                                                                      \
        _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(zero),            \
                                                _mm512_castps_si512(a), S)),          \
        a, (__mmask16) ~((WIN) | k->uz[J]))
    ROUND512(0, done, 1);
    ROUND512(1, w1, 2);
    ROUND512(2, w2, 4);
    ROUND512(3, w3, 8);
#undef ROUND512
    const __m512 cv = _mm512_broadcastss_ps(_mm512_castps512_ps128(above)); /* lane 0 */
    const __m512 h = _mm512_mask3_fmadd_ps(k->B[4], cv, a, (__mmask16) ~(w4 | k->uz[4]));
    *cut = (w4 | k->uz[4]) & 1; /* lane 0 (the next vector's carry) did not take this one's */
    _mm512_storeu_ps(ch->o0 + t, h);
    if (ch->o1) _mm512_storeu_ps(ch->o1 + t, _mm512_add_ps(h, v));
    return h;
}

AVX512_INLINE k512_t k512_of(const ctx_t *c, const bconst_t *kc) {
    k512_t k;
    for (int j = 0; j < 5; j++) {
        k.B[j] = (__m512)kc->B[j];
        k.uz[j] = 0;
        for (int i = 0; i < 16; i++) k.uz[j] |= (unsigned)(kc->Z[j][i] != 0) << i;
    }
    k.gv = _mm512_set1_ps((float)c->gs);
    k.lv = _mm512_set1_ps((float)c->lms);
    k.gae = c->mode == MODE_GAE;
    k.bytes = c->te.kind == K_I8;
    return k;
}

/* a thread that waits for another's segment (fast_units): a few cycles at a time, then
 * giving its core away between looks (the other thread may be waiting for a core: a
 * busy machine, or more threads than cores) */
static inline void seg_wait(const unsigned char *flag) {
    for (unsigned k = 0; !__atomic_load_n(flag, __ATOMIC_ACQUIRE); k++) {
        if (k < 4096) {
            __builtin_ia32_pause(); /* (gcc on x86-64: the fast walks' only compiler) */
        } else {
#ifndef _WIN32
            sched_yield();
#endif
        }
    }
}

/* Work units [lo, hi) of a contiguous call with gamma and lambda numbers (kc: their
 * flag-free products): unit u is segment u % S of stream u / S. A stream's vectors
 * (vector j: steps [16 j, 16 j + 16), the top one maybe fewer) are cut into S segments
 * of c->seg vectors (S > 1: a few long streams on more threads); a segment below the top
 * one starts from h = 0, and its first vectors are recomputed from the true carry
 * (fast_fix) by its own thread once the segment above is done (done: a flag a unit, set
 * when its unit is fixed up; a thread waits only for a unit taken before its own, as
 * units are taken from the top), or, where done is NULL, by fast_fixup after all threads.
 *
 * fast_fix: a segment's first vectors again, from the true carry (the h of the step
 * above, as stored), down to the first whose lane 0 did not take its carry; from there
 * on, every carry was already the true one. The same operations on the same values as
 * one pass down the stream: the same bits.
 *
 * Both for each vector path W (512: AVX-512, 256: AVX2): its function attributes FN,
 * vector type VT, constants KT (from K_OF), 16 steps VEC, and VT from one float in every
 * lane (SET1) or from a generic vector (FROM16). */
#define FAST_WALK(W, FN, VT, KT, K_OF, VEC, SET1, FROM16)                             \
    /* a segment's vectors jtop down to jlo again, from the true carry */             \
    FN static void fast_fix##W(const KT *k, const chain512_t *ch, ssz jlo, ssz jtop) {   \
        VT h = SET1(ch->o0[16 * (jtop + 1)]);                                         \
        unsigned cut = 0;                                                             \
        for (ssz j = jtop; j >= jlo && !cut; j--) h = VEC(k, ch, 16 * j, h, &cut, 0, 0.0f); \
    }                                                                                 \
    FN static void fast_units##W(const ctx_t *c, ssz lo, ssz hi, const bconst_t *kc,   \
                                 unsigned char *done) {                               \
        const ssz T = c->T, S = c->S;                                                 \
        const ssz q = (T - 1) / 16, t0 = 16 * q, m = T - t0;                          \
        const KT k = K_OF(c, kc);                                                     \
        tries_t tries = {0, 0};                                                       \
        const v16f zero = {0};                                                        \
        unsigned cut;                                                                 \
        for (ssz u = hi - 1; u >= lo; u--) {                                          \
            const ssz n = u / S, sg = u % S;                                          \
            const ssz jlo = sg * c->seg;                                              \
            const ssz jtop = jlo + c->seg - 1 < q ? jlo + c->seg - 1 : q;             \
            const views_t f = views_of(c, n, 1);                                      \
            const chain512_t ch = chain512_of(&f);                                    \
            VT h = SET1(0.0f);                                                        \
            ssz j = jtop;                                                             \
            if (jtop == q) { /* the stream's top 16 steps (fewer: the generic path) */ \
                const float boot = !c->has_nv && c->has_boot                          \
                                       ? (float)get1(&c->boot, off3(&c->boot, n, c->N2)) \
                                       : 0.0f;                                        \
                if (m == 16)                                                          \
                    h = VEC(&k, &ch, t0, h, &cut, 1, boot);                           \
                else                                                                  \
                    h = FROM16(fast16(c, &f, t0, m, zero, boot, k.gae, 1, NULL, &tries)); \
                j--;                                                                  \
            }                                                                         \
            for (; j >= jlo; j--) h = VEC(&k, &ch, 16 * j, h, &cut, 0, 0.0f);         \
            if (!done) continue;                                                      \
            if (sg < S - 1) { /* fixed up here, from the segment above once it is done */ \
                seg_wait(&done[u + 1]);                                               \
                fast_fix##W(&k, &ch, jlo, jlo + c->seg - 1);                          \
            }                                                                         \
            __atomic_store_n(&done[u], 1, __ATOMIC_RELEASE);                          \
        }                                                                             \
    }                                                                                 \
    FN static void fast_fixup##W(const ctx_t *c, const bconst_t *kc) {                \
        const ssz N = c->N1 * c->N2, S = c->S;                                        \
        const KT k = K_OF(c, kc);                                                     \
        for (ssz n = 0; n < N; n++) {                                                 \
            const views_t f = views_of(c, n, 1);                                      \
            const chain512_t ch = chain512_of(&f);                                    \
            for (ssz sg = S - 2; sg >= 0; sg--)                                       \
                fast_fix##W(&k, &ch, sg * c->seg, sg * c->seg + c->seg - 1);          \
        }                                                                             \
    }

#define FROM16_512(g) ((__m512)(g))
FAST_WALK(512, AVX512, __m512, k512_t, k512_of, vec512, _mm512_set1_ps, FROM16_512)
#endif

#if defined(__x86_64__)
/* The same inner vectors on AVX2 (CPUs without AVX-512): each 16-lane vector as two
 * 8-lane halves, every operation of vec512 on both, the lane shifts as permutes of both
 * halves and a blend, the masks as lane masks. The same operations on the same values
 * in the same order: the same bits as vec512 (a test compares them). */
#define AVX2_TARGET target("avx2,fma")
#define AVX2 __attribute__((AVX2_TARGET, noinline))
#define AVX2_INLINE __attribute__((AVX2_TARGET, always_inline)) static inline

typedef struct {
    __m256 lo, hi;
} v2x8;

typedef struct {
    v2x8 B[5];
    unsigned uz[5];
    __m256 gv, lv;
    int gae, bytes;
} k256_t;

AVX2_INLINE __m256 lanes8(unsigned bits) { /* bit i of bits -> lane i all ones */
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i b = _mm256_and_si256(_mm256_set1_epi32((int)bits), sel);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, sel));
}

/* a + b x where the mask's bit is clear (one fused rounding), a where set */
AVX2_INLINE v2x8 fma_keep(v2x8 b, v2x8 x, v2x8 a, unsigned keep) {
    v2x8 r;
    r.lo = _mm256_blendv_ps(_mm256_fmadd_ps(b.lo, x.lo, a.lo), a.lo, lanes8(keep & 0xff));
    r.hi = _mm256_blendv_ps(_mm256_fmadd_ps(b.hi, x.hi, a.hi), a.hi, lanes8(keep >> 8));
    return r;
}

/* lane i takes lane i + s (past 15: 0), s in 1, 2, 4, 8 */
AVX2_INLINE v2x8 shift256(v2x8 a, const int s) {
    v2x8 r;
    if (s == 8) {
        r.lo = a.hi;
        r.hi = _mm256_setzero_ps();
        return r;
    }
    const __m256i idx = _mm256_and_si256(
        _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(s)),
        _mm256_set1_epi32(7));
    const __m256 plo = _mm256_permutevar8x32_ps(a.lo, idx);
    const __m256 phi = _mm256_permutevar8x32_ps(a.hi, idx);
    const __m256 top = lanes8((0xffu << (8 - s)) & 0xffu); /* lanes i >= 8 - s */
    r.lo = _mm256_blendv_ps(plo, phi, top);
    r.hi = _mm256_blendv_ps(phi, _mm256_setzero_ps(), top);
    return r;
}

AVX2_INLINE v2x8 ld256(const float *p) {
    v2x8 r = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    return r;
}

/* 16 flags at p (bytes or float32 bits without the sign) as a 16-bit mask */
AVX2_INLINE unsigned flags256(const char *p, ssz t, int bytes) {
    if (bytes) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(p + t));
        const unsigned zero = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(b, _mm_setzero_si128()));
        return ~zero & 0xffffu;
    }
    const __m256i nosign = _mm256_set1_epi32(0x7fffffff), z = _mm256_setzero_si256();
    const __m256i a0 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 4 * t)), nosign);
    const __m256i a1 =
        _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 4 * t + 32)), nosign);
    const unsigned e0 = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a0, z)));
    const unsigned e1 = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a1, z)));
    return ~(e0 | e1 << 8) & 0xffffu;
}

/* vec512, in two halves */
AVX2_INLINE v2x8 vec256(const k256_t *k, const chain512_t *ch, ssz t, v2x8 above,
                        unsigned *cut, const int top, const float boot) {
    const __m256 zero = _mm256_setzero_ps();
    const v2x8 z2 = {zero, zero};
    const v2x8 x = ld256(ch->x + t);
    const v2x8 v = ch->v ? ld256(ch->v + t) : z2;
    v2x8 nv;
    if (ch->nv) {
        nv = ld256(ch->nv + t);
    } else if (!ch->v) {
        nv = z2;
    } else if (top) { /* V_{t+1}; the last lane the bootstrap */
        nv.lo = _mm256_loadu_ps(ch->v + t + 1);
        nv.hi = _mm256_maskload_ps(ch->v + t + 9, _mm256_castps_si256(lanes8(0x7f)));
    } else {
        nv = ld256(ch->v + t + 1);
    }
    if (top && !ch->nv) nv.hi = _mm256_blendv_ps(nv.hi, _mm256_set1_ps(boot), lanes8(0x80));
    const unsigned te = flags256(ch->te, t, k->bytes);
    const unsigned tr = ch->tr ? flags256(ch->tr, t, k->bytes) : 0;
    unsigned done = te | tr;
    v2x8 a;
    const __m256 nte_lo = lanes8(~te & 0xff), nte_hi = lanes8((~te >> 8) & 0xff);
    if (k->gae) {
        a.lo = _mm256_sub_ps(_mm256_add_ps(x.lo, _mm256_and_ps(_mm256_mul_ps(k->gv, nv.lo), nte_lo)), v.lo);
        a.hi = _mm256_sub_ps(_mm256_add_ps(x.hi, _mm256_and_ps(_mm256_mul_ps(k->gv, nv.hi), nte_hi)), v.hi);
    } else {
        if (top) done |= 0x8000;
        const __m256 one = _mm256_set1_ps(1.0f);
        const __m256 lc_lo = _mm256_and_ps(k->lv, lanes8(~done & 0xff));
        const __m256 lc_hi = _mm256_and_ps(k->lv, lanes8((~done >> 8) & 0xff));
        const __m256 g1_lo = _mm256_mul_ps(k->gv, _mm256_sub_ps(one, lc_lo));
        const __m256 g1_hi = _mm256_mul_ps(k->gv, _mm256_sub_ps(one, lc_hi));
        a.lo = _mm256_add_ps(x.lo, _mm256_and_ps(_mm256_mul_ps(g1_lo, nv.lo), nte_lo));
        a.hi = _mm256_add_ps(x.hi, _mm256_and_ps(_mm256_mul_ps(g1_hi, nv.hi), nte_hi));
    }
    const unsigned w1 = done | (done >> 1), w2 = w1 | (w1 >> 2), w3 = w2 | (w2 >> 4);
    const unsigned w4 = w3 | (w3 >> 8);
    a = fma_keep(k->B[0], shift256(a, 1), a, done | k->uz[0]);
    a = fma_keep(k->B[1], shift256(a, 2), a, w1 | k->uz[1]);
    a = fma_keep(k->B[2], shift256(a, 4), a, w2 | k->uz[2]);
    a = fma_keep(k->B[3], shift256(a, 8), a, w3 | k->uz[3]);
    const __m256 c0 = _mm256_permutevar8x32_ps(above.lo, _mm256_setzero_si256());
    const v2x8 cv = {c0, c0};
    const v2x8 h = fma_keep(k->B[4], cv, a, w4 | k->uz[4]);
    *cut = (w4 | k->uz[4]) & 1;
    _mm256_storeu_ps(ch->o0 + t, h.lo);
    _mm256_storeu_ps(ch->o0 + t + 8, h.hi);
    if (ch->o1) {
        _mm256_storeu_ps(ch->o1 + t, _mm256_add_ps(h.lo, v.lo));
        _mm256_storeu_ps(ch->o1 + t + 8, _mm256_add_ps(h.hi, v.hi));
    }
    return h;
}

AVX2_INLINE k256_t k256_of(const ctx_t *c, const bconst_t *kc) {
    k256_t k;
    for (int j = 0; j < 5; j++) {
        float b[16];
        memcpy(b, &kc->B[j], sizeof(b));
        k.B[j].lo = _mm256_loadu_ps(b);
        k.B[j].hi = _mm256_loadu_ps(b + 8);
        k.uz[j] = 0;
        for (int i = 0; i < 16; i++) k.uz[j] |= (unsigned)(kc->Z[j][i] != 0) << i;
    }
    k.gv = _mm256_set1_ps((float)c->gs);
    k.lv = _mm256_set1_ps((float)c->lms);
    k.gae = c->mode == MODE_GAE;
    k.bytes = c->te.kind == K_I8;
    return k;
}

AVX2_INLINE v2x8 set1_256(float x) {
    const v2x8 r = {_mm256_set1_ps(x), _mm256_set1_ps(x)};
    return r;
}

AVX2_INLINE v2x8 from16_256(v16f g) {
    v2x8 r;
    memcpy(&r, &g, sizeof(r));
    return r;
}

FAST_WALK(256, AVX2, v2x8, k256_t, k256_of, vec256, set1_256, from16_256)
#endif

/* the call's row walk takes fast_units512: AVX-512, every array contiguous, gamma and
 * lambda numbers */
static int fast512(const ctx_t *c) {
#if defined(__x86_64__)
    return use_vec8 && use_512 && fast_contiguous(c) && !c->g_t && !c->l_t;
#else
    (void)c;
    return 0;
#endif
}

/* ... or fast_units256: AVX2 without AVX-512 (or the AVX-512 path off in tests) */
static int fast256(const ctx_t *c) {
#if defined(__x86_64__)
    return has_avx2 && use_256 && !fast512(c) && fast_contiguous(c) && !c->g_t && !c->l_t;
#else
    (void)c;
    return 0;
#endif
}

/* streams [lo, hi), from the last (see run_job), the loop compiled once per mode,
 * contiguous or not */
INLINE void fast_streams(const ctx_t *c, ssz lo, ssz hi, unsigned char *done) {
    const int gae = c->mode == MODE_GAE, cont = fast_contiguous(c);
    tries_t tries = {0, 0};
    /* gamma lambda: every step's beta where no flag is set (gamma and lambda numbers) */
    const bconst_t kc = bconst_of((float)c->gs * (float)c->lms);
    const bconst_t *kp = !c->g_t && !c->l_t ? &kc : NULL;
#define STREAMS(G, C)                                                                 \
    for (ssz n = hi - 1; n >= lo; n--) fast_stream(c, n, G, C, kp, &tries)
#if defined(__x86_64__)
    if (fast512(c)) {
        fast_units512(c, lo, hi, &kc, done);
        return;
    }
    if (fast256(c)) {
        fast_units256(c, lo, hi, &kc, done);
        return;
    }
#endif
    if (gae && cont) STREAMS(1, 1);
    else if (gae) STREAMS(1, 0);
    else if (cont) STREAMS(0, 1);
    else STREAMS(0, 0);
#undef STREAMS
}

/* the call can take the fast row walk: float32 data and outputs */
static int fast_ok(const ctx_t *c) {
    if (c->x.kind != K_F32 || c->o0.kind != K_F32) return 0;
    if (c->two_out && c->o1.kind != K_F32) return 0;
    if (c->has_v && c->v.kind != K_F32) return 0;
    if (c->has_nv && c->nv.kind != K_F32) return 0;
    return 1;
}
#endif

/* ------------------------------------------------------------------- column walk */

typedef struct {
    double X[WC], V[WC], NV[WC], VN[WC], G[WC], L[WC], A[WC], B[WC], H[WC], TE[WC], TR[WC];
} colbuf_t;

/* block b: streams n0 .. n0 + w - 1, consecutive in one lane stride (within one n1 where
 * N2 > 1) */
INLINE void col_block(const ctx_t *c, colbuf_t *bf, ssz blk) {
    const ssz N2 = c->N2, T = c->T;
    ssz n0, w;
    if (N2 > 1) {
        const ssz per = (N2 + WC - 1) / WC;
        const ssz i = blk / per, j0 = (blk % per) * WC;
        n0 = i * N2 + j0;
        w = N2 - j0 < WC ? N2 - j0 : WC;
    } else {
        n0 = blk * WC;
        w = c->N1 - n0 < WC ? c->N1 - n0 : WC;
    }
#define LS(a) (N2 > 1 ? (a)->s1 : (a)->s0)
    ssz k;
    for (k = 0; k < w; k++) bf->H[k] = 0.0;
    if (!c->has_nv) {
        if (c->has_boot) load_d(bf->VN, &c->boot, off3(&c->boot, n0, N2), LS(&c->boot), w);
        else for (k = 0; k < w; k++) bf->VN[k] = 0.0;
    }
    for (ssz t = T - 1; t >= 0; t--) {
        load_d(bf->X, &c->x, off3(&c->x, n0, N2) + t * c->x.st, LS(&c->x), w);
        if (c->has_v) load_d(bf->V, &c->v, off3(&c->v, n0, N2) + t * c->v.st, LS(&c->v), w);
        else for (k = 0; k < w; k++) bf->V[k] = 0.0;
        const double *NV = bf->VN;
        if (c->has_nv) {
            load_d(bf->NV, &c->nv, off3(&c->nv, n0, N2) + t * c->nv.st, LS(&c->nv), w);
            NV = bf->NV;
        } else if (t + 1 < T && !c->has_v) {
            for (k = 0; k < w; k++) bf->VN[k] = 0.0;
        }
        load_m(bf->TE, &c->te, off3(&c->te, n0, N2) + t * c->te.st, LS(&c->te), w);
        if (c->has_trunc)
            load_m(bf->TR, &c->tr, off3(&c->tr, n0, N2) + t * c->tr.st, LS(&c->tr), w);
        if (c->g_t) load_d(bf->G, &c->g, off3(&c->g, n0, N2) + t * c->g.st, LS(&c->g), w);
        if (c->l_t) load_d(bf->L, &c->lm, off3(&c->lm, n0, N2) + t * c->lm.st, LS(&c->lm), w);
        coefs(c, w, bf->X, bf->V, NV, bf->TE, bf->TR, bf->G, bf->L, t + 1 >= T ? 0 : w, bf->A,
              bf->B);
        double *restrict A = bf->A, *restrict B = bf->B, *restrict H = bf->H;
        NOALIAS for (k = 0; k < w; k++) {
            const double a = A[k], b = B[k];
            H[k] = b == 0.0 ? a : a + b * H[k];
        }
        store_d(&c->o0, off3(&c->o0, n0, N2) + t * c->o0.st, LS(&c->o0), w, H, NULL);
        if (c->two_out)
            store_d(&c->o1, off3(&c->o1, n0, N2) + t * c->o1.st, LS(&c->o1), w, H, bf->V);
        if (!c->has_nv && c->has_v) memcpy(bf->VN, bf->V, sizeof(double) * w);
    }
#undef LS
}

/* ------------------------------------------------------------------------ threads */

/* The threads take their work from one counter, a few units (row groups or column
 * blocks) at a time: where another process's threads hold a core (torch's OpenMP
 * workers spin for a while after each parallel op), the thread that runs takes more. */
/* Work the calling thread does before it takes units (the replay's Python side: its
 * tensors' checks and its outputs' tensor objects), with the GIL held, while the other
 * threads already scan; it then releases the GIL (ts) for the rest of the call */
typedef struct {
    int (*fn)(void *); /* 0: the scan's result will not be used (the rest is skipped) */
    void *arg;
    int ran;
    PyThreadState *ts;
#ifndef _WIN32
    pthread_t caller;
#endif
} side_t;

#define SEG_DONE_MAX 256 /* segments a call fixes up in its threads, at most */

typedef struct {
    const ctx_t *c;
    ssz *next; /* the first unit nobody has taken */
    ssz units, chunk;
    int failed;
    side_t *side;
    unsigned char *seg_done; /* the fast walk's segments done and fixed up (fast_units),
                                or NULL: fixed up after (fast_fixup) */
} job_t;

static inline ssz take_units(const job_t *j) {
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_fetch_add(j->next, j->chunk, __ATOMIC_RELAXED);
#else
    const ssz lo = *j->next; /* one thread only (see run_all) */
    *j->next += j->chunk;
    return lo;
#endif
}

MULTIVERSION static void *run_job(void *arg) {
    const job_t *j = (const job_t *)arg;
    const ctx_t *c = j->c;
#if VEC8
    if (c->fastcol) {
        for (ssz lo; (lo = take_units(j)) < j->units;) {
            const ssz hi = lo + j->chunk < j->units ? lo + j->chunk : j->units;
            fastcol_blocks(c, lo, hi);
        }
        return NULL;
    }
#endif
    if (c->columns) {
        colbuf_t *bf = (colbuf_t *)malloc(sizeof(colbuf_t));
        if (!bf) return (void *)1;
        for (int k = 0; k < WC; k++) { /* the numbers, and no truncation: filled once */
            bf->G[k] = c->gs;
            bf->L[k] = c->lms;
            bf->TR[k] = 0.0;
        }
        for (ssz lo; (lo = take_units(j)) < j->units;) {
            const ssz hi = lo + j->chunk < j->units ? lo + j->chunk : j->units;
            for (ssz b = lo; b < hi; b++) col_block(c, bf, b);
        }
        free(bf);
    }
#if VEC8
    else if (c->fast) {
        /* from the last stream to the first, each backwards: one descending sweep of
         * memory, which the hardware prefetchers follow. Up each stream and back down
         * the next ([4096, 128] batch-major), a stream of 128 steps took 3x as long from
         * memory on the 2-core EPYC VM (and 1.8x from the caches) */
        for (ssz lo; (lo = take_units(j)) < j->units;) {
            const ssz hi = lo + j->chunk < j->units ? lo + j->chunk : j->units;
            fast_streams(c, j->units - hi, j->units - lo, j->seg_done);
        }
    }
#endif
    else {
        rowbuf_t *bf = rowbuf_new(c);
        if (!bf) return (void *)1;
        for (ssz lo; (lo = take_units(j)) < j->units;) {
            const ssz hi = lo + j->chunk < j->units ? lo + j->chunk : j->units;
            for (ssz g = hi - 1; g >= lo; g--) { /* downwards, as the fast walk */
                const ssz g0 = g * W, g1 = g0 + W < c->nlanes ? g0 + W : c->nlanes;
                row_group(c, bf, g0, g1);
            }
        }
        free(bf);
    }
    return NULL;
}

static void pool_job(void *arg) {
    job_t *j = (job_t *)arg;
    side_t *sd = j->side;
#ifndef _WIN32
    if (sd && pthread_equal(pthread_self(), sd->caller)) {
#else
    if (sd) { /* the caller's thread is the only one there */
#endif
        if (!sd->fn(sd->arg)) /* no unit left for anyone */
#if defined(__GNUC__) || defined(__clang__)
            __atomic_store_n(j->next, j->units, __ATOMIC_RELAXED);
#else
            *j->next = j->units;
#endif
        sd->ran = 1;
        sd->ts = PyEval_SaveThread();
    }
    if (run_job(j) != NULL) {
#if defined(__GNUC__) || defined(__clang__)
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
#else
        j->failed = 1;
#endif
    }
}

static int run_all(ctx_t *c, int threads, side_t *side) {
    const ssz units = c->columns ? c->nblocks
                      : c->fast  ? c->N1 * c->N2 * c->S
                                 : (c->nlanes + W - 1) / W;
    if (threads > units) threads = (int)units;
    if (threads < 1) threads = 1;
    ssz next = 0;
    job_t job;
    job.c = c;
    job.next = &next;
    job.units = units;
    job.chunk = threads == 1 ? units : units / (8 * (ssz)threads);
    if (job.chunk < 1) job.chunk = 1;
    job.failed = 0;
    job.side = side;
    /* a few long streams cut into segments: each fixed up by its own thread, right after
     * it (its code and its data still in that core's caches; after other work, the
     * fixup after the threads took 3 us of RLlib's 55 us call on the 2-core VM) */
    unsigned char seg_done[SEG_DONE_MAX];
    job.seg_done = NULL;
#if VEC8 && defined(__x86_64__)
    if (c->fast && c->S > 1 && units <= SEG_DONE_MAX) {
        memset(seg_done, 0, (size_t)units);
        job.seg_done = seg_done;
    }
#endif
    pool_run(pool_job, &job, threads);
    const int failed = job.failed;
#if VEC8 && defined(__x86_64__)
    if (!failed && c->fast && c->S > 1 && !job.seg_done) {
        const bconst_t kc = bconst_of((float)c->gs * (float)c->lms);
        if (fast512(c))
            fast_fixup512(c, &kc);
        else
            fast_fixup256(c, &kc);
    }
#endif
    if (!failed && c->h_end && c->S > 1) {
        rowbuf_t *bf = rowbuf_new(c);
        if (!bf) return 1;
        const ssz N = c->N1 * c->N2;
        for (ssz n = 0; n < N; n++) row_fixup(c, bf, n);
        free(bf);
    }
    return failed;
}

/* ------------------------------------------------------------------- Python entry */

static int kind_of(const Py_buffer *b, int data) {
    const char *f = b->format ? b->format : "B";
    while (*f == '@' || *f == '=' || *f == '<' || *f == '>' || *f == '!') f++;
    const char ch = *f;
    if (ch == 'f' && b->itemsize == 4) return K_F32;
    if (ch == 'd' && b->itemsize == 8) return K_F64;
    if (data) return -1;
    if (strchr("?bBhHiIlLqQ", ch) == NULL) return -1;
    switch (b->itemsize) {
    case 1: return K_I8;
    case 2: return K_I16;
    case 4: return K_I32;
    case 8: return K_I64;
    default: return -1;
    }
}

static int take(PyObject *obj, Py_buffer *b, int *held, arr_t *a, int ndim, int writable,
                int data, const char *name) {
    if (PyObject_GetBuffer(obj, b, PyBUF_STRIDES | PyBUF_FORMAT |
                                       (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    *held = 1;
    if (b->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "_cscan.scan: %s must have %d dimensions", name, ndim);
        return -1;
    }
    a->kind = kind_of(b, data);
    if (a->kind < 0) return 1; /* a dtype this kernel does not read: the caller's fallback */
    a->p = (char *)b->buf;
    a->s0 = b->strides[0];
    a->s1 = b->strides[1];
    a->st = ndim == 3 ? b->strides[2] : 0;
    return 0;
}

static const char *const NAMES[10] = {"out0", "out1", "x", "v", "nv", "term", "trunc",
                                      "boot", "g", "lm"};

/* The walk and its work units for a call whose arrays are in c (shapes, strides, kinds):
 * the fast row walk, the column walk or the row walk (with segments for a few long
 * streams). Depends on the shapes, strides and dtypes only, so a recorded call keeps it. */
#define FAST_SEG 128 /* vectors: 2,048 steps */
static void plan_walk(ctx_t *c, int threads) {
    const ssz N = c->N1 * c->N2, T = c->T;
    /* the rewards' contiguous axis decides the walk */
    const ssz item = c->x.kind == K_F32 ? 4 : 8;
    const ssz lane = c->N2 > 1 ? c->x.s1 : c->x.s0;
    c->columns = T > 1 && N > 1 && llabs((long long)lane) == item &&
                 llabs((long long)c->x.st) != item;
    c->fast = c->fastcol = 0;
#if VEC8
    /* float32 data: the fast walks where the CPU has AVX-512; elsewhere the float64
     * walks below (see use_vec8), numba's bits */
    c->fast = !c->columns && use_fast && fast_ok(c) && (use_vec8 || fast256(c));
    c->fastcol = c->columns && use_fast && use_vec8 && fast_ok(c);
#endif
    c->h_end = NULL;
    if (c->fast) {
        c->S = 1;
        c->seg = T;
        c->nlanes = N;
        /* a few long streams on more threads: each cut into segments of whole vectors
         * (at least FAST_SEG of them), fixed up by their threads (fast_units512); two
         * or four segments a thread, claimed as threads come free, were no faster than
         * one on RLlib's 100,000 steps on the 2-core VM */
#if VEC8
        const ssz nvec = (T + 15) / 16;
        if (N < threads && (fast512(c) || fast256(c)) && nvec >= 2 * FAST_SEG) {
            ssz S = (threads + N - 1) / N;
            if (S > nvec / FAST_SEG) S = nvec / FAST_SEG;
            c->seg = (nvec + S - 1) / S;
            c->S = (nvec + c->seg - 1) / c->seg;
        }
#endif
    } else if (c->fastcol) {
        c->nblocks = c->N2 > 1 ? c->N1 * ((c->N2 + WF - 1) / WF) : (c->N1 + WF - 1) / WF;
        c->S = 1;
    } else if (c->columns) {
        c->nblocks = c->N2 > 1 ? c->N1 * ((c->N2 + WC - 1) / WC) : (c->N1 + WC - 1) / WC;
        c->S = 1;
    } else {
        /* a few long streams: cut each into segments so every thread has W lanes */
        ssz S = 1;
        if (T >= 1024 && N < (ssz)W * threads) {
            S = ((ssz)W * threads + N - 1) / N;
            if (S > T / 256) S = T / 256;
            if (S < 1) S = 1;
        }
        c->seg = (T + S - 1) / S;
        c->S = (T + c->seg - 1) / c->seg;
        c->nlanes = N * c->S;
    }
}

/* The elements from which a call takes more than one thread: with threads of our own,
 * only large calls (starting one costs tens of us on a virtual machine, and one that
 * shares a core with a spinning OpenMP worker of torch's loses a whole time slice, see
 * _cpool.h); with torch's OpenMP team, whose workers are already running, from calls of
 * about 20 us (RLlib's 100,000-step stream: 36 us on one thread, 21 on two). */
#ifndef MIN2_GOMP
#define MIN2_GOMP (1 << 16)
#endif
#define MIN2_OWN (1 << 21)
static int threads_for(const ctx_t *c, int threads) {
    if (threads < 1) threads = 1;
    const ssz min2 = pool_is_gomp() ? MIN2_GOMP : MIN2_OWN;
    if (c->N1 * c->N2 * c->T < min2) threads = 1;
    return threads;
}

/* run a planned call (c: arrays and walk set); 0 done, -1 with a Python error set */
/* The scan of c on `threads` threads, the GIL released; with `side`, the calling thread
 * first runs side->fn (the GIL held) while the others scan. The side runs whatever
 * happens (also where nothing is to scan). */
static int execute_side(ctx_t *c, int threads, side_t *side) {
    if (c->N1 * c->N2 == 0 || c->T == 0) {
        if (side) (void)side->fn(side->arg);
        return 0;
    }
    c->h_end = NULL;
    if (!c->fast && !c->columns && c->S > 1) {
        c->h_end = (double *)malloc(sizeof(double) * c->nlanes);
        if (!c->h_end) {
            if (side) (void)side->fn(side->arg);
            PyErr_NoMemory();
            return -1;
        }
    }
    int failed;
    if (side) {
        side->ran = 0;
        side->ts = NULL;
#ifndef _WIN32
        side->caller = pthread_self();
#endif
        failed = run_all(c, threads, side);
        if (side->ran)
            PyEval_RestoreThread(side->ts);
        else
            (void)side->fn(side->arg); /* not reached: the caller's thread takes part */
    } else {
        Py_BEGIN_ALLOW_THREADS
        failed = run_all(c, threads, NULL);
        Py_END_ALLOW_THREADS
    }
    free(c->h_end);
    c->h_end = NULL;
    if (failed) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int execute(ctx_t *c, int threads) { return execute_side(c, threads, NULL); }

/* The arguments of scan() into c: 1 read (c planned), 0 an array's dtype this kernel
 * does not read (nothing else done), -1 with a Python error set. The buffers taken are
 * released before returning: the caller holds the arrays. */
static int parse_call(PyObject *const *args, Py_ssize_t nargs, ctx_t *c, int *threads) {
    if (nargs != 21) {
        PyErr_SetString(PyExc_TypeError, "_cscan.scan takes 21 arguments");
        return -1;
    }
    long iv[9];
    for (int i = 0; i < 9; i++) {
        iv[i] = PyLong_AsLong(args[i]);
        if (iv[i] == -1 && PyErr_Occurred()) return -1;
    }
    memset(c, 0, sizeof(*c));
    c->mode = (int)iv[0];
    c->two_out = (int)iv[1];
    c->has_v = (int)iv[2];
    c->has_nv = (int)iv[3];
    c->has_trunc = (int)iv[4];
    c->has_boot = (int)iv[5];
    c->g_t = (int)iv[6];
    c->l_t = (int)iv[7];
    if (c->mode != MODE_GAE && c->mode != MODE_TDLAMBDA) {
        PyErr_SetString(PyExc_ValueError, "_cscan.scan: mode must be GAE or TD(lambda)");
        return -1;
    }
    c->gs = PyFloat_AsDouble(args[19]);
    if (c->gs == -1.0 && PyErr_Occurred()) return -1;
    c->lms = PyFloat_AsDouble(args[20]);
    if (c->lms == -1.0 && PyErr_Occurred()) return -1;

    Py_buffer bufs[10];
    int held[10] = {0};
    arr_t *arrs[10] = {&c->o0, &c->o1, &c->x, &c->v, &c->nv, &c->te, &c->tr, &c->boot,
                       &c->g, &c->lm};
    const int want[10] = {1, c->two_out, 1, c->has_v, c->has_nv, 1, c->has_trunc,
                          c->has_boot, c->g_t, c->l_t};
    int ret = 1;
    for (int i = 0; i < 10 && ret == 1; i++) {
        if (!want[i]) continue;
        const int r = take(args[9 + i], &bufs[i], &held[i], arrs[i], i == 7 ? 2 : 3, i < 2,
                           i != 5 && i != 6, NAMES[i]);
        if (r < 0) ret = -1;
        else if (r > 0) ret = 0;
    }
    if (ret == 1) {
        c->N1 = bufs[2].shape[0];
        c->N2 = bufs[2].shape[1];
        c->T = bufs[2].shape[2];
        *threads = threads_for(c, (int)iv[8]);
        plan_walk(c, *threads);
    }
    for (int i = 0; i < 10; i++)
        if (held[i]) PyBuffer_Release(&bufs[i]);
    return ret;
}

/* scan(mode, two_out, has_v, has_nv, has_trunc, has_boot, g_t, l_t, threads,
 *      out0, out1, x, v, nv, term, trunc, boot, g, lm, gs, lms) */
static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    ctx_t c;
    int threads = 1;
    const int r = parse_call(args, nargs, &c, &threads);
    if (r < 0) return NULL;
    if (r == 0) Py_RETURN_FALSE;
    if (execute(&c, threads) < 0) return NULL;
    Py_RETURN_TRUE;
}

/* A recorded call: what scan() would do with these arguments, kept as bytes (the ctx
 * and the thread count); run() repeats it on other arrays of the same shapes, strides
 * and dtypes, given by their data pointers. */
typedef struct {
    ctx_t c;
    int threads;
} prepared_t;

/* prepare(<scan's arguments>): the recorded call as bytes, or None where scan() would
 * return False */
static PyObject *prepare(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    prepared_t pr;
    memset(&pr, 0, sizeof(pr));
    const int r = parse_call(args, nargs, &pr.c, &pr.threads);
    if (r < 0) return NULL;
    if (r == 0) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)&pr, sizeof(pr));
}

/* run(prepared, gs, lms, out0, out1, x, v, nv, term, trunc, boot, g, lm): the recorded
 * call on the arrays at these addresses (ints; 0 for an absent one); gamma and lambda
 * numbers as given. The caller guarantees the arrays are those the recording saw, in
 * shape, strides and dtype. */
static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13 || !PyBytes_Check(args[0]) ||
        PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)sizeof(prepared_t)) {
        PyErr_SetString(PyExc_TypeError, "_cscan.run(prepared, gs, lms, 10 addresses)");
        return NULL;
    }
    prepared_t pr;
    memcpy(&pr, PyBytes_AS_STRING(args[0]), sizeof(pr));
    ctx_t *c = &pr.c;
    c->gs = PyFloat_AsDouble(args[1]);
    if (c->gs == -1.0 && PyErr_Occurred()) return NULL;
    c->lms = PyFloat_AsDouble(args[2]);
    if (c->lms == -1.0 && PyErr_Occurred()) return NULL;
    arr_t *arrs[10] = {&c->o0, &c->o1, &c->x, &c->v, &c->nv, &c->te, &c->tr, &c->boot,
                       &c->g, &c->lm};
    for (int i = 0; i < 10; i++) {
        void *p = PyLong_AsVoidPtr(args[3 + i]);
        if (p == NULL && PyErr_Occurred()) return NULL;
        if (arrs[i]->p) arrs[i]->p = (char *)p; /* absent arrays stay absent */
    }
    if (execute(c, pr.threads) < 0) return NULL;
    Py_RETURN_NONE;
}

/* ---- The replay of a recorded call from the user's own arguments ----------------------
 *
 * The cached CPU call in C: the call's key is built from the tensors' metadata as torch
 * gives it through the DLPack C exchange table (torch.Tensor.__dlpack_c_exchange_api__:
 * shape, strides, dtype, device and data pointer, no Python attribute read), the
 * recording is found in the plan dictionary, the outputs are allocated by torch.empty
 * and the recorded scan runs on the new addresses. What it does is what
 * the CPU record (_dispatch.CpuRun) does; it only touches less memory on the way
 * (a call after other work ran 110 us in Python against 56 us in the kernel). Anything
 * it does not recognise returns None, and the Python path takes the call. */

typedef struct { uint32_t major, minor; } dl_version_t;
typedef struct { int32_t device_type, device_id; } dl_device_t;
typedef struct { uint8_t code, bits; uint16_t lanes; } dl_dtype_t;
typedef struct {
    void *data;
    dl_device_t device;
    int32_t ndim;
    dl_dtype_t dtype;
    int64_t *shape, *strides;
    uint64_t byte_offset;
} dl_tensor_t;
typedef struct dl_api_header {
    dl_version_t version;
    struct dl_api_header *prev;
} dl_api_header_t;
typedef struct { /* DLPack 1.x's DLPackExchangeAPI: the entries used here, in order */
    dl_api_header_t header;
    void *managed_tensor_allocator, *managed_tensor_from_py_object_no_sync,
        *managed_tensor_to_py_object_no_sync;
    int (*dltensor_from_py_object_no_sync)(void *, dl_tensor_t *);
} dl_api_t;

/* _torchalloc.cpp's functions, where loaded (gpu_alloc): a tensor's check (whether it
 * requires grad or has the negative bit), a CPU tensor's description with that check
 * (0 plain, 1 not, 2 not described: DLPack then), and a CPU tensor over a block */
typedef int (*ext_plain_t)(PyObject *);
static ext_plain_t ext_plain;
typedef int (*ext_view_t)(PyObject *, dl_tensor_t *);
static ext_view_t ext_view;
static int ext_view_cuda; /* ext_view's CUDA tensors are used (gpu_views: checked first) */
typedef PyObject *(*ext_blob_t)(void *, int, const int64_t *, int, void (*)(void *), void *);
static ext_blob_t ext_blob;

#define DL_CPU 1
#define KEY_ARGS 16 /* arguments of a call the key covers, at most */
#define KEY_DIMS 8  /* dimensions of a tensor the key covers, at most */

static const dl_api_t *dl_api;        /* torch's exchange table, or NULL: no replay */
static PyTypeObject *tensor_type;     /* torch.Tensor (subclasses take the Python path) */
static PyObject *torch_empty, *s_requires_grad, *s_is_neg, *kw_dtype;
static int gpu_kept; /* a CUDA record was kept (_claunch.h's gpu_hooks) */

/* A recorded call: the scan and where each of the user's arguments goes. */
typedef struct {
    prepared_t pr;
    int32_t nargs;
    int8_t addr[KEY_ARGS]; /* argument -> the scan's array (0..9), or -1 */
    int8_t num[KEY_ARGS];  /* argument -> 0 gamma, 1 lambda (numbers), or -1 */
    double lo[KEY_ARGS], hi[KEY_ARGS]; /* a number's range (else the Python path) */
    int64_t extent[KEY_ARGS]; /* an out= call: each tensor's bytes from its address */
} replay_t;

/* The key of a call (prefix, then per argument its kind and, for a tensor, its dtype,
 * device, shape, strides and address mod 16; then time_dim and the tuning) into buf; the tensors'
 * views into dl. Returns the key's length, 0 where the call has no key (an argument
 * of another type, a tensor subclass, too many arguments or dimensions), -1 with a
 * Python error set. *plain: 1 where every tensor is plain (needs no autograd, has no
 * negative bit: see plain_tensor), 0 where one is not, -1 where not known (read through
 * DLPack, which does not say). */
static Py_ssize_t call_key(PyObject *prefix, PyObject *args, PyObject *time_dim,
                           PyObject *tuning, char *buf, Py_ssize_t cap, dl_tensor_t *dl,
                           int *plain) {
    *plain = ext_view ? 1 : -1;
    if (!PyBytes_Check(prefix) || !PyTuple_Check(args) || !PyLong_CheckExact(time_dim))
        return 0;
    const Py_ssize_t n = PyTuple_GET_SIZE(args), np = PyBytes_GET_SIZE(prefix);
    if (n > KEY_ARGS || np + 16 > cap) return 0;
    memcpy(buf, PyBytes_AS_STRING(prefix), np);
    char *k = buf + np, *end = buf + cap;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        if (Py_IS_TYPE(a, tensor_type)) {
            dl_tensor_t *d = &dl[i];
            int v = ext_view ? ext_view(a, d) : 2;
            if (v != 2 && d->device.device_type != DL_CPU && !ext_view_cuda) v = 2;
            if (v == 1) *plain = 0;
            if (v == 2) {
                *plain = *plain == 0 ? 0 : -1; /* not known: all_plain reads it */
                if (dl_api->dltensor_from_py_object_no_sync(a, d)) {
                    PyErr_Clear(); /* not describable (sparse, nested): the Python path
                                      says why */
                    return 0;
                }
            }
            const int nd = d->ndim;
            if (!d->data && nd >= 0 && nd <= KEY_DIMS) { /* no memory: a functionalized
                                                           tensor, say; else empty */
                int64_t numel = 1;
                for (int j = 0; j < nd; j++) numel *= d->shape[j];
                if (numel != 0) return 0;
            }
            /* recordings are of CPU calls, and of CUDA ones once one is kept (_claunch.h;
             * until then a CUDA call builds no key) */
            if (d->device.device_type != DL_CPU && !(d->device.device_type == 2 && gpu_kept))
                return 0;
            if (nd < 0 || nd > KEY_DIMS || k + 24 + 16 * nd > end) return 0;
            *k++ = 'T';
            *k++ = (char)nd;
            memcpy(k, &d->dtype, 4), k += 4;
            memcpy(k, &d->device, 8), k += 8;
            *k++ = (char)((uintptr_t)d->data & 15);
            if (nd) {
                memcpy(k, d->shape, 8 * (size_t)nd), k += 8 * nd;
                if (d->strides) memcpy(k, d->strides, 8 * (size_t)nd);
                else memset(k, 0xff, 8 * (size_t)nd); /* contiguous, strides not given */
                k += 8 * nd;
            }
        } else if (a == Py_None) {
            *k++ = 'N';
        } else if (PyFloat_CheckExact(a) || PyLong_CheckExact(a)) {
            *k++ = '#'; /* a number: its value is checked, not keyed */
        } else if (PyBool_Check(a)) {
            *k++ = a == Py_True ? 'y' : 'n';
        } else {
            return 0;
        }
        if (k + 24 > end) return 0;
    }
    const long td = PyLong_AsLong(time_dim);
    if (td == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *k++ = 't';
    memcpy(k, &td, sizeof(td)), k += sizeof(td);
    /* the tuning in effect, by identity: its recording holds it, so the address is not
     * reused while the key can be found */
    memcpy(k, &tuning, sizeof(tuning)), k += sizeof(tuning);
    return k - buf;
}

/* bind(tensor_type, exchange_capsule, empty): what the replay needs of torch; False
 * (no replay) where the table is missing or of another DLPack major version. */
static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "_cscan.bind(torch.Tensor, capsule, torch.empty)");
        return NULL;
    }
    dl_api = NULL;
    if (!PyCapsule_IsValid(args[1], "dlpack_exchange_api")) Py_RETURN_FALSE;
    const dl_api_t *api = PyCapsule_GetPointer(args[1], "dlpack_exchange_api");
    if (!api || api->header.version.major != 1 || !api->dltensor_from_py_object_no_sync)
        Py_RETURN_FALSE;
    if (!s_requires_grad && !(s_requires_grad = PyUnicode_InternFromString("requires_grad")))
        return NULL;
    if (!s_is_neg && !(s_is_neg = PyUnicode_InternFromString("is_neg"))) return NULL;
    if (!kw_dtype && !(kw_dtype = Py_BuildValue("(s)", "dtype"))) return NULL;
    Py_INCREF(args[0]);
    Py_INCREF(args[2]);
    Py_XSETREF(tensor_type, (PyTypeObject *)args[0]);
    Py_XSETREF(torch_empty, args[2]);
    dl_api = api;
    Py_RETURN_TRUE;
}

#define KEY_CAP 1024

/* key(prefix, args, time_dim, tuning): the replay's key of a call (bytes), or None */
static PyObject *key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "_cscan.key(prefix, args, time_dim, tuning)");
        return NULL;
    }
    if (!dl_api) Py_RETURN_NONE;
    char buf[KEY_CAP];
    dl_tensor_t dl[KEY_ARGS];
    int plain;
    const Py_ssize_t n = call_key(args[0], args[1], args[2], args[3], buf, KEY_CAP, dl, &plain);
    if (n < 0) return NULL;
    if (n == 0) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(buf, n);
}

/* views(tensor, ext): the tensor's description as the replay reads it, through
 * _torchalloc's view (ext true: None where it does not describe it) or DLPack (None where
 * that fails): (data address, byte offset, device type, device index, ndim, (code, bits,
 * lanes), shape, strides, plain: 1, 0, or -1 not known). _torchalloc compares the two
 * before the replay reads tensors through the first. */
static PyObject *views(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !dl_api || !Py_IS_TYPE(args[0], tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "_cscan.views(tensor, ext) after bind");
        return NULL;
    }
    dl_tensor_t d;
    int plain = -1;
    if (PyObject_IsTrue(args[1])) {
        if (!ext_view) Py_RETURN_NONE;
        const int v = ext_view(args[0], &d);
        if (v == 2) Py_RETURN_NONE;
        plain = v == 0;
    } else if (dl_api->dltensor_from_py_object_no_sync(args[0], &d)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *shape = PyTuple_New(d.ndim), *strides = d.strides ? PyTuple_New(d.ndim) : NULL;
    if (!shape || (d.strides && !strides)) goto fail;
    for (int i = 0; i < d.ndim; i++) {
        PyObject *x = PyLong_FromLongLong(d.shape[i]);
        if (!x) goto fail;
        PyTuple_SET_ITEM(shape, i, x);
        if (strides) {
            if (!(x = PyLong_FromLongLong(d.strides[i]))) goto fail;
            PyTuple_SET_ITEM(strides, i, x);
        }
    }
    return Py_BuildValue("(KKii i(iii)NNi)", (unsigned long long)(uintptr_t)d.data,
                         (unsigned long long)d.byte_offset, (int)d.device.device_type,
                         (int)d.device.device_id, (int)d.ndim, (int)d.dtype.code,
                         (int)d.dtype.bits, (int)d.dtype.lanes, shape,
                         strides ? strides : (Py_INCREF(Py_None), Py_None), plain);
fail:
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    return NULL;
}

/* recording(prepared, addr, num, lo, hi): a replay_t as bytes: per argument of the call
 * (tuples of equal length), the scan's array it is (-1: none), the number it is (0
 * gamma, 1 lambda, -1: none) and that number's range. */
static PyObject *recording(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyBytes_Check(args[0]) ||
        PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)sizeof(prepared_t)) {
        PyErr_SetString(PyExc_TypeError,
                        "_cscan.recording(prepared, addr, num, lo, hi, extents)");
        return NULL;
    }
    replay_t rp;
    memset(&rp, 0, sizeof(rp));
    memcpy(&rp.pr, PyBytes_AS_STRING(args[0]), sizeof(prepared_t));
    for (int j = 1; j < nargs; j++)
        if (!PyTuple_Check(args[j]) || PyTuple_GET_SIZE(args[j]) != PyTuple_GET_SIZE(args[1])) {
            PyErr_SetString(PyExc_TypeError, "_cscan.recording: tuples of equal length");
            return NULL;
        }
    const Py_ssize_t n = PyTuple_GET_SIZE(args[1]);
    if (n > KEY_ARGS) Py_RETURN_NONE;
    rp.nargs = (int32_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        const long a = PyLong_AsLong(PyTuple_GET_ITEM(args[1], i));
        const long m = PyLong_AsLong(PyTuple_GET_ITEM(args[2], i));
        rp.lo[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(args[3], i));
        rp.hi[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(args[4], i));
        if (PyErr_Occurred()) return NULL;
        if (a < -1 || a > 9 || m < -1 || m > 1) {
            PyErr_SetString(PyExc_ValueError, "_cscan.recording: an index out of range");
            return NULL;
        }
        rp.addr[i] = (int8_t)a;
        rp.num[i] = (int8_t)m;
        rp.extent[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[5], i));
        if (rp.extent[i] == -1 && PyErr_Occurred()) return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)&rp, sizeof(rp));
}

/* Large outputs straight from the block cache (_ctoken's blocks_api), as torch tensors
 * made through DLPack (torch's managed_tensor_to_py_object_no_sync): what _host.empty
 * gives, without its Python calls (after other work, two [4096, 128] outputs took 45-52
 * us through _host.empty on the 2-core VM; torch.frombuffer and view alone 13-16). The
 * tensor owns a DLManagedTensorVersioned whose deleter returns the block. */
typedef struct dl_managed {
    dl_version_t version;
    void *manager_ctx;
    void (*deleter)(struct dl_managed *);
    uint64_t flags;
    dl_tensor_t dl_tensor;
} dl_managed_t;
typedef struct {
    void *(*get)(size_t size, size_t *cap, size_t *off);
    void (*put)(void *mem, size_t cap);
} blocks_api_t;
typedef struct {
    dl_managed_t m;
    void *mem;
    size_t cap;
    int refs; /* torch's tensor (or the replay, until it hands the block over), and the
                 scan while it may write the block: the last one out returns it */
    int64_t shape[KEY_DIMS], strides[KEY_DIMS];
} out_block_t;
static const blocks_api_t *blocks_api; /* NULL: outputs through the recorded allocator */
static PyObject *host_dict, *host_empty, *blocks_module, *dt_f32, *dt_f64, *s_blocks;

/* Freed blocks kept here, descriptor and memory together, for the next call's outputs:
 * after other work, taking an output's block from the cache (calloc, the cache's lock
 * and list in the other extension) took 2.4 us for a call's first output on the 2-core
 * VM, mostly memory pages the call touched nowhere else (docs/notes.md). KEPT blocks at
 * most, each of KEPT_MAX bytes at most, held besides the cache's own; taken and put
 * with atomic exchanges (torch frees a tensor on any thread, without the GIL). */
#if defined(__GNUC__) || defined(__clang__)
#define KEPT 4
#else
#define KEPT 0
#endif
#define KEPT_MAX ((size_t)16 << 20)
static out_block_t *kept[KEPT > 0 ? KEPT : 1];

/* 1 where o went into a free slot of kept */
static int kept_put(out_block_t *o) {
#if KEPT
    if (o->cap > KEPT_MAX) return 0;
    for (int i = 0; i < KEPT; i++) {
        out_block_t *empty = NULL;
        if (__atomic_compare_exchange_n(&kept[i], &empty, o, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
            return 1;
    }
#else
    (void)o;
#endif
    return 0;
}

static void block_release(out_block_t *o) {
    blocks_api->put(o->mem, o->cap);
    free(o);
}

/* a kept block whose memory holds need bytes (at most 1.25x: the cache's own rule), or
 * NULL */
static out_block_t *kept_take(size_t need) {
#if KEPT
    for (int i = 0; i < KEPT; i++) {
        if (!__atomic_load_n(&kept[i], __ATOMIC_RELAXED)) continue;
        out_block_t *o = __atomic_exchange_n(&kept[i], NULL, __ATOMIC_ACQUIRE);
        if (!o) continue;
        if (o->cap >= need && o->cap - need <= need / 4) return o;
        if (!kept_put(o)) block_release(o);
    }
#else
    (void)need;
#endif
    return NULL;
}

/* one reference to the block dropped; the last keeps it (kept) or returns it to the cache */
static void block_unref(out_block_t *o) {
#if defined(__GNUC__) || defined(__clang__)
    if (__atomic_sub_fetch(&o->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
#else
    if (--o->refs != 0) return;
#endif
    if (!kept_put(o)) block_release(o);
}

static void out_block_free(dl_managed_t *self) { block_unref((out_block_t *)self); }

/* An output's block (a kept one, else from the cache) and its DLPack description, not
 * yet a tensor, its data at the offset of color k (_cblocks.h: a call's two outputs 0
 * and 1); NULL with *done = 0 where the cache does not apply (another allocator, the
 * cache off or swapped, another dtype), or NULL with *done = 1 and an error set */
static out_block_t *block_reserve(PyObject *alloc, PyObject *shape, PyObject *dtype, unsigned k,
                                  int *done) {
    *done = 0;
    if (!blocks_api || alloc != host_empty || (dtype != dt_f32 && dtype != dt_f64) ||
        !PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > KEY_DIMS ||
        !dl_api->managed_tensor_to_py_object_no_sync)
        return NULL;
    PyObject *blocks = PyDict_GetItemWithError(host_dict, s_blocks); /* _host._BLOCKS */
    if (blocks != blocks_module) return NULL;
    *done = 1;
    const int nd = (int)PyTuple_GET_SIZE(shape);
    const int64_t item = dtype == dt_f32 ? 4 : 8;
    int64_t sizes[KEY_DIMS], numel = 1;
    for (int i = 0; i < nd; i++) {
        sizes[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (sizes[i] < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a negative size");
            return NULL;
        }
        numel *= sizes[i];
    }
    const size_t bytes = (size_t)(numel * item);
    out_block_t *o = kept_take(bytes + BLOCK_COLOR_SPAN);
    if (!o) {
        if (!(o = (out_block_t *)malloc(sizeof(out_block_t)))) return (out_block_t *)PyErr_NoMemory();
        size_t off_unused = 0;
        o->mem = blocks_api->get(bytes, &o->cap, &off_unused); /* (+ the span: see there) */
        if (!o->mem) {
            free(o);
            return (out_block_t *)PyErr_NoMemory();
        }
    }
    int64_t st = 1;
    for (int i = nd - 1; i >= 0; i--) { /* contiguous */
        o->shape[i] = sizes[i];
        o->strides[i] = st;
        st *= sizes[i] > 0 ? sizes[i] : 1;
    }
    o->refs = 1;
    memset(&o->m, 0, sizeof(o->m));
    o->m.version.major = 1;
    o->m.version.minor = 0;
    o->m.manager_ctx = o;
    o->m.deleter = out_block_free;
    o->m.dl_tensor.data = (char *)o->mem + block_offset(o->mem, k);
    o->m.dl_tensor.device.device_type = DL_CPU;
    o->m.dl_tensor.ndim = nd;
    o->m.dl_tensor.dtype.code = 2; /* kDLFloat */
    o->m.dl_tensor.dtype.bits = (uint8_t)(8 * item);
    o->m.dl_tensor.dtype.lanes = 1;
    o->m.dl_tensor.shape = o->shape;
    o->m.dl_tensor.strides = o->strides;
    return o;
}

/* the replay's reference to a block it never handed to torch */
static void block_drop(out_block_t *o) { block_unref(o); }

/* the reserved block as a tensor whose deleter drops the replay's reference; NULL (no
 * error set) where torch did not make one: torch may then have run the deleter already
 * (the tensor made, its Python object not), or not (it failed before it took it: the
 * block leaks, safer than a double free) */
static void block_free(void *ctx) { block_unref((out_block_t *)ctx); }

static PyObject *block_wrap(out_block_t *o) {
    if (ext_blob) { /* c10's float32 and float64: 6, 7 (_torchalloc checks the numbers) */
        PyObject *t = ext_blob(o->m.dl_tensor.data, o->m.dl_tensor.ndim, o->shape,
                               o->m.dl_tensor.dtype.bits == 32 ? 6 : 7, block_free, o);
        if (!t) PyErr_Clear();
        return t;
    }
    void *t = NULL;
    int (*to_py)(void *, void **) = (int (*)(void *, void **))dl_api->managed_tensor_to_py_object_no_sync;
    if (to_py(&o->m, &t) || !t) {
        PyErr_Clear();
        return NULL;
    }
    return (PyObject *)t;
}

/* The output as a block-cache tensor, or NULL with *done = 0 where this does not apply
 * (see block_reserve; also where torch did not make the tensor: the recorded allocator
 * then), or NULL with *done = 1 and an error set */
static PyObject *block_output(PyObject *alloc, PyObject *shape, PyObject *dtype, unsigned k,
                              char **data, int *done) {
    out_block_t *o = block_reserve(alloc, shape, dtype, k, done);
    if (!o) return NULL;
    PyObject *t = block_wrap(o);
    if (!t) {
        *done = 0;
        return NULL;
    }
    *data = (char *)o->m.dl_tensor.data;
    return t;
}

/* kept_blocks(): how many freed blocks the replay keeps (besides the cache's own) */
static PyObject *kept_blocks(PyObject *self, PyObject *unused) {
    int n = 0;
#if KEPT
    for (int i = 0; i < KEPT; i++) n += __atomic_load_n(&kept[i], __ATOMIC_RELAXED) != NULL;
#endif
    return PyLong_FromLong(n);
}

/* bind_blocks(_host, _ctoken, torch.float32, torch.float64): large outputs of the
 * replay from the block cache through DLPack, where _host.empty would give them */
static PyObject *bind_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyModule_Check(args[0]) || !PyModule_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "_cscan.bind_blocks(_host, _ctoken, torch.float32, torch.float64)");
        return NULL;
    }
#ifdef _WIN32 /* the cache has no lock there: its blocks go back under the GIL only */
    Py_RETURN_FALSE;
#endif
    PyObject *cap = PyObject_GetAttrString(args[1], "blocks_api");
    if (!cap) return NULL;
    const blocks_api_t *api = PyCapsule_GetPointer(cap, "rl_triton_core._ctoken.blocks_api");
    Py_DECREF(cap);
    if (!api) return NULL;
    PyObject *d = PyModule_GetDict(args[0]); /* borrowed */
    PyObject *e = PyDict_GetItemString(d, "empty");
    if (!e) {
        PyErr_SetString(PyExc_TypeError, "_cscan.bind_blocks: _host has no empty");
        return NULL;
    }
    if (!s_blocks && !(s_blocks = PyUnicode_InternFromString("_BLOCKS"))) return NULL;
    Py_INCREF(d);
    Py_INCREF(e);
    Py_INCREF(args[1]);
    Py_INCREF(args[2]);
    Py_INCREF(args[3]);
    Py_XSETREF(host_dict, d);
    Py_XSETREF(host_empty, e);
    Py_XSETREF(blocks_module, args[1]);
    Py_XSETREF(dt_f32, args[2]);
    Py_XSETREF(dt_f64, args[3]);
    blocks_api = api;
    Py_RETURN_TRUE;
}

/* out = alloc(shape, dtype=dtype) (torch.empty, or _host.empty for a large output) and
 * its data pointer, or NULL */
static PyObject *new_output(PyObject *alloc, PyObject *shape, PyObject *dtype, unsigned k,
                            char **data) {
    int done;
    PyObject *b = block_output(alloc, shape, dtype, k, data, &done);
    if (b || done) return b;
    if (PyErr_Occurred()) return NULL;
    PyObject *call[2] = {shape, dtype};
    PyObject *t = PyObject_Vectorcall(alloc, call, 1, kw_dtype);
    if (!t) return NULL;
    dl_tensor_t d;
    if (!Py_IS_TYPE(t, tensor_type) || dl_api->dltensor_from_py_object_no_sync(t, &d)) {
        Py_DECREF(t);
        return NULL;
    }
    *data = (char *)d.data;
    return t;
}

/* 1 where the replay may take tensor a, 0 where the Python path must (a tensor that
 * requires grad: autograd, or detach; a view with the negative bit, x.conj().imag:
 * DLPack describes its memory, not its values), -1 with a Python error set */

static int plain_tensor(PyObject *a) {
    if (ext_plain) return ext_plain(a);
    PyObject *rg = PyObject_GetAttr(a, s_requires_grad);
    if (!rg) return -1;
    Py_DECREF(rg);
    if (rg != Py_False) return 0;
    PyObject *ng = PyObject_CallMethodNoArgs(a, s_is_neg);
    if (!ng) return -1;
    Py_DECREF(ng);
    return ng == Py_False;
}

/* 1 where every tensor of the call is plain (plain_tensor), 0 where one is not, -1 with
 * a Python error set */
static int all_plain(PyObject *call_args) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(call_args); i++) {
        PyObject *a = PyTuple_GET_ITEM(call_args, i);
        if (!Py_IS_TYPE(a, tensor_type)) continue;
        const int plain = plain_tensor(a);
        if (plain <= 0) return plain;
    }
    return 1;
}

/* The replay's Python side, done by the calling thread while the other threads scan:
 * the tensors' checks, then the outputs' blocks made tensors. status: 1 done, 0 the
 * Python path must take the call, -1 a Python error set. */
typedef struct {
    PyObject *call_args; /* the tensors to check, or NULL: known to be plain */
    out_block_t *b[2]; /* blocks not (yet) handed to torch */
    PyObject *out[2];
    int status;
} replay_side_t;

static int replay_side(void *p) {
    replay_side_t *a = (replay_side_t *)p;
    a->status = a->call_args ? all_plain(a->call_args) : 1; /* NULL: known plain */
    for (int k = 0; k < 2 && a->status == 1; k++) {
        if (!a->b[k]) continue;
        a->out[k] = block_wrap(a->b[k]);
        a->b[k] = NULL; /* torch's now; or, not made, see block_wrap */
        if (!a->out[k]) a->status = 0;
    }
    return a->status == 1;
}

/* A repeat whose outputs are the reserved blocks b0 (and b1): the scan starts right away
 * and the calling thread reads the tensors' flags and makes the output tensors while the
 * other threads scan (from memory, after other work, those Python-side steps took as
 * long as the scan of RLlib's 100,000 steps on this path's 2-core machine; docs/notes.md).
 * The scan writes the blocks only, so a call the Python path must take (a tensor that
 * requires grad, say) is computed again there. The result, None for the Python path, or
 * NULL with an error set. */
static PyObject *replay_overlapped(ctx_t *c, int threads, PyObject *call_args, out_block_t *b0,
                                   out_block_t *b1) {
    replay_side_t a = {call_args, {b0, b1}, {NULL, NULL}, -1};
    side_t side = {replay_side, &a, 0, NULL};
    out_block_t *held[2] = {b0, b1};
    for (int k = 0; k < 2; k++) /* the scan's reference: a block torch lets go of (a
                                   tensor made, then dropped) stays out of the cache */
        if (held[k]) held[k]->refs = 2;
    const int failed = execute_side(c, threads, &side) < 0;
    for (int k = 0; k < 2; k++) {
        if (a.b[k]) block_drop(a.b[k]); /* never handed to torch */
        if (held[k]) block_unref(held[k]); /* the scan is done with it */
    }
    if (failed || a.status != 1) {
        Py_XDECREF(a.out[0]);
        Py_XDECREF(a.out[1]);
        if (failed || a.status < 0) return NULL;
        Py_RETURN_NONE;
    }
    if (!b1) return a.out[0];
    PyObject *res = PyTuple_Pack(2, a.out[0], a.out[1]);
    Py_DECREF(a.out[0]);
    Py_DECREF(a.out[1]);
    return res;
}

#include "_claunch.h"


/* ---- The replay's two lookups, each remembered while what it read is unchanged --------
 *
 * After other work, every cache line a call touches before its scan starts comes from
 * memory: the two switches' getenv() (a compare at every variable's string), and the
 * plan's lookup (a bytes object made and hashed, the table's slot, the stored key) took
 * 2.5 and 2.9 us of a 70 us call on the 2-core VM (docs/notes.md). */

/* glibc only: its setenv() never rewrites or frees a string it made, so a changed
 * variable is a changed pointer (BSD's and Apple's libc rewrite their own strings in
 * place, musl frees the old one: the same address can come back); elsewhere getenv() */
#if defined(__GLIBC__)
#define ENV_MEMO 1
extern char **environ;
#else
#define ENV_MEMO 0
#endif
#define ENV_SNAP 256 /* variables: a larger environment is read each call */

static struct {
    int valid, cpu_ok, gpu_ok;
    char **arr;
    size_t n;
    char *snap[ENV_SNAP + 1];
} env_memo;

/* 1 where environ holds the remembered pointers, in order, and no more */
static int env_same(char **e) {
    if (!env_memo.valid || e != env_memo.arr || !e) return 0;
    for (size_t i = 0; i <= env_memo.n; i++) /* slot by slot: a shorter array stops at NULL */
        if (e[i] != env_memo.snap[i]) return 0;
    return 1;
}

/* The two switches, read at call time as the Python path reads them
 * (RL_TRITON_CORE_BACKEND=auto|cpu|triton, RL_TRITON_CORE_CPU_KERNEL=numba): with glibc,
 * their values are remembered with the environment's array of string pointers, and read
 * again where any pointer differs (setenv, putenv and unsetenv, os.environ's too, change
 * one; a string changed in place after putenv() is not seen). */
static void env_switches(int *cpu_ok, int *gpu_ok) {
#if ENV_MEMO
    char **e = environ;
    if (env_same(e)) {
        *cpu_ok = env_memo.cpu_ok;
        *gpu_ok = env_memo.gpu_ok;
        return;
    }
#endif
    const char *backend = getenv("RL_TRITON_CORE_BACKEND");
    const int auto_ = !backend || !strcmp(backend, "auto");
    const char *kernel = getenv("RL_TRITON_CORE_CPU_KERNEL");
    *cpu_ok = (auto_ || !strcmp(backend, "cpu")) && !(kernel && !strcmp(kernel, "numba"));
    *gpu_ok = auto_ || !strcmp(backend, "triton");
#if ENV_MEMO
    size_t n = 0;
    env_memo.valid = 0;
    if (!e) return;
    while (n <= ENV_SNAP && e[n]) n++;
    if (n > ENV_SNAP) return;
    memcpy(env_memo.snap, e, sizeof(char *) * (n + 1)); /* the NULL at the end too */
    env_memo.arr = e;
    env_memo.n = n;
    env_memo.cpu_ok = *cpu_ok;
    env_memo.gpu_ok = *gpu_ok;
    env_memo.valid = 1;
#endif
}

/* The last plans found, by key: the table (a strong reference: no other dictionary can
 * take its address), the plan, the key. An entry holds while the table is unchanged:
 * its version tag (Python 3.11) or, from 3.12 on, no event of the dictionary watcher on
 * it since (a change of any watched table retires every entry). An entry keeps its
 * table and plan alive until it is replaced (at most four). */
#define HITS 4
typedef struct {
    PyObject *plans, *rec;
    uint64_t stamp;
    Py_ssize_t n;
    char key[KEY_CAP];
} hit_t;
static hit_t hits[HITS];

#if PY_VERSION_HEX >= 0x030C0000
static int plans_watcher = -1;
static uint64_t plans_gen = 1; /* raised by every event of a watched table */
static int plans_changed(PyDict_WatchEvent ev, PyObject *d, PyObject *k, PyObject *v) {
    (void)ev, (void)d, (void)k, (void)v;
    plans_gen++;
    return 0;
}
static uint64_t plans_stamp(PyObject *plans) { (void)plans; return plans_gen; }
static int plans_watch(PyObject *plans) {
    if (plans_watcher < 0 && (plans_watcher = PyDict_AddWatcher(plans_changed)) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (PyDict_Watch(plans_watcher, plans) < 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}
#else
static uint64_t plans_stamp(PyObject *plans) {
    return ((PyDictObject *)plans)->ma_version_tag;
}
static int plans_watch(PyObject *plans) { (void)plans; return 1; }
#endif

static size_t hit_slot(const char *key, Py_ssize_t n) {
    uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ull;
    for (Py_ssize_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, key + i, 8);
        h = (h ^ w) * 0x100000001B3ull;
    }
    return (size_t)(h >> 32) % HITS;
}

/* plans[key] (a new reference), or NULL (with an error set where the lookup raised) */
static PyObject *plan_of(PyObject *plans, const char *key, Py_ssize_t n) {
    hit_t *h = &hits[hit_slot(key, n)];
    if (h->plans == plans && h->n == n && h->stamp == plans_stamp(plans) &&
        !memcmp(h->key, key, (size_t)n)) {
        Py_INCREF(h->rec);
        return h->rec;
    }
    PyObject *k = PyBytes_FromStringAndSize(key, n);
    if (!k) return NULL;
    PyObject *rec = PyDict_GetItemWithError(plans, k);
    Py_DECREF(k);
    if (!rec) return NULL;
    Py_INCREF(rec);
    if (n <= KEY_CAP && plans_watch(plans)) {
        PyObject *old_plans = h->plans, *old_rec = h->rec;
        Py_INCREF(plans);
        Py_INCREF(rec);
        h->plans = plans;
        h->rec = rec;
        h->n = n;
        memcpy(h->key, key, (size_t)n);
        h->stamp = plans_stamp(plans); /* after the watch: a change before it retires it */
        Py_XDECREF(old_plans); /* last: these may run Python code */
        Py_XDECREF(old_rec);
    }
    return rec;
}

/* replay()'s work: args = (plans (a dict), prefix, args, time_dim, tuning) */
static PyObject *replay_call(PyObject *const *args) {
    if (!dl_api) Py_RETURN_NONE;
    int cpu_ok, gpu_ok;
    env_switches(&cpu_ok, &gpu_ok);
    char buf[KEY_CAP];
    dl_tensor_t dl[KEY_ARGS];
    int plain;
    const Py_ssize_t n = call_key(args[1], args[2], args[3], args[4], buf, KEY_CAP, dl, &plain);
    if (n <= 0 || plain == 0) { /* (a tensor that is not plain: the Python path) */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    /* held: the getters below can run Python code (a torch function mode), which could
     * drop the plan from the dictionary */
    PyObject *rec = plan_of(args[0], buf, n);
    if (!rec) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *out0 = NULL, *out1 = NULL, *res = NULL;
    if (PyTuple_CheckExact(rec) && PyTuple_GET_SIZE(rec) == 5 &&
        PyTuple_GET_ITEM(rec, 2) == args[4]) { /* a CUDA call's recording */
        res = gpu_ok ? gpu_replay(rec, args[2], dl, plain) : (Py_INCREF(Py_None), Py_None);
        Py_DECREF(rec);
        return res;
    }
    if (!cpu_ok || !PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 6 ||
        PyTuple_GET_ITEM(rec, 3) != args[4])
        goto none; /* recorded under another tuning */
    PyObject *blob = PyTuple_GET_ITEM(rec, 0);
    if (!PyBytes_Check(blob) || PyBytes_GET_SIZE(blob) != (Py_ssize_t)sizeof(replay_t))
        goto none;
    const replay_t *rp = (const replay_t *)PyBytes_AS_STRING(blob);
    PyObject *call_args = args[2];
    if (PyTuple_GET_SIZE(call_args) != rp->nargs) goto none;
    prepared_t pr = rp->pr;
    ctx_t *c = &pr.c;
    arr_t *arrs[10] = {&c->o0, &c->o1, &c->x, &c->v, &c->nv, &c->te, &c->tr, &c->boot,
                       &c->g, &c->lm};
    for (Py_ssize_t i = 0; i < rp->nargs; i++) { /* (the tensors' checks: all_plain) */
        PyObject *a = PyTuple_GET_ITEM(call_args, i);
        if (Py_IS_TYPE(a, tensor_type)) {
            if (rp->addr[i] >= 0 && arrs[rp->addr[i]]->p) arrs[rp->addr[i]]->p = dl[i].data;
        } else if (rp->num[i] >= 0) {
            const double x = PyFloat_AsDouble(a);
            if (x == -1.0 && PyErr_Occurred()) goto fail;
            if (!(rp->lo[i] <= x && x <= rp->hi[i])) goto none; /* NaN too: the error */
            if (rp->num[i] == 0) c->gs = x;
            else c->lms = x;
        }
    }
    PyObject *shape = PyTuple_GET_ITEM(rec, 1), *dtype = PyTuple_GET_ITEM(rec, 2);
    const int two = PyTuple_GET_ITEM(rec, 4) == Py_True;
    PyObject *alloc = PyTuple_GET_ITEM(rec, 5);
    if (shape != Py_None) { /* outputs from the block cache: the scan starts at once */
        int done;
        out_block_t *b0 = block_reserve(alloc, shape, dtype, 0, &done), *b1 = NULL;
        if (!b0 && (done || PyErr_Occurred())) goto fail;
        if (b0 && two && !(b1 = block_reserve(alloc, shape, dtype, 1, &done))) {
            block_drop(b0);
            if (done) goto fail;
            b0 = NULL;
        }
        if (b0) {
            c->o0.p = (char *)b0->m.dl_tensor.data;
            if (c->o1.p) c->o1.p = (char *)(two ? b1 : b0)->m.dl_tensor.data;
            res = replay_overlapped(c, pr.threads, plain == 1 ? NULL : call_args, b0, b1);
            Py_DECREF(rec);
            return res;
        }
    }
    if (plain < 0 && (plain = all_plain(call_args)) <= 0) {
        if (plain < 0) goto fail;
        goto none;
    }
    if (shape == Py_None) { /* an out= call: the scan writes into the user's tensors */
        PyObject *given[2] = {NULL, NULL};
        for (Py_ssize_t o = 0; o < rp->nargs; o++) {
            if (rp->addr[o] != 0 && rp->addr[o] != 1) continue;
            given[rp->addr[o]] = PyTuple_GET_ITEM(call_args, o);
            /* none may share memory with another tensor of the call (the Python path
             * raises the error): the addresses and the extents the key fixes */
            const uintptr_t lo = (uintptr_t)dl[o].data, hi = lo + (uintptr_t)rp->extent[o];
            for (Py_ssize_t i = 0; i < rp->nargs; i++) {
                if (i == o || !rp->extent[i] ||
                    !Py_IS_TYPE(PyTuple_GET_ITEM(call_args, i), tensor_type))
                    continue;
                const uintptr_t q0 = (uintptr_t)dl[i].data, q1 = q0 + (uintptr_t)rp->extent[i];
                if (q0 < hi && lo < q1) goto none;
            }
        }
        if (!given[0] || (two && !given[1])) goto none;
        if (!two && c->o1.p) c->o1.p = c->o0.p;
        if (execute(c, pr.threads) < 0) goto fail;
        res = two ? PyTuple_Pack(2, given[0], given[1]) : (Py_INCREF(given[0]), given[0]);
        Py_DECREF(rec);
        return res;
    }
    char *p0, *p1 = NULL;
    if (!(out0 = new_output(alloc, shape, dtype, 0, &p0))) goto fail;
    if (two && !(out1 = new_output(alloc, shape, dtype, 1, &p1))) goto fail;
    c->o0.p = p0;
    if (c->o1.p) c->o1.p = two ? p1 : p0;
    if (execute(c, pr.threads) < 0) goto fail;
    res = two ? PyTuple_Pack(2, out0, out1) : (Py_INCREF(out0), out0);
    Py_DECREF(rec);
    Py_DECREF(out0);
    Py_XDECREF(out1);
    return res;
fail: /* an error set: raised; else (an output not a plain tensor) the Python path */
    Py_DECREF(rec);
    Py_XDECREF(out0);
    Py_XDECREF(out1);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
none:
    Py_DECREF(rec);
    Py_RETURN_NONE;
}

/* replay(plans, prefix, args, time_dim, tuning): the call's result where plans holds a
 * recording of it, under key(prefix, args, time_dim, tuning), as (replay_t bytes, output shape,
 * output dtype, tuning, two outputs, the outputs' allocator); else None (the Python path
 * takes the call). */
static PyObject *replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "_cscan.replay(plans, prefix, args, time_dim, tuning)");
        return NULL;
    }
    return replay_call(args);
}


/* ---- The estimators' entry: their public functions' calls straight into the replay ----
 *
 * entry(fn, spec, prefix, names, defaults, order, npos, front, est, dispatch, config):
 * a callable that takes fn's arguments (a Python function def name(a, b, ..., *, ...,
 * time_dim, out=None) whose body is `return front(spec, args, time_dim, out)`, args in
 * the row's order) and, for a call without out=, maps them to the row's order itself
 * (names: fn's parameters but time_dim and out; defaults: theirs, or the entry type for
 * none; order: each one's place in args; npos: how many may come by position) and tries
 * the replay; where it does not take the call, front(spec, args, time_dim, None, True).
 * A default that is the type Entry itself marks a required parameter.
 * Anything else (out= a tensor, an unknown or repeated keyword, a missing argument, the
 * replay swapped in est, _replay: a test's spy) is fn's own call. front and the defaults
 * are taken when the entry is made (a later change to fn's defaults or estimators._front
 * is not seen). After other work, fn's frame,
 * its keywords and the check that dynamo is not tracing cost 8-11 us of a 70 us call
 * (docs/notes.md); dynamo traces fn itself (estimators.py). */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict; /* __doc__, __name__, __wrapped__, ... */
    PyObject *weakrefs;
#define ENTRY_OBJS(X) X(fn) X(spec) X(prefix) X(names) X(defaults) X(front) X(est) X(dispatch) X(config)
#define ENTRY_FIELD(f) PyObject *f;
    ENTRY_OBJS(ENTRY_FIELD)
#undef ENTRY_FIELD
    int n, npos;
    int8_t order[KEY_ARGS];
} entry_t;

static PyObject *s_time_dim, *s_out, *s_plans, *s_current, *s_replay, *replay_fn;
static PyTypeObject entry_type;

static PyObject *entry_vcall(PyObject *self, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames) {
    entry_t *e = (entry_t *)self;
    const Py_ssize_t npos = PyVectorcall_NARGS(nargsf);
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *vals[KEY_ARGS], *time_dim = NULL;
    if (!e->fn) { /* cleared (a finalizer after the collector's clear) */
        PyErr_SetString(PyExc_RuntimeError, "an rl_triton_core entry used after its clear");
        return NULL;
    }
    if (npos > e->npos || PyDict_GetItemWithError(e->est, s_replay) != replay_fn)
        goto python;
    for (int i = 0; i < e->n; i++) vals[i] = PyTuple_GET_ITEM(e->defaults, i);
    for (Py_ssize_t i = 0; i < npos; i++) vals[i] = args[i];
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, j);
        if (k == s_time_dim) {
            time_dim = args[npos + j];
            continue;
        }
        if (k == s_out && args[npos + j] == Py_None) continue; /* out=None: none */
        int i = 0;
        while (i < e->n && PyTuple_GET_ITEM(e->names, i) != k) i++; /* interned names */
        if (i == e->n || i < npos) goto python; /* out=, not interned, unknown, twice */
        vals[i] = args[npos + j];
    }
    if (!time_dim) goto python;
    PyObject *call_args = PyTuple_New(e->n);
    if (!call_args) return NULL;
    for (int i = 0; i < e->n; i++) {
        if (vals[i] == (PyObject *)&entry_type) { /* required, not given */
            Py_DECREF(call_args);
            goto python;
        }
        Py_INCREF(vals[i]);
        PyTuple_SET_ITEM(call_args, e->order[i], vals[i]);
    }
    PyObject *res = NULL;
    PyObject *plans = PyDict_GetItemWithError(e->dispatch, s_plans);
    PyObject *tuning = plans ? PyDict_GetItemWithError(e->config, s_current) : NULL;
    if (plans && tuning && PyDict_Check(plans)) {
        PyObject *rargs[5] = {plans, e->prefix, call_args, time_dim, tuning};
        res = replay_call(rargs);
        if (res == Py_None) Py_CLEAR(res);
    }
    if (!res && !PyErr_Occurred()) {
        PyObject *fargs[5] = {e->spec, call_args, time_dim, Py_None, Py_True};
        res = PyObject_Vectorcall(e->front, fargs, 5, NULL);
    }
    Py_DECREF(call_args);
    return res;
python:
    if (PyErr_Occurred()) return NULL;
    return PyObject_Vectorcall(e->fn, args, nargsf, kwnames);
}

static PyObject *entry_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11 || !PyBytes_Check(args[2]) || !PyTuple_Check(args[3]) ||
        !PyTuple_Check(args[4]) || !PyTuple_Check(args[5]) || !PyLong_Check(args[6]) ||
        !PyDict_Check(args[8]) || !PyDict_Check(args[9]) || !PyDict_Check(args[10])) {
        PyErr_SetString(PyExc_TypeError,
                        "_cscan.entry(fn, spec, prefix, names, defaults, order, npos, front, "
                        "est.__dict__, dispatch.__dict__, config.__dict__)");
        return NULL;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(args[3]);
    if (n > KEY_ARGS || PyTuple_GET_SIZE(args[4]) != n || PyTuple_GET_SIZE(args[5]) != n) {
        PyErr_SetString(PyExc_ValueError, "_cscan.entry: names, defaults and order differ");
        return NULL;
    }
    if (!s_time_dim && !(s_time_dim = PyUnicode_InternFromString("time_dim"))) return NULL;
    if (!s_out && !(s_out = PyUnicode_InternFromString("out"))) return NULL;
    if (!s_plans && !(s_plans = PyUnicode_InternFromString("_PLANS"))) return NULL;
    if (!s_current && !(s_current = PyUnicode_InternFromString("_current"))) return NULL;
    if (!s_replay && !(s_replay = PyUnicode_InternFromString("_replay"))) return NULL;
    entry_t *e = PyObject_GC_New(entry_t, &entry_type);
    if (!e) return NULL;
    e->vectorcall = entry_vcall;
    e->dict = NULL;
    e->weakrefs = NULL;
    e->n = (int)n;
    e->npos = (int)PyLong_AsLong(args[6]);
    PyObject **slots[9] = {&e->fn, &e->spec, &e->prefix, &e->names, &e->defaults, &e->front,
                           &e->est, &e->dispatch, &e->config};
    const int from[9] = {0, 1, 2, 3, 4, 7, 8, 9, 10};
    for (int i = 0; i < 9; i++) {
        Py_INCREF(args[from[i]]);
        *slots[i] = args[from[i]];
    }
    PyObject_GC_Track(e);
    int bad = e->npos < 0 || e->npos > n;
    uint32_t seen = 0; /* order: a permutation */
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        PyObject *nm = PyTuple_GET_ITEM(args[3], i);
        const long o = PyLong_AsLong(PyTuple_GET_ITEM(args[5], i));
        bad = !PyUnicode_CheckExact(nm) || o < 0 || o >= n || (seen >> o & 1);
        if (!bad) seen |= 1u << o;
        if (!bad) {
            Py_INCREF(nm);
            PyUnicode_InternInPlace(&nm); /* (the tuple's own is interned: the same one) */
            bad = nm != PyTuple_GET_ITEM(args[3], i);
            Py_DECREF(nm);
        }
        e->order[i] = (int8_t)o;
    }
    if (bad) {
        Py_DECREF(e);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "_cscan.entry: a name not interned or an order "
                                              "out of range");
        return NULL;
    }
    return (PyObject *)e;
}

static int entry_traverse(entry_t *e, visitproc visit, void *arg) {
#define ENTRY_VISIT(f) Py_VISIT(e->f);
    Py_VISIT(e->dict);
    ENTRY_OBJS(ENTRY_VISIT)
#undef ENTRY_VISIT
    return 0;
}

static int entry_clear(entry_t *e) {
#define ENTRY_CLEAR(f) Py_CLEAR(e->f);
    Py_CLEAR(e->dict);
    ENTRY_OBJS(ENTRY_CLEAR)
#undef ENTRY_CLEAR
    return 0;
}

static void entry_dealloc(entry_t *e) {
    PyObject_GC_UnTrack(e);
    if (e->weakrefs) PyObject_ClearWeakRefs((PyObject *)e);
    entry_clear(e);
    PyObject_GC_Del(e);
}

static PyObject *entry_repr(entry_t *e) {
    if (!e->fn) return PyUnicode_FromString("<function (C entry), cleared>");
    PyObject *q = PyObject_GetAttrString(e->fn, "__qualname__");
    if (!q) return NULL;
    PyObject *r = PyUnicode_FromFormat("<function %S (C entry) at %p>", q, (void *)e);
    Py_DECREF(q);
    return r;
}

/* pickled by name, as a function is */
static PyObject *entry_reduce(entry_t *e, PyObject *unused) {
    if (!e->fn) return PyUnicode_FromString("?");
    return PyObject_GetAttrString(e->fn, "__qualname__");
}

/* a method where a class holds it, as a function is */
static PyObject *entry_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyMethodDef entry_methods[] = {
    {"__reduce__", (PyCFunction)entry_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef entry_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject entry_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rl_triton_core.scan._cscan.Entry",
    .tp_basicsize = sizeof(entry_t),
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_vectorcall_offset = offsetof(entry_t, vectorcall),
    .tp_repr = (reprfunc)entry_repr,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "An estimator's public function: see its __wrapped__.",
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_clear = (inquiry)entry_clear,
    .tp_methods = entry_methods,
    .tp_getset = entry_getset,
    .tp_dictoffset = offsetof(entry_t, dict),
    .tp_weaklistoffset = offsetof(entry_t, weakrefs),
    .tp_descr_get = entry_get,
};

/* ---- The benchmark's same-bytes floor -------------------------------------------------
 *
 * floor(out0, out1, threads, *inputs): reads every input once and writes two outputs,
 * o0 = the sum of the float32 inputs plus the xor of the byte ones and of the int64 ones
 * read as flags (nonzero: set), o1 = o0 / 2, no
 * recurrence: what any kernel reading and writing these arrays must at least move, done
 * two ways, the benchmark taking the faster: floor() in blocks of 2,048 elements that stay
 * in L1 while each array's run of the block is read in turn (the faster for data in the
 * caches), floor_fused() in one pass over every array at once, outputs streamed when large
 * (the faster from memory); the inputs split over `threads` threads. Arrays: 1-D,
 * contiguous, one length; float32, one byte or int64 each. */

#define FLOOR_MAX 8
#define FLOOR_BLOCK 2048
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FLOOR_NT_BYTES (16 << 20) /* outputs from which they are streamed (as _ctoken's) */
#else
#define FLOOR_NT_BYTES 0
#endif

typedef struct {
    int nf, nb, nq, parts, nt, fused;
    const float *f[FLOOR_MAX];
    const unsigned char *b[FLOOR_MAX];
    const int64_t *q[FLOOR_MAX];
    float *o0, *o1;
    ssz n;
    ssz next;
} floor_t;

typedef float f16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
typedef int64_t q8v __attribute__((vector_size(64)));
typedef unsigned char u16b __attribute__((vector_size(16)));

/* blocks of 2,048 elements, each array's run of it in turn, the sum kept in L1 (the
   faster for data in the caches) */
MULTIVERSION static void floor_blocks(const floor_t *F, ssz lo, ssz hi) {
    float *restrict o0 = F->o0, *restrict o1 = F->o1;
    unsigned char m[FLOOR_BLOCK];
    for (ssz b0 = lo; b0 < hi; b0 += FLOOR_BLOCK) {
        const ssz e = hi - b0 < FLOOR_BLOCK ? hi - b0 : FLOOR_BLOCK;
        const float *restrict f0 = F->f[0] + b0;
        float *restrict p = o0 + b0;
        NOALIAS
        for (ssz i = 0; i < e; i++) p[i] = f0[i];
        for (int j = 1; j < F->nf; j++) {
            const float *restrict fj = F->f[j] + b0;
            NOALIAS
            for (ssz i = 0; i < e; i++) p[i] += fj[i];
        }
        if (F->nb || F->nq) {
            NOALIAS
            for (ssz i = 0; i < e; i++) m[i] = 0;
            for (int j = 0; j < F->nb; j++) {
                const unsigned char *restrict qj = F->b[j] + b0;
                NOALIAS
                for (ssz i = 0; i < e; i++) m[i] ^= qj[i];
            }
            for (int j = 0; j < F->nq; j++) { /* 8-byte integers (a mask): set where nonzero */
                const int64_t *restrict qj = F->q[j] + b0;
                NOALIAS
                for (ssz i = 0; i < e; i++) m[i] ^= (unsigned char)(qj[i] != 0);
            }
            NOALIAS
            for (ssz i = 0; i < e; i++) p[i] += (float)m[i];
        }
        float *restrict q = o1 + b0;
        NOALIAS
        for (ssz i = 0; i < e; i++) q[i] = 0.5f * p[i];
    }
}

/* the elements [i, hi) past the fused passes' last whole vector, one at a time */
INLINE void floor_tail(const floor_t *F, ssz i, ssz hi) {
    for (; i < hi; i++) {
        float p = F->f[0][i];
        unsigned m = 0;
        for (int j = 1; j < F->nf; j++) p += F->f[j][i];
        for (int j = 0; j < F->nb; j++) m ^= F->b[j][i];
        for (int j = 0; j < F->nq; j++) m ^= F->q[j][i] != 0;
        F->o0[i] = p + (float)m;
        F->o1[i] = 0.5f * F->o0[i];
    }
}

/* one pass, 16 elements at a time, every input read as the loop goes (no intermediate
   buffer): the hardware prefetchers see each array as one long run (the faster from
   memory), outputs streamed when large */
MULTIVERSION static void floor_fused(const floor_t *F, ssz lo, ssz hi) {
    float *restrict o0 = F->o0, *restrict o1 = F->o1;
    const f16v half = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f,
                       0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    ssz i = lo;
    for (; i + 16 <= hi; i += 16) {
        f16v p, x;
        memcpy(&p, F->f[0] + i, 64);
        for (int j = 1; j < F->nf; j++) {
            memcpy(&x, F->f[j] + i, 64);
            p += x;
        }
        if (F->nb || F->nq) {
            i16v m = {0};
            for (int j = 0; j < F->nb; j++) {
                u16b c;
                memcpy(&c, F->b[j] + i, 16);
                m ^= __builtin_convertvector(c, i16v);
            }
            for (int j = 0; j < F->nq; j++) { /* 8-byte integers (a mask): set where nonzero */
                q8v a, c;
                memcpy(&a, F->q[j] + i, 64);
                memcpy(&c, F->q[j] + i + 8, 64);
                a = a != 0;
                c = c != 0;
                i16v t = {(int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)a[3],
                          (int32_t)a[4], (int32_t)a[5], (int32_t)a[6], (int32_t)a[7],
                          (int32_t)c[0], (int32_t)c[1], (int32_t)c[2], (int32_t)c[3],
                          (int32_t)c[4], (int32_t)c[5], (int32_t)c[6], (int32_t)c[7]};
                m ^= -t;
            }
            p += __builtin_convertvector(m, f16v);
        }
        x = half * p;
#if FLOOR_NT_BYTES
        if (F->nt) { /* streamed: whole lines to memory, no read for ownership */
            for (int k = 0; k < 16; k += 4) {
                _mm_stream_ps(o0 + i + k, _mm_loadu_ps((const float *)&p + k));
                _mm_stream_ps(o1 + i + k, _mm_loadu_ps((const float *)&x + k));
            }
            continue;
        }
#endif
        memcpy(o0 + i, &p, 64);
        memcpy(o1 + i, &x, 64);
    }
    floor_tail(F, i, hi);
#if FLOOR_NT_BYTES
    if (F->nt) _mm_sfence();
#endif
}

#if VEC8 && defined(__x86_64__)
/* floor_fused on AVX-512, with the byte flags widened by vpmovzxbd: gcc made 16 scalar
   extracts of __builtin_convertvector's widening of a byte vector, so the generic loop
   took 2.4x the time of this one from the caches ([4096, 128]: three float32 inputs and
   two byte flags, one thread, 371 against 155 us on the 2-core EPYC VM) */
AVX512 static void floor_fused512(const floor_t *F, ssz lo, ssz hi) {
    float *restrict o0 = F->o0, *restrict o1 = F->o1;
    const int nf = F->nf, nb = F->nb, nq = F->nq, nt = F->nt;
    const float *fp[FLOOR_MAX];
    const unsigned char *bp[FLOOR_MAX];
    const int64_t *qp[FLOOR_MAX];
    for (int j = 0; j < FLOOR_MAX; j++) fp[j] = F->f[j], bp[j] = F->b[j], qp[j] = F->q[j];
    const __m512 half = _mm512_set1_ps(0.5f);
    ssz i = lo;
    for (; i + 16 <= hi; i += 16) {
        __m512 p = _mm512_loadu_ps(fp[0] + i);
        for (int j = 1; j < nf; j++) p = _mm512_add_ps(p, _mm512_loadu_ps(fp[j] + i));
        if (nb || nq) {
            __m128i u = _mm_setzero_si128();
            for (int j = 0; j < nb; j++)
                u = _mm_xor_si128(u, _mm_loadu_si128((const __m128i *)(bp[j] + i)));
            __m512i w = _mm512_cvtepu8_epi32(u);
            for (int j = 0; j < nq; j++) { /* 8-byte integers (a mask): set where nonzero */
                const __m512i a = _mm512_loadu_si512((const void *)(qp[j] + i));
                const __m512i c = _mm512_loadu_si512((const void *)(qp[j] + i + 8));
                const __mmask16 k = (__mmask16)(_mm512_test_epi64_mask(a, a) |
                                                ((unsigned)_mm512_test_epi64_mask(c, c) << 8));
                w = _mm512_xor_si512(w, _mm512_maskz_set1_epi32(k, 1));
            }
            p = _mm512_add_ps(p, _mm512_cvtepi32_ps(w));
        }
        const __m512 x = _mm512_mul_ps(half, p);
        if (nt) { /* streamed: whole lines to memory, no read for ownership */
            _mm_stream_ps(o0 + i, _mm512_extractf32x4_ps(p, 0));
            _mm_stream_ps(o0 + i + 4, _mm512_extractf32x4_ps(p, 1));
            _mm_stream_ps(o0 + i + 8, _mm512_extractf32x4_ps(p, 2));
            _mm_stream_ps(o0 + i + 12, _mm512_extractf32x4_ps(p, 3));
            _mm_stream_ps(o1 + i, _mm512_extractf32x4_ps(x, 0));
            _mm_stream_ps(o1 + i + 4, _mm512_extractf32x4_ps(x, 1));
            _mm_stream_ps(o1 + i + 8, _mm512_extractf32x4_ps(x, 2));
            _mm_stream_ps(o1 + i + 12, _mm512_extractf32x4_ps(x, 3));
            continue;
        }
        _mm512_storeu_ps(o0 + i, p);
        _mm512_storeu_ps(o1 + i, x);
    }
    floor_tail(F, i, hi);
    if (nt) _mm_sfence();
}
#endif

static void floor_part(void *arg) {
    floor_t *F = (floor_t *)arg;
#if defined(__GNUC__)
    const ssz k = __atomic_fetch_add(&F->next, 1, __ATOMIC_RELAXED);
#else
    const ssz k = F->next++;
#endif
    if (k >= F->parts) return;
    /* part k: a run of whole blocks */
    const ssz per = ((F->n + F->parts - 1) / F->parts + FLOOR_BLOCK - 1) / FLOOR_BLOCK * FLOOR_BLOCK;
    const ssz lo = k * per, hi = lo + per < F->n ? lo + per : F->n;
    if (lo < hi) {
#if VEC8 && defined(__x86_64__)
        if (F->fused && use_vec8) floor_fused512(F, lo, hi);
        else
#endif
        if (F->fused) floor_fused(F, lo, hi);
        else floor_blocks(F, lo, hi);
    }
}

static PyObject *floor_impl(PyObject *const *args, Py_ssize_t nargs, int fused) {
    if (nargs < 4 || nargs > 3 + 2 * FLOOR_MAX) {
        PyErr_SetString(PyExc_TypeError, "_cscan.floor(out0, out1, threads, *inputs)");
        return NULL;
    }
    const long threads = PyLong_AsLong(args[2]);
    if (threads == -1 && PyErr_Occurred()) return NULL;
    Py_buffer bufs[3 + 2 * FLOOR_MAX];
    int held = 0, ok = 1;
    floor_t F;
    memset(&F, 0, sizeof(F));
    for (Py_ssize_t i = 0; i < nargs && ok; i++) {
        if (i == 2) continue;
        const int out = i < 2;
        Py_buffer *b = &bufs[i];
        if (PyObject_GetBuffer(args[i], b, (out ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS |
                                               PyBUF_FORMAT) < 0) {
            ok = 0;
            break;
        }
        held |= 1 << i;
        const ssz n = b->itemsize ? b->len / b->itemsize : 0;
        if (F.n == 0 && i == 0) F.n = n;
        const char fmt = b->format ? b->format[b->format[0] == '<' || b->format[0] == '='] : 'B';
        const int q8 = b->itemsize == 8 && (fmt == 'q' || fmt == 'l');
        if (n != F.n || (out && fmt != 'f') ||
            (b->itemsize != 4 && b->itemsize != 1 && !q8) || (b->itemsize == 4 && fmt != 'f')) {
            PyErr_SetString(PyExc_ValueError,
                            "_cscan.floor: 1-D contiguous arrays of one length, float32 "
                            "outputs, float32, one-byte or int64 inputs");
            ok = 0;
        } else if (out) {
            if (i == 0) F.o0 = (float *)b->buf;
            else F.o1 = (float *)b->buf;
        } else if (b->itemsize == 4) {
            F.f[F.nf++] = (const float *)b->buf;
        } else if (q8) {
            F.q[F.nq++] = (const int64_t *)b->buf;
        } else {
            F.b[F.nb++] = (const unsigned char *)b->buf;
        }
    }
    if (ok && F.nf == 0) {
        PyErr_SetString(PyExc_ValueError, "_cscan.floor needs a float32 input");
        ok = 0;
    }
    if (ok && F.n > 0) {
        F.fused = fused;
        F.parts = threads < 1 ? 1 : (int)threads;
        F.nt = fused && FLOOR_NT_BYTES && (double)F.n * 8.0 >= (double)FLOOR_NT_BYTES &&
               ((uintptr_t)F.o0 & 15) == 0 && ((uintptr_t)F.o1 & 15) == 0;
        Py_BEGIN_ALLOW_THREADS
        pool_run(floor_part, &F, F.parts);
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (held & (1 << i)) PyBuffer_Release(&bufs[i]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *floor_(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return floor_impl(args, nargs, 0);
}

static PyObject *floor_fused_(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return floor_impl(args, nargs, 1);
}

/* use_vector(flag): switch the vector recurrence (where the CPU has it) on or off;
 * returns whether it was on. For tests: both loops give the same bits. */
static PyObject *use_vector(PyObject *self, PyObject *arg) {
    const int was = use_vec8, want = PyObject_IsTrue(arg);
    if (want < 0) return NULL;
#if VEC8 && defined(__x86_64__)
    use_vec8 = want && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw");
#endif
    return PyBool_FromLong(was);
}

/* A test switch: NAME(flag) sets VAR (on or off) and returns whether it was on. Tests
 * reach the other paths with the same data: use_fast (the fast row walk), use_256 (its
 * AVX2 path), use_512 (its AVX-512 path: the generic fast walk gives the same bits),
 * use_gomp (torch's OpenMP team for the threads, where loaded: off, threads of our own). */
#define SWITCH(NAME, VAR)                                                              \
    static PyObject *NAME##_(PyObject *self, PyObject *arg) {                          \
        const int was = VAR, want = PyObject_IsTrue(arg);                              \
        if (want < 0) return NULL;                                                     \
        VAR = want;                                                                    \
        return PyBool_FromLong(was);                                                   \
    }
SWITCH(use_fast, use_fast)
SWITCH(use_256, use_256)
SWITCH(use_512, use_512)
SWITCH(use_gomp, pool_use_gomp)

/* pool(): which threads a parallel call takes now: "openmp" (torch's team) or "own" */
static PyObject *pool(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(pool_is_gomp() ? "openmp" : "own");
}

static PyMethodDef methods[] = {
    {"use_gomp", use_gomp_, METH_O,
     "use_gomp(flag): torch's OpenMP team for a call's threads (where loaded) on or off; "
     "returns whether it was on (for tests)."},
    {"pool", pool, METH_NOARGS,
     "pool(): 'openmp' where a call's threads are torch's OpenMP team, 'own' where they "
     "are threads of this module."},
    {"use_fast", use_fast_, METH_O,
     "use_fast(flag): the fast walks (float32 data in float32, where the CPU has "
     "AVX-512) on or off; returns whether they were on (for tests)."},
    {"use_256", use_256_, METH_O,
     "use_256(flag): the fast row walk's AVX2 path (where the AVX-512 one is not taken) on "
     "or off; returns whether it was on (for tests: the same bits)."},
    {"use_512", use_512_, METH_O,
     "use_512(flag): the fast row walk's AVX-512 path on or off; returns whether it was "
     "on (for tests: the generic fast walk gives the same bits)."},
    {"use_vector", use_vector, METH_O,
     "use_vector(flag): the vector recurrence on (where the CPU has AVX-512) or off; "
     "returns whether it was on (for tests: both give the same bits)."},
    {"prepare", (PyCFunction)(void (*)(void))prepare, METH_FASTCALL,
     "prepare(<scan's 21 arguments>): the call recorded as bytes for run(), or None where "
     "scan() would return False; nothing is computed."},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(prepared, gs, lms, out0, out1, x, v, nv, term, trunc, boot, g, lm): a prepared "
     "call on the arrays at these addresses (ints, 0 for an absent one), of the shapes, "
     "strides and dtypes that prepare() saw."},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(torch.Tensor, torch.Tensor.__dlpack_c_exchange_api__, torch.empty): what replay() "
     "needs of torch; False (replay() then always returns None) where the table is missing "
     "or of another DLPack major version."},
    {"bind_blocks", (PyCFunction)(void (*)(void))bind_blocks, METH_FASTCALL,
     "bind_blocks(_host, _ctoken, torch.float32, torch.float64): replay() makes the large "
     "outputs _host.empty would give from the block cache itself, through DLPack."},
    {"kept_blocks", kept_blocks, METH_NOARGS,
     "kept_blocks(): how many freed output blocks the replay keeps for its next outputs, "
     "besides the block cache's own."},
    {"views", (PyCFunction)(void (*)(void))views, METH_FASTCALL,
     "views(tensor, ext): a tensor's description as the replay reads it, through "
     "_torchalloc's view (ext true) or DLPack; None where that does not describe it."},
    {"key", (PyCFunction)(void (*)(void))key, METH_FASTCALL,
     "key(prefix, args, time_dim, tuning): the key replay() looks a call up by (bytes), "
     "or None where the call has none."},
    {"recording", (PyCFunction)(void (*)(void))recording, METH_FASTCALL,
     "recording(prepared, addr, num, lo, hi, extents): a prepared call and, per "
     "argument of the user's call, the scan's array it is (or -1; 0 and 1 for out= "
     "tensors), the number it is (0 gamma, 1 lambda, or -1), that number's range and, "
     "for an out= call, each tensor's extent in bytes; bytes for replay()."},
    {"entry", (PyCFunction)(void (*)(void))entry_new, METH_FASTCALL,
     "entry(fn, spec, prefix, names, defaults, order, npos, front, est.__dict__, "
     "dispatch.__dict__, config.__dict__): an estimator's public function whose calls "
     "without out= go straight to the replay (estimators.py)."},
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(plans, prefix, args, time_dim, tuning): the call's result where plans holds "
     "(recording, shape, dtype, tuning, two_out, alloc) under key(prefix, args, "
     "time_dim, tuning) and every check passes (alloc(shape, dtype=dtype): an output); "
     "else None."},
    {"gpu_bind", (PyCFunction)(void (*)(void))gpu_bind, METH_FASTCALL,
     "gpu_bind(torch.empty_strided, torch.zeros): find the CUDA driver; True where "
     "replay() can repeat recorded CUDA launches."},
    {"gpu_views", gpu_views, METH_O,
     "gpu_views(on): the replay reads CUDA tensors through gpu_alloc's view too (True), or "
     "through DLPack; returns the previous setting."},
    {"gpu_alloc", (PyCFunction)(void (*)(void))gpu_alloc, METH_FASTCALL,
     "gpu_alloc(alloc, plain): replay() allocates (and checks tensors) through "
     "_torchalloc's C++ functions; (None, None): through Python."},
    {"alloc_test", (PyCFunction)(void (*)(void))alloc_test, METH_FASTCALL,
     "alloc_test(spec, device): a CPU tensor as replay() allocates one (for tests)."},
    {"gpu_hooks", gpu_hooks, METH_O,
     "gpu_hooks(triton.knobs.runtime): where replay() reads Triton's launch hooks."},
    {"param_sizes", param_sizes, METH_O,
     "param_sizes(function): each parameter's byte size of a CUfunction, or None."},
    {"grecord", (PyCFunction)(void (*)(void))grecord, METH_FASTCALL,
     "grecord(nargs, checks, launches): a recorded CUDA call as bytes for replay()."},
    {"floor", (PyCFunction)(void (*)(void))floor_, METH_FASTCALL,
     "floor(out0, out1, threads, *inputs): the benchmark's same-bytes floor: reads each "
     "input once (1-D, contiguous, float32, one byte or int64), writes out0 = the sum of "
     "the float inputs plus the xor of the others as flags, and out1 = out0 / 2; in blocks "
     "of 2,048 elements, an array at a time."},
    {"floor_fused", (PyCFunction)(void (*)(void))floor_fused_, METH_FASTCALL,
     "floor_fused(out0, out1, threads, *inputs): the same in one pass over all the arrays "
     "at once, outputs streamed when large."},
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(mode, two_out, has_v, has_nv, has_trunc, has_boot, g_t, l_t, threads, out0, "
     "out1, x, v, nv, term, trunc, boot, g, lm, gs, lms): GAE or TD(lambda) into out0 "
     "(and out1), backwards in time, in float64. True when done; False (nothing written) "
     "where an array's dtype is not one it reads."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cscan",
                                    "The CPU scan kernel for GAE and TD(lambda), in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__cscan(void) {
#if VEC8 && defined(__x86_64__)
    __builtin_cpu_init();
    use_vec8 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    if (PyType_Ready(&entry_type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    /* the replay as estimators.py holds it (where a test swapped it, entries step aside) */
    if (!(replay_fn = PyObject_GetAttrString(m, "replay"))) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&entry_type); /* the type: also the "no default" of entry()'s defaults */
    if (PyModule_AddObject(m, "Entry", (PyObject *)&entry_type) < 0) {
        Py_DECREF(&entry_type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
