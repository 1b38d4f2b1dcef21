/* Every logit-statistics kernel this target compiles, against a scalar reference in double;
 * and each one's maxima of blocks (what kept() selects a top-k sampler's support from), exactly.
 *
 *   cc -O2 -I edgekit/runtime tests/kernels/check.c -lm -o check && ./check
 *   aarch64-linux-gnu-gcc ... && qemu-aarch64-static -L /usr/aarch64-linux-gnu ./check
 *
 * No Python: this is how the aarch64 kernels are tested on an x86-64 machine (user-mode
 * emulation), and natively it checks the x86 ones the same way. `./check bench [calls]`
 * also times each kernel on a 262,144-entry vocabulary (under emulation that is emulated
 * time, not device time). Exit status 1 if any check fails. `./check selftest` runs the
 * checks on a kernel with planted errors and fails if they find none. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "_logitstats_kernels.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static double
uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double
normal(void)
{
    return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
}

/* out as the kernels define it, from plain definitions: max, second, first argmax,
 * S = sum exp(z - m), T = sum exp(z - m) (z - m) (with z - m clamped to -87, as the
 * kernels do), mean and variance. */
static void
reference(const float *z, ptrdiff_t n, double *out)
{
    double m = -INFINITY, second = -INFINITY;
    ptrdiff_t im = 0;
    for (ptrdiff_t i = 0; i < n; i++) {
        if (z[i] > m) {
            second = m;
            m = z[i];
            im = i;
        } else if (z[i] > second) {
            second = z[i];
        }
    }
    double s = 0, t = 0, mean = 0, var = 0;
    for (ptrdiff_t i = 0; i < n; i++) {
        double d = (double)z[i] - m;
        if (d < -87.0) d = -87.0;
        s += exp(d);
        t += exp(d) * d;
        mean += z[i];
    }
    mean /= n;
    for (ptrdiff_t i = 0; i < n; i++) var += ((double)z[i] - mean) * ((double)z[i] - mean);
    out[0] = m;
    out[1] = second;
    out[2] = (double)im;
    out[3] = s;
    out[4] = t;
    out[5] = mean;
    out[6] = var / n;
}

static int failures = 0;

static void
expect(const char *kernel, const char *name, int mode, const char *what, double got, double want, double tol)
{
    int ok = isnan(want) ? isnan(got) : fabs(got - want) <= tol * (1.0 + fabs(want)) || got == want;
    if (!ok) {
        failures++;
        printf("FAIL %-8s %-24s mode %d %-8s got %.9g want %.9g\n", kernel, name, mode, what, got, want);
    }
}

/* The baseline kernel with its sum off by 1e-5 and its argmax off by one on ties:
 * `./check selftest` must find it wrong, or the checks could not fail. */
static void
planted(const float *z, ptrdiff_t n, int mode, double *out)
{
    kernel_base(z, n, mode, out);
    out[3] *= 1.0 + 1e-5;
    if (n > 1 && out[2] + 1 < n && z[(ptrdiff_t)out[2] + 1] == z[(ptrdiff_t)out[2]]) out[2] += 1;
}

/* ... and its blocks' maxima blind to the row's last value. */
static int
planted_blocks(const float *z, ptrdiff_t n, float *maxima)
{
    return kernel_base_blocks(z, n > 1 ? n - 1 : n, maxima);
}

static const ls_kernel planted_kernels[] = {{"planted", planted, planted_blocks}};
static const ls_kernel *under_test = ls_kernels;
static int n_under_test = LS_NKERNELS;

/* Each block's maximum, as a loop of comparisons would have it, and whether a value is NaN. */
static int
reference_blocks(const float *z, ptrdiff_t n, float *maxima)
{
    int nan = 0;
    for (ptrdiff_t b = 0; b * LS_BLOCK < n; b++) {
        float m = -INFINITY;
        for (ptrdiff_t i = b * LS_BLOCK; i < n && i < (b + 1) * LS_BLOCK; i++) {
            nan |= z[i] != z[i];
            if (z[i] > m) m = z[i];
        }
        maxima[b] = m;
    }
    return nan;
}

static float want_maxima[262145 / LS_BLOCK + 1], got_maxima[262145 / LS_BLOCK + 1];

/* A kernel's blocks' maxima against the reference's: the NaN flag always, each maximum where
 * no value is NaN (the maxima are not to be used otherwise). */
static void
check_blocks(const ls_kernel *k, const char *name, const float *z, ptrdiff_t n)
{
    ptrdiff_t nb = (n + LS_BLOCK - 1) / LS_BLOCK;
    int want_nan = reference_blocks(z, n, want_maxima);
    for (ptrdiff_t b = 0; b < nb; b++) got_maxima[b] = NAN;
    int got_nan = k->blocks(z, n, got_maxima);
    expect(k->name, name, -1, "blocks nan", got_nan, want_nan, 0);
    if (want_nan) return;
    for (ptrdiff_t b = 0; b < nb; b++) {
        if (got_maxima[b] != want_maxima[b]) { /* -inf blocks compare equal; a NaN never does */
            expect(k->name, name, -1, "blocks", got_maxima[b], want_maxima[b], 0);
            return;
        }
    }
}

/* One case through every kernel under test and every mode. */
static void
check(const char *name, const float *z, ptrdiff_t n, int finite)
{
    double want[7];
    reference(z, n, want);
    double entropy = log(want[3]) - want[4] / want[3];
    for (int k = 0; k < n_under_test; k++) {
        if (!ls_runs(&under_test[k])) continue;
        check_blocks(&under_test[k], name, z, n);
        const int modes[] = {0, LS_SOFTMAX, LS_SOFTMAX | LS_MOMENTS};
        for (int j = 0; j < 3; j++) {
            double got[7];
            under_test[k].fn(z, n, modes[j], got);
            const char *kn = under_test[k].name;
            expect(kn, name, modes[j], "max", got[0], want[0], 0);
            expect(kn, name, modes[j], "second", got[1], want[1], 0);
            expect(kn, name, modes[j], "argmax", got[2], want[2], 0);
            if (modes[j] & LS_SOFTMAX) {
                expect(kn, name, modes[j], "sum", got[3], want[3], 2e-6);
                expect(kn, name, modes[j], "entropy", log(got[3]) - got[4] / got[3], entropy, 2e-5);
            }
            if ((modes[j] & LS_MOMENTS) && finite) {
                expect(kn, name, modes[j], "mean", got[5], want[5], 1e-6);
                expect(kn, name, modes[j], "variance", got[6], want[6], 1e-5);
            }
        }
    }
}

static const ptrdiff_t sizes[] = {1, 2, 3, 7, 16, 33, 257, 2048, 2049, 4099, 32000, 151936, 262145};
#define NSIZES ((int)(sizeof sizes / sizeof sizes[0]))

static void
cases(float *z)
{
    char name[64];
    for (int si = 0; si < NSIZES; si++) {
        ptrdiff_t n = sizes[si];
        const double scales[] = {0.01, 1.0, 4.0, 20.0};
        for (int sc = 0; sc < 4; sc++) {
            for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)(scales[sc] * normal());
            snprintf(name, sizeof name, "random n=%td x%g", n, scales[sc]);
            check(name, z, n, 1);
        }
        for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)(3.0 * normal() + 1000.0);
        snprintf(name, sizeof name, "shifted +1000 n=%td", n);
        check(name, z, n, 1);
        for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)(3.0 * normal() - 5000.0);
        snprintf(name, sizeof name, "shifted -5000 n=%td", n);
        check(name, z, n, 1);
        for (ptrdiff_t i = 0; i < n; i++) z[i] = uniform() < 0.9 ? -INFINITY : (float)(2.0 * normal());
        z[n / 2] = 1.0f; /* at least one finite value */
        snprintf(name, sizeof name, "masked 90%% n=%td", n);
        check(name, z, n, 0);
        for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)(-10.0 + (double)i / (double)n * 40.0);
        snprintf(name, sizeof name, "rising, maxima last n=%td", n);
        check(name, z, n, 1);
        for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)normal();
        z[n - 1] = 300.0f; /* far above everything, in the last entry (the tail, where n is odd) */
        snprintf(name, sizeof name, "late maximum n=%td", n);
        check(name, z, n, 1);
        for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)normal();
        for (ptrdiff_t i = n / 3; i < n; i += 1 + n / 7) z[i] = 9.0f; /* ties: the first index wins */
        snprintf(name, sizeof name, "ties n=%td", n);
        check(name, z, n, 1);
        for (ptrdiff_t i = 0; i < n; i++) z[i] = 2.5f;
        snprintf(name, sizeof name, "uniform n=%td", n);
        check(name, z, n, 1);
        for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)(normal() - 200.0);
        z[0] = 0.0f; /* a long tail far below the top */
        snprintf(name, sizeof name, "long tail n=%td", n);
        check(name, z, n, 1);
        if (n >= 2) {
            for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)normal();
            z[0] = NAN; /* never the maximum, in any lane; the sums are NaN */
            z[n / 2 + (n > 16)] = 7.0f;
            snprintf(name, sizeof name, "a NaN first n=%td", n);
            check(name, z, n, 0);
        }
        for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)(i % 5 == 0 ? 60.0 * uniform() : normal());
        snprintf(name, sizeof name, "headroom jumps n=%td", n); /* lanes whose reference moves often */
        check(name, z, n, 1);
    }
}

static double
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void
bench(float *z, int calls)
{
    const ptrdiff_t n = 262144;
    for (ptrdiff_t i = 0; i < n; i++) z[i] = (float)(3.0 * normal());
    for (int k = 0; k < LS_NKERNELS; k++) {
        if (!ls_runs(&ls_kernels[k])) continue;
        const int modes[] = {0, LS_SOFTMAX, LS_SOFTMAX | LS_MOMENTS};
        for (int j = 0; j < 3; j++) {
            double out[7], best = INFINITY;
            for (int c = 0; c < calls; c++) {
                double t0 = now();
                ls_kernels[k].fn(z, n, modes[j], out);
                double dt = now() - t0;
                if (dt < best) best = dt;
            }
            printf("{\"kernel\": \"%s\", \"mode\": %d, \"vocab\": %td, \"best_us\": %.1f}\n", ls_kernels[k].name,
                   modes[j], n, best * 1e6);
        }
    }
}

int
main(int argc, char **argv)
{
    float *z = malloc(sizeof(float) * 262145);
    if (z == NULL) return 2;
    if (argc > 1 && strcmp(argv[1], "selftest") == 0) {
        under_test = planted_kernels;
        n_under_test = 1;
        cases(z);
        printf("planted errors found: %d\n", failures);
        free(z);
        return failures ? 0 : 1;
    }
    if (argc > 1 && strcmp(argv[1], "bench") == 0) {
        bench(z, argc > 2 ? atoi(argv[2]) : 20);
        free(z);
        return 0;
    }
    cases(z);
    printf("kernels:");
    for (int k = 0; k < LS_NKERNELS; k++)
        if (ls_runs(&ls_kernels[k])) printf(" %s", ls_kernels[k].name);
    printf("; best %s; %d failures\n", ls_best()->name, failures);
    free(z);
    return failures ? 1 : 0;
}
