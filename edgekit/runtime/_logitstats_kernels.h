/* Every logit-statistics kernel this target compiles, and which of them this CPU runs.
 * No Python here: _logitstats.c wraps it for Python, and tests/kernels/check.c runs it
 * against a scalar reference, natively and cross-compiled for aarch64 under emulation.
 *
 *   x86-64   baseline (SSE2, 4 lanes), avx2 (AVX2 and FMA, 8), avx512f (16)
 *   aarch64  baseline (the generic vector code, 4 lanes), neon (4 lanes, maximum and
 *            minimum as one instruction each)
 *   other    baseline
 *
 * ls_kernels lists them best first; ls_runs(k) says whether this CPU has k's instructions.
 */
#ifndef EDGEKIT_LOGITSTATS_KERNELS_H
#define EDGEKIT_LOGITSTATS_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LS_CAT_(a, b) a##b
#define LS_CAT(a, b) LS_CAT_(a, b)

/* What a kernel computes past the first pass: bits of its `mode`. */
#define LS_SOFTMAX 1 /* s and t: the top probability, entropy and margin */
#define LS_MOMENTS 2 /* mean and variance: the logit standard deviation (with LS_SOFTMAX) */

/* kernel(z, n, mode, out): out = [max, second largest, argmax, sum exp(z - max),
 * sum exp(z - max) (z - max), mean, variance]; NaN where the mode did not ask. */
typedef void (*ls_kernel_fn)(const float *, ptrdiff_t, int, double *);

/* blocks(z, n, maxima): the maximum of each LS_BLOCK values into maxima; 1 if a value is NaN. */
#define LS_BLOCK 32 /* a multiple of every kernel's lanes */
typedef int (*ls_blocks_fn)(const float *, ptrdiff_t, float *);

#define LS_W 4
#define LS_NAME kernel_base
#define LS_TARGET
#include "_logitstats_kernel.h"
#undef LS_W
#undef LS_NAME
#undef LS_TARGET

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LS_X86 1
#include <immintrin.h>

#define LS_W 8
#define LS_NAME kernel_avx2
#define LS_TARGET __attribute__((target("avx2,fma")))
#define LS_VMAX(a, b) ((VF)_mm256_max_ps((__m256)(a), (__m256)(b)))
#define LS_VMIN(a, b) ((VF)_mm256_min_ps((__m256)(a), (__m256)(b)))
#include "_logitstats_kernel.h"
#undef LS_W
#undef LS_NAME
#undef LS_TARGET

#define LS_W 16
#define LS_NAME kernel_avx512
#define LS_TARGET __attribute__((target("avx512f")))
#define LS_VMAX(a, b) ((VF)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define LS_VMIN(a, b) ((VF)_mm512_min_ps((__m512)(a), (__m512)(b)))
#include "_logitstats_kernel.h"
#undef LS_W
#undef LS_NAME
#undef LS_TARGET
#endif

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define LS_ARM64 1
#include <arm_neon.h>

/* NEON is part of every aarch64 CPU. Its fmaxnm, fminnm and fmax are one instruction each
 * where the generic code compares and selects (fcmgt and bsl): in the inner loops GCC 12 makes of
 * this header, 43 instructions per 16 logits against 55 for the first pass, 73 against 82
 * per 8 for the fused pass, 84 against 100 with the moments (tests/kernels/README.md). */
#define LS_W 4
#define LS_NAME kernel_neon
#define LS_TARGET
/* a > b ? a : b with b never NaN where it is used (a running maximum): fmaxnm keeps the number */
#define LS_VMAX(a, b) ((VF)vmaxnmq_f32((float32x4_t)(a), (float32x4_t)(b)))
#define LS_VMIN(a, b) ((VF)vminnmq_f32((float32x4_t)(a), (float32x4_t)(b)))
#define LS_VFLOOR(d, f) ((VF)vmaxq_f32((float32x4_t)(d), (float32x4_t)(f))) /* fmax: a NaN d stays NaN */
#include "_logitstats_kernel.h"
#undef LS_W
#undef LS_NAME
#undef LS_TARGET
#endif

typedef struct {
    const char *name;
    ls_kernel_fn fn;
    ls_blocks_fn blocks;
} ls_kernel;

static const ls_kernel ls_kernels[] = {
#ifdef LS_X86
    {"avx512f", kernel_avx512, kernel_avx512_blocks},
    {"avx2", kernel_avx2, kernel_avx2_blocks},
#endif
#ifdef LS_ARM64
    {"neon", kernel_neon, kernel_neon_blocks},
#endif
    {"baseline", kernel_base, kernel_base_blocks},
};
#define LS_NKERNELS ((int)(sizeof ls_kernels / sizeof ls_kernels[0]))

/* Whether this CPU runs kernel k. */
static int
ls_runs(const ls_kernel *k)
{
#ifdef LS_X86
    __builtin_cpu_init();
    if (strcmp(k->name, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
    if (strcmp(k->name, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    (void)k;
    return 1; /* the baseline, and NEON (every aarch64 CPU) */
}

/* The kernel called `name`, if this target has it and this CPU runs it; NULL otherwise. */
static const ls_kernel *
ls_find(const char *name)
{
    for (int i = 0; i < LS_NKERNELS; i++)
        if (strcmp(ls_kernels[i].name, name) == 0) return ls_runs(&ls_kernels[i]) ? &ls_kernels[i] : NULL;
    return NULL;
}

/* The best kernel this CPU runs. */
static const ls_kernel *
ls_best(void)
{
    for (int i = 0; i < LS_NKERNELS; i++)
        if (ls_runs(&ls_kernels[i])) return &ls_kernels[i];
    return &ls_kernels[LS_NKERNELS - 1];
}

#endif
