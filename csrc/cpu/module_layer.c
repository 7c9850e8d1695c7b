/* Entry points of exactdraft._cpu_kernels for the fused decoder layer: layer_plan checks a
 * layer's weights and sizes once and keeps them in a capsule; decoder_layers runs a stack of
 * layers for the rows of one or more sequences.
 *
 * Invariant: see decoder_layer.h; these only check and unpack arguments, so the fused layer's
 * bits are run_decoder_layer's.
 */
#include "module_layer.h"

#include <stdlib.h>

#include "decoder_layer.h"
#include "module_args.h"

#define PLAN_CAPSULE "exactdraft._cpu_kernels.layer_plan"

/* A weight that must be [columns, depth]: a tuple of 1 to MAX_WEIGHT_PARTS parts stacked along
 * the output, each (data, bias_or_0, part columns, depth, format, layout). */
static int take_weight(PyObject *arg, const char *name, Py_ssize_t columns, Py_ssize_t depth,
                       struct layer_weight *out)
{
    if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) < 1 ||
        PyTuple_GET_SIZE(arg) > MAX_WEIGHT_PARTS) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple of 1 to %d parts", name,
                     MAX_WEIGHT_PARTS);
        return -1;
    }
    *out = (struct layer_weight){.columns = columns, .depth = depth,
                                 .parts = (int)PyTuple_GET_SIZE(arg)};
    Py_ssize_t total = 0;
    for (int i = 0; i < out->parts; i++) {
        PyObject *entry = PyTuple_GET_ITEM(arg, i);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 6) {
            PyErr_Format(PyExc_TypeError, "%s part %d must be a tuple (data, bias, columns, "
                         "depth, format, layout)", name, i);
            return -1;
        }
        void *data, *bias;
        Py_ssize_t part_columns, found_depth, format, layout;
        PyObject *const *item = &PyTuple_GET_ITEM(entry, 0);
        if (take_pointer(item[0], name, 0, &data) || take_pointer(item[1], name, 1, &bias) ||
            take_size(item[2], name, 1, &part_columns) ||
            take_size(item[3], name, 1, &found_depth) || take_size(item[4], name, 0, &format) ||
            take_size(item[5], name, 0, &layout) ||
            check_weight_codes(name, format, layout, found_depth))
            return -1;
        if (found_depth != depth) {
            PyErr_Format(PyExc_ValueError, "%s part %d has depth %zd, the layer needs %zd", name,
                         i, found_depth, depth);
            return -1;
        }
        out->part[i] = (struct weight_part){
            .data = data, .bias = bias, .columns = part_columns,
            .row_bytes = weight_row_bytes(format, depth), .format = (int)format,
            .layout = (int)layout};
        total += part_columns;
    }
    if (total != columns) {
        PyErr_Format(PyExc_ValueError, "%s has %zd output columns, the layer needs %zd", name,
                     total, columns);
        return -1;
    }
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

#define MAX_SEQUENCES 256
#define MAX_LAYERS 512

/* One sequence entry (keys, values, capacity, start, rows, depths, tree_paths) into *out, with
 * keys and values taken from `keys` and `values` (pointers); 0 or -1 with an error set. */
static int take_sequence(PyObject *const *item, void *keys, void *values,
                         struct layer_sequence *out)
{
    void *depths, *tree_paths;
    Py_ssize_t capacity, start, part;
    if (take_size(item[2], "capacity", 1, &capacity) || take_size(item[3], "start", 0, &start) ||
        take_size(item[4], "rows", 1, &part) || take_pointer(item[5], "depths", 1, &depths) ||
        take_pointer(item[6], "tree_paths", 1, &tree_paths))
        return -1;
    if (!depths != !tree_paths) {
        PyErr_SetString(PyExc_ValueError, "depths and tree_paths go together");
        return -1;
    }
    if (depths && check_tree(depths, tree_paths, part)) return -1;
    if (start + part > capacity) {
        PyErr_Format(PyExc_ValueError, "positions %zd..%zd do not fit a KV buffer of %zd",
                     start, start + part - 1, capacity);
        return -1;
    }
    *out = (struct layer_sequence){keys, values, capacity, start, part, depths, tree_paths};
    return 0;
}

/* The entries of `list` (a tuple of 1 to MAX_SEQUENCES 7-tuples), their count, or -1. */
static int sequence_entries(PyObject *list)
{
    if (!PyTuple_Check(list) || PyTuple_GET_SIZE(list) < 1 ||
        PyTuple_GET_SIZE(list) > MAX_SEQUENCES) {
        PyErr_Format(PyExc_TypeError, "sequences must be a tuple of 1 to %d entries",
                     MAX_SEQUENCES);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(list); i++) {
        PyObject *entry = PyTuple_GET_ITEM(list, i);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 7) {
            PyErr_SetString(PyExc_TypeError, "a sequence is (keys, values, capacity, start, rows, "
                                             "depths, tree_paths)");
            return -1;
        }
    }
    return (int)PyTuple_GET_SIZE(list);
}

static double layer_work(const struct layer_plan *plan, Py_ssize_t rows)
{
    return (double)rows * (double)(plan->qkv.columns + plan->gate_up.columns) *
           (double)plan->hidden_size;
}

/* Pointer `index` of a tuple of pointers named `name`, into *out; 0 or -1 with an error. */
static int take_pointer_at(PyObject *tuple, Py_ssize_t index, Py_ssize_t expected,
                           const char *name, void **out)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != expected) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple of %zd pointers", name, expected);
        return -1;
    }
    return take_pointer(PyTuple_GET_ITEM(tuple, index), name, 0, out);
}

/* decoder_layers(plans, hidden, out, sequences, cos, sin): the layers of a stack in one call,
 * layer i run_decoder_layer(plans[i], ...) on the output of layer i - 1. plans, cos and sin are
 * tuples of one entry per layer; sequences is a tuple of (keys, values, capacity, start, rows,
 * depths, tree_paths) per sequence, in the order their rows sit in hidden, keys and values
 * being tuples of one buffer per layer and depths and tree_paths 0 for a chain
 * (layer_sequence). hidden is read only; out gets the last layer's output. */
PyObject *py_decoder_layers(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    void *hidden, *out;
    if (expect_arguments(nargs, 6, "decoder_layers") ||
        take_pointer(args[1], "hidden", 0, &hidden) || take_pointer(args[2], "out", 0, &out))
        return NULL;
    PyObject *plans = args[0];
    if (!PyTuple_Check(plans) || PyTuple_GET_SIZE(plans) < 1 ||
        PyTuple_GET_SIZE(plans) > MAX_LAYERS) {
        PyErr_Format(PyExc_TypeError, "plans must be a tuple of 1 to %d layer plans", MAX_LAYERS);
        return NULL;
    }
    const Py_ssize_t layers = PyTuple_GET_SIZE(plans);
    const int count = sequence_entries(args[3]);
    if (count < 0) return NULL;
    const struct layer_plan *plan_of[MAX_LAYERS];
    void *cos[MAX_LAYERS], *sin[MAX_LAYERS];
    for (Py_ssize_t l = 0; l < layers; l++) {
        plan_of[l] = PyCapsule_GetPointer(PyTuple_GET_ITEM(plans, l), PLAN_CAPSULE);
        if (!plan_of[l] || take_pointer_at(args[4], l, layers, "cos", &cos[l]) ||
            take_pointer_at(args[5], l, layers, "sin", &sin[l]))
            return NULL;
        if (plan_of[l]->hidden_size != plan_of[0]->hidden_size) {
            PyErr_Format(PyExc_ValueError, "layer %zd has hidden size %zd, layer 0 %zd", l,
                         plan_of[l]->hidden_size, plan_of[0]->hidden_size);
            return NULL;
        }
    }
    struct layer_sequence *sequences = malloc(sizeof *sequences * (size_t)(layers * count));
    if (!sequences) return PyErr_NoMemory();
    Py_ssize_t rows = 0;
    for (int i = 0; i < count; i++) {
        PyObject *const *item = &PyTuple_GET_ITEM(PyTuple_GET_ITEM(args[3], i), 0);
        for (Py_ssize_t l = 0; l < layers; l++) {
            void *keys, *values;
            if (take_pointer_at(item[0], l, layers, "keys", &keys) ||
                take_pointer_at(item[1], l, layers, "values", &values) ||
                take_sequence(item, keys, values, &sequences[l * count + i])) {
                free(sequences);
                return NULL;
            }
        }
        rows += sequences[i].rows;
    }
    const size_t bytes = (size_t)rows * (size_t)plan_of[0]->hidden_size * sizeof(float);
    float *spare = malloc(bytes);
    if (!spare) {
        free(sequences);
        return PyErr_NoMemory();
    }
    double work = 0;
    for (Py_ssize_t l = 0; l < layers; l++) work += layer_work(plan_of[l], rows);
    int status = 0;
    /* Layers alternate between out and spare so that the last one writes out. */
    RUN(work, for (Py_ssize_t l = 0; l < layers && !status; l++) {
        const float *source = l == 0 ? hidden : ((layers - l) % 2 ? spare : out);
        float *destination = (layers - 1 - l) % 2 ? spare : out;
        status = run_decoder_layer(plan_of[l], source, destination, &sequences[l * count],
                                   count, cos[l], sin[l]);
    });
    free(spare);
    free(sequences);
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
