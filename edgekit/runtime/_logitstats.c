/* edgekit.runtime._logitstats: the softmax statistics of one logit vector in one pass.
 *
 * Stats(logits): the statistics of a C-contiguous float32 logit vector (the
 *   draft's vocabulary, 150k-262k entries), computed on first use and kept.
 *   argmax()          the first index of the largest value (as numpy's): one
 *                     pass over the vocabulary
 *   softmax()         [max, second largest, argmax, sum exp(z - max),
 *                     sum exp(z - max) (z - max), mean, variance]
 *   features_into(x, columns, position, acceptance)
 *                     the rejection predictor's features (edgekit._logits.
 *                     FEATURE_NAMES: confidence, entropy, margin, logit_std,
 *                     position, recent_acceptance) in the order of columns (a
 *                     bytes object of indices into that list), written as
 *                     float32 into x; only the sums those columns need are
 *                     computed (no moments without logit_std).
 *
 * kept(rows, keep, within, spread)
 *                     a top-k or min-p sampler's support of each row of a batch (the
 *                     verifier's rows under such sampling): each row's blocks' maxima in
 *                     one vector pass, then, from the few blocks whose maxima reach the
 *                     keep-th largest of those maxima and the row's largest less spread,
 *                     the keep-th largest value selected and the values that reach it
 *                     (and the floor) taken; the GIL let go throughout.
 *
 * It runs inside the drafting loop, right after a llama.cpp decode has evicted
 * every cache, so it is one call that reads the vocabulary once, computing the
 * exponentials while the logits stream in from memory, and takes no
 * allocation. The kernel is chosen once, at import, for the CPU: the best of
 * _logitstats_kernels.h's (avx512f, avx2 or baseline on x86-64; neon or baseline on
 * aarch64). ISA names it; KERNELS lists those this CPU runs; use(name) switches to
 * another of them (the tests run every kernel).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_logitstats_kernels.h"

static const ls_kernel *kernel; /* the one in use: ls_best() at import, or as use() says */

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

/* ---- Stats: one logit vector's statistics, computed on first use and kept ---- */

typedef struct {
    PyObject_HEAD
    PyObject *logits;
    double out[7];    /* [max, second, argmax, s, t, mean, variance] */
    int level;        /* what out holds: 0 nothing, 1 the top two, 2 and s, t; 3 and the moments */
} StatsObject;

static PyTypeObject StatsType;

/* The level a kernel mode leaves, and the mode that reaches a level. */
#define LEVEL_OF(mode) ((mode) & LS_MOMENTS ? 3 : (mode) & LS_SOFTMAX ? 2 : 1)
#define MODE_FOR(level) ((level) >= 3 ? LS_SOFTMAX | LS_MOMENTS : (level) == 2 ? LS_SOFTMAX : 0)

/* Makes sure self->out holds at least `level`: one kernel call if not; -1 with an exception set. */
static int
ensure(StatsObject *self, int level)
{
    if (self->level >= level) return 0;
    Py_buffer z;
    if (PyObject_GetBuffer(self->logits, &z, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (z.itemsize != 4 || !is_format(z.format, 'f') || z.len < 4) {
        PyBuffer_Release(&z);
        PyErr_SetString(PyExc_ValueError, "logits must be a non-empty contiguous float32 array");
        return -1;
    }
    int mode = MODE_FOR(level);
    Py_BEGIN_ALLOW_THREADS
    kernel->fn((const float *)z.buf, z.len / 4, mode, self->out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&z);
    self->level = LEVEL_OF(mode);
    return 0;
}

static PyObject *
Stats_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *logits;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) > 0) || !PyArg_ParseTuple(args, "O:Stats", &logits)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "Stats(logits) takes no keyword arguments");
        return NULL;
    }
    StatsObject *self = (StatsObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(logits);
    self->logits = logits;
    self->level = 0;
    return (PyObject *)self;
}

static void
Stats_dealloc(StatsObject *self)
{
    Py_XDECREF(self->logits);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Stats_argmax(StatsObject *self, PyObject *unused)
{
    if (ensure(self, 1) < 0) return NULL;
    return PyLong_FromSsize_t((Py_ssize_t)self->out[2]);
}

static PyObject *
Stats_softmax(StatsObject *self, PyObject *unused)
{
    if (ensure(self, 3) < 0) return NULL;
    PyObject *list = PyList_New(7);
    for (int i = 0; list != NULL && i < 7; i++) {
        PyObject *v = PyFloat_FromDouble(self->out[i]);
        if (v == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

/* The features (FEATURE_NAMES order) from the statistics. */
static void
derive(const double *st, double position, double acceptance, double *f)
{
    double m = st[0], second = st[1], s = st[3], t = st[4], var = st[6];
    double entropy = log(s) - t / s;
    f[0] = 1.0 / s;
    f[1] = entropy > 0.0 ? entropy : 0.0; /* rounding leaves a few 1e-7 below 0 at one-hot */
    f[2] = (1.0 - exp(second - m)) / s;   /* exp(-inf) = 0: a single entry */
    f[3] = var > 0.0 ? sqrt(var) : 0.0;   /* NaN (masked logits) as 0 */
    f[4] = position;
    f[5] = acceptance;
}

/* The level of statistics the feature columns need, or -1 (ValueError) for a bad column. */
static int
level_for(const unsigned char *columns, Py_ssize_t ncol)
{
    int level = 1;
    for (Py_ssize_t j = 0; j < ncol; j++) {
        if (columns[j] >= 6) {
            PyErr_SetString(PyExc_ValueError, "a column is not a feature index (0-5)");
            return -1;
        }
        int need = columns[j] == 3 ? 3 : columns[j] < 3 ? 2 : 1;
        if (need > level) level = need;
    }
    return level;
}

static PyObject *
Stats_features_into(StatsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "features_into(x, columns, position, recent_acceptance)");
        return NULL;
    }
    if (!PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "columns must be bytes");
        return NULL;
    }
    double position = PyFloat_AsDouble(args[2]), acceptance = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    const unsigned char *columns = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    Py_ssize_t ncol = PyBytes_GET_SIZE(args[1]);
    int level = level_for(columns, ncol);
    Py_buffer x;
    if (level < 0 || PyObject_GetBuffer(args[0], &x, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return NULL;
    if (x.itemsize != 4 || !is_format(x.format, 'f') || x.len != ncol * 4) {
        PyBuffer_Release(&x);
        PyErr_SetString(PyExc_ValueError, "x must be a writable contiguous float32 array with one entry per column");
        return NULL;
    }
    double f[6];
    int rc = ensure(self, level);
    if (rc == 0) {
        derive(self->out, position, acceptance, f);
        for (Py_ssize_t j = 0; j < ncol; j++) ((float *)x.buf)[j] = (float)f[columns[j]];
    }
    PyBuffer_Release(&x);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMemberDef Stats_members[] = {
    {"logits", T_OBJECT_EX, offsetof(StatsObject, logits), READONLY, "the logit vector"},
    {NULL},
};

static PyMethodDef Stats_methods[] = {
    {"argmax", (PyCFunction)Stats_argmax, METH_NOARGS, "The first index of the largest logit (as numpy's argmax)."},
    {"softmax", (PyCFunction)Stats_softmax, METH_NOARGS,
     "[max, second, argmax, s, t, mean, variance] as floats, s = sum exp(z - max), t = sum exp(z - max) (z - max)."},
    {"features_into", (PyCFunction)(void (*)(void))Stats_features_into, METH_FASTCALL,
     "features_into(x, columns, position, recent_acceptance): the features `columns` (FEATURE_NAMES "
     "indices, as bytes) into the float32 array x, one per column; only the sums they need are computed."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StatsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edgekit.runtime._logitstats.Stats",
    .tp_basicsize = sizeof(StatsObject),
    .tp_dealloc = (destructor)Stats_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Stats(logits): the statistics of one float32 logit vector, computed on first use and kept.",
    .tp_methods = Stats_methods,
    .tp_members = Stats_members,
    .tp_new = Stats_new,
};

/* ---- kept(): each row's logits that reach its k-th largest (a top-k sampler's support) ---- */

/* What kept() gives back, all rows' one after another: ids and values, grown as rows are read. */
typedef struct {
    int64_t *id;
    float *value;
    Py_ssize_t len, cap;
} Kept;

static int
kept_add(Kept *o, int64_t id, float value)
{
    if (o->len == o->cap) {
        Py_ssize_t cap = o->cap ? 2 * o->cap : 4096;
        int64_t *ids = PyMem_RawRealloc(o->id, (size_t)cap * sizeof(int64_t));
        if (ids == NULL) return -1;
        o->id = ids;
        float *values = PyMem_RawRealloc(o->value, (size_t)cap * sizeof(float));
        if (values == NULL) return -1;
        o->value = values;
        o->cap = cap;
    }
    o->id[o->len] = id;
    o->value[o->len++] = value;
    return 0;
}

/* Restores the min-heap h[0..k) from position i down. */
static void
sift_down(float *h, Py_ssize_t k, Py_ssize_t i)
{
    float v = h[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= k) break;
        if (c + 1 < k && h[c + 1] < h[c]) c++;
        if (!(h[c] < v)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

/* Values tested at once (a loop the compiler vectorizes) before any is looked at alone. */
#define SCAN 16

static inline int
any_reaching(const float *a, float t)
{
    int reaching = 0;
    for (int j = 0; j < SCAN; j++) reaching |= a[j] >= t;
    return reaching;
}

/* The k-th largest of a[0..n), k <= n, by a min-heap h of k floats: past the first k, a value
 * costs one comparison (sixteen at a time) unless it is among the k largest so far. For the
 * maxima of a logit row's blocks (4,752 on Qwen's rows) and k = 40, a few hundred enter, where a
 * selection would move them all. */
static float
kth_by_heap(const float *a, Py_ssize_t n, Py_ssize_t k, float *h)
{
    memcpy(h, a, (size_t)k * sizeof(float));
    for (Py_ssize_t i = k / 2; i-- > 0;) sift_down(h, k, i);
    Py_ssize_t i = k;
    for (; i + SCAN <= n; i += SCAN) {
        if (!any_reaching(a + i, h[0])) continue; /* most of them, past the first few hundred */
        for (Py_ssize_t j = i; j < i + SCAN; j++) {
            if (a[j] > h[0]) {
                h[0] = a[j];
                sift_down(h, k, 0);
            }
        }
    }
    for (; i < n; i++) {
        if (a[i] > h[0]) {
            h[0] = a[i];
            sift_down(h, k, 0);
        }
    }
    return h[0];
}

/* The value of rank r (0: the smallest) of a[0..n), no NaN, 0 <= r < n; a is reordered.
 * Hoare's selection with a median-of-three pivot: equal values stop both scans, so rows of
 * ties split evenly, and sorted runs do not degrade it. */
static float
select_rank(float *a, Py_ssize_t n, Py_ssize_t r)
{
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
        float p = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < p) i++;
            while (a[j] > p) j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (r <= j)
            hi = j;
        else if (r >= i)
            lo = i;
        else
            return a[r]; /* between the two scans: equal to the pivot */
    }
    return a[r];
}

/* The least float32 at least x: a float32 reaches it exactly where it reaches x. */
static float
float_at_least(double x)
{
    float f = (float)x;
    return (double)f < x ? nextafterf(f, INFINITY) : f;
}

/* The largest of a[0..n), n >= 1, no NaN: eight running maxima, so that the comparisons do not
 * wait on one another (one chain is a comparison's latency per value). */
static float
row_top(const float *a, Py_ssize_t n)
{
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = a[0];
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = a[i + j] > m[j] ? a[i + j] : m[j];
    for (; i < n; i++) m[0] = a[i] > m[0] ? a[i] : m[0];
    for (int j = 1; j < 8; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

/* Row z[0..n)'s values that reach both its k-th largest (ties counted: numpy's partition's value
 * at index n - k of the sorted row; k = 0: no such cut) and its floor, the largest value less
 * `spread` (in float64; spread = inf: no floor), appended to `out` in id order.
 * The kernel's one pass takes each block's maximum. t, the k-th largest of those maxima, is reached
 * by k values at least (one in each of k blocks), so the k-th largest is t or more; the cut is
 * t or the floor, the higher, and every value that reaches it lies in a block whose maximum does.
 * Only those blocks (about k of them on a logit row under top-k; under min-p those near the top)
 * are read again, while they are still in cache: their values that reach the cut are collected,
 * the k-th largest selected among them where they are more than k (Hoare's selection: k may be in
 * the thousands; fewer: the k-th largest is below the floor, which cuts), and what reaches it
 * taken. `maxima` has room for the blocks' maxima, `scratch` for n values, `blocks` for their
 * indices. Returns 0; 1 if a value is NaN (numpy orders NaN last, the selection cannot); -1 out
 * of memory. */
static int
kept_row(const float *z, Py_ssize_t n, Py_ssize_t k, double spread, float *maxima, float *scratch,
         Py_ssize_t *blocks, Kept *out)
{
    if (kernel->blocks(z, n, maxima)) return 1;
    Py_ssize_t nb = (n + LS_BLOCK - 1) / LS_BLOCK, nc = 0, m = 0;
    float t = -INFINITY; /* k blocks or fewer: every block */
    if (k > 0 && k < nb) t = kth_by_heap(maxima, nb, k, scratch);
    if (spread < INFINITY) {
        float top = row_top(maxima, nb);
        float floor = float_at_least((double)top - spread);
        t = floor > t ? floor : t;
    }
    for (Py_ssize_t b0 = 0; b0 < nb; b0 += SCAN) {
        Py_ssize_t b1 = b0 + SCAN < nb ? b0 + SCAN : nb;
        if (b1 - b0 == SCAN && !any_reaching(maxima + b0, t)) continue;
        for (Py_ssize_t b = b0; b < b1; b++) {
            if (!(maxima[b] >= t)) continue;
            blocks[nc++] = b;
            Py_ssize_t end = (b + 1) * LS_BLOCK < n ? (b + 1) * LS_BLOCK : n;
            for (Py_ssize_t i = b * LS_BLOCK; i < end; i++)
                if (z[i] >= t) scratch[m++] = z[i];
        }
    }
    /* m >= k where only top-k cuts (k blocks' maxima reach t); under a floor m may be fewer */
    float cut = k > 0 && m > k ? select_rank(scratch, m, m - k) : t;
    for (Py_ssize_t c = 0; c < nc; c++) {
        Py_ssize_t b = blocks[c], end = (b + 1) * LS_BLOCK < n ? (b + 1) * LS_BLOCK : n;
        for (Py_ssize_t i = b * LS_BLOCK; i < end; i++)
            if (z[i] >= cut && kept_add(out, i, z[i]) < 0) return -1;
    }
    return 0;
}

/* kept(rows, keep, within, spread) -> (ids, logits, counts) as bytearrays, or None */
static PyObject *
kept(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "kept(rows, keep, within, spread)");
        return NULL;
    }
    Py_ssize_t keep = PyLong_AsSsize_t(args[1]), within = PyLong_AsSsize_t(args[2]);
    double spread = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (keep < 0 || !(spread >= 0) || (keep == 0 && spread == INFINITY)) {
        PyErr_SetString(PyExc_ValueError, "keep must be 0 or more and spread 0 or more, and one of them must cut");
        return NULL;
    }
    Py_buffer z;
    if (PyObject_GetBuffer(args[0], &z, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (z.itemsize != 4 || !is_format(z.format, 'f') || z.ndim != 2 || within < 1 || within > z.shape[1]) {
        PyBuffer_Release(&z);
        PyErr_SetString(PyExc_ValueError, "rows must be a contiguous 2-d float32 array and 1 <= within <= its row length");
        return NULL;
    }
    Py_ssize_t rows = z.shape[0], n = z.shape[1], k = keep < within ? keep : within;
    Py_ssize_t nb = (within + LS_BLOCK - 1) / LS_BLOCK;
    float *scratch = PyMem_RawMalloc((size_t)within * sizeof(float));
    float *maxima = PyMem_RawMalloc((size_t)nb * sizeof(float));
    Py_ssize_t *blocks = PyMem_RawMalloc((size_t)nb * sizeof(Py_ssize_t));
    PyObject *counts = PyByteArray_FromStringAndSize(NULL, rows * (Py_ssize_t)sizeof(int64_t));
    PyObject *ids = NULL, *values = NULL, *out = NULL;
    Kept got = {NULL, NULL, 0, 0};
    int status = 0;
    if (scratch == NULL || maxima == NULL || blocks == NULL || counts == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    int64_t *count = (int64_t *)PyByteArray_AS_STRING(counts);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows && status == 0; r++) {
        Py_ssize_t before = got.len;
        status = kept_row((const float *)z.buf + r * n, within, k, spread, maxima, scratch, blocks, &got);
        count[r] = got.len - before;
    }
    Py_END_ALLOW_THREADS
    if (status < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (status > 0) { /* a NaN: numpy answers */
        Py_INCREF(Py_None);
        out = Py_None;
        goto done;
    }
    ids = PyByteArray_FromStringAndSize((const char *)got.id, got.len * (Py_ssize_t)sizeof(int64_t));
    values = PyByteArray_FromStringAndSize((const char *)got.value, got.len * (Py_ssize_t)sizeof(float));
    if (ids == NULL || values == NULL) goto done;
    out = PyTuple_Pack(3, ids, values, counts);
done:
    Py_XDECREF(ids);
    Py_XDECREF(values);
    Py_XDECREF(counts);
    PyMem_RawFree(got.id);
    PyMem_RawFree(got.value);
    PyMem_RawFree(blocks);
    PyMem_RawFree(maxima);
    PyMem_RawFree(scratch);
    PyBuffer_Release(&z);
    return out;
}

static PyObject *
use(PyObject *module, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL) return NULL;
    const ls_kernel *k = ls_find(name);
    if (k == NULL) {
        PyErr_Format(PyExc_ValueError, "no %s kernel on this CPU", name);
        return NULL;
    }
    kernel = k;
    if (PyModule_AddStringConstant(module, "ISA", k->name) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"use", use, METH_O, "use(name): run the kernel of that name, one of KERNELS (ValueError if this CPU lacks it)."},
    {"kept", (PyCFunction)(void (*)(void))kept, METH_FASTCALL,
     "kept(rows, keep, within, spread) -> (ids, logits, counts): of each row of a 2-d float32 array, the "
     "ids and values of its first `within` values that reach its keep-th largest (ties counted, as numpy's "
     "partition; keep 0: no such cut) and its largest less spread (in float64; inf: no such cut), rows one after another, as bytearrays of int64, float32 and int64 (how many each row kept); "
     "None where a row holds a NaN."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_logitstats", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__logitstats(void)
{
    kernel = ls_best();
    if (PyType_Ready(&StatsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    PyObject *runs = PyList_New(0), *names = NULL;
    for (int i = 0; runs != NULL && i < LS_NKERNELS; i++) {
        if (!ls_runs(&ls_kernels[i])) continue;
        PyObject *name = PyUnicode_FromString(ls_kernels[i].name);
        if (name == NULL || PyList_Append(runs, name) < 0) Py_CLEAR(runs);
        Py_XDECREF(name);
    }
    if (runs != NULL) names = PyList_AsTuple(runs);
    Py_XDECREF(runs);
    if (names == NULL || PyModule_AddObjectRef(m, "KERNELS", names) < 0 ||
        PyModule_AddStringConstant(m, "ISA", kernel->name) < 0 ||
        PyModule_AddObjectRef(m, "Stats", (PyObject *)&StatsType) < 0) {
        Py_XDECREF(names);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(names);
    return m;
}
