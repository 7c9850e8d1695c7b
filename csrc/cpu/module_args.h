/* Argument helpers shared by the entry points of exactdraft._cpu_kernels (module.c and
 * module_layer.c); included once by each, so everything here is static.
 *
 * Invariant: a helper only converts and checks Python arguments; it does no arithmetic on data.
 */
#ifndef EXACTDRAFT_CPU_MODULE_ARGS_H
#define EXACTDRAFT_CPU_MODULE_ARGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kernels.h"

/* Calls with less work than this keep the GIL: releasing and taking it back costs more. */
#define RELEASE_GIL_MIN_WORK 1000000.0

/* Bytes of one weight row of K = depth in the rows or grouped layout. */
static inline size_t weight_row_bytes(Py_ssize_t format, Py_ssize_t depth)
{
    const struct format_row *row = &FORMAT_ROWS[format];
    return (size_t)(depth / row->block_size) * (size_t)row->block_bytes;
}

/* A data pointer given as an integer, or as an object with a contiguous buffer (a numpy array);
 * the caller keeps the object alive for the whole call. */
static inline int take_pointer(PyObject *arg, const char *name, int may_be_null, void **out)
{
    if (!PyLong_Check(arg) && PyObject_CheckBuffer(arg)) {
        Py_buffer view;
        if (PyObject_GetBuffer(arg, &view, PyBUF_ANY_CONTIGUOUS) != 0) return -1;
        *out = view.buf;
        PyBuffer_Release(&view);
    } else {
        *out = PyLong_AsVoidPtr(arg);
    }
    if (*out == NULL && PyErr_Occurred()) return -1;
    if (*out == NULL && !may_be_null) {
        PyErr_Format(PyExc_ValueError, "%s must be a non-null data pointer", name);
        return -1;
    }
    return 0;
}

static inline int take_size(PyObject *arg, const char *name, Py_ssize_t minimum, Py_ssize_t *out)
{
    *out = PyLong_AsSsize_t(arg);
    if (*out == -1 && PyErr_Occurred()) return -1;
    if (*out < minimum) {
        PyErr_Format(PyExc_ValueError, "%s must be at least %zd, got %zd", name, minimum, *out);
        return -1;
    }
    return 0;
}

static inline int take_float(PyObject *arg, float *out)
{
    double value = PyFloat_AsDouble(arg);
    if (value == -1.0 && PyErr_Occurred()) return -1;
    *out = (float)value;
    return 0;
}

static inline int expect_arguments(Py_ssize_t nargs, Py_ssize_t expected, const char *function)
{
    if (nargs == expected) return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", function, expected, nargs);
    return -1;
}

#define RUN(work, call)                                    \
    do {                                                   \
        if ((work) >= RELEASE_GIL_MIN_WORK) {              \
            Py_BEGIN_ALLOW_THREADS call; Py_END_ALLOW_THREADS \
        } else {                                           \
            call;                                          \
        }                                                  \
    } while (0)

/* Check a weight's format and layout codes against its depth; returns 0 or -1 with an error. */
static inline int check_weight_codes(const char *name, Py_ssize_t format, Py_ssize_t layout,
                                     Py_ssize_t depth)
{
    if (format >= FORMAT_COUNT || !FORMAT_ROWS[format].name) {
        PyErr_Format(PyExc_ValueError, "%s: unknown weight format code %zd", name, format);
        return -1;
    }
    if (layout >= LAYOUT_COUNT) {
        PyErr_Format(PyExc_ValueError, "%s: unknown weight layout code %zd", name, layout);
        return -1;
    }
    const struct format_row *row = &FORMAT_ROWS[format];
    if (layout == LAYOUT_DOT && !row->dot_record_bytes) {
        PyErr_Format(PyExc_ValueError, "%s: the dot layout has no kernel for %s weights", name,
                     row->name);
        return -1;
    }
    if (layout != LAYOUT_DOT && !row->float_kernel) {
        PyErr_Format(PyExc_ValueError, "%s: %s weights are multiplied in the dot layout only",
                     name, row->name);
        return -1;
    }
    if ((format >= FORMAT_Q8_0 || layout != LAYOUT_ROWS) && depth % QUANT_BLOCK) {
        PyErr_Format(PyExc_ValueError,
                     "%s: quantized or grouped weights need depth %% 32 == 0, got %zd", name,
                     depth);
        return -1;
    }
    if (depth % row->block_size) {
        PyErr_Format(PyExc_ValueError, "%s: %s weights need depth %% %d == 0, got %zd", name,
                     row->name, row->block_size, depth);
        return -1;
    }
    return 0;
}

/* A token tree of `rows` rows (attention_problem.tree_paths): depths[r] in [0, r], and each
 * path entry d <= depths[r] a row of depth d, the last one r itself, so every key a row reads
 * was written by a row of its own pass. */
static inline int check_tree(const int32_t *depths, const int32_t *paths, Py_ssize_t rows)
{
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int32_t depth = depths[r];
        if (depth < 0 || depth > r || paths[r * rows + depth] != r) {
            PyErr_Format(PyExc_ValueError, "tree row %zd: depth %d or its path's end is invalid",
                         r, (int)depth);
            return -1;
        }
        for (int32_t d = 0; d < depth; d++) {
            const int32_t ancestor = paths[r * rows + d];
            if (ancestor < 0 || ancestor >= r || depths[ancestor] != d) {
                PyErr_Format(PyExc_ValueError,
                             "tree row %zd: path entry %d (row %d) is not a row of depth %d "
                             "before it", r, (int)d, (int)ancestor, (int)d);
                return -1;
            }
        }
    }
    return 0;
}

#endif
