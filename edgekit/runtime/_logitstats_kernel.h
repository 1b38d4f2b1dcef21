/* One SIMD width of the logit-statistics kernel, included by _logitstats_kernels.h
 * once per instruction set with LS_W (lanes), LS_NAME (function name) and LS_TARGET
 * (a target attribute, or nothing) defined. GCC/Clang vector extensions, so the
 * same source becomes AVX-512, AVX2, SSE or NEON code. An instruction set whose
 * maximum and minimum are one instruction defines LS_VMAX(a, b) and LS_VMIN(a, b)
 * (a > b ? a : b and a < b ? a : b, as vectors: b wherever either is NaN) and may define
 * LS_VFLOOR(d, f) (d below f raised to f, NaN kept); otherwise they are a compare and a
 * select. So a NaN logit never becomes the maximum, and it makes the sums NaN, in every
 * kernel alike (tests/kernels/check.c has the case). */

#define LS_CHUNK 2048 /* float sums go into double lanes every LS_CHUNK entries (a multiple of LS_W * 4) */
#define LS_HEADROOM 64.0f /* a lane's sums run at most e^64 above its reference: no float overflow */
#define LS_INLINE LS_TARGET static inline __attribute__((always_inline))
#define LS_FN(suffix) LS_CAT(LS_NAME, suffix)

typedef float LS_CAT(vf, LS_W) __attribute__((vector_size(LS_W * 4)));
typedef int32_t LS_CAT(vi, LS_W) __attribute__((vector_size(LS_W * 4)));
typedef double LS_CAT(vd, LS_W) __attribute__((vector_size(LS_W * 8)));
#define VF LS_CAT(vf, LS_W)
#define VI LS_CAT(vi, LS_W)
#define VD LS_CAT(vd, LS_W)

/* One vector x (its first index `at`) into each lane's largest value (first index on
 * ties) and second largest. */
#ifndef LS_VMAX
LS_INLINE VF
LS_FN(_max)(VF a, VF b)
{
    VI gt = a > b;
    return (VF)((gt & (VI)a) | (~gt & (VI)b));
}
LS_INLINE VF
LS_FN(_min)(VF a, VF b)
{
    VI lt = a < b;
    return (VF)((lt & (VI)a) | (~lt & (VI)b));
}
#define LS_VMAX(a, b) LS_FN(_max)(a, b)
#define LS_VMIN(a, b) LS_FN(_min)(a, b)
#endif
#ifndef LS_VFLOOR
#define LS_VFLOOR(d, f) LS_VMAX(f, d) /* f > d ? f : d: a NaN d stays NaN */
#endif

LS_INLINE void
LS_FN(_top2)(VF x, int32_t at, VI lane, VF *top, VF *sec, VI *idx)
{
    VI gt = x > *top;
    *idx = (gt & (lane + at)) | (~gt & *idx);
    *sec = LS_VMAX(LS_VMIN(x, *top), *sec);
    *top = LS_VMAX(x, *top);
}

/* exp(x - c) into s and exp(x - c) (x - c) into t, lane by lane, and with moments x - h into
 * a and (x - h)^2 into q (h near the values keeps the variance from cancelling). x - c is clamped to at least -87 (e^-87 = 1.6e-38, still a normal float)
 * and must be at most LS_HEADROOM. exp(d): d = n ln2 + r with |r| <= ln2/2, n rounded by
 * adding 1.5 * 2^23 (whose float then carries 127 + n in its low bits, shifted into 2^n), r
 * in one FMA (the rounding of ln2 costs under 3e-7 relative at |n| = 126), and a degree-5
 * minimax polynomial for e^r: relative error under 2e-7. (Degree 4, 3e-6, is 1-2 us faster
 * cold on 262k logits, but a near-certain token's entropy is about the error of its top term.) */
LS_INLINE void
LS_FN(_add)(VF x, VF c, VF h, const int moments, VF *s, VF *t, VF *a, VF *q)
{
    if (moments) {
        VF y = x - h;
        *a += y;
        *q += y * y;
    }
    const VF floor = (VF){0} - 87.0f;
    VF d = LS_VFLOOR(x - c, floor);
    VF k = d * 1.44269504088896341f + 12583039.0f;
    VF r = d - (k - 12583039.0f) * 0.693147180559945309f;
    VF p = (VF){0} + 0.0082903066650033f;
    p = p * r + 0.04189793020486832f;
    p = p * r + 0.1666763573884964f;
    p = p * r + 0.4999915063381195f;
    p = p * r + 0.9999997019767761f;
    p = p * r + 1.0f;
    VF e = p * (VF)((VI)k << 23);
    *s += e;
    *t += e * d;
}

/* Max, second largest and argmax over the lanes of nu accumulator sets and the scalar
 * tail z[nv:n], into out[0..2]. */
LS_INLINE void
LS_FN(_finish)(const VF *top, const VF *sec, const VI *idx, int nu, const float *z, ptrdiff_t nv,
               ptrdiff_t n, double *out)
{
    float m = -INFINITY, second = -INFINITY;
    ptrdiff_t im = 0;
    for (int u = 0; u < nu; u++) {
        for (int k = 0; k < LS_W; k++) {
            float v = top[u][k];
            ptrdiff_t j = idx[u][k];
            if (v > m || (v == m && j < im)) {
                if (m > second) second = m;
                m = v;
                im = j;
            } else if (v > second) {
                second = v;
            }
            if (sec[u][k] > second) second = sec[u][k];
        }
    }
    for (ptrdiff_t i = nv; i < n; i++) {
        float v = z[i];
        if (v > m) {
            second = m;
            m = v;
            im = i;
        } else if (v > second) {
            second = v;
        }
    }
    out[0] = m;
    out[1] = second;
    out[2] = (double)im;
}

/* The first pass alone (the argmax of a step that makes no decision): the vocabulary
 * comes cold from memory, so 4 independent accumulator sets keep the compare chains busy. */
LS_INLINE void
LS_FN(_top)(const float *z, ptrdiff_t n, double *out)
{
    enum { U = 4 };
    const ptrdiff_t step = LS_W * U, nv = n / step * step;
    VF top[U], sec[U];
    VI idx[U], lane;
    for (int k = 0; k < LS_W; k++) lane[k] = k;
    for (int u = 0; u < U; u++) {
        top[u] = sec[u] = (VF){0} - INFINITY;
        idx[u] = (VI){0};
    }
    for (ptrdiff_t i = 0; i < nv; i += step) {
        for (int u = 0; u < U; u++) {
            VF x;
            memcpy(&x, z + i + u * LS_W, sizeof x);
            LS_FN(_top2)(x, (int32_t)(i + u * LS_W), lane, &top[u], &sec[u], &idx[u]);
        }
    }
    LS_FN(_finish)(top, sec, idx, U, z, nv, n, out);
    out[3] = out[4] = out[5] = out[6] = NAN;
}

/* The top two and the softmax sums in one pass over the vocabulary, so that the
 * exponentials are computed while the logits stream in from memory. The maximum is
 * not known until the end, so each lane sums exp(z - c) against its own reference c,
 * which only moves up: a chunk in which some lane's values passed c + LS_HEADROOM is
 * summed again after c is raised to that lane's maximum and its sums so far are
 * rescaled (the first chunk always; on real logits rarely another). At the end the
 * lanes are brought to the global maximum m: exp(z - m) = exp(z - c) exp(c - m), and
 * sum exp(z - m) (z - m) = exp(c - m) (t + (c - m) s). */
LS_INLINE void
LS_FN(_fused)(const float *z, ptrdiff_t n, const int moments, double *out)
{
    enum { U = 2 }; /* the exponentials give each vector enough work to hide the compare chains */
    const ptrdiff_t step = LS_W * U, nv = n / step * step;
    VF top[U], sec[U], s[U], t[U], a[U], q[U];
    VI idx[U], lane;
    VF c = (VF){0} - 3.0e38f; /* finite, so that -inf logits give -inf differences, not NaN */
    VD S2 = (VD){0}, T2 = (VD){0}, A2 = (VD){0}, Q2 = (VD){0};
    double hs = 0.0; /* the moments' shift: the mean of the first finite values (one outlier, such as */
    int hn = 0;      /* a padding token's logit first in the vocabulary, would cost the variance digits) */
    for (ptrdiff_t i = 0; i < n && i < 64; i++)
        if (isfinite(z[i])) hs += z[i], hn++;
    const float h = hn ? (float)(hs / hn) : 0.0f;
    const VF vh = (VF){0} + h;
    for (int k = 0; k < LS_W; k++) lane[k] = k;
    for (int u = 0; u < U; u++) {
        top[u] = sec[u] = (VF){0} - INFINITY;
        idx[u] = (VI){0};
    }
    for (ptrdiff_t ch = 0; ch < nv; ch += LS_CHUNK) {
        ptrdiff_t end = ch + LS_CHUNK < nv ? ch + LS_CHUNK : nv;
        for (int u = 0; u < U; u++) s[u] = t[u] = a[u] = q[u] = (VF){0};
        for (ptrdiff_t i = ch; i < end; i += step) {
            for (int u = 0; u < U; u++) {
                VF x;
                memcpy(&x, z + i + u * LS_W, sizeof x);
                LS_FN(_top2)(x, (int32_t)(i + u * LS_W), lane, &top[u], &sec[u], &idx[u]);
                LS_FN(_add)(x, c, vh, moments, &s[u], &t[u], &a[u], &q[u]);
            }
        }
        VF hi = top[0]; /* each lane's maximum so far */
        for (int u = 1; u < U; u++) hi = LS_VMAX(top[u], hi);
        VI over = hi > c + LS_HEADROOM;
        int32_t any = 0;
        for (int k = 0; k < LS_W; k++) any |= over[k];
        if (any) {
            for (int k = 0; k < LS_W; k++) {
                if (!(hi[k] > c[k])) continue;
                double shift = (double)c[k] - hi[k], f = exp(shift);
                T2[k] = f > 0.0 ? f * (T2[k] + shift * S2[k]) : 0.0;
                S2[k] *= f;
                c[k] = hi[k];
            }
            for (int u = 0; u < U; u++) s[u] = t[u] = (VF){0};
            for (ptrdiff_t i = ch; i < end; i += step) {
                for (int u = 0; u < U; u++) {
                    VF x;
                    memcpy(&x, z + i + u * LS_W, sizeof x);
                    LS_FN(_add)(x, c, vh, 0, &s[u], &t[u], NULL, NULL);
                }
            }
        }
        for (int u = 0; u < U; u++) {
            S2 += __builtin_convertvector(s[u], VD);
            T2 += __builtin_convertvector(t[u], VD);
            if (moments) {
                A2 += __builtin_convertvector(a[u], VD);
                Q2 += __builtin_convertvector(q[u], VD);
            }
        }
    }
    LS_FN(_finish)(top, sec, idx, U, z, nv, n, out);
    double m = out[0], S = 0.0, T = 0.0, A = 0.0, Q = 0.0;
    for (int k = 0; k < LS_W; k++) {
        double shift = (double)c[k] - m, f = exp(shift);
        if (f > 0.0) { /* a lane of -inf logits only (c never moved) adds nothing */
            S += f * S2[k];
            T += f * (T2[k] + shift * S2[k]);
        }
        A += A2[k];
        Q += Q2[k];
    }
    for (ptrdiff_t i = nv; i < n; i++) {
        double y = (double)z[i] - h;
        A += y;
        Q += y * y;
        double d = (double)z[i] - m;
        if (d < -87.0) d = -87.0;
        double e = exp(d);
        S += e;
        T += e * d;
    }
    out[3] = S;
    out[4] = T;
    A /= n;
    out[5] = moments ? h + A : NAN; /* the mean */
    out[6] = moments ? Q / n - A * A : NAN; /* the variance */
}

/* The maximum of each LS_BLOCK logits of z[0..n) (the last block may be shorter) into
 * maxima[0..ceil(n / LS_BLOCK)), in one pass that streams the row from memory: a top-k
 * sampler's support lies in the blocks whose maxima reach the k-th largest of them
 * (_logitstats.c, kept). Returns 1 if a value is NaN (the maxima are then not to be used),
 * else 0. */
LS_TARGET static int
LS_CAT(LS_NAME, _blocks)(const float *z, ptrdiff_t n, float *maxima)
{
    const ptrdiff_t nv = n / LS_BLOCK * LS_BLOCK;
    VI bad = (VI){0};
    for (ptrdiff_t i = 0; i < nv; i += LS_BLOCK) {
        VF m, x;
        memcpy(&m, z + i, sizeof m);
        bad |= m != m;
        for (int j = LS_W; j < LS_BLOCK; j += LS_W) {
            memcpy(&x, z + i + j, sizeof x);
            bad |= x != x;
            m = LS_VMAX(x, m);
        }
        float b = m[0];
        for (int k = 1; k < LS_W; k++) b = m[k] > b ? m[k] : b;
        maxima[i / LS_BLOCK] = b;
    }
    int nan = 0;
    for (int k = 0; k < LS_W; k++) nan |= bad[k] != 0;
    if (nv < n) {
        float b = z[nv];
        for (ptrdiff_t i = nv; i < n; i++) {
            nan |= z[i] != z[i];
            b = z[i] > b ? z[i] : b;
        }
        maxima[nv / LS_BLOCK] = b;
    }
    return nan;
}

/* mode 0: the first pass alone; LS_SOFTMAX (| LS_MOMENTS): the fused pass. */
LS_TARGET static void
LS_NAME(const float *z, ptrdiff_t n, int mode, double *out)
{
    if (!(mode & LS_SOFTMAX))
        LS_FN(_top)(z, n, out);
    else if (mode & LS_MOMENTS)
        LS_FN(_fused)(z, n, 1, out);
    else
        LS_FN(_fused)(z, n, 0, out);
}

#undef VF
#undef VI
#undef VD
#undef LS_VMAX
#undef LS_VMIN
#undef LS_VFLOOR
#undef LS_CHUNK
#undef LS_HEADROOM
#undef LS_INLINE
#undef LS_FN
