/* The hot calls of the native library as a CPython extension module.
 *
 * Why: cold (its code and data out of the caches, as between a training
 * loop's steps), a ctypes call costs 12-18 us before the C function starts
 * (argument conversion, libffi, the GIL released and taken back), a call
 * of a builtin function like these ~5-7 us. A small extend, sample or
 * update makes one or two such calls and is ~100 us in all cold.
 *
 * This file includes tree.c, so the module is the whole library: one build,
 * loaded once (ctypes opens the same file for every other function). It is
 * built only where Python's headers are installed; elsewhere the library is
 * built from tree.c alone and native.CtypesCalls makes the same calls
 * through ctypes. Both give the same results (tests/variants/test_native.py).
 *
 * Every address is a Python int the caller took from its own live tensors
 * or argument blocks (the contract of tree.c's functions holds). The GIL is
 * released for a batch of RB_RELEASE_GIL_AT or more rows (as ctypes always
 * does): a small batch's work is shorter than the release. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "tree.c"

#define RB_RELEASE_GIL_AT 1024

/* stmt, with the GIL released when rows >= RB_RELEASE_GIL_AT */
#define RB_CALL(rows, stmt)                          \
    do {                                             \
        if ((rows) >= RB_RELEASE_GIL_AT) {           \
            Py_BEGIN_ALLOW_THREADS stmt;             \
            Py_END_ALLOW_THREADS                     \
        } else {                                     \
            stmt;                                    \
        }                                            \
    } while (0)

static int rb_ints(PyObject *const *args, Py_ssize_t n, int64_t *out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = (int64_t)PyLong_AsLongLong(args[i]);
        if (out[i] == -1 && PyErr_Occurred()) return 0;
    }
    return 1;
}

/* extend(block, mode, first, n, write_count, index_out, *sources): sets those
 * fields of the rb_extend_args at block and each column's source address,
 * then mode 0: rb_extend, 1: rb_extend_whole, 2: rb_extend_prepare; returns
 * the function's code. A mode outside 0..2 or another number of sources
 * raises before anything is written. */
static PyObject *py_extend(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[6];
    if (nargs < 6 || !rb_ints(args, 6, v)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "extend(block, mode, first, n, write_count, index_out, *sources)");
        return NULL;
    }
    if (v[1] < 0 || v[1] > 2) {
        PyErr_Format(PyExc_ValueError, "mode=%lld, but should be 0, 1 or 2", (long long)v[1]);
        return NULL;
    }
    rb_extend_args *x = (rb_extend_args *)(intptr_t)v[0];
    if (nargs - 6 != x->n_cols) {
        PyErr_Format(PyExc_TypeError, "sources=%zd, but should be the block's %lld columns", nargs - 6,
                     (long long)x->n_cols);
        return NULL;
    }
    int64_t *cols = (int64_t *)(intptr_t)x->cols;
    for (Py_ssize_t c = 6; c < nargs; c++) {
        int64_t source = (int64_t)PyLong_AsLongLong(args[c]);
        if (source == -1 && PyErr_Occurred()) return NULL;
        cols[4 * (c - 6)] = source;
    }
    x->first = v[2];
    x->n = v[3];
    x->write_count = v[4];
    x->index_out = (int64_t *)(intptr_t)v[5];
    int64_t code;
    RB_CALL(v[3], code = v[1] == 1 ? rb_extend_whole(x) : v[1] == 2 ? rb_extend_prepare(x) : rb_extend(x));
    return PyLong_FromLongLong(code);
}

/* The spec of one column for add (int64 each): the buffer-protocol format
 * character of its dtype (0: none, only addresses accepted), its element
 * size, its row's number of dimensions and its row's dimensions. */
#define RB_ADD_DIMS 8
#define RB_ADD_SPEC (3 + RB_ADD_DIMS)
#define RB_ADD_MAX_COLS 64

/* Whether view holds exactly one row of the column spec (format, item size,
 * shape; C-contiguous, as requested). */
static int rb_add_fits(const Py_buffer *view, const int64_t *spec)
{
    if (spec[0] == 0 || !view->format || view->format[0] != (char)spec[0] || view->format[1] != 0
        || view->itemsize != spec[1] || view->ndim != spec[2])
        return 0;
    for (int d = 0; d < view->ndim; d++)
        if (!view->shape || view->shape[d] != spec[3 + d]) return 0;
    return 1;
}

/* add(block, spec, mode, first, write_count, index_out, priority_col, *sources):
 * ONE row (rbcheck.variants.add_fast). Each source is either an int (the
 * address of a row the caller checked) or an object with the buffer protocol
 * (a NumPy array or scalar), checked here against the column's spec (format,
 * item size, shape, C-contiguous). When every source fits, the fields of the
 * rb_extend_args at block are set (n = 1; priority = the source of column
 * priority_col when >= 0) and mode 0 runs rb_extend, 1 rb_extend_whole;
 * the function's code is returned. -2: a source did not fit (nothing
 * written; the caller takes its general path). */
static PyObject *py_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[7];
    if (nargs < 7 || !rb_ints(args, 7, v)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "add(block, spec, mode, first, write_count, index_out, priority_col, *sources)");
        return NULL;
    }
    if (v[2] < 0 || v[2] > 1) {
        PyErr_Format(PyExc_ValueError, "mode=%lld, but should be 0 or 1", (long long)v[2]);
        return NULL;
    }
    rb_extend_args *x = (rb_extend_args *)(intptr_t)v[0];
    const int64_t *spec = (const int64_t *)(intptr_t)v[1];
    Py_ssize_t n_cols = nargs - 7;
    if (n_cols != x->n_cols || n_cols > RB_ADD_MAX_COLS || v[6] >= n_cols) {
        PyErr_Format(PyExc_TypeError, "sources=%zd, but should be the block's %lld columns (at most %d)", n_cols,
                     (long long)x->n_cols, RB_ADD_MAX_COLS);
        return NULL;
    }
    Py_buffer views[RB_ADD_MAX_COLS];
    int held = 0;
    int64_t code = -2, *cols = (int64_t *)(intptr_t)x->cols;
    for (Py_ssize_t c = 0; c < n_cols; c++) {
        PyObject *o = args[7 + c];
        if (PyLong_CheckExact(o)) {
            int64_t source = (int64_t)PyLong_AsLongLong(o);
            if (source == -1 && PyErr_Occurred()) goto done;
            cols[4 * c] = source;
            continue;
        }
        if (PyObject_GetBuffer(o, &views[held], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
            PyErr_Clear();
            goto done;
        }
        held++;
        if (!rb_add_fits(&views[held - 1], spec + RB_ADD_SPEC * c)) goto done;
        cols[4 * c] = (int64_t)(intptr_t)views[held - 1].buf;
    }
    x->first = v[3];
    x->n = 1;
    x->write_count = v[4];
    x->index_out = (int64_t *)(intptr_t)v[5];
    if (v[6] >= 0) x->priority = (const void *)(intptr_t)cols[4 * v[6]];
    code = v[2] == 1 ? rb_extend_whole(x) : rb_extend(x);
done:
    for (int i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(code);
}

/* sample(block, step): step 0 rb_sample_descend (returns 0), 1 rb_sample_rows
 * (returns its code), on the rb_sample_args at block. */
static PyObject *py_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[2];
    if (nargs != 2 || !rb_ints(args, 2, v)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "sample(block, step)");
        return NULL;
    }
    const rb_sample_args *a = (const rb_sample_args *)(intptr_t)v[0];
    int64_t code = 0;
    RB_CALL(a->n, if (v[1] == 0) rb_sample_descend(a); else code = rb_sample_rows(a));
    return PyLong_FromLongLong(code);
}

/* prepare_update(index, n, capacity, priority, is_float32, eps, out, max_priority, high_out):
 * rb_prepare_update's arguments, addresses as ints. */
static PyObject *py_prepare_update(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[9];
    if (nargs != 9 || !rb_ints(args, 5, v) || !rb_ints(args + 6, 3, v + 6)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "prepare_update takes 9 arguments");
        return NULL;
    }
    double eps = PyFloat_AsDouble(args[5]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    int64_t code;
    RB_CALL(v[1], code = rb_prepare_update((const int64_t *)(intptr_t)v[0], v[1], v[2], (const void *)(intptr_t)v[3],
                                           v[4], eps, (double *)(intptr_t)v[6], (const double *)(intptr_t)v[7],
                                           (double *)(intptr_t)v[8]));
    return PyLong_FromLongLong(code);
}

/* finish_update(value, n, high, max_priority, alpha, vector_pow, do_pow): rb_finish_update's. */
static PyObject *py_finish_update(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[7];
    if (nargs != 7 || !rb_ints(args, 4, v) || !rb_ints(args + 5, 2, v + 5)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "finish_update takes 7 arguments");
        return NULL;
    }
    double alpha = PyFloat_AsDouble(args[4]);
    if (alpha == -1.0 && PyErr_Occurred()) return NULL;
    int64_t code;
    RB_CALL(v[1], code = rb_finish_update((double *)(intptr_t)v[0], v[1], (const double *)(intptr_t)v[2],
                                          (double *)(intptr_t)v[3], alpha, (const void *)(intptr_t)v[5], v[6]));
    return PyLong_FromLongLong(code);
}

/* update_whole(index, n, capacity, priority, is_float32, eps, value, max_priority, high, alpha,
 * vector_pow, sum_nodes, min_nodes, size): rb_update_whole's arguments, addresses as ints. */
static PyObject *py_update_whole(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t v[14];
    if (nargs != 14 || !rb_ints(args, 5, v) || !rb_ints(args + 6, 3, v + 6) || !rb_ints(args + 10, 4, v + 10)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "update_whole takes 14 arguments");
        return NULL;
    }
    double eps = PyFloat_AsDouble(args[5]), alpha = PyFloat_AsDouble(args[9]);
    if ((eps == -1.0 || alpha == -1.0) && PyErr_Occurred()) return NULL;
    int64_t code;
    RB_CALL(v[1], code = rb_update_whole((const int64_t *)(intptr_t)v[0], v[1], v[2], (const void *)(intptr_t)v[3],
                                         v[4], eps, (double *)(intptr_t)v[6], (double *)(intptr_t)v[7],
                                         (double *)(intptr_t)v[8], alpha, (const void *)(intptr_t)v[10],
                                         (double *)(intptr_t)v[11], (double *)(intptr_t)v[12], v[13]));
    return PyLong_FromLongLong(code);
}

static PyMethodDef rb_methods[] = {
    {"extend", (PyCFunction)(void (*)(void))py_extend, METH_FASTCALL, "rb_extend and friends on a block"},
    {"add", (PyCFunction)(void (*)(void))py_add, METH_FASTCALL, "one row: rb_extend / rb_extend_whole"},
    {"sample", (PyCFunction)(void (*)(void))py_sample, METH_FASTCALL, "rb_sample_descend / rb_sample_rows"},
    {"prepare_update", (PyCFunction)(void (*)(void))py_prepare_update, METH_FASTCALL, "rb_prepare_update"},
    {"finish_update", (PyCFunction)(void (*)(void))py_finish_update, METH_FASTCALL, "rb_finish_update"},
    {"update_whole", (PyCFunction)(void (*)(void))py_update_whole, METH_FASTCALL, "rb_update_whole"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rb_module = {PyModuleDef_HEAD_INIT, "_rbcheck_native", NULL, -1, rb_methods};

PyMODINIT_FUNC PyInit__rbcheck_native(void)
{
    PyObject *m = PyModule_Create(&rb_module);
    if (m && PyModule_AddIntConstant(m, "abi_version", RB_ABI_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
