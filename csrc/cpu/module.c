/* The Python module exactdraft._cpu_kernels: thin entry points taking integer data pointers and
 * sizes (the Python wrapper in exactdraft/kernels/cpu.py checks dtypes, shapes and layout).
 *
 * Invariant: an entry point only unpacks its arguments and calls the dispatcher; it adds no
 * arithmetic of its own, so the kernels' row invariance is the module's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "amx_probe.h"
#include "dispatch.h"
#include "module_args.h"
#include "module_layer.h"
#include "pack_dot.h"
#include "thread_pool.h"

/* matmul(x, rows, depth, weight, columns, format, layout, bias_or_0, out, out_stride); layout is
 * a weight_layout code (kernels.h), out_stride the floats between output rows (0: columns). */
static PyObject *py_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    struct matmul_problem p = {0};
    void *x, *weight, *bias, *out;
    Py_ssize_t rows, depth, columns, format, layout, out_stride;
    if (expect_arguments(nargs, 10, "matmul") || take_pointer(args[0], "x", 0, &x) ||
        take_size(args[1], "rows", 1, &rows) || take_size(args[2], "depth", 1, &depth) ||
        take_pointer(args[3], "weight", 0, &weight) ||
        take_size(args[4], "columns", 1, &columns) || take_size(args[5], "format", 0, &format) ||
        take_size(args[6], "layout", 0, &layout) || take_pointer(args[7], "bias", 1, &bias) ||
        take_pointer(args[8], "out", 0, &out) || take_size(args[9], "out_stride", 0, &out_stride) ||
        check_weight_codes("weight", format, layout, depth))
        return NULL;
    if (out_stride && out_stride < columns) {
        PyErr_Format(PyExc_ValueError, "out_stride %zd is below columns %zd", out_stride,
                     columns);
        return NULL;
    }
    p.out_stride = out_stride;
    p.x = x;
    p.weight = weight;
    p.bias = bias;
    p.out = out;
    p.rows = rows;
    p.depth = depth;
    p.columns = columns;
    p.format = (int)format;
    p.layout = (int)layout;
    p.row_bytes = weight_row_bytes(format, depth);
    int status;
    RUN((double)rows * (double)columns * (double)depth, status = run_matmul(&p));
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* quantize_rows(x, rows, depth, values, scales, scaled_sums, sums): the dot layout's activation
 * quantization on its own, block-major (int8 values [K / 32, M, 32]; float32, float32, int32
 * [K / 32, M]). */
static PyObject *py_quantize_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    void *x, *values, *scales, *scaled_sums, *sums;
    Py_ssize_t rows, depth;
    if (expect_arguments(nargs, 7, "quantize_rows") || take_pointer(args[0], "x", 0, &x) ||
        take_size(args[1], "rows", 1, &rows) || take_size(args[2], "depth", 1, &depth) ||
        take_pointer(args[3], "values", 0, &values) ||
        take_pointer(args[4], "scales", 0, &scales) ||
        take_pointer(args[5], "scaled_sums", 0, &scaled_sums) ||
        take_pointer(args[6], "sums", 0, &sums))
        return NULL;
    if (depth % QUANT_BLOCK) {
        PyErr_Format(PyExc_ValueError, "quantize_rows needs depth %% 32 == 0, got %zd", depth);
        return NULL;
    }
    struct quantized_rows out = {values, scales, scaled_sums, sums, NULL};
    struct quantize_problem p = {x, &out, rows, depth};
    RUN((double)rows * (double)depth, run_quantize_rows(&p));
    Py_RETURN_NONE;
}

/* attention(q, rows, heads, head_dim, keys, values, kv_heads, capacity, positions, window,
 *           scale, out, tree_paths, tree_base[, sinks]): tree_paths 0 for a chain, else
 *           int32 [rows, rows] with row r at position tree_base + its depth; sinks 0 or
 *           float32 [heads] (attention_problem), optional so that callers written for builds
 *           without sinks (benchmarks/attention_ab.py) call any build. */
static PyObject *py_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    struct attention_problem p;
    void *q, *keys, *values, *positions, *out, *tree_paths, *sinks = NULL;
    Py_ssize_t rows, heads, head_dim, kv_heads, capacity, window, tree_base;
    if (expect_arguments(nargs, nargs == 14 ? 14 : 15, "attention") ||
        take_pointer(args[0], "q", 0, &q) ||
        take_size(args[1], "rows", 1, &rows) || take_size(args[2], "heads", 1, &heads) ||
        take_size(args[3], "head_dim", 1, &head_dim) ||
        take_pointer(args[4], "keys", 0, &keys) || take_pointer(args[5], "values", 0, &values) ||
        take_size(args[6], "kv_heads", 1, &kv_heads) ||
        take_size(args[7], "capacity", 1, &capacity) ||
        take_pointer(args[8], "positions", 0, &positions) ||
        take_size(args[9], "window", 0, &window) || take_float(args[10], &p.scale) ||
        take_pointer(args[11], "out", 0, &out) ||
        take_pointer(args[12], "tree_paths", 1, &tree_paths) ||
        take_size(args[13], "tree_base", 0, &tree_base) ||
        (nargs == 15 && take_pointer(args[14], "sinks", 1, &sinks)))
        return NULL;
    if (heads % kv_heads) {
        PyErr_Format(PyExc_ValueError, "heads (%zd) must be a multiple of kv_heads (%zd)", heads,
                     kv_heads);
        return NULL;
    }
    if (head_dim > MAX_HEAD_DIM) {
        PyErr_Format(PyExc_ValueError, "head_dim %zd exceeds the supported %d", head_dim,
                     MAX_HEAD_DIM);
        return NULL;
    }
    const int64_t *position = positions;
    double work = 0;
    for (Py_ssize_t m = 0; m < rows; m++) {
        if (position[m] < 0 || position[m] >= capacity) {
            PyErr_Format(PyExc_ValueError,
                         "positions[%zd] = %lld is outside the key buffer of %zd positions", m,
                         (long long)position[m], capacity);
            return NULL;
        }
        work += (double)(position[m] + 1);
    }
    if (tree_paths) {
        int32_t *depths = malloc((size_t)rows * sizeof(int32_t));
        if (!depths) return PyErr_NoMemory();
        for (Py_ssize_t m = 0; m < rows; m++)
            depths[m] = (int32_t)(position[m] - tree_base < 0 ? -1 : position[m] - tree_base);
        const int bad = tree_base + rows > capacity || check_tree(depths, tree_paths, rows);
        free(depths);
        if (bad) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "tree slots %zd..%zd do not fit %zd positions",
                             tree_base, tree_base + rows - 1, capacity);
            return NULL;
        }
    }
    p.tree_paths = tree_paths;
    p.tree_base = tree_base;
    p.sinks = sinks;
    p.q = q;
    p.keys = keys;
    p.values = values;
    p.positions = position;
    p.out = out;
    p.rows = rows;
    p.heads = heads;
    p.kv_heads = kv_heads;
    p.capacity = capacity;
    p.head_dim = head_dim;
    p.window = window;
    RUN(work * (double)heads * (double)head_dim, run_attention(&p));
    Py_RETURN_NONE;
}

/* rms_norm(x, rows, width, weight, eps, out) */
static PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    struct rows_problem p = {0};
    void *x, *weight, *out;
    Py_ssize_t rows, width;
    if (expect_arguments(nargs, 6, "rms_norm") || take_pointer(args[0], "x", 0, &x) ||
        take_size(args[1], "rows", 1, &rows) || take_size(args[2], "width", 1, &width) ||
        take_pointer(args[3], "weight", 0, &weight) || take_float(args[4], &p.eps) ||
        take_pointer(args[5], "out", 0, &out))
        return NULL;
    p.x = x;
    p.weight = weight;
    p.out = out;
    p.rows = rows;
    p.width = width;
    RUN((double)rows * (double)width, run_rms_norm(&p));
    Py_RETURN_NONE;
}

/* rope(x, rows, heads, head_dim, cos, sin, out) */
static PyObject *py_rope(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    struct rows_problem p = {0};
    void *x, *cos, *sin, *out;
    Py_ssize_t rows, heads, head_dim;
    if (expect_arguments(nargs, 7, "rope") || take_pointer(args[0], "x", 0, &x) ||
        take_size(args[1], "rows", 1, &rows) || take_size(args[2], "heads", 1, &heads) ||
        take_size(args[3], "head_dim", 2, &head_dim) || take_pointer(args[4], "cos", 0, &cos) ||
        take_pointer(args[5], "sin", 0, &sin) || take_pointer(args[6], "out", 0, &out))
        return NULL;
    if (head_dim % 2) {
        PyErr_Format(PyExc_ValueError, "rope needs an even head_dim, got %zd", head_dim);
        return NULL;
    }
    p.x = x;
    p.weight = cos;
    p.weight2 = sin;
    p.out = out;
    p.rows = rows;
    p.heads = heads;
    p.width = head_dim;
    RUN((double)rows * (double)heads * (double)head_dim, run_rope(&p));
    Py_RETURN_NONE;
}

/* A gated activation (gate_up, rows, width, out): width is the output width I (gate_up holds
 * gate then up, 2 I wide). */
static PyObject *gated(PyObject *const *args, Py_ssize_t nargs, const char *name,
                       void (*run)(const struct rows_problem *))
{
    struct rows_problem p = {0};
    void *x, *out;
    Py_ssize_t rows, width;
    if (expect_arguments(nargs, 4, name) || take_pointer(args[0], "gate_up", 0, &x) ||
        take_size(args[1], "rows", 1, &rows) || take_size(args[2], "width", 1, &width) ||
        take_pointer(args[3], "out", 0, &out))
        return NULL;
    p.x = x;
    p.out = out;
    p.rows = rows;
    p.width = width;
    RUN((double)rows * (double)width, run(&p));
    Py_RETURN_NONE;
}

static PyObject *py_silu_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return gated(args, nargs, "silu_mul", run_silu_mul);
}

static PyObject *py_gelu_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return gated(args, nargs, "gelu_mul", run_gelu_mul);
}

/* pack_dot(format, source, rows, depth, records): GGUF rows into dot-layout records. */
static PyObject *py_pack_dot(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    void *source, *records;
    Py_ssize_t format, rows, depth;
    if (expect_arguments(nargs, 5, "pack_dot") || take_size(args[0], "format", 0, &format) ||
        take_pointer(args[1], "source", 0, &source) || take_size(args[2], "rows", 1, &rows) ||
        take_size(args[3], "depth", 1, &depth) || take_pointer(args[4], "records", 0, &records))
        return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS status = pack_dot_records((int)format, source, rows, depth, records);
    Py_END_ALLOW_THREADS
    if (status) {
        PyErr_Format(PyExc_ValueError, "pack_dot: format code %zd with depth %zd has no dot "
                     "layout", format, depth);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* format_table(): ((code, name, weights per block, bytes per block, float kernel, dot record
 * bytes), ...) of formats.h. */
static PyObject *py_format_table(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *rows = PyList_New(0);
    if (!rows) return NULL;
    for (int code = 0; code < FORMAT_COUNT; code++) {
        const struct format_row *row = &FORMAT_ROWS[code];
        if (!row->name) continue; /* a gap in the codes */
        PyObject *entry = Py_BuildValue("(isiiii)", code, row->name, row->block_size,
                                        row->block_bytes, row->float_kernel,
                                        row->dot_record_bytes);
        const int failed = !entry || PyList_Append(rows, entry) < 0;
        Py_XDECREF(entry);
        if (failed) {
            Py_DECREF(rows);
            return NULL;
        }
    }
    PyObject *table = PyList_AsTuple(rows);
    Py_DECREF(rows);
    return table;
}

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg)
{
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > 1024) {
        PyErr_Format(PyExc_ValueError, "thread count must be in 1..1024, got %ld", n);
        return NULL;
    }
    int running;
    Py_BEGIN_ALLOW_THREADS running = pool_set_threads((int)n);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(running);
}

static PyObject *py_num_threads(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    int n;
    Py_BEGIN_ALLOW_THREADS n = pool_threads();
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(n);
}

static PyObject *py_simd_level(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(active_level()->name);
}

/* The names of the levels a dispatch.c list function gives, as a tuple of str. */
static PyObject *level_names(int (*list)(const struct kernel_table **out, int capacity))
{
    const struct kernel_table *levels[8];
    const int count = list(levels, 8);
    PyObject *names = PyTuple_New(count);
    if (!names) return NULL;
    for (int i = 0; i < count; i++) {
        PyObject *name = PyUnicode_FromString(levels[i]->name);
        if (!name) {
            Py_DECREF(names);
            return NULL;
        }
        PyTuple_SET_ITEM(names, i, name);
    }
    return names;
}

static PyObject *py_simd_levels(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return level_names(supported_levels);
}

static PyObject *py_emulated_simd_levels(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return level_names(test_levels);
}

static PyObject *reason_or_none(const char *reason)
{
    if (reason) return PyUnicode_FromString(reason);
    Py_RETURN_NONE;
}

static PyObject *py_amx_unavailable_reason(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    const char *reason;
    Py_BEGIN_ALLOW_THREADS reason = amx_unavailable_reason();
    Py_END_ALLOW_THREADS
    return reason_or_none(reason);
}

static PyObject *py_probe_amx(PyObject *self, PyObject *args)
{
    (void)self;
    int assume_cpu_support, refuse_permission;
    if (!PyArg_ParseTuple(args, "pp", &assume_cpu_support, &refuse_permission)) return NULL;
    const char *reason;
    Py_BEGIN_ALLOW_THREADS reason = probe_amx_level(assume_cpu_support, refuse_permission);
    Py_END_ALLOW_THREADS
    return reason_or_none(reason);
}

static PyObject *py_set_simd_level(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    if (select_level(name) != 0) {
        PyErr_Format(PyExc_ValueError, "SIMD level %R is not supported on this CPU", arg);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_FASTCALL, "x @ weight.T (+ bias)"},
    {"quantize_rows", (PyCFunction)(void (*)(void))py_quantize_rows, METH_FASTCALL,
     "int8 block quantization of activation rows, as the dot layout's matmul does it"},
    {"layer_plan", (PyCFunction)(void (*)(void))py_layer_plan, METH_FASTCALL,
     "a decoder layer's weights and sizes, checked once, for decoder_layers"},
    {"decoder_layers", (PyCFunction)(void (*)(void))py_decoder_layers, METH_FASTCALL,
     "a stack of decoder layers for M rows, in one call"},
    {"attention", (PyCFunction)(void (*)(void))py_attention, METH_FASTCALL,
     "causal grouped-query attention over a KV buffer"},
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_FASTCALL, "RMS norm of rows"},
    {"rope", (PyCFunction)(void (*)(void))py_rope, METH_FASTCALL, "rotate-half RoPE"},
    {"silu_mul", (PyCFunction)(void (*)(void))py_silu_mul, METH_FASTCALL, "silu(gate) * up"},
    {"gelu_mul", (PyCFunction)(void (*)(void))py_gelu_mul, METH_FASTCALL,
     "gelu_tanh(gate) * up"},
    {"format_table", py_format_table, METH_NOARGS, "the weight formats of formats.h"},
    {"pack_dot", (PyCFunction)(void (*)(void))py_pack_dot, METH_FASTCALL,
     "GGUF block rows into dot-layout records"},
    {"set_num_threads", py_set_num_threads, METH_O, "set the pool size; returns the count"},
    {"num_threads", py_num_threads, METH_NOARGS, "threads that run kernels"},
    {"simd_level", py_simd_level, METH_NOARGS, "the active SIMD level"},
    {"simd_levels", py_simd_levels, METH_NOARGS, "SIMD levels this CPU supports, best first"},
    {"set_simd_level", py_set_simd_level, METH_O, "make a supported SIMD level active"},
    {"emulated_simd_levels", py_emulated_simd_levels, METH_NOARGS, "levels only tests select"},
    {"amx_unavailable_reason", py_amx_unavailable_reason, METH_NOARGS,
     "why the amx level is not offered, or None"},
    {"probe_amx", py_probe_amx, METH_VARARGS,
     "probe the amx level again (assume_cpu_support, refuse_permission)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "exactdraft._cpu_kernels",
    "Row-invariant CPU kernels (see exactdraft.kernels.cpu).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cpu_kernels(void) { return PyModule_Create(&module); }
