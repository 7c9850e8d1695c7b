/* Entry points of exactdraft._cpu_kernels for the fused decoder layer: layer_plan checks a
 * layer's weights and sizes once and keeps them in a capsule; decoder_layer runs the layer.
 *
 * Invariant: see decoder_layer.h; these only check and unpack arguments, so the fused layer's
 * bits are run_decoder_layer's.
 */
#include "module_layer.h"

#include <stdlib.h>

#include "decoder_layer.h"
#include "module_args.h"

#define PLAN_CAPSULE "exactdraft._cpu_kernels.layer_plan"

/* (data, bias_or_0, columns, depth, format, layout) of a weight that must be [columns, depth]. */
static int take_weight(PyObject *arg, const char *name, Py_ssize_t columns, Py_ssize_t depth,
                       struct layer_weight *out)
{
    if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 6) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple (data, bias, columns, depth, format, "
                     "layout)", name);
        return -1;
    }
    void *data, *bias;
    Py_ssize_t found_columns, found_depth, format, layout;
    PyObject *const *item = &PyTuple_GET_ITEM(arg, 0);
    if (take_pointer(item[0], name, 0, &data) || take_pointer(item[1], name, 1, &bias) ||
        take_size(item[2], name, 1, &found_columns) || take_size(item[3], name, 1, &found_depth) ||
        take_size(item[4], name, 0, &format) || take_size(item[5], name, 0, &layout) ||
        check_weight_codes(name, format, layout, found_depth))
        return -1;
    if (found_columns != columns || found_depth != depth) {
        PyErr_Format(PyExc_ValueError, "%s is [%zd, %zd], the layer needs [%zd, %zd]", name,
                     found_columns, found_depth, columns, depth);
        return -1;
    }
    *out = (struct layer_weight){.data = data, .bias = bias, .columns = columns, .depth = depth,
                                 .row_bytes = weight_row_bytes(format, depth),
                                 .format = (int)format, .layout = (int)layout};
    return 0;
}

static void free_plan(PyObject *capsule)
{
    free(PyCapsule_GetPointer(capsule, PLAN_CAPSULE));
}

/* layer_plan(hidden_size, heads, kv_heads, head_dim, intermediate, window, eps, scale,
 *            attention_norm, mlp_norm, q_norm_or_0, k_norm_or_0, qkv, output, gate_up, down,
 *            post_attention_norm_or_0, post_mlp_norm_or_0, activation) */
PyObject *py_layer_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    struct layer_plan p;
    void *attention_norm, *mlp_norm, *q_norm, *k_norm, *post_attention_norm, *post_mlp_norm;
    Py_ssize_t hidden, heads, kv_heads, dim, inner, window, activation;
    if (expect_arguments(nargs, 19, "layer_plan") ||
        take_size(args[0], "hidden_size", 1, &hidden) || take_size(args[1], "heads", 1, &heads) ||
        take_size(args[2], "kv_heads", 1, &kv_heads) || take_size(args[3], "head_dim", 2, &dim) ||
        take_size(args[4], "intermediate", 1, &inner) ||
        take_size(args[5], "window", 0, &window) || take_float(args[6], &p.eps) ||
        take_float(args[7], &p.scale) ||
        take_pointer(args[8], "attention_norm", 0, &attention_norm) ||
        take_pointer(args[9], "mlp_norm", 0, &mlp_norm) ||
        take_pointer(args[10], "q_norm", 1, &q_norm) ||
        take_pointer(args[11], "k_norm", 1, &k_norm) ||
        take_pointer(args[16], "post_attention_norm", 1, &post_attention_norm) ||
        take_pointer(args[17], "post_mlp_norm", 1, &post_mlp_norm) ||
        take_size(args[18], "activation", 0, &activation))
        return NULL;
    if (activation != ACTIVATION_SILU && activation != ACTIVATION_GELU_TANH) {
        PyErr_Format(PyExc_ValueError, "unknown activation code %zd", activation);
        return NULL;
    }
    if (heads % kv_heads || dim % 2 || dim > MAX_HEAD_DIM || (!q_norm != !k_norm)) {
        PyErr_Format(PyExc_ValueError, "unsupported layer shape: %zd heads, %zd KV heads, head "
                     "dim %zd (even, at most %d), q and k norms %s", heads, kv_heads, dim,
                     MAX_HEAD_DIM, !q_norm != !k_norm ? "not both given" : "ok");
        return NULL;
    }
    const Py_ssize_t q_size = heads * dim, qkv = q_size + 2 * kv_heads * dim;
    if (take_weight(args[12], "qkv", qkv, hidden, &p.qkv) ||
        take_weight(args[13], "output", hidden, q_size, &p.output) ||
        take_weight(args[14], "gate_up", 2 * inner, hidden, &p.gate_up) ||
        take_weight(args[15], "down", hidden, inner, &p.down))
        return NULL;
    p.hidden_size = hidden;
    p.heads = heads;
    p.kv_heads = kv_heads;
    p.head_dim = dim;
    p.intermediate = inner;
    p.window = window;
    p.attention_norm = attention_norm;
    p.mlp_norm = mlp_norm;
    p.q_norm = q_norm;
    p.k_norm = k_norm;
    p.post_attention_norm = post_attention_norm;
    p.post_mlp_norm = post_mlp_norm;
    p.activation = (int)activation;
    struct layer_plan *kept = malloc(sizeof *kept);
    if (!kept) return PyErr_NoMemory();
    *kept = p;
    PyObject *capsule = PyCapsule_New(kept, PLAN_CAPSULE, free_plan);
    if (!capsule) free(kept);
    return capsule;
}

/* decoder_layer(plan, hidden, out, rows, keys, values, capacity, start, cos, sin) */
PyObject *py_decoder_layer(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    void *hidden, *out, *keys, *values, *cos, *sin;
    Py_ssize_t rows, capacity, start;
    if (expect_arguments(nargs, 10, "decoder_layer")) return NULL;
    const struct layer_plan *plan = PyCapsule_GetPointer(args[0], PLAN_CAPSULE);
    if (!plan || take_pointer(args[1], "hidden", 0, &hidden) ||
        take_pointer(args[2], "out", 0, &out) || take_size(args[3], "rows", 1, &rows) ||
        take_pointer(args[4], "keys", 0, &keys) || take_pointer(args[5], "values", 0, &values) ||
        take_size(args[6], "capacity", 1, &capacity) || take_size(args[7], "start", 0, &start) ||
        take_pointer(args[8], "cos", 0, &cos) || take_pointer(args[9], "sin", 0, &sin))
        return NULL;
    if (start + rows > capacity) {
        PyErr_Format(PyExc_ValueError, "positions %zd..%zd do not fit a KV buffer of %zd",
                     start, start + rows - 1, capacity);
        return NULL;
    }
    double work = (double)rows * (double)(plan->qkv.columns + plan->gate_up.columns) *
                  (double)plan->hidden_size;
    int status;
    RUN(work, status = run_decoder_layer(plan, hidden, out, rows, keys, values, capacity, start,
                                         cos, sin));
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
