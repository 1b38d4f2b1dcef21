/* One SIMD width of the logit-statistics kernel, included by _logitstats.c once
 * per instruction set with LS_W (lanes), LS_NAME (function name) and LS_TARGET
 * (a target attribute, or nothing) defined. GCC/Clang vector extensions, so the
 * same source becomes AVX-512, AVX2 or SSE/NEON code. */

#define LS_CHUNK 2048 /* a multiple of LS_W * LS_U */
#define LS_U 4 /* independent accumulators: the loop-carried max/add chains are latency-bound */

typedef float LS_CAT(vf, LS_W) __attribute__((vector_size(LS_W * 4)));
typedef int32_t LS_CAT(vi, LS_W) __attribute__((vector_size(LS_W * 4)));
typedef double LS_CAT(vd, LS_W) __attribute__((vector_size(LS_W * 8)));
#define VF LS_CAT(vf, LS_W)
#define VI LS_CAT(vi, LS_W)
#define VD LS_CAT(vd, LS_W)

LS_TARGET static void LS_NAME(const float *z, Py_ssize_t n, int softmax, double *out)
{
    const Py_ssize_t step = LS_W * LS_U, nv = n / step * step;
    VF top[LS_U], sec[LS_U];
    VI idx[LS_U], lane;
    for (int k = 0; k < LS_W; k++) lane[k] = k;
    for (int u = 0; u < LS_U; u++) {
        top[u] = (VF){0} - INFINITY;
        sec[u] = top[u];
        idx[u] = (VI){0};
    }
    /* pass 1: per lane, the largest value (first index on ties) and the second largest */
    for (Py_ssize_t i = 0; i < nv; i += step) {
        for (int u = 0; u < LS_U; u++) {
            VF x;
            memcpy(&x, z + i + u * LS_W, sizeof x);
            VI gt = x > top[u];
            idx[u] = (gt & (lane + (int32_t)(i + u * LS_W))) | (~gt & idx[u]);
            VI lt = x < top[u];
            VF lo = (VF)((lt & (VI)x) | (~lt & (VI)top[u])); /* min(top, x) */
            VI ge = lo > sec[u];
            sec[u] = (VF)((ge & (VI)lo) | (~ge & (VI)sec[u]));
            top[u] = (VF)((gt & (VI)x) | (~gt & (VI)top[u]));
        }
    }
    float m = -INFINITY, second = -INFINITY;
    Py_ssize_t im = 0;
    for (int u = 0; u < LS_U; u++) {
        for (int k = 0; k < LS_W; k++) {
            float v = top[u][k];
            Py_ssize_t j = idx[u][k];
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
    for (Py_ssize_t i = nv; i < n; i++) {
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
    if (!softmax) {
        out[3] = out[4] = out[5] = out[6] = NAN;
        return;
    }
    /* pass 2 (the vocabulary is warm in L2 now): s = sum exp(z - m), t = sum exp(z - m) (z - m),
     * and sum z, sum z^2 for the standard deviation.
     * exp by Cody-Waite reduction and a degree-5 Taylor polynomial: relative error < 3e-6 on
     * [-87, 0]; differences below -87 (e^-87 = 1.6e-38) are clamped there. */
    /* float lanes summed over chunks of LS_CHUNK entries, then into double lanes */
    VF s[LS_U], t[LS_U], a[LS_U], q[LS_U];
    VD S2 = (VD){0}, T2 = (VD){0}, A2 = (VD){0}, Q2 = (VD){0};
    const VF vm = (VF){0} + m;
    for (Py_ssize_t c = 0; c < nv; c += LS_CHUNK) {
        Py_ssize_t end = c + LS_CHUNK < nv ? c + LS_CHUNK : nv;
        for (int u = 0; u < LS_U; u++) s[u] = t[u] = a[u] = q[u] = (VF){0};
        for (Py_ssize_t i = c; i < end; i += step) {
            for (int u = 0; u < LS_U; u++) {
                VF x;
                memcpy(&x, z + i + u * LS_W, sizeof x);
                a[u] += x;
                q[u] += x * x;
                VF d = x - vm;
                VI low = d < -87.0f;
                d = (VF)((low & (VI)((VF){0} - 87.0f)) | (~low & (VI)d));
                VI ni = __builtin_convertvector(d * 1.44269504088896341f - 0.5f, VI);
                VF nf = __builtin_convertvector(ni, VF);
                VF r = d - nf * 0.693145751953125f - nf * 1.42860682030941723e-6f;
                VF p = (VF){0} + (1.0f / 120);
                p = p * r + (1.0f / 24);
                p = p * r + (1.0f / 6);
                p = p * r + 0.5f;
                p = p * r + 1.0f;
                p = p * r + 1.0f;
                VF e = p * (VF)((ni + 127) << 23);
                s[u] += e;
                t[u] += e * d;
            }
        }
        for (int u = 0; u < LS_U; u++) {
            S2 += __builtin_convertvector(s[u], VD);
            T2 += __builtin_convertvector(t[u], VD);
            A2 += __builtin_convertvector(a[u], VD);
            Q2 += __builtin_convertvector(q[u], VD);
        }
    }
    double S = 0.0, T = 0.0, A = 0.0, Q = 0.0;
    for (int k = 0; k < LS_W; k++) {
        S += S2[k];
        T += T2[k];
        A += A2[k];
        Q += Q2[k];
    }
    for (Py_ssize_t i = nv; i < n; i++) {
        A += z[i];
        Q += (double)z[i] * z[i];
        double d = (double)z[i] - m;
        if (d < -87.0) d = -87.0;
        double e = exp(d);
        S += e;
        T += e * d;
    }
    out[3] = S;
    out[4] = T;
    out[5] = A;
    out[6] = Q;
}

#undef VF
#undef VI
#undef VD
#undef LS_CHUNK
#undef LS_U
