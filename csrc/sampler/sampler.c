/* The Python module exactdraft._sampler: SAMPLER.md's draw (steps 3-9) on a processed float64
 * logits row (or a float32 row, widened exactly: step 2 without bias or penalties), computed by
 * draw.c.
 *
 * Invariant: the entry point only checks and unpacks its arguments and turns draw()'s failures
 * into ValueError; the token is draw()'s. draw() reuses module-wide scratch memory, so it runs
 * with the GIL held and never releases it (a call takes well under a millisecond).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>

#include "float64_math.h"
#include <stdlib.h>
#include <string.h>

#include "draw.h"

/* A finite float in [minimum, maximum], or in (minimum, maximum] when open_minimum. */
static int take_float(PyObject *arg, const char *name, double minimum, int open_minimum,
                      double maximum, const char *allowed, double *out)
{
    *out = PyFloat_AsDouble(arg);
    if (*out == -1.0 && PyErr_Occurred()) return -1;
    if (isfinite(*out) && (open_minimum ? *out > minimum : *out >= minimum) && *out <= maximum)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s must be %s, got %R", name, allowed, arg);
    return -1;
}

static int take_uint64(PyObject *arg, const char *name, uint64_t *out)
{
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %R", name, arg);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(arg);
    if (*out == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an integer in [0, 2**64), got %R", name, arg);
        return -1;
    }
    return 0;
}

static int take_size(PyObject *arg, const char *name, size_t maximum, const char *allowed,
                     size_t *out)
{
    Py_ssize_t value = PyLong_AsSsize_t(arg);
    if (value == -1 && PyErr_Occurred()) return -1;
    if (value >= 0 && (size_t)value <= maximum) {
        *out = (size_t)value;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s must be %s, got %zd", name, allowed, value);
    return -1;
}

/* The struct-module item of a buffer's format ('d', 'f'), 0 when it is anything else. */
static char item_of(const char *format)
{
    if (!format) return 0;
    if (*format == '@' || *format == '=' || *format == (PY_LITTLE_ENDIAN ? '<' : '>')) format++;
    return (format[0] == 'd' || format[0] == 'f') && format[1] == '\0' ? format[0] : 0;
}

/* The row as a C-contiguous 1-D float64 buffer (or float32 where `floats` allows it: the
 * caller widens it), or -1 with ValueError set. */
static int take_row(PyObject *arg, Py_buffer *view, int floats)
{
    const char *wanted = floats ? "float64 or float32" : "float64";
    if (PyObject_GetBuffer(arg, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyObject *type, *why, *trace;
        PyErr_Fetch(&type, &why, &trace);
        PyErr_Format(PyExc_ValueError, "x must be a C-contiguous 1-D %s array; the %.100s "
                     "given is refused: %S", wanted, Py_TYPE(arg)->tp_name, why ? why : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(why);
        Py_XDECREF(trace);
        return -1;
    }
    const char item = item_of(view->format);
    const int typed = (item == 'd' && view->itemsize == 8) ||
                      (floats && item == 'f' && view->itemsize == 4);
    if (view->ndim == 1 && typed && view->shape[0] >= 1 &&
        (uint64_t)view->shape[0] <= UINT32_MAX)
        return 0;
    if (view->ndim != 1 || !typed)
        PyErr_Format(PyExc_ValueError, "x must be a 1-D %s array, got %d-D items of "
                     "format '%s'", wanted, view->ndim, view->format ? view->format : "B");
    else
        PyErr_Format(PyExc_ValueError, "x must hold between 1 and 2**32 - 1 logits, got %zd",
                     view->shape[0]);
    PyBuffer_Release(view);
    return -1;
}

/* A float32 row widened to float64 (exact), in memory kept from call to call. */
static const double *widened(const float *row, size_t n)
{
    static double *buffer;
    static size_t capacity;
    if (n > capacity) {
        double *grown = realloc(buffer, n * sizeof *grown);
        if (!grown) return NULL;
        buffer = grown;
        capacity = n;
    }
    widen_row(row, buffer, n);
    return buffer;
}

static PyObject *raise_failure(struct draw_result result)
{
    PyObject *number;
    switch (result.status) {
    case DRAW_NAN:
        return PyErr_Format(PyExc_ValueError, "logits row has NaN at token %zu", result.index);
    case DRAW_NO_FINITE_MAXIMUM:
        number = PyFloat_FromDouble(result.value);
        if (number) {
            PyErr_Format(PyExc_ValueError,
                         "logits row has no finite maximum after processing (max %R)", number);
            Py_DECREF(number);
        }
        return NULL;
    case DRAW_UNIT_UNIFORM:
        return PyErr_Format(PyExc_ValueError, "the keyed uniform of token %zu rounds to 1.0, "
                            "where -log(-log(u)) is undefined", result.index);
    case DRAW_NO_MEMORY:
        return PyErr_NoMemory();
    default:
        return PyErr_Format(PyExc_SystemError, "unknown draw status %d", (int)result.status);
    }
}

/* The tokens of a draw_among row: a C-contiguous 1-D int64 buffer of `count` ids ascending
 * strictly from 0 up, or -1 with ValueError set. */
static int take_tokens(PyObject *arg, Py_buffer *view, size_t count)
{
    if (PyObject_GetBuffer(arg, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    const int typed = (f[0] == 'q' || f[0] == 'l') && f[1] == '\0' && view->itemsize == 8;
    if (view->ndim != 1 || !typed || (size_t)view->shape[0] != count) {
        PyErr_Format(PyExc_ValueError, "tokens must be a 1-D int64 array of %zu ids", count);
        PyBuffer_Release(view);
        return -1;
    }
    const int64_t *ids = view->buf;
    for (size_t i = 0; i < count; i++)
        if (ids[i] < 0 || (i > 0 && ids[i] <= ids[i - 1])) {
            PyErr_Format(PyExc_ValueError, "tokens must ascend strictly from 0 up; token %lld "
                         "at index %zu does not", (long long)ids[i], i);
            PyBuffer_Release(view);
            return -1;
        }
    return 0;
}

/* The shared body of draw and draw_among: `row`, `tokens` (NULL: none) and args, which are
 * temperature, top_k, top_p, min_p, seed, pos[, top_p_path[, scan]]. */
static PyObject *run_draw(PyObject *row, PyObject *tokens, PyObject *const *args,
                          Py_ssize_t nargs)
{
    struct draw_request r;
    size_t path = TOP_P_AUTO, scan = SCAN_BEST;
    if (take_float(args[0], "temperature", 0.0, 0, INFINITY, "a finite number >= 0",
                   &r.temperature) ||
        take_size(args[1], "top_k", PY_SSIZE_T_MAX, ">= 0 (0 = off)", &r.top_k) ||
        take_float(args[2], "top_p", 0.0, 1, 1.0, "in (0, 1]", &r.top_p) ||
        take_float(args[3], "min_p", 0.0, 0, 1.0, "in [0, 1]", &r.min_p) ||
        take_uint64(args[4], "seed", &r.seed) || take_uint64(args[5], "pos", &r.pos) ||
        (nargs >= 7 && take_size(args[6], "top_p_path", TOP_P_BOUNDED,
                                 "0 (auto), 1 (exhaustive) or 2 (bounded)", &path)) ||
        (nargs == 8 && take_size(args[7], "scan", SCAN_COUNT - 1,
                                 "0 (best), 1 (scalar), 2 (avx2) or 3 (avx512)", &scan)))
        return NULL;
    r.top_p_path = (enum top_p_path)path;
    if (!scan_available((enum row_scan)scan)) {
        PyErr_Format(PyExc_ValueError, "scan %zu is not available on this CPU", scan);
        return NULL;
    }
    r.scan = (enum row_scan)scan;
    Py_buffer view, listed;
    if (take_row(row, &view, 1)) return NULL;
    r.vocab = (size_t)view.shape[0];
    r.tokens = NULL;
    if (tokens) {
        if (take_tokens(tokens, &listed, r.vocab)) {
            PyBuffer_Release(&view);
            return NULL;
        }
        r.tokens = listed.buf;
    }
    r.x = view.itemsize == 8 ? view.buf : widened(view.buf, r.vocab);
    struct draw_result result = {DRAW_NO_MEMORY, 0, 0.0};
    if (r.x) result = draw(&r);
    if (tokens && (result.status == DRAW_UNIT_UNIFORM || result.status == DRAW_NAN))
        result.index = (size_t)r.tokens[result.index]; /* errors name the token */
    PyBuffer_Release(&view);
    if (tokens) PyBuffer_Release(&listed);
    if (result.status != DRAW_OK) return raise_failure(result);
    return PyLong_FromSize_t(result.index);
}

/* draw(x, temperature, top_k, top_p, min_p, seed, pos[, top_p_path[, scan]]) -> token id */
static PyObject *py_draw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs < 7 || nargs > 9) {
        PyErr_Format(PyExc_TypeError, "draw takes 7 to 9 arguments, got %zd", nargs);
        return NULL;
    }
    return run_draw(args[0], NULL, args + 1, nargs - 1);
}

/* draw_among(x, tokens, temperature, top_k, top_p, min_p, seed, pos[, top_p_path[, scan]])
 * -> the index in x of the winner of the draw among the listed tokens alone, x[i] being the
 * logit of token tokens[i] */
static PyObject *py_draw_among(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs < 8 || nargs > 10) {
        PyErr_Format(PyExc_TypeError, "draw_among takes 8 to 10 arguments, got %zd", nargs);
        return NULL;
    }
    return run_draw(args[0], args[1], args + 2, nargs - 2);
}

static PyObject *py_top_p_path_counts(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    uint64_t counts[3];
    top_p_path_counts(counts);
    return Py_BuildValue("(KKK)", (unsigned long long)counts[0], (unsigned long long)counts[1],
                         (unsigned long long)counts[2]);
}

/* elementwise(x) -> list: xd_exp or xd_log of each double of a float64 row (for tests holding
 * the C functions equal to exactdraft/float64_math.py). */
static PyObject *elementwise(PyObject *arg, double (*function)(double))
{
    Py_buffer view;
    if (take_row(arg, &view, 0)) return NULL;
    const double *x = view.buf;
    const Py_ssize_t count = view.shape[0];
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out && i < count; i++) {
        PyObject *value = PyFloat_FromDouble(function(x[i]));
        if (!value) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, value);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyObject *py_exp(PyObject *self, PyObject *arg)
{
    (void)self;
    return elementwise(arg, xd_exp);
}

static PyObject *py_log(PyObject *self, PyObject *arg)
{
    (void)self;
    return elementwise(arg, xd_log);
}

static PyObject *py_scans(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    PyObject *found = PyList_New(0);
    for (int scan = SCAN_SCALAR; found && scan < SCAN_COUNT; scan++) {
        if (!scan_available((enum row_scan)scan)) continue;
        PyObject *number = PyLong_FromLong(scan);
        if (!number || PyList_Append(found, number)) Py_CLEAR(found);
        Py_XDECREF(number);
    }
    if (!found) return NULL;
    PyObject *result = PyList_AsTuple(found);
    Py_DECREF(found);
    return result;
}

static PyMethodDef methods[] = {
    {"exp", py_exp, METH_O, "exp(x) -> list: exactdraft's float64 exp of each value of x"},
    {"log", py_log, METH_O, "log(x) -> list: exactdraft's float64 log of each value of x"},
    {"draw_among", (PyCFunction)(void (*)(void))py_draw_among, METH_FASTCALL,
     "draw_among(x, tokens, temperature, top_k, top_p, min_p, seed, pos[, top_p_path[, scan]])"
     " -> the index in x of the winner among the listed tokens alone, x[i] the logit of token "
     "tokens[i] (int64, strictly ascending)"},
    {"draw", (PyCFunction)(void (*)(void))py_draw, METH_FASTCALL,
     "draw(x, temperature, top_k, top_p, min_p, seed, pos[, top_p_path[, scan]]) -> "
     "int: steps 3-9 of SAMPLER.md on the processed C-contiguous float64 row x (a float32 "
     "row is widened exactly). top_p_path "
     "(tests): 0 auto, 1 exhaustive, 2 bounded; scan (tests): 0 the best this CPU runs, "
     "1 scalar, 2 AVX2, 3 AVX-512; all give the same token."},
    {"scans", py_scans, METH_NOARGS,
     "scans() -> tuple: the scans (1 scalar, 2 AVX2, 3 AVX-512) this CPU runs."},
    {"top_p_path_counts", py_top_p_path_counts, METH_NOARGS,
     "(exhaustive, bounded and decided, bounded then exhaustive): top-p decisions so far."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "exactdraft._sampler",
    "SAMPLER.md's draw (steps 3-9) on a processed float64 logits row.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sampler(void) { return PyModule_Create(&module); }
