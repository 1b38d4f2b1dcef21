/* edgekit._logitstats: the softmax statistics of one logit vector in two passes.
 *
 * stats(logits, out, softmax=True) -> argmax
 *   logits: a C-contiguous float32 buffer (the draft's vocabulary, 150k-262k entries)
 *   out:    a writable float64 buffer of at least 7 entries, filled with
 *           [max, second largest, argmax, sum exp(z - max), sum exp(z - max) (z - max),
 *            sum z, sum z^2] (the last four NaN when softmax is false: one pass then)
 *
 * features(logits, out, x, columns, position, acceptance) -> argmax
 *   stats(logits, out) and then the rejection predictor's features from them
 *   (edgekit._logits.FEATURE_NAMES: confidence, entropy, margin,
 *   logit_std, position, recent_acceptance), written as float32 into x in the
 *   order of columns (a bytes object of indices into that list): the
 *   predictor's bound input, with no Python in between.
 *
 * It runs inside the drafting loop, right after a llama.cpp decode has evicted
 * every cache, so it is one call that reads the vocabulary twice (the second
 * time from L2) and takes no allocation. The argmax is the first index of the
 * largest value, as numpy's. The kernel is chosen once, at import, for the CPU:
 * AVX-512, AVX2 or the baseline (SSE2 on x86-64, NEON on arm64). ISA names it;
 * use(name) switches to another this CPU has (the tests run every kernel).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LS_CAT_(a, b) a##b
#define LS_CAT(a, b) LS_CAT_(a, b)

typedef void (*kernel_fn)(const float *, Py_ssize_t, int, double *);

#define LS_W 4
#define LS_NAME kernel_base
#define LS_TARGET
#include "_logitstats_kernel.h"
#undef LS_W
#undef LS_NAME
#undef LS_TARGET

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LS_X86 1
#define LS_W 8
#define LS_NAME kernel_avx2
#define LS_TARGET __attribute__((target("avx2,fma")))
#include "_logitstats_kernel.h"
#undef LS_W
#undef LS_NAME
#undef LS_TARGET

#define LS_W 16
#define LS_NAME kernel_avx512
#define LS_TARGET __attribute__((target("avx512f")))
#include "_logitstats_kernel.h"
#undef LS_W
#undef LS_NAME
#undef LS_TARGET
#endif

static kernel_fn kernel = kernel_base;
static const char *isa = "baseline";

/* A native-order format code: "f", "=f", "@f", or "<f" on a little-endian machine. */
static int
is_format(const char *format, char code)
{
    if (format == NULL) return 0;
    if (*format == '@' || *format == '=') format++;
#if PY_LITTLE_ENDIAN
    else if (*format == '<') format++;
#endif
    return format[0] == code && format[1] == '\0';
}

/* The kernel on logits, into out (float64 >= 7) and copied into local[7]; the
 * argmax, or -1 with an exception set. */
static Py_ssize_t
run(PyObject *logits, PyObject *out, int softmax, double *local, Py_ssize_t *n)
{
    Py_buffer z, o;
    if (PyObject_GetBuffer(logits, &z, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (z.itemsize != 4 || !is_format(z.format, 'f') || z.len < 4) {
        PyBuffer_Release(&z);
        PyErr_SetString(PyExc_ValueError, "logits must be a non-empty contiguous float32 array");
        return -1;
    }
    if (PyObject_GetBuffer(out, &o, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&z);
        return -1;
    }
    if (o.itemsize != 8 || !is_format(o.format, 'd') || o.len < 7 * 8) {
        PyBuffer_Release(&z);
        PyBuffer_Release(&o);
        PyErr_SetString(PyExc_ValueError, "out must be a writable contiguous float64 array of at least 7 entries");
        return -1;
    }
    *n = z.len / 4;
    Py_BEGIN_ALLOW_THREADS
    kernel((const float *)z.buf, *n, softmax, (double *)o.buf);
    Py_END_ALLOW_THREADS
    memcpy(local, o.buf, 7 * sizeof(double));
    PyBuffer_Release(&z);
    PyBuffer_Release(&o);
    return (Py_ssize_t)local[2];
}

static PyObject *
stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "stats(logits, out, softmax=True)");
        return NULL;
    }
    int softmax = 1;
    if (nargs == 3 && (softmax = PyObject_IsTrue(args[2])) < 0) return NULL;
    double local[7];
    Py_ssize_t n, argmax = run(args[0], args[1], softmax, local, &n);
    return argmax < 0 ? NULL : PyLong_FromSsize_t(argmax);
}

/* The features from the statistics (FEATURE_NAMES order); n is the vocabulary size. */
static void
derive(const double *st, Py_ssize_t n, double position, double acceptance, double *f)
{
    double m = st[0], second = st[1], s = st[3], t = st[4], mean = st[5] / n;
    double entropy = log(s) - t / s, var = st[6] / n - mean * mean;
    f[0] = 1.0 / s;
    f[1] = entropy > 0.0 ? entropy : 0.0; /* rounding leaves a few 1e-7 below 0 at one-hot */
    f[2] = (1.0 - exp(second - m)) / s;   /* exp(-inf) = 0: a single entry */
    f[3] = var > 0.0 ? sqrt(var) : 0.0;
    f[4] = position;
    f[5] = acceptance;
}

static PyObject *
features(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "features(logits, out, x, columns, position, acceptance)");
        return NULL;
    }
    if (!PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "columns must be bytes");
        return NULL;
    }
    double position = PyFloat_AsDouble(args[4]), acceptance = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred()) return NULL;
    const unsigned char *columns = (const unsigned char *)PyBytes_AS_STRING(args[3]);
    Py_ssize_t ncol = PyBytes_GET_SIZE(args[3]);
    for (Py_ssize_t j = 0; j < ncol; j++) {
        if (columns[j] >= 6) {
            PyErr_SetString(PyExc_ValueError, "a column is not a feature index (0-5)");
            return NULL;
        }
    }
    Py_buffer x;
    if (PyObject_GetBuffer(args[2], &x, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) return NULL;
    if (x.itemsize != 4 || !is_format(x.format, 'f') || x.len != ncol * 4) {
        PyBuffer_Release(&x);
        PyErr_SetString(PyExc_ValueError, "x must be a writable contiguous float32 array with one entry per column");
        return NULL;
    }
    double local[7], f[6];
    Py_ssize_t n, argmax = run(args[0], args[1], 1, local, &n);
    if (argmax >= 0) {
        derive(local, n, position, acceptance, f);
        for (Py_ssize_t j = 0; j < ncol; j++) ((float *)x.buf)[j] = (float)f[columns[j]];
    }
    PyBuffer_Release(&x);
    return argmax < 0 ? NULL : PyLong_FromSsize_t(argmax);
}

static int
supported(const char *name, kernel_fn *fn)
{
    if (strcmp(name, "baseline") == 0) {
        *fn = kernel_base;
        return 1;
    }
#ifdef LS_X86
    __builtin_cpu_init();
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *fn = kernel_avx2;
        return 1;
    }
    if (strcmp(name, "avx512f") == 0 && __builtin_cpu_supports("avx512f")) {
        *fn = kernel_avx512;
        return 1;
    }
#endif
    return 0;
}

static PyObject *
use(PyObject *module, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    kernel_fn fn;
    if (name == NULL) return NULL;
    if (!supported(name, &fn)) {
        PyErr_Format(PyExc_ValueError, "no %s kernel on this CPU (baseline, avx2, avx512f)", name);
        return NULL;
    }
    kernel = fn;
    isa = strcmp(name, "baseline") == 0 ? "baseline" : strcmp(name, "avx2") == 0 ? "avx2" : "avx512f";
    if (PyModule_AddStringConstant(module, "ISA", isa) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"stats", (PyCFunction)(void (*)(void))stats, METH_FASTCALL,
     "stats(logits, out, softmax=True) -> argmax: fills out with [max, second, argmax, "
     "sum exp(z - max), sum exp(z - max) (z - max), sum z, sum z^2]."},
    {"features", (PyCFunction)(void (*)(void))features, METH_FASTCALL,
     "features(logits, out, x, columns, position, acceptance) -> argmax: stats, then the predictor's "
     "features written into x in the order of columns."},
    {"use", use, METH_O, "use(name): run the baseline, avx2 or avx512f kernel (ValueError if this CPU lacks it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_logitstats", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__logitstats(void)
{
    if (supported("avx512f", &kernel))
        isa = "avx512f";
    else if (supported("avx2", &kernel))
        isa = "avx2";
    PyObject *m = PyModule_Create(&moduledef);
    if (m != NULL && PyModule_AddStringConstant(m, "ISA", isa) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
