/* Entry points of exactdraft._cpu_kernels for the fused decoder layer (module_layer.c).
 *
 * Invariant: see decoder_layer.h; these only check and unpack arguments.
 */
#ifndef EXACTDRAFT_CPU_MODULE_LAYER_H
#define EXACTDRAFT_CPU_MODULE_LAYER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *py_layer_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_decoder_layers(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
